// What every com.trtspec op shares: the ONNX Runtime API table, errors (exceptions inside an op, an OrtStatus at the
// ABI boundary), views of input tensors, outputs, the 16-float vector arithmetic whose results do not depend on a
// call's shape, and the OrtCustomOp record an op is registered with (ops.cc adds them all to the domain).
#pragma once

#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#if defined(__SSE__)
#include <immintrin.h>  // _mm_getcsr / _mm_setcsr (the caller's denormal mode, given to every worker), FMA
#endif

#include "ort_abi.h"

namespace trtspec_ops {

using namespace ort_abi;

constexpr const char* kDomain = "com.trtspec";

// the API table, set by RegisterCustomOps (ops.cc) before any op runs
extern const OrtApi* g_api;

// ---- errors ---------------------------------------------------------------------------------------------------------
struct OpError : std::exception {
  explicit OpError(std::string text, OrtErrorCode code = ORT_INVALID_ARGUMENT) : message(std::move(text)), code(code) {}
  const char* what() const noexcept override { return message.c_str(); }
  std::string message;
  OrtErrorCode code;
};

inline void check(OrtStatus* status) {
  if (status == nullptr) return;
  std::string text = g_api->GetErrorMessage(status);
  OrtErrorCode code = g_api->GetErrorCode(status);
  g_api->ReleaseStatus(status);
  throw OpError(text, code);
}

// runs `body`, turning what it throws into an OrtStatus whose message starts with the op's name
template <typename Body>
OrtStatus* guarded(const char* op, Body body) noexcept {
  try {
    body();
    return nullptr;
  } catch (const OpError& e) {
    return g_api->CreateStatus(e.code, (std::string(op) + ": " + e.message).c_str());
  } catch (const std::bad_alloc&) {
    return g_api->CreateStatus(ORT_FAIL, (std::string(op) + ": out of memory").c_str());
  } catch (const std::exception& e) {
    return g_api->CreateStatus(ORT_FAIL, (std::string(op) + ": " + e.what()).c_str());
  } catch (...) {
    return g_api->CreateStatus(ORT_FAIL, (std::string(op) + ": unknown error").c_str());
  }
}

inline std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// ---- tensors --------------------------------------------------------------------------------------------------------
struct TensorView {
  void* data = nullptr;
  std::vector<int64_t> shape;
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
};

inline std::vector<int64_t> dims_of(const OrtTensorTypeAndShapeInfo* info) {
  size_t rank = 0;
  check(g_api->GetDimensionsCount(info, &rank));
  std::vector<int64_t> shape(rank);
  if (rank) check(g_api->GetDimensions(info, shape.data(), rank));
  return shape;
}

inline TensorView view_of(const OrtValue* value) {
  TensorView view;
  OrtTensorTypeAndShapeInfo* info = nullptr;
  check(g_api->GetTensorTypeAndShape(value, &info));
  try {
    check(g_api->GetTensorElementType(info, &view.type));
    view.shape = dims_of(info);
  } catch (...) {
    g_api->ReleaseTensorTypeAndShapeInfo(info);
    throw;
  }
  g_api->ReleaseTensorTypeAndShapeInfo(info);
  // GetTensorMutableData is the API-17 way to read an input's buffer; inputs are only read through the pointer
  check(g_api->GetTensorMutableData(const_cast<OrtValue*>(value), &view.data));
  return view;
}

// input `index` (called `name` in messages) of `rank` dimensions (-1: any rank)
inline TensorView input(const OrtKernelContext* context, size_t index, int rank, const char* name) {
  const OrtValue* value = nullptr;
  check(g_api->KernelContext_GetInput(context, index, &value));
  if (value == nullptr) throw OpError(std::string("input ") + name + " is missing");
  TensorView view = view_of(value);
  if (rank >= 0 && view.shape.size() != size_t(rank))
    throw OpError(std::string("input ") + name + " has shape " + shape_text(view.shape) + ", expected " +
                  std::to_string(rank) + " dimensions");
  return view;
}

inline void expect_shape(const char* name, const TensorView& view, const std::vector<int64_t>& expected) {
  if (view.shape != expected)
    throw OpError(std::string("input ") + name + " has shape " + shape_text(view.shape) + ", expected " +
                  shape_text(expected));
}

inline float* output(OrtKernelContext* context, size_t index, const std::vector<int64_t>& shape) {
  OrtValue* value = nullptr;
  check(g_api->KernelContext_GetOutput(context, index, shape.data(), shape.size(), &value));
  if (value == nullptr) throw OpError("output " + std::to_string(index) + " is missing");
  void* data = nullptr;
  check(g_api->GetTensorMutableData(value, &data));
  return static_cast<float*>(data);
}

// the number of inputs a kernel was given, checked against the op's
inline void expect_input_count(const OrtKernelContext* context, size_t expected) {
  size_t count = 0;
  check(g_api->KernelContext_GetInputCount(context, &count));
  if (count != expected)
    throw OpError("expects " + std::to_string(expected) + " inputs, got " + std::to_string(count));
}

// ---- the worker threads' floating-point mode ------------------------------------------------------------------------
// ONNX Runtime's pool threads may run with another MXCSR (flush-to-zero, denormals-are-zero) than the caller:
// a task sets the caller's for its duration, so that a number comes out the same on whichever thread computes it.
struct CallerMode {
#if defined(__SSE__)
  unsigned int csr = _mm_getcsr();
#endif
};

class WorkerMode {
 public:
  explicit WorkerMode(const CallerMode& caller) {
#if defined(__SSE__)
    saved_ = _mm_getcsr();
    _mm_setcsr(caller.csr);
#else
    (void)caller;
#endif
  }
  ~WorkerMode() {
#if defined(__SSE__)
    _mm_setcsr(saved_);
#endif
  }
  WorkerMode(const WorkerMode&) = delete;
  WorkerMode& operator=(const WorkerMode&) = delete;

