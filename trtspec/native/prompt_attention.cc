// PromptAttention (domain com.trtspec, CPU, float32): causal rotary attention of a prompt's T new tokens over each
// row's KV cache and themselves, as an ONNX Runtime custom op: what a context graph's GroupQueryAttention computes
// (do_rotary=1, half-split RoPE, scale 1: q is pre-scaled), with the work a causal prompt needs and no more.
//
// Inputs   0 qkv           float [B, T, (nh + 2 nkv) hd]  packed q | k | v
//          1 past_key      float [B, nkv, capacity, hd]   the cache (BNSH)
//          2 past_value    float [B, nkv, capacity, hd]
//          3 past_lengths  int32 [B]                      each row's cached tokens; new token t sits at past + t
//          4 cos_cache     float [P, hd / 2]
//          5 sin_cache     float [P, hd / 2]
// Outputs  0 attn          float [B, T, nh hd]
//          1 present_key   float [B, nkv, S, hd]   past, new rows at past_lengths[b] + t; S = max(capacity, past + T)
//          2 present_value float [B, nkv, S, hd]   (in place when bound to the past's buffer, then S = capacity)
// Attributes num_heads, kv_num_heads; query head h reads kv head h / (nh / nkv).
//
// Why: GroupQueryAttention scores every (row, key) pair of a prompt's square, a large share of the prompt's time.
// Here token t meets keys 0 .. past + t only. The keys are transposed once in blocks of 16; 8 query rows (the kv
// head's query heads over 16 tokens make a unit) score a block with fused multiply-adds, and each row keeps a
// running maximum, sum and output over spans of 64 keys (the online softmax), so nothing T x T is ever written. A prompt's
// numbers are shared by plain decoding and every drafter (the prefill runs once), so they need not match any other
// kernel bit for bit; they are fp32 attention, as GroupQueryAttention's.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "op_support.h"

