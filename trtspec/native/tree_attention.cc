// TreeAttention (domain com.trtspec, CPU, float32): rotary attention over a KV cache and a tree of new slots, as an
// ONNX Runtime custom op whose arithmetic for one query row depends only on that row's visible keys, in order.
//
// Inputs   0 qkv           float [B, T, (nh + 2 nkv) hd]  packed q | k | v, q already scaled (scale 1 here)
//          1 past_key      float [B, nkv, capacity, hd]   the cache (BNSH)
//          2 past_value    float [B, nkv, capacity, hd]
//          3 past_lengths  int32 [B]                      each row's cached tokens
//          4 position_ids  int64 [B, T]                   RoPE position of each new slot
//          5 tree_mask     bool  [B, T, T]                slot r sees slot j iff mask[b, r, j]
//          6 cos_cache     float [P, hd / 2]
//          7 sin_cache     float [P, hd / 2]
// Outputs  0 attn          float [B, T, nh hd]
//          1 present_key   float [B, nkv, S, hd]   past + the new rows at past_lengths[b] + j; S = max(capacity, past + T)
//          2 present_value float [B, nkv, S, hd]   (in place when bound to the past's buffer, then S = capacity)
// Attributes num_heads, kv_num_heads; query head h reads kv head h / (nh / nkv).
//
// RoPE is the half-split form (GroupQueryAttention's do_rotary=1, rotary_interleaved=0). Query row (b, r, h) attends
// to cache positions 0 .. past_b - 1, then to the new slots j with mask[b, r, j], in slot order.
//
// Why a row's result is invariant (the point of the op): a row's scores are dot products from one function (fixed
// lane split, fixed final reduction), its maximum is exact, its exponentials come from one scalar expf each, and its
// sum of exponentials and its output sum_j p_j v_j accumulate key by key in key order (vectorised only across the
// independent hd lanes). Masked slots are skipped, never added as zeros. Work is split across threads by whole query
// rows. So a row computes the same bits whether its call has 1 or 17 slots, whichever slot columns its ancestors sit
// in, in a batch of 1 or 4, on 1 or 2 threads: its keys arrive in the same order (past, then ancestors, then itself)
// through the same code. The build compiles with -fno-fast-math -ffp-contract=off so that no expression is
// reassociated or fused differently in two places.
#include <cerrno>
#include <cmath>
#include <algorithm>
#include <cstring>
#include <exception>
#include <limits>
#include <new>
#include <string>
#include <vector>

#if defined(__SSE__)
#include <xmmintrin.h>  // _mm_getcsr / _mm_setcsr: the caller's denormal mode, given to every worker
#endif

#include "ort_abi.h"

using namespace ort_abi;