 private:
#if defined(__SSE__)
  unsigned int saved_ = 0;
#endif
};

// ---- work across ONNX Runtime's intra-op threads ---------------------------------------------------------------------
// body(unit) for every unit in [0, units) through KernelContext_ParallelFor, each task in the caller's floating-point
// mode; the first exception a task throws (an allocation) is rethrown here once all have run.
template <typename Body>
struct ParallelWork {
  Body* body;
  CallerMode mode;
  std::mutex lock;
  std::exception_ptr failure;
};

template <typename Body>
void parallel_task(void* data, size_t unit) {
  ParallelWork<Body>& work = *static_cast<ParallelWork<Body>*>(data);
  const WorkerMode mode(work.mode);
  try {
    (*work.body)(unit);
  } catch (...) {
    std::lock_guard<std::mutex> guard(work.lock);
    if (!work.failure) work.failure = std::current_exception();
  }
}

template <typename Body>
void parallel_for(OrtKernelContext* context, size_t units, const CallerMode& mode, Body body) {
  ParallelWork<Body> work{&body, mode, {}, {}};
  check(g_api->KernelContext_ParallelFor(context, parallel_task<Body>, units, 0, &work));
  if (work.failure) std::rethrow_exception(work.failure);
}

// ---- vector arithmetic ----------------------------------------------------------------------------------------------
// Vectors of 16 floats (one AVX-512 register; two AVX2 ones elsewhere). Every floating-point result of an op is an
// elementwise function of its own operands, or a reduction in an order fixed by the source: no path computes a row's
// numbers differently from another.
constexpr int kWidth = 16;
typedef float Vec __attribute__((vector_size(kWidth * sizeof(float))));
typedef int32_t IVec __attribute__((vector_size(kWidth * sizeof(int32_t))));

inline Vec splat(float x) { return Vec{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }  // (not 0 + x: an add)

inline Vec load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void store(float* p, Vec v) { std::memcpy(p, &v, sizeof(v)); }

// IEEE half (binary16) to float: exact, so every path below gives the same floats
inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);  // inf, nan
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;  // ±0
  } else {  // subnormal: normalise
    int e = -1;
    uint32_t m = mantissa;
    do {
      ++e;
      m <<= 1;
    } while ((m & 0x400u) == 0);
    bits = sign | uint32_t(112 - e) << 23 | ((m & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// 16 halves at p, as floats (F16C / AVX-512 conversions where the CPU has them; the same values either way)
inline Vec load_half(const uint16_t* p) {
#if defined(__AVX512F__)
  return (Vec)_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#elif defined(__F16C__)
  Vec out;
  _mm256_storeu_ps((float*)&out, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  _mm256_storeu_ps((float*)&out + 8, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8))));
  return out;
#else
  float f[kWidth];
  for (int i = 0; i < kWidth; ++i) f[i] = half_to_float(p[i]);
  return load(f);
#endif
}

// a·b + c, one rounding where the CPU fuses (every call site of this build fuses, or none does)
inline Vec fma(Vec a, Vec b, Vec c) {
#if defined(__AVX512F__)
  return (Vec)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__)
  __m256 lo = _mm256_fmadd_ps(_mm256_loadu_ps((const float*)&a), _mm256_loadu_ps((const float*)&b),
                              _mm256_loadu_ps((const float*)&c));
  __m256 hi = _mm256_fmadd_ps(_mm256_loadu_ps((const float*)&a + 8), _mm256_loadu_ps((const float*)&b + 8),
                              _mm256_loadu_ps((const float*)&c + 8));
  Vec out;
  _mm256_storeu_ps((float*)&out, lo);
  _mm256_storeu_ps((float*)&out + 8, hi);
  return out;
#else
  return a * b + c;  // compiled with -ffp-contract=off: two roundings, everywhere alike
#endif
}

