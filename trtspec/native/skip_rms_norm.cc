// SkipRMSNorm (domain com.trtspec, CPU, float32): the residual add and the RMS norm after it, per row of the last
// dimension: total = x + skip, y = (total · (1 / sqrt(sum(total²) / H + epsilon))) · gamma. What ONNX Runtime's
// SkipSimplifiedLayerNormalization computes, in a `--native-matmul` graph.
//
// Inputs   0 x      float [..., H]
//          1 skip   float [..., H]
//          2 gamma  float [H]
// Outputs  0 y      float [..., H]
//          1 total  float [..., H]
// Attribute epsilon  float
//
// Why: a decode step's norms are one row each, where ONNX Runtime's op costs more in handing the row to its threads
// than in the arithmetic; here a call under kInlineBelow elements runs on the calling thread, larger ones in chunks of
// rows. A row's numbers are its own in any call: the sum of squares in lanes of 16 over the row in order, the lanes
// added in a fixed order, then the rest of the row one by one.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "op_support.h"

namespace trtspec_ops {
namespace {

constexpr const char* kOpName = "SkipRMSNorm";
const char* const kInputNames[] = {"x", "skip", "gamma"};
const ONNXTensorElementDataType kInputTypes[] = {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
                                                 ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT};
constexpr size_t kInputCount = sizeof(kInputTypes) / sizeof(kInputTypes[0]);
constexpr int64_t kInlineBelow = int64_t(1) << 15;  // elements under which the calling thread does every row
constexpr int64_t kChunkRows = 16;                  // rows of one parallel unit

void norm_rows(const float* x, const float* skip, const float* gamma, int64_t rows, int64_t h, float epsilon,
               float* y, float* total) {
  const int64_t whole = h / kWidth * kWidth;
  for (int64_t r = 0; r < rows; ++r) {
    const float *a = x + r * h, *b = skip + r * h;
    float *t = total + r * h, *out = y + r * h;
    Vec squares = {};
    for (int64_t i = 0; i < whole; i += kWidth) {
      const Vec v = load(a + i) + load(b + i);
      store(t + i, v);
      squares += v * v;
    }
    float sum = lane_sum(squares);
    for (int64_t i = whole; i < h; ++i) {
      t[i] = a[i] + b[i];
      sum += t[i] * t[i];
    }
    const float inverse = 1.0f / std::sqrt(sum / float(h) + epsilon);
    for (int64_t i = 0; i < whole; i += kWidth) store(out + i, (load(t + i) * splat(inverse)) * load(gamma + i));
    for (int64_t i = whole; i < h; ++i) out[i] = (t[i] * inverse) * gamma[i];
  }
}

struct Kernel {
  float epsilon;
};

void compute(const Kernel& kernel, OrtKernelContext* context) {
  expect_input_count(context, kInputCount);
  const TensorView x = input(context, 0, -1, kInputNames[0]), skip = input(context, 1, -1, kInputNames[1]);
  const TensorView gamma = input(context, 2, 1, kInputNames[2]);
  const TensorView* views[] = {&x, &skip, &gamma};
  for (size_t i = 0; i < kInputCount; ++i)
    if (views[i]->type != kInputTypes[i]) throw OpError(std::string("input ") + kInputNames[i] + " is not float32");
  if (x.shape.empty()) throw OpError("input x must have at least one dimension");
  expect_shape(kInputNames[1], skip, x.shape);
  const int64_t h = x.shape.back();
  expect_shape(kInputNames[2], gamma, {h});
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < x.shape.size(); ++i) rows *= x.shape[i];
  float* y = output(context, 0, x.shape);
  float* total = output(context, 1, x.shape);
  if (rows == 0 || h == 0) return;
  const float *a = static_cast<const float*>(x.data), *b = static_cast<const float*>(skip.data);
  const float* g = static_cast<const float*>(gamma.data);
  const float epsilon = kernel.epsilon;
  if (rows * h < kInlineBelow) return norm_rows(a, b, g, rows, h, epsilon, y, total);
  const int64_t chunks = (rows + kChunkRows - 1) / kChunkRows;
  parallel_for(context, size_t(chunks), CallerMode{}, [=](size_t chunk) {
    const int64_t r = int64_t(chunk) * kChunkRows, count = std::min(kChunkRows, rows - r);
    norm_rows(a + r * h, b + r * h, g, count, h, epsilon, y + r * h, total + r * h);
  });
}

OrtStatus* create_kernel(const OrtCustomOp*, const OrtApi* api, const OrtKernelInfo* info, void** kernel) noexcept {
  if (g_api == nullptr) g_api = api;
  return guarded(kOpName, [&] {
    size_t inputs = 0;
    check(api->KernelInfo_GetInputCount(info, &inputs));
    if (inputs != kInputCount) throw OpError("expects 3 inputs, got " + std::to_string(inputs));
    float epsilon = 0.0f;
    check(api->KernelInfoGetAttribute_float(info, "epsilon", &epsilon));
    if (!(epsilon >= 0.0f)) throw OpError("attribute epsilon is " + std::to_string(epsilon) + ", not >= 0");
    *kernel = new Kernel{epsilon};
  });
}

OrtStatus* compute_kernel(void* kernel, OrtKernelContext* context) noexcept {
  return guarded(kOpName, [&] { compute(*static_cast<const Kernel*>(kernel), context); });
}

void destroy_kernel(void* kernel) noexcept { delete static_cast<Kernel*>(kernel); }

const OpRecord g_record = make_record(kOpName, kInputTypes, kInputCount, 2, create_kernel, compute_kernel,
                                      destroy_kernel);

}  // namespace

const OrtCustomOp* skip_rms_norm_op() { return &g_record.op; }

}  // namespace trtspec_ops