namespace {

constexpr const char* kDomain = "com.trtspec";
constexpr const char* kOpName = "TreeAttention";
constexpr int kLanes = 8;  // floats per vector; hd must be a multiple of it

const OrtApi* g_api = nullptr;

// ---- errors: exceptions inside, OrtStatus at the ABI boundary -------------------------------------------------------
struct OpError : std::exception {
  explicit OpError(std::string text, OrtErrorCode code = ORT_INVALID_ARGUMENT) : message(std::move(text)), code(code) {}
  const char* what() const noexcept override { return message.c_str(); }
  std::string message;
  OrtErrorCode code;
};

void check(OrtStatus* status) {
  if (status == nullptr) return;
  std::string text = g_api->GetErrorMessage(status);
  OrtErrorCode code = g_api->GetErrorCode(status);
  g_api->ReleaseStatus(status);
  throw OpError(text, code);
}

template <typename Body>
OrtStatus* guarded(Body body) noexcept {
  try {
    body();
    return nullptr;
  } catch (const OpError& e) {
    return g_api->CreateStatus(e.code, (std::string(kOpName) + ": " + e.message).c_str());
  } catch (const std::bad_alloc&) {
    return g_api->CreateStatus(ORT_FAIL, "TreeAttention: out of memory");
  } catch (const std::exception& e) {
    return g_api->CreateStatus(ORT_FAIL, (std::string(kOpName) + ": " + e.what()).c_str());
  } catch (...) {
    return g_api->CreateStatus(ORT_FAIL, "TreeAttention: unknown error");
  }
}

std::string shape_text(const std::vector<int64_t>& shape) {
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

std::vector<int64_t> dims_of(const OrtTensorTypeAndShapeInfo* info) {
  size_t rank = 0;
  check(g_api->GetDimensionsCount(info, &rank));
  std::vector<int64_t> shape(rank);
  if (rank) check(g_api->GetDimensions(info, shape.data(), rank));
  return shape;
}

TensorView view_of(const OrtValue* value) {
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

const char* const kInputNames[] = {"qkv", "past_key", "past_value", "past_lengths",
                                   "position_ids", "tree_mask", "cos_cache", "sin_cache"};
const ONNXTensorElementDataType kInputTypes[] = {
    ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
    ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL,
    ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT};
constexpr size_t kInputCount = sizeof(kInputTypes) / sizeof(kInputTypes[0]);
constexpr size_t kOutputCount = 3;

TensorView input(const OrtKernelContext* context, size_t index, size_t rank) {
  const OrtValue* value = nullptr;
  check(g_api->KernelContext_GetInput(context, index, &value));
  if (value == nullptr) throw OpError(std::string("input ") + kInputNames[index] + " is missing");
  TensorView view = view_of(value);
  if (view.shape.size() != rank)
    throw OpError(std::string("input ") + kInputNames[index] + " has shape " + shape_text(view.shape) + ", expected " +
                  std::to_string(rank) + " dimensions");
  return view;
}

void expect_shape(size_t index, const TensorView& view, const std::vector<int64_t>& expected) {
  if (view.shape != expected)
    throw OpError(std::string("input ") + kInputNames[index] + " has shape " + shape_text(view.shape) +
                  ", expected " + shape_text(expected));
}

float* output(OrtKernelContext* context, size_t index, const std::vector<int64_t>& shape) {
  OrtValue* value = nullptr;
  check(g_api->KernelContext_GetOutput(context, index, shape.data(), shape.size(), &value));
  if (value == nullptr) throw OpError("output " + std::to_string(index) + " is missing");
  void* data = nullptr;
  check(g_api->GetTensorMutableData(value, &data));
  return static_cast<float*>(data);
}

// ---- the arithmetic (one definition of each step, used for every row) ----------------------------------------------
typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));

inline Vec load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void store(float* p, Vec v) { std::memcpy(p, &v, sizeof(v)); }

// q · k over hd floats: even 8-float chunks into one lane accumulator, odd ones into another, then the two summed
// and the 8 lanes reduced in a fixed tree. Never inlined: every score of every row comes from this one machine code.
__attribute__((noinline)) float dot(const float* q, const float* k, int hd) {
  Vec even = {0, 0, 0, 0, 0, 0, 0, 0}, odd = {0, 0, 0, 0, 0, 0, 0, 0};
  int c = 0;
  for (; c + 2 * kLanes <= hd; c += 2 * kLanes) {
    even = even + load(q + c) * load(k + c);
    odd = odd + load(q + c + kLanes) * load(k + c + kLanes);
  }
  if (c < hd) even = even + load(q + c) * load(k + c);
  const Vec sum = even + odd;
  return ((sum[0] + sum[4]) + (sum[2] + sum[6])) + ((sum[1] + sum[5]) + (sum[3] + sum[7]));
}

// acc += p · v over hd floats (each lane on its own: the order over keys is the caller's)
inline void accumulate(float* acc, float p, const float* v, int hd) {
  const Vec scale = {p, p, p, p, p, p, p, p};
  for (int c = 0; c < hd; c += kLanes) store(acc + c, load(acc + c) + scale * load(v + c));
}

// half-split rotary embedding of one head vector: out[i] = x[i] cos - x[i + h] sin, out[i + h] = x[i + h] cos + x[i] sin
inline void rope(const float* x, const float* cos, const float* sin, int hd, float* out) {
  const int half = hd / 2;
  for (int i = 0; i < half; ++i) {
    const float x1 = x[i], x2 = x[i + half];
    out[i] = x1 * cos[i] - x2 * sin[i];
    out[i + half] = x2 * cos[i] + x1 * sin[i];
  }
}

// ---- one call's problem ---------------------------------------------------------------------------------------------
struct Problem {
  int batch, slots, heads, kv_heads, group, hd, capacity, positions;
  int splits;  // query heads of one kv head are split into this many work units
  const float* qkv;
  const int32_t* past_lengths;
  const int64_t* position_ids;
  const bool* mask;
  const float* cos;
  const float* sin;
  const float* key;    // present_key (the past already in it)
  const float* value;  // present_value
  float* out;
#if defined(__SSE__)
  unsigned int csr;  // the calling thread's MXCSR (flush-to-zero / denormals-are-zero), set on every worker
#endif
  size_t qkv_width() const { return size_t(heads + 2 * kv_heads) * hd; }
  size_t cache_offset(int b, int kvh, int64_t row) const { return ((size_t(b) * kv_heads + kvh) * capacity + row) * hd; }
};

// per-thread scratch: rotated queries, one accumulator per row, each row's scores then exponentials
thread_local std::vector<float> t_scratch;

// Attention of query heads [h_begin, h_end) of kv head `kvh` in batch row b, over all T slots: every key and value
// vector is read once for all of those rows; each row keeps its own running sums in key order.
void attend(const Problem& p, int b, int kvh, int h_begin, int h_end) {
  const int hd = p.hd, slots = p.slots, hn = h_end - h_begin, rows = slots * hn;
  const int past = p.past_lengths[b];
  const int width = past + slots;  // score columns: the past, then the new slots
  const size_t need = size_t(rows) * (2 * hd + width + 1);
  if (t_scratch.size() < need) t_scratch.resize(need);
  float* q = t_scratch.data();             // [rows, hd]
  float* acc = q + size_t(rows) * hd;      // [rows, hd]
  float* score = acc + size_t(rows) * hd;  // [rows, width]
  float* sums = score + size_t(rows) * width;  // [rows]
  const bool* mask = p.mask + size_t(b) * slots * slots;

  // row i = r * hn + (h - h_begin)
  for (int r = 0; r < slots; ++r) {
    const int64_t pos = p.position_ids[size_t(b) * slots + r];
    const float* cos = p.cos + size_t(pos) * (hd / 2);
    const float* sin = p.sin + size_t(pos) * (hd / 2);
    const float* x = p.qkv + (size_t(b) * slots + r) * p.qkv_width();
    for (int h = h_begin; h < h_end; ++h) rope(x + size_t(h) * hd, cos, sin, hd, q + size_t(r * hn + h - h_begin) * hd);
  }

  const float* keys = p.key + p.cache_offset(b, kvh, 0);
  const float* values = p.value + p.cache_offset(b, kvh, 0);
  for (int k = 0; k < past; ++k) {
    const float* key = keys + size_t(k) * hd;
    for (int i = 0; i < rows; ++i) score[size_t(i) * width + k] = dot(q + size_t(i) * hd, key, hd);
  }
  for (int j = 0; j < slots; ++j) {
    const float* key = keys + size_t(past + j) * hd;
    for (int r = 0; r < slots; ++r) {
      if (!mask[size_t(r) * slots + j]) continue;
      for (int i = r * hn; i < (r + 1) * hn; ++i) score[size_t(i) * width + past + j] = dot(q + size_t(i) * hd, key, hd);
    }
  }

  // softmax numerators in place of the scores, each row's sum of them in key order
  for (int r = 0; r < slots; ++r) {
    const bool* sees = mask + size_t(r) * slots;
    for (int i = r * hn; i < (r + 1) * hn; ++i) {
      float* s = score + size_t(i) * width;
      float top = -std::numeric_limits<float>::infinity();
      for (int k = 0; k < past; ++k) top = s[k] > top ? s[k] : top;
      for (int j = 0; j < slots; ++j)
        if (sees[j]) top = s[past + j] > top ? s[past + j] : top;
      float sum = 0.0f;
      for (int k = 0; k < past; ++k) {
        s[k] = std::exp(s[k] - top);
        sum += s[k];
      }
      for (int j = 0; j < slots; ++j)
        if (sees[j]) {
          s[past + j] = std::exp(s[past + j] - top);
          sum += s[past + j];
        }
      sums[i] = sum;
    }
  }

  std::memset(acc, 0, sizeof(float) * size_t(rows) * hd);
  for (int k = 0; k < past; ++k) {
    const float* value = values + size_t(k) * hd;
    for (int i = 0; i < rows; ++i) accumulate(acc + size_t(i) * hd, score[size_t(i) * width + k], value, hd);
  }
  for (int j = 0; j < slots; ++j) {
    const float* value = values + size_t(past + j) * hd;
    for (int r = 0; r < slots; ++r) {
      if (!mask[size_t(r) * slots + j]) continue;
      for (int i = r * hn; i < (r + 1) * hn; ++i)
        accumulate(acc + size_t(i) * hd, score[size_t(i) * width + past + j], value, hd);
    }
  }

  for (int r = 0; r < slots; ++r) {
    float* out_row = p.out + (size_t(b) * slots + r) * size_t(p.heads) * hd;
    for (int h = h_begin; h < h_end; ++h) {
      const int i = r * hn + h - h_begin;
      float* out = out_row + size_t(h) * hd;
      const float* a = acc + size_t(i) * hd;
      const float sum = sums[i];
      if (sum > 0.0f) {
        for (int d = 0; d < hd; ++d) out[d] = a[d] / sum;
      } else {  // a row that sees no key at all (no past and its own slot masked): zeros, not 0/0
        for (int d = 0; d < hd; ++d) out[d] = 0.0f;
      }
    }
  }
}

struct Work {
  const Problem* problem;
  std::exception_ptr failure;  // the first task that threw (allocation), reported after the ParallelFor
};

void run_unit(void* data, size_t unit) {
  Work& work = *static_cast<Work*>(data);
  const Problem& p = *work.problem;
#if defined(__SSE__)
  const unsigned int saved = _mm_getcsr();
  _mm_setcsr(p.csr);
#endif
  try {
    const int per_batch = p.kv_heads * p.splits;
    const int b = int(unit / per_batch), kvh = int(unit % per_batch) / p.splits, s = int(unit % p.splits);
    const int h0 = kvh * p.group + s * p.group / p.splits, h1 = kvh * p.group + (s + 1) * p.group / p.splits;
    attend(p, b, kvh, h0, h1);
  } catch (...) {
    if (!work.failure) work.failure = std::current_exception();  // a benign race: any one failure is reported
  }
#if defined(__SSE__)
  _mm_setcsr(saved);
#endif
}

// ---- the kernel -----------------------------------------------------------------------------------------------------
struct Kernel {
  int heads;
  int kv_heads;
};

void compute(const Kernel& kernel, OrtKernelContext* context) {
  size_t count = 0;
  check(g_api->KernelContext_GetInputCount(context, &count));
  if (count != kInputCount) throw OpError("expects 8 inputs, got " + std::to_string(count));

  const TensorView qkv = input(context, 0, 3), past_key = input(context, 1, 4), past_value = input(context, 2, 4);
  const int64_t batch = qkv.shape[0], slots = qkv.shape[1];
  const int64_t kv_heads = past_key.shape[1], capacity = past_key.shape[2], hd = past_key.shape[3];
  if (past_key.shape[0] != batch || kv_heads != kernel.kv_heads)
    throw OpError("input past_key has shape " + shape_text(past_key.shape) + ", expected [" + std::to_string(batch) +
                  ", " + std::to_string(kernel.kv_heads) + ", capacity, head_size]");
  if (hd <= 0 || hd % kLanes != 0)
    throw OpError("head size " + std::to_string(hd) + " is not a positive multiple of " + std::to_string(kLanes));
  expect_shape(2, past_value, past_key.shape);
  const int64_t width = (kernel.heads + 2 * int64_t(kernel.kv_heads)) * hd;
  if (qkv.shape[2] != width)
    throw OpError("input qkv has shape " + shape_text(qkv.shape) + ", expected [B, T, " + std::to_string(width) +
                  "] ((num_heads + 2 kv_num_heads) head_size)");
  const TensorView lengths = input(context, 3, 1), positions = input(context, 4, 2), mask = input(context, 5, 3);
  const TensorView cos = input(context, 6, 2), sin = input(context, 7, 2);
  expect_shape(3, lengths, {batch});
  expect_shape(4, positions, {batch, slots});
  expect_shape(5, mask, {batch, slots, slots});
  if (cos.shape.size() != 2 || cos.shape[1] != hd / 2) expect_shape(6, cos, {cos.shape[0], hd / 2});
  expect_shape(7, sin, cos.shape);
  for (size_t i = 0; i < kInputCount; ++i) {
    const TensorView* views[] = {&qkv, &past_key, &past_value, &lengths, &positions, &mask, &cos, &sin};
    if (views[i]->type != kInputTypes[i]) throw OpError(std::string("input ") + kInputNames[i] + " has the wrong type");
  }

  const int32_t* past_lengths = static_cast<const int32_t*>(lengths.data);
  const int64_t* position_ids = static_cast<const int64_t*>(positions.data);
  int64_t needed = capacity;  // the present's rows: the past's, or more when a row's new slots run past them
  for (int64_t b = 0; b < batch; ++b) {
    if (past_lengths[b] < 0 || past_lengths[b] > capacity)
      throw OpError("row " + std::to_string(b) + ": past length " + std::to_string(past_lengths[b]) +
                    " is outside the cache's " + std::to_string(capacity) + " rows");
    needed = std::max(needed, int64_t(past_lengths[b]) + slots);
    for (int64_t r = 0; r < slots; ++r) {
      const int64_t pos = position_ids[b * slots + r];
      if (pos < 0 || pos >= cos.shape[0])
        throw OpError("position id " + std::to_string(pos) + " is outside the rotary cache's " +
                      std::to_string(cos.shape[0]) + " positions");
    }
  }

  float* out = output(context, 0, {batch, slots, kernel.heads * hd});
  // present [B, nkv, max(capacity, past + T), hd], as GroupQueryAttention's: bound to the past's own buffer (the
  // runtime's IO binding, which sizes the cache for every step) the new rows are appended in place; otherwise the
  // present starts as a copy of the past, with room for the new rows
  const std::vector<int64_t> present_shape{batch, kv_heads, needed, hd};
  float* present_key = output(context, 1, present_shape);
  float* present_value = output(context, 2, present_shape);
  if ((present_key == past_key.data || present_value == past_value.data) && needed != capacity)
    throw OpError("the present cache shares the past's buffer but the new slots do not fit its rows");
  const float* pasts[] = {static_cast<const float*>(past_key.data), static_cast<const float*>(past_value.data)};
  float* presents[] = {present_key, present_value};
  for (int i = 0; i < 2; ++i) {
    if (presents[i] == pasts[i]) continue;
    const size_t block = size_t(capacity) * hd, stride = size_t(needed) * hd;
    for (size_t head = 0; head < size_t(batch) * kv_heads; ++head)
      std::memcpy(presents[i] + head * stride, pasts[i] + head * block, block * sizeof(float));
  }
  if (batch == 0 || slots == 0) return;

  Problem p{};
  p.batch = int(batch), p.slots = int(slots), p.heads = kernel.heads, p.kv_heads = kernel.kv_heads;
  p.group = kernel.heads / kernel.kv_heads, p.hd = int(hd), p.capacity = int(needed), p.positions = int(cos.shape[0]);
  p.qkv = static_cast<const float*>(qkv.data), p.past_lengths = past_lengths, p.position_ids = position_ids;
  p.mask = static_cast<const bool*>(mask.data);
  p.cos = static_cast<const float*>(cos.data), p.sin = static_cast<const float*>(sin.data);
  p.key = present_key, p.value = present_value, p.out = out;
#if defined(__SSE__)
  p.csr = _mm_getcsr();
#endif

  // the new keys (rotated) and values into the cache at past + j: one pass, before any row reads them
  for (int b = 0; b < p.batch; ++b)
    for (int j = 0; j < p.slots; ++j) {
      const int64_t pos = position_ids[size_t(b) * p.slots + j];
      const float* x = p.qkv + (size_t(b) * p.slots + j) * p.qkv_width();
      for (int kvh = 0; kvh < p.kv_heads; ++kvh) {
        const size_t at = p.cache_offset(b, kvh, past_lengths[b] + j);
        rope(x + size_t(p.heads + kvh) * p.hd, p.cos + size_t(pos) * (p.hd / 2), p.sin + size_t(pos) * (p.hd / 2),
             p.hd, present_key + at);
        std::memcpy(present_value + at, x + size_t(p.heads + p.kv_heads + kvh) * p.hd, sizeof(float) * p.hd);
      }
    }

  // work units: (batch row, kv head, a share of its query heads); with few (b, kv head) pairs each query head is a
  // unit of its own so that two threads share the work evenly (each re-reads its kv head's cache from L2)
  p.splits = p.batch * p.kv_heads >= 8 ? 1 : p.group;
  Work work{&p, nullptr};
  const size_t units = size_t(p.batch) * p.kv_heads * p.splits;
  check(g_api->KernelContext_ParallelFor(context, run_unit, units, 0, &work));
  if (work.failure) std::rethrow_exception(work.failure);
}

// ---- the OrtCustomOp callbacks --------------------------------------------------------------------------------------
OrtStatus* create_kernel(const OrtCustomOp*, const OrtApi* api, const OrtKernelInfo* info, void** kernel) noexcept {
  if (g_api == nullptr) g_api = api;
  return guarded([&] {
    int64_t heads = 0, kv_heads = 0;
    check(api->KernelInfoGetAttribute_int64(info, "num_heads", &heads));
    check(api->KernelInfoGetAttribute_int64(info, "kv_num_heads", &kv_heads));
    if (heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0)
      throw OpError("num_heads " + std::to_string(heads) + " must be a positive multiple of kv_num_heads " +
                    std::to_string(kv_heads));
    size_t inputs = 0;
    check(api->KernelInfo_GetInputCount(info, &inputs));
    if (inputs != kInputCount) throw OpError("expects 8 inputs, got " + std::to_string(inputs));
    // a head size known from the graph (past_key's last dimension) is checked now, at session creation
    OrtTypeInfo* type = nullptr;
    check(api->KernelInfo_GetInputTypeInfo(info, 1, &type));
    try {
      const OrtTensorTypeAndShapeInfo* tensor = nullptr;
      check(api->CastTypeInfoToTensorInfo(type, &tensor));
      if (tensor != nullptr) {
        const std::vector<int64_t> shape = dims_of(tensor);
        if (shape.size() == 4 && shape[3] > 0 && shape[3] % kLanes != 0)
          throw OpError("head size " + std::to_string(shape[3]) + " (past_key's last dimension) is not a multiple of " +
                        std::to_string(kLanes));
      }
    } catch (...) {
      api->ReleaseTypeInfo(type);
      throw;
    }
    api->ReleaseTypeInfo(type);
    *kernel = new Kernel{int(heads), int(kv_heads)};
  });
}

OrtStatus* compute_kernel(void* kernel, OrtKernelContext* context) noexcept {
  return guarded([&] { compute(*static_cast<const Kernel*>(kernel), context); });
}

void destroy_kernel(void* kernel) noexcept { delete static_cast<Kernel*>(kernel); }

const char* op_name(const OrtCustomOp*) noexcept { return kOpName; }
const char* op_provider(const OrtCustomOp*) noexcept { return "CPUExecutionProvider"; }
ONNXTensorElementDataType input_type(const OrtCustomOp*, size_t index) noexcept {
  return index < kInputCount ? kInputTypes[index] : ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
}
size_t input_count(const OrtCustomOp*) noexcept { return kInputCount; }
ONNXTensorElementDataType output_type(const OrtCustomOp*, size_t) noexcept { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
size_t output_count(const OrtCustomOp*) noexcept { return kOutputCount; }
OrtCustomOpInputOutputCharacteristic required(const OrtCustomOp*, size_t) noexcept { return INPUT_OUTPUT_REQUIRED; }
OrtMemType cpu_memory(const OrtCustomOp*, size_t) noexcept { return OrtMemTypeDefault; }
int one(const OrtCustomOp*) noexcept { return 1; }

OrtCustomOp make_op() {
  OrtCustomOp op;
  std::memset(&op, 0, sizeof(op));
  op.version = kApiVersion;
  op.GetName = op_name;
  op.GetExecutionProviderType = op_provider;
  op.GetInputType = input_type;
  op.GetInputTypeCount = input_count;
  op.GetOutputType = output_type;
  op.GetOutputTypeCount = output_count;
  op.KernelDestroy = destroy_kernel;
  op.GetInputCharacteristic = required;
  op.GetOutputCharacteristic = required;
  op.GetInputMemoryType = cpu_memory;
  op.GetVariadicInputMinArity = one;
  op.GetVariadicInputHomogeneity = one;
  op.GetVariadicOutputMinArity = one;
  op.GetVariadicOutputHomogeneity = one;
  op.CreateKernelV2 = create_kernel;
  op.KernelComputeV2 = compute_kernel;
  return op;
}

const OrtCustomOp g_op = make_op();

}  // namespace

// ONNX Runtime's entry point for a custom-op library (SessionOptions.register_custom_ops_library): adds the domain
// com.trtspec with TreeAttention to `options`. The domain lives as long as the process (sessions keep pointers to it).
extern "C" __attribute__((visibility("default"))) OrtStatus* RegisterCustomOps(OrtSessionOptions* options,
                                                                               const OrtApiBase* base) noexcept {
  const OrtApi* api = base->GetApi(kApiVersion);
  if (api == nullptr) {
    // CreateStatus is slot 0 of every version's table (upstream asserts it), so version 1's table can report this
    const OrtApi* v1 = base->GetApi(1);
    std::string text = std::string("trtspec TreeAttention needs ONNX Runtime API version ") +
                       std::to_string(kApiVersion) + " (1.17 or later); this is " + base->GetVersionString();
    return v1 ? v1->CreateStatus(ORT_FAIL, text.c_str()) : nullptr;
  }
  g_api = api;
  return guarded([&] {
    OrtCustomOpDomain* domain = nullptr;
    check(api->CreateCustomOpDomain(kDomain, &domain));
    check(api->CustomOpDomain_Add(domain, &g_op));
    check(api->AddCustomOpDomain(options, domain));
  });
}