// the 16 lanes of v added in one fixed tree: lane l + 8, then l + 4, l + 2, l + 1
inline float lane_sum(Vec v) {
  float s[kWidth];
  std::memcpy(s, &v, sizeof(s));
  for (int step = kWidth / 2; step >= 1; step /= 2)
    for (int l = 0; l < step; ++l) s[l] = s[l] + s[l + step];
  return s[0];
}

// e^x for x <= 0, lane by lane: x = n ln2 + r (Cody-Waite), e^r by a degree-6 polynomial (Horner), times 2^n;
// 0 below -87.3 (where e^x leaves the normal range). Within 2 ulp of e^x; exactly 1 at x = 0.
inline Vec exp_nonpositive(Vec x) {
  const Vec round_magic = splat(12582912.0f);  // 1.5 · 2^23: adding it rounds to an integer (round to nearest)
  const Vec n = (x * splat(1.44269504088896341f) + round_magic) - round_magic;
  Vec r = x - n * splat(0.693145751953125f);   // ln 2, high part (exact products with n)
  r = r - n * splat(1.42860682030941723212e-6f);  // ln 2, low part
  Vec poly = splat(1.0f / 720.0f);
  poly = poly * r + splat(1.0f / 120.0f);
  poly = poly * r + splat(1.0f / 24.0f);
  poly = poly * r + splat(1.0f / 6.0f);
  poly = poly * r + splat(0.5f);
  poly = poly * r + splat(1.0f);
  poly = poly * r + splat(1.0f);
  const IVec bits = (__builtin_convertvector(n, IVec) + 127) << 23;
  Vec scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  const Vec result = poly * scale;
  return x < splat(-87.3f) ? splat(0.0f) : result;
}

// the logistic function 1 / (1 + e^-x), lane by lane, from e^-|x| (exp_nonpositive): 1 / (1 + e^-x) for x >= 0,
// e^x / (1 + e^x) below, so nothing overflows
inline Vec sigmoid_of(Vec x) {
  const Vec e = exp_nonpositive(x < splat(0.0f) ? x : -x);
  return (x < splat(0.0f) ? e : splat(1.0f)) / (splat(1.0f) + e);
}

// half-split rotary embedding of one head vector (h = hd / 2):
// out[i] = x[i] cos - x[i + h] sin, out[i + h] = x[i + h] cos + x[i] sin
inline void rope(const float* x, const float* cos, const float* sin, int hd, float* out) {
  const int half = hd / 2;
  for (int i = 0; i < half; ++i) {
    const float x1 = x[i], x2 = x[i + half];
    out[i] = x1 * cos[i] - x2 * sin[i];
    out[i + half] = x2 * cos[i] + x1 * sin[i];
  }
}

// ---- the attention ops' shared parts (TreeAttention, PromptAttention) ---------------------------------------------
struct PresentCache {
  float* key;
  float* value;
};

// outputs 1 and 2, present_key / present_value [B, nkv, needed, hd], as GroupQueryAttention's: bound to the past's
// own buffer (the runtime's IO binding, which sizes the cache for every step) the new rows are appended in place;
// otherwise the present starts as a copy of the past, with room for the new rows
inline PresentCache present_cache(OrtKernelContext* context, const TensorView& past_key, const TensorView& past_value,
                                  int64_t needed) {
  const int64_t batch = past_key.shape[0], kv_heads = past_key.shape[1], capacity = past_key.shape[2];
  const int64_t hd = past_key.shape[3];
  const std::vector<int64_t> shape{batch, kv_heads, needed, hd};
  PresentCache present{output(context, 1, shape), output(context, 2, shape)};
  if ((present.key == past_key.data || present.value == past_value.data) && needed != capacity)
    throw OpError("the present cache shares the past's buffer, which has no room for the new rows");
  const float* pasts[] = {static_cast<const float*>(past_key.data), static_cast<const float*>(past_value.data)};
  float* presents[] = {present.key, present.value};
  for (int i = 0; i < 2; ++i) {
    if (presents[i] == pasts[i]) continue;
    const size_t block = size_t(capacity) * hd, stride = size_t(needed) * hd;
    for (size_t head = 0; head < size_t(batch) * kv_heads; ++head)
      std::memcpy(presents[i] + head * stride, pasts[i] + head * block, block * sizeof(float));
  }
  return present;
}