namespace trtspec_ops {
namespace {

constexpr const char* kOpName = "PromptAttention";
constexpr int kKeys = kWidth;     // keys a transposed block holds (one vector of scores per query row)
constexpr int kSpan = 4 * kKeys;  // keys of one online-softmax step
constexpr int kQueryTokens = 16;  // new tokens of a work unit
constexpr int kRowTile = 8;       // query rows whose scores and outputs advance together over a block's keys
constexpr int kMaxHeadSize = 256;

const char* const kInputNames[] = {"qkv", "past_key", "past_value", "past_lengths", "cos_cache", "sin_cache"};
const ONNXTensorElementDataType kInputTypes[] = {
    ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
    ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT};
constexpr size_t kInputCount = sizeof(kInputTypes) / sizeof(kInputTypes[0]);
constexpr size_t kOutputCount = 3;

struct Problem {
  int batch, slots, heads, kv_heads, group, hd, capacity, token_blocks;
  const float* qkv;
  const int32_t* past_lengths;
  const float* cos;
  const float* sin;
  const float* key;     // present_key (the past and the new rows already in it)
  const float* value;   // present_value
  const float* keys_t;  // [B, nkv, key blocks, hd, 16]: each block of 16 keys transposed, zeros past the last key
  int key_blocks;       // per (batch row, kv head): enough for the longest row
  float* out;
  CallerMode mode;
  size_t qkv_width() const { return size_t(heads + 2 * kv_heads) * hd; }
  const float* cache(const float* base, int b, int kvh) const {
    return base + (size_t(b) * kv_heads + kvh) * capacity * hd;
  }
};

const Vec kLane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

struct Scratch {
  std::vector<float> q, p, o, top, sum;
};
thread_local Scratch t_scratch;

// the largest lane of v (exact in any order)
inline float lane_max(Vec v) {
  float top = v[0];
  for (int l = 1; l < kWidth; ++l) top = v[l] > top ? v[l] : top;
  return top;
}

// scores of N query rows (q: N rows of hd floats) against a transposed block of 16 keys
template <int N>
inline void scores(const float* q, const float* keys_t, int hd, float* out) {
  Vec acc[N] = {};
  for (int d = 0; d < hd; ++d) {
    const Vec k = load(keys_t + size_t(d) * kKeys);
    for (int r = 0; r < N; ++r) acc[r] = fma(splat(q[size_t(r) * hd + d]), k, acc[r]);
  }
  for (int r = 0; r < N; ++r) store(out + size_t(r) * kSpan, acc[r]);
}

// o[r] += sum over the block's `count` keys j of p[r][j] v_j, for N rows and one 16-float chunk of the head
template <int N>
inline void outputs(const float* p, const float* values, int count, int hd, float* o) {
  Vec acc[N];
  for (int r = 0; r < N; ++r) acc[r] = load(o + size_t(r) * hd);
  for (int j = 0; j < count; ++j) {
    const Vec v = load(values + size_t(j) * hd);
    for (int r = 0; r < N; ++r) acc[r] = fma(splat(p[size_t(r) * kSpan + j]), v, acc[r]);
  }
  for (int r = 0; r < N; ++r) store(o + size_t(r) * hd, acc[r]);
}

template <int N = 1>
void scores_rest(int n, const float* q, const float* keys_t, int hd, float* out) {
  if constexpr (N < kRowTile) {
    if (n == N) return scores<N>(q, keys_t, hd, out);
    scores_rest<N + 1>(n, q, keys_t, hd, out);
  }
}

template <int N = 1>
void outputs_rest(int n, const float* p, const float* values, int count, int hd, float* o) {
  if constexpr (N < kRowTile) {
    if (n == N) return outputs<N>(p, values, count, hd, o);
    outputs_rest<N + 1>(n, p, values, count, hd, o);
  }
}

// Attention of new tokens [t0, t0 + tokens) of batch row b for the query heads of kv head kvh. Query row i is token
// t0 + i / group, head kvh · group + i % group; it sees keys 0 .. past + t0 + i / group.
void attend(const Problem& p, int b, int kvh, int t0) {
  const int hd = p.hd, chunks = hd / kWidth, past = p.past_lengths[b];
  const int tokens = std::min(kQueryTokens, p.slots - t0), rows = tokens * p.group;
  const int keys_end = past + t0 + tokens;  // the unit's last row sees keys below this
  Scratch& s = t_scratch;
  s.q.resize(size_t(rows) * hd), s.p.resize(size_t(rows) * kSpan);
  s.o.assign(size_t(rows) * hd, 0.0f), s.top.assign(size_t(rows), -std::numeric_limits<float>::infinity());
  s.sum.assign(size_t(rows), 0.0f);
  for (int i = 0; i < rows; ++i) {  // rotated queries
    const int t = t0 + i / p.group, h = kvh * p.group + i % p.group;
    const size_t at = size_t(past + t) * (hd / 2);
    rope(p.qkv + (size_t(b) * p.slots + t) * p.qkv_width() + size_t(h) * hd, p.cos + at, p.sin + at, hd,
         s.q.data() + size_t(i) * hd);
  }
  const float* values = p.cache(p.value, b, kvh);
  const float* keys_t = p.keys_t + (size_t(b) * p.kv_heads + kvh) * p.key_blocks * hd * kKeys;
  const float minus_infinity = -std::numeric_limits<float>::infinity();
  for (int k0 = 0; k0 < keys_end; k0 += kSpan) {
    const int count = std::min(kSpan, keys_end - k0), blocks = (count + kKeys - 1) / kKeys;
    // scores: kRowTile rows at a time share each transposed key vector
    for (int blk = 0; blk < blocks; ++blk) {
      const float* block = keys_t + size_t(k0 / kKeys + blk) * hd * kKeys;
      float* out = s.p.data() + blk * kKeys;
      int i0 = 0;
      for (; i0 + kRowTile <= rows; i0 += kRowTile)
        scores<kRowTile>(s.q.data() + size_t(i0) * hd, block, hd, out + size_t(i0) * kSpan);
      if (i0 < rows) scores_rest(rows - i0, s.q.data() + size_t(i0) * hd, block, hd, out + size_t(i0) * kSpan);
    }
    // the online softmax: each row's running maximum, sum of exponentials and output, rescaled by a new maximum
    for (int i = 0; i < rows; ++i) {
      float* row = s.p.data() + size_t(i) * kSpan;
      const int visible = std::min(count, past + t0 + i / p.group + 1 - k0);  // keys of the span the row sees
      if (visible <= 0) {
        std::memset(row, 0, sizeof(float) * kSpan);
        continue;
      }
      Vec part[kSpan / kKeys];
      Vec top_lanes = splat(minus_infinity);
      for (int blk = 0; blk < blocks; ++blk) {
        part[blk] = load(row + blk * kKeys);
        if (visible < (blk + 1) * kKeys)  // lanes past the last visible key
          part[blk] = kLane < splat(float(visible - blk * kKeys)) ? part[blk] : splat(minus_infinity);
        top_lanes = part[blk] > top_lanes ? part[blk] : top_lanes;
      }
      const float top = std::max(s.top[size_t(i)], lane_max(top_lanes));
      Vec total = {};
      for (int blk = 0; blk < blocks; ++blk) {
        const Vec e = exp_nonpositive(part[blk] - splat(top));
        store(row + blk * kKeys, e);
        total += e;
      }
      const float rescale = s.top[size_t(i)] == top ? 1.0f : std::exp(s.top[size_t(i)] - top);
      s.top[size_t(i)] = top;
      s.sum[size_t(i)] = s.sum[size_t(i)] * rescale + lane_sum(total);
      if (rescale != 1.0f) {
        float* o = s.o.data() + size_t(i) * hd;
        for (int c = 0; c < chunks; ++c) store(o + c * kWidth, load(o + c * kWidth) * splat(rescale));
      }
    }
    // outputs += p · V, one chunk of the head at a time; kRowTile rows share each value chunk
    for (int c = 0; c < chunks; ++c) {
      const float* v = values + size_t(k0) * hd + c * kWidth;
      int r0 = 0;
      for (; r0 + kRowTile <= rows; r0 += kRowTile)
        outputs<kRowTile>(s.p.data() + size_t(r0) * kSpan, v, count, hd, s.o.data() + size_t(r0) * hd + c * kWidth);
      if (r0 < rows)
        outputs_rest(rows - r0, s.p.data() + size_t(r0) * kSpan, v, count, hd,
                     s.o.data() + size_t(r0) * hd + c * kWidth);
    }
  }
  for (int i = 0; i < rows; ++i) {
    const int t = t0 + i / p.group, h = kvh * p.group + i % p.group;
    float* out = p.out + (size_t(b) * p.slots + t) * size_t(p.heads) * hd + size_t(h) * hd;
    const Vec inverse = splat(1.0f / s.sum[size_t(i)]);  // every row sees at least its own key
    for (int c = 0; c < chunks; ++c) store(out + c * kWidth, load(s.o.data() + size_t(i) * hd + c * kWidth) * inverse);
  }
}

// one work unit: (batch row, kv head, a pair of token blocks j and last - j), so that units cost about alike
void run_unit(const Problem& p, size_t unit) {
  const int pairs = (p.token_blocks + 1) / 2, per_head = pairs;
  const int b = int(unit / (size_t(p.kv_heads) * per_head)), kvh = int(unit / per_head) % p.kv_heads;
  const int j = int(unit % per_head), mirror = p.token_blocks - 1 - j;
  attend(p, b, kvh, j * kQueryTokens);
  if (mirror != j) attend(p, b, kvh, mirror * kQueryTokens);
}

struct Kernel {
  int heads;
  int kv_heads;
};

void compute(const Kernel& kernel, OrtKernelContext* context) {
  expect_input_count(context, kInputCount);
  TensorView views[kInputCount];
  const int ranks[] = {3, 4, 4, 1, 2, 2};
  for (size_t i = 0; i < kInputCount; ++i) {
    views[i] = input(context, i, ranks[i], kInputNames[i]);
    if (views[i].type != kInputTypes[i]) throw OpError(std::string("input ") + kInputNames[i] + " has the wrong type");
  }
  const TensorView &qkv = views[0], &past_key = views[1], &past_value = views[2], &lengths = views[3];
  const TensorView &cos = views[4], &sin = views[5];
  const int64_t batch = qkv.shape[0], slots = qkv.shape[1];
  const int64_t kv_heads = past_key.shape[1], capacity = past_key.shape[2], hd = past_key.shape[3];
  if (past_key.shape[0] != batch || kv_heads != kernel.kv_heads)
    throw OpError("input past_key has shape " + shape_text(past_key.shape) + ", expected [" + std::to_string(batch) +
                  ", " + std::to_string(kernel.kv_heads) + ", capacity, head_size]");
  if (hd <= 0 || hd % kWidth != 0 || hd > kMaxHeadSize)
    throw OpError("head size " + std::to_string(hd) + " is not a positive multiple of " + std::to_string(kWidth) +
                  " up to " + std::to_string(kMaxHeadSize));
  expect_shape(kInputNames[2], past_value, past_key.shape);
  const int64_t width = (kernel.heads + 2 * int64_t(kernel.kv_heads)) * hd;
  if (qkv.shape[2] != width)
    throw OpError("input qkv has shape " + shape_text(qkv.shape) + ", expected [B, T, " + std::to_string(width) +
                  "] ((num_heads + 2 kv_num_heads) head_size)");
  expect_shape(kInputNames[3], lengths, {batch});
  if (cos.shape[1] != hd / 2) expect_shape(kInputNames[4], cos, {cos.shape[0], hd / 2});
  expect_shape(kInputNames[5], sin, cos.shape);

  const int32_t* past_lengths = static_cast<const int32_t*>(lengths.data);
  int64_t needed = capacity;
  for (int64_t b = 0; b < batch; ++b) {
    if (past_lengths[b] < 0 || past_lengths[b] > capacity)
      throw OpError("row " + std::to_string(b) + ": past length " + std::to_string(past_lengths[b]) +
                    " is outside the cache's " + std::to_string(capacity) + " rows");
    if (past_lengths[b] + slots > cos.shape[0])
      throw OpError("row " + std::to_string(b) + ": position " + std::to_string(past_lengths[b] + slots - 1) +
                    " is outside the rotary cache's " + std::to_string(cos.shape[0]) + " positions");
    needed = std::max(needed, int64_t(past_lengths[b]) + slots);
  }

  float* out = output(context, 0, {batch, slots, kernel.heads * hd});
  const PresentCache present = present_cache(context, past_key, past_value, needed);  // max(capacity, past + T) rows
  float *present_key = present.key, *present_value = present.value;
  if (batch == 0 || slots == 0) return;

  Problem p{};
  p.batch = int(batch), p.slots = int(slots), p.heads = kernel.heads, p.kv_heads = kernel.kv_heads;
  p.group = kernel.heads / kernel.kv_heads, p.hd = int(hd), p.capacity = int(needed);
  p.token_blocks = int((slots + kQueryTokens - 1) / kQueryTokens);
  p.qkv = static_cast<const float*>(qkv.data), p.past_lengths = past_lengths;
  p.cos = static_cast<const float*>(cos.data), p.sin = static_cast<const float*>(sin.data);
  p.key = present_key, p.value = present_value, p.out = out;

  // the new keys (rotated) and values into the cache at past + t, before any row reads them
  parallel_for(context, size_t(batch) * slots, p.mode, [&p, present_key, present_value](size_t unit) {
    const int b = int(unit / size_t(p.slots)), t = int(unit % size_t(p.slots));
    const int pos = p.past_lengths[b] + t;
    const float* x = p.qkv + (size_t(b) * p.slots + t) * p.qkv_width();
    for (int kvh = 0; kvh < p.kv_heads; ++kvh) {
      const size_t at = ((size_t(b) * p.kv_heads + kvh) * p.capacity + pos) * p.hd;
      rope(x + size_t(p.heads + kvh) * p.hd, p.cos + size_t(pos) * (p.hd / 2), p.sin + size_t(pos) * (p.hd / 2), p.hd,
           present_key + at);
      std::memcpy(present_value + at, x + size_t(p.heads + p.kv_heads + kvh) * p.hd, sizeof(float) * p.hd);
    }
  });
  // every row's keys transposed in blocks of 16, once for all the units that read them
  int longest = 0;
  for (int b = 0; b < p.batch; ++b) longest = std::max(longest, past_lengths[b] + p.slots);
  p.key_blocks = (longest + kKeys - 1) / kKeys;
  thread_local std::vector<float> transposed;
  transposed.resize(size_t(batch) * kv_heads * p.key_blocks * hd * kKeys);
  p.keys_t = transposed.data();
  parallel_for(context, size_t(batch) * kv_heads * p.key_blocks, p.mode, [&p](size_t unit) {
    const int block = int(unit % size_t(p.key_blocks)), head = int(unit / size_t(p.key_blocks));
    const int b = head / p.kv_heads, end = p.past_lengths[b] + p.slots;
    const float* keys = p.key + size_t(head) * p.capacity * p.hd;
    float* out = const_cast<float*>(p.keys_t) + unit * size_t(p.hd) * kKeys;
    for (int j = 0; j < kKeys; ++j) {
      const int k = block * kKeys + j;
      for (int d = 0; d < p.hd; ++d) out[size_t(d) * kKeys + j] = k < end ? keys[size_t(k) * p.hd + d] : 0.0f;
    }
  });
  const size_t units = size_t(batch) * p.kv_heads * ((p.token_blocks + 1) / 2);
  parallel_for(context, units, p.mode, [&p](size_t unit) { run_unit(p, unit); });
}

OrtStatus* create_kernel(const OrtCustomOp*, const OrtApi* api, const OrtKernelInfo* info, void** kernel) noexcept {
  if (g_api == nullptr) g_api = api;
  return guarded(kOpName, [&] {
    int heads = 0, kv_heads = 0;
    attention_heads(api, info, heads, kv_heads);
    size_t inputs = 0;
    check(api->KernelInfo_GetInputCount(info, &inputs));
    if (inputs != kInputCount) throw OpError("expects 6 inputs, got " + std::to_string(inputs));
    *kernel = new Kernel{heads, kv_heads};
  });
}

OrtStatus* compute_kernel(void* kernel, OrtKernelContext* context) noexcept {
  return guarded(kOpName, [&] { compute(*static_cast<const Kernel*>(kernel), context); });
}

void destroy_kernel(void* kernel) noexcept { delete static_cast<Kernel*>(kernel); }

const OpRecord g_record = make_record(kOpName, kInputTypes, kInputCount, kOutputCount, create_kernel, compute_kernel,
                                      destroy_kernel);

}  // namespace

const OrtCustomOp* prompt_attention_op() { return &g_record.op; }

}  // namespace trtspec_ops