// an int attribute the node may leave out (then `fallback`)
inline int64_t optional_int_attribute(const OrtApi* api, const OrtKernelInfo* info, const char* name,
                                      int64_t fallback) {
  int64_t value = fallback;
  if (OrtStatus* status = api->KernelInfoGetAttribute_int64(info, name, &value)) {
    api->ReleaseStatus(status);
    return fallback;
  }
  return value;
}

// the num_heads and kv_num_heads attributes, num_heads a positive multiple of kv_num_heads
inline void attention_heads(const OrtApi* api, const OrtKernelInfo* info, int& heads, int& kv_heads) {
  int64_t h = 0, kv = 0;
  check(api->KernelInfoGetAttribute_int64(info, "num_heads", &h));
  check(api->KernelInfoGetAttribute_int64(info, "kv_num_heads", &kv));
  if (h <= 0 || kv <= 0 || h % kv != 0)
    throw OpError("num_heads " + std::to_string(h) + " must be a positive multiple of kv_num_heads " +
                  std::to_string(kv));
  heads = int(h), kv_heads = int(kv);
}

// ---- an op's registration record ------------------------------------------------------------------------------------
// OrtCustomOp first, so that the pointer ONNX Runtime hands every callback is the record's own; the rest says what
// the callbacks report. Every output is float32; every input is required and lives in CPU memory.
struct OpRecord {
  OrtCustomOp op;
  const char* name;
  const ONNXTensorElementDataType* input_types;
  size_t inputs;
  size_t outputs;
};

namespace record_callbacks {
inline const OpRecord& of(const OrtCustomOp* op) { return *reinterpret_cast<const OpRecord*>(op); }
inline const char* name(const OrtCustomOp* op) noexcept { return of(op).name; }
inline const char* provider(const OrtCustomOp*) noexcept { return "CPUExecutionProvider"; }
inline ONNXTensorElementDataType input_type(const OrtCustomOp* op, size_t index) noexcept {
  return index < of(op).inputs ? of(op).input_types[index] : ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
}
inline size_t input_count(const OrtCustomOp* op) noexcept { return of(op).inputs; }
inline ONNXTensorElementDataType output_type(const OrtCustomOp*, size_t) noexcept {
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
inline size_t output_count(const OrtCustomOp* op) noexcept { return of(op).outputs; }
inline OrtCustomOpInputOutputCharacteristic required(const OrtCustomOp*, size_t) noexcept {
  return INPUT_OUTPUT_REQUIRED;
}
inline OrtMemType cpu_memory(const OrtCustomOp*, size_t) noexcept { return OrtMemTypeDefault; }
inline int one(const OrtCustomOp*) noexcept { return 1; }
}  // namespace record_callbacks

using CreateKernel = OrtStatus* (*)(const OrtCustomOp*, const OrtApi*, const OrtKernelInfo*, void**) noexcept;
using ComputeKernel = OrtStatus* (*)(void*, OrtKernelContext*) noexcept;
using DestroyKernel = void (*)(void*) noexcept;

inline OpRecord make_record(const char* name, const ONNXTensorElementDataType* input_types, size_t inputs,
                            size_t outputs, CreateKernel create, ComputeKernel compute, DestroyKernel destroy) {
  namespace cb = record_callbacks;
  OpRecord record;
  std::memset(&record.op, 0, sizeof(record.op));
  OrtCustomOp& op = record.op;
  op.version = kApiVersion;
  op.GetName = cb::name;
  op.GetExecutionProviderType = cb::provider;
  op.GetInputType = cb::input_type;
  op.GetInputTypeCount = cb::input_count;
  op.GetOutputType = cb::output_type;
  op.GetOutputTypeCount = cb::output_count;
  op.KernelDestroy = destroy;
  op.GetInputCharacteristic = cb::required;
  op.GetOutputCharacteristic = cb::required;
  op.GetInputMemoryType = cb::cpu_memory;
  op.GetVariadicInputMinArity = cb::one;
  op.GetVariadicInputHomogeneity = cb::one;
  op.GetVariadicOutputMinArity = cb::one;
  op.GetVariadicOutputHomogeneity = cb::one;
  op.CreateKernelV2 = create;
  op.KernelComputeV2 = compute;
  record.name = name;
  record.input_types = input_types;
  record.inputs = inputs;
  record.outputs = outputs;
  return record;
}

// the ops of the library (defined in their own files)
const OrtCustomOp* tree_attention_op();
const OrtCustomOp* prompt_attention_op();
const OrtCustomOp* add_block_offsets_op();
const OrtCustomOp* block_matmul_op();
const OrtCustomOp* skip_rms_norm_op();

}  // namespace trtspec_ops
