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
// to cache positions 0 .. past_b - 1, then to the new slots j with mask[b, r, j], in slot order. A tree's slots come
// in topological order (each slot's ancestors at smaller indices, as trtspec's trees are), so a slot meets its keys in
// the order plain decoding would: the past, its ancestors root first, itself.
//
// Why a row's result is invariant (the point of the op): every number a row needs is an elementwise function of its
// operands or a sum in an order fixed by the source, never by the call's shape:
//   - a score q.k: 16 lane sums, each a chain of fused multiply-adds over the head's 16-float chunks in order, then
//     the 16 lanes added in one fixed tree (the same tree for every (row, key) pair, whichever block, lane or call);
//   - the maximum over the visible keys (exact in any order);
//   - exp(score - max): one vectorised function (range reduction and a polynomial), the same operations in every
//     lane, used for every element (not libm's expf: scalar expf cost a quarter of the kernel);
//   - the sum of the exponentials and the output sum_k e_k v_k: accumulated key by key in key order (the past, then
//     the visible slots by index), vectorised only across rows (the sums) or the hd lanes (the outputs).
// Masked slots are skipped, never added as zeros. Work is split across threads by whole query rows. So a row computes
// the same bits whether its call has 1 or 17 slots, wherever its ancestors sit among the slots, in a batch of 1 or 4,
// on 1 or 2 threads: its keys arrive in the same order (past, ancestors, itself) through the same arithmetic. The
// build uses -fno-fast-math -ffp-contract=off so that no expression is reassociated, or fused in one place and not
// another; the fused multiply-adds are explicit (all of them, or none where the CPU has no FMA).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "op_support.h"

namespace trtspec_ops {
namespace {

constexpr const char* kOpName = "TreeAttention";
constexpr int kLanes = 8;         // hd must be a multiple of it ...
constexpr int kMaxHeadSize = 256;  // ... and at most this (the kernels are instantiated per 16-float chunk count)

const char* const kInputNames[] = {"qkv", "past_key", "past_value", "past_lengths",
                                   "position_ids", "tree_mask", "cos_cache", "sin_cache"};
const ONNXTensorElementDataType kInputTypes[] = {
    ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
    ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL,
    ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT};
constexpr size_t kInputCount = sizeof(kInputTypes) / sizeof(kInputTypes[0]);
constexpr size_t kOutputCount = 3;

TensorView input(const OrtKernelContext* context, size_t index, int rank) {
  return trtspec_ops::input(context, index, rank, kInputNames[index]);
}

void expect_shape(size_t index, const TensorView& view, const std::vector<int64_t>& expected) {
  trtspec_ops::expect_shape(kInputNames[index], view, expected);
}

// ---- the arithmetic (one definition of each step, used for every row; the vector type is op_support.h's) ----------
// the first `n` floats at p (n is 8 or 16: hd is a multiple of 8), the other lanes zero
inline Vec load_part(const float* p, int n) {
  if (n == kWidth) return load(p);
  Vec v = {};
  std::memcpy(&v, p, sizeof(float) * 8);
  return v;
}

inline void store(float* p, Vec v) { std::memcpy(p, &v, sizeof(v)); }
inline void store_part(float* p, Vec v, int n) {
  if (n == kWidth) store(p, v);
  else std::memcpy(p, &v, sizeof(float) * 8);
}

// q · k for one query row and 16 keys at once. Each key's dot product: 16 lane sums, each lane over the head's
// 16-float chunks in order (fused multiply-adds), then the lanes added in one fixed tree,
// ((l0+l8)+(l4+l12)) ... i.e. l+8, then l+4, then l+2, then l+1. The 16 keys' trees run side by side through
// shuffles, each key's additions exactly those of its own tree.
inline Vec tree_level(Vec x, Vec y, const IVec& low, const IVec& high) {
  return __builtin_shuffle(x, y, low) + __builtin_shuffle(x, y, high);
}

constexpr IVec kLevel1Low = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
constexpr IVec kLevel1High = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
constexpr IVec kLevel2Low = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
constexpr IVec kLevel2High = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
constexpr IVec kLevel3Low = {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29};
constexpr IVec kLevel3High = {2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31};
constexpr IVec kLevel4Low = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
constexpr IVec kLevel4High = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};

// partial[j]: key j's 16 lane sums, for 8 keys. Levels 1-3 of their trees: lanes l + 8 -> [a: 8 | b: 8], then
// l + 4 -> [a: 4 | b: 4 | c: 4 | d: 4], then l + 2 -> 8 keys x 2 lanes (key j in lanes 2j, 2j + 1).
inline Vec reduce_8_keys(const Vec partial[8]) {
  Vec one[4], two[2];
  for (int m = 0; m < 4; ++m) one[m] = tree_level(partial[2 * m], partial[2 * m + 1], kLevel1Low, kLevel1High);
  for (int m = 0; m < 2; ++m) two[m] = tree_level(one[2 * m], one[2 * m + 1], kLevel2Low, kLevel2High);
  return tree_level(two[0], two[1], kLevel3Low, kLevel3High);
}

// level 4 of 16 keys' trees (keys 0-7 from `first`, 8-15 from `second`): lanes 0 + 1 -> key j in lane j
inline Vec reduce_16_keys(Vec first, Vec second) { return tree_level(first, second, kLevel4Low, kLevel4High); }

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
  CallerMode mode;  // the calling thread's floating-point mode, set on every worker
  size_t qkv_width() const { return size_t(heads + 2 * kv_heads) * hd; }
  size_t cache_offset(int b, int kvh, int64_t row) const {
    return ((size_t(b) * kv_heads + kvh) * capacity + row) * hd;
  }
};

// per-thread scratch: the unit's rotated queries, then its rows' scores (turned into exponentials in place)
thread_local std::vector<Vec> t_scratch;

constexpr int kRowBlock = 4;  // query rows whose output accumulators advance together over the values

// acc[t] = sum over the past keys k, in order, of e[t][k] v_k (fused multiply-adds from zero), for N rows at once
// chunk c of a head vector of C chunks: 16 floats, or `tail` (8 or 16) for the last one, zeros after them
template <int C>
inline Vec chunk(const float* row, int c, int tail) {
  return c + 1 < C ? load(row + c * kWidth) : load_part(row + c * kWidth, tail);
}

template <int C, int N>
inline void accumulate_past(Vec (*acc)[C], const float* const* e, const float* values, int past, int hd, int tail) {
  Vec sum[N][C];
  for (int t = 0; t < N; ++t)
    for (int c = 0; c < C; ++c) sum[t][c] = Vec{};
  for (int k = 0; k < past; ++k) {
    const float* value = values + size_t(k) * hd;
    for (int c = 0; c < C; ++c) {
      const Vec v = chunk<C>(value, c, tail);
      for (int t = 0; t < N; ++t) sum[t][c] = fma(splat(e[t][k]), v, sum[t][c]);
    }
  }
  for (int t = 0; t < N; ++t)
    for (int c = 0; c < C; ++c) acc[t][c] = sum[t][c];
}

// Attention of query heads [h_begin, h_end) of kv head `kvh` in batch row b, over all T slots, for a head of C
// 16-float chunks (the last one `tail` = 8 or 16 floats wide). Key and value vectors are read once per block of
// rows; each row's softmax sum and output accumulate key by key in key order. C is a compile-time constant so that
// a row's query chunks and a row block's output accumulators stay in registers.
template <int C>
void attend(const Problem& p, int b, int kvh, int h_begin, int h_end) {
  const int hd = p.hd, slots = p.slots, hn = h_end - h_begin, rows = slots * hn;
  const int tail = hd - (C - 1) * kWidth;
  const int past = p.past_lengths[b];
  const int columns = past + slots;  // keys: the past, then the new slots
  const int blocks = (columns + kWidth - 1) / kWidth, width = blocks * kWidth;
  const size_t need = size_t(rows) * C + size_t(rows) * blocks + 1;
  if (t_scratch.size() < need) t_scratch.resize(need);
  Vec* q = t_scratch.data();                                       // [rows][C], zero past hd
  float* score = reinterpret_cast<float*>(q + size_t(rows) * C);  // [rows][width]
  const bool* mask = p.mask + size_t(b) * slots * slots;

  // rotated queries, row i = r * hn + (h - h_begin)
  float rotated[C * kWidth];
  for (int r = 0; r < slots; ++r) {
    const int64_t pos = p.position_ids[size_t(b) * slots + r];
    const float* x = p.qkv + (size_t(b) * slots + r) * p.qkv_width();
    for (int h = h_begin; h < h_end; ++h) {
      rope(x + size_t(h) * hd, p.cos + size_t(pos) * (hd / 2), p.sin + size_t(pos) * (hd / 2), hd, rotated);
      Vec* qi = q + size_t(r * hn + h - h_begin) * C;
      for (int c = 0; c < C; ++c) qi[c] = chunk<C>(rotated, c, tail);
    }
  }

  // scores of every (row, key) pair, the new slots' columns included (masked ones are never read). Each key's 16
  // lane sums: fused multiply-adds over its chunks in order from zero, the last chunk `tail` wide; one code for
  // full and partial blocks alike.
  const float* keys = p.key + p.cache_offset(b, kvh, 0);
  const float* values = p.value + p.cache_offset(b, kvh, 0);
  for (int block = 0; block < blocks; ++block) {
    const int first = block * kWidth, count = std::min(kWidth, columns - first);
    const float* key = keys + size_t(first) * hd;
    for (int i = 0; i < rows; ++i) {
      Vec qi[C];
      for (int c = 0; c < C; ++c) qi[c] = q[size_t(i) * C + c];
      Vec half[2];  // keys 0-7 and 8-15, each reduced to 2 lanes a key (8 keys at a time: fewer live registers)
      for (int g = 0; g < 2; ++g) {
        const float* base = key + g * 8 * hd;
        Vec partial[8];
        if (count >= (g + 1) * 8) {  // 8 keys' chains side by side
          for (int j = 0; j < 8; ++j) partial[j] = fma(qi[0], chunk<C>(base + j * hd, 0, tail), Vec{});
          for (int c = 1; c < C; ++c)
            for (int j = 0; j < 8; ++j) partial[j] = fma(qi[c], chunk<C>(base + j * hd, c, tail), partial[j]);
        } else {  // the last block: the same chains for the keys there are, zeros after them
          for (int j = 0; j < 8; ++j) partial[j] = Vec{};
          for (int j = 0; j < count - g * 8; ++j) {
            partial[j] = fma(qi[0], chunk<C>(base + j * hd, 0, tail), Vec{});
            for (int c = 1; c < C; ++c) partial[j] = fma(qi[c], chunk<C>(base + j * hd, c, tail), partial[j]);
          }
        }
        half[g] = reduce_8_keys(partial);
      }
      store(score + size_t(i) * width + first, reduce_16_keys(half[0], half[1]));
    }
  }

  for (int r0 = 0; r0 < rows; r0 += kRowBlock) {
    const int n = std::min(kRowBlock, rows - r0);
    // softmax numerators in place of the scores; each row's sum over its keys in key order
    float sums[kRowBlock] = {};
    for (int t = 0; t < n; ++t) {
      const int i = r0 + t;
      const bool* sees = mask + size_t(i / hn) * slots;
      float* s = score + size_t(i) * width;
      Vec top_past = splat(-std::numeric_limits<float>::infinity());
      int k = 0;
      for (; k + kWidth <= past; k += kWidth) {
        const Vec x = load(s + k);
        top_past = x > top_past ? x : top_past;
      }
      float top = -std::numeric_limits<float>::infinity();
      for (int l = 0; l < kWidth; ++l) top = top_past[l] > top ? top_past[l] : top;  // exact in any order
      for (; k < past; ++k) top = s[k] > top ? s[k] : top;
      for (int j = 0; j < slots; ++j)
        if (sees[j]) top = s[past + j] > top ? s[past + j] : top;
      for (int k = 0; k < width; k += kWidth) store(s + k, exp_nonpositive(load(s + k) - splat(top)));
    }
    for (int k = 0; k < past; ++k)  // the rows' chains interleaved, each one in key order
      for (int t = 0; t < kRowBlock; ++t)
        if (t < n) sums[t] += score[size_t(r0 + t) * width + k];
    for (int t = 0; t < n; ++t) {
      const bool* sees = mask + size_t((r0 + t) / hn) * slots;
      for (int j = 0; j < slots; ++j)
        if (sees[j]) sums[t] += score[size_t(r0 + t) * width + past + j];
    }

    // outputs: sum_k e_k v_k, lane by lane over hd, keys in order, fused multiply-adds from zero; the rows of the
    // block share each value vector
    Vec acc[kRowBlock][C];
    const float* e[kRowBlock];
    for (int t = 0; t < n; ++t) e[t] = score + size_t(r0 + t) * width;
    switch (n) {
      case 1: accumulate_past<C, 1>(acc, e, values, past, hd, tail); break;
      case 2: accumulate_past<C, 2>(acc, e, values, past, hd, tail); break;
      case 3: accumulate_past<C, 3>(acc, e, values, past, hd, tail); break;
      default: accumulate_past<C, kRowBlock>(acc, e, values, past, hd, tail); break;
    }
    for (int j = 0; j < slots; ++j) {
      const float* value = values + size_t(past + j) * hd;
      for (int t = 0; t < n; ++t) {
        if (!mask[size_t((r0 + t) / hn) * slots + j]) continue;
        const Vec w = splat(e[t][past + j]);
        for (int c = 0; c < C; ++c) {
          acc[t][c] = fma(w, chunk<C>(value, c, tail), acc[t][c]);
        }
      }
    }

    for (int t = 0; t < n; ++t) {
      const int i = r0 + t, r = i / hn, h = h_begin + i % hn;
      float* out = p.out + (size_t(b) * slots + r) * size_t(p.heads) * hd + size_t(h) * hd;
      // a row that sees no key at all (no past, its own slot masked): zeros, not 0/0
      const Vec sum = splat(sums[t]);
      for (int c = 0; c < C; ++c) {
        const Vec o = sums[t] > 0.0f ? acc[t][c] / sum : Vec{};
        if (c + 1 < C) store(out + c * kWidth, o);
        else store_part(out + c * kWidth, o, tail);
      }
    }
  }
}

constexpr int kMaxChunks = kMaxHeadSize / kWidth;

template <int... C>
void attend_dispatch(std::integer_sequence<int, C...>, int chunks, const Problem& p, int b, int kvh, int h0, int h1) {
  ((chunks == C + 1 ? attend<C + 1>(p, b, kvh, h0, h1) : void()), ...);
}

void attend_any(const Problem& p, int b, int kvh, int h0, int h1) {
  attend_dispatch(std::make_integer_sequence<int, kMaxChunks>{}, (p.hd + kWidth - 1) / kWidth, p, b, kvh, h0, h1);
}

// one work unit: (batch row, kv head, a share of its query heads)
void run_unit(const Problem& p, size_t unit) {
  const int per_batch = p.kv_heads * p.splits;
  const int b = int(unit / per_batch), kvh = int(unit % per_batch) / p.splits, s = int(unit % p.splits);
  const int h0 = kvh * p.group + s * p.group / p.splits, h1 = kvh * p.group + (s + 1) * p.group / p.splits;
  attend_any(p, b, kvh, h0, h1);
}

// ---- the kernel -----------------------------------------------------------------------------------------------------
struct Kernel {
  int heads;
  int kv_heads;
};

void compute(const Kernel& kernel, OrtKernelContext* context) {
  expect_input_count(context, kInputCount);

  const TensorView qkv = input(context, 0, 3), past_key = input(context, 1, 4), past_value = input(context, 2, 4);
  const int64_t batch = qkv.shape[0], slots = qkv.shape[1];
  const int64_t kv_heads = past_key.shape[1], capacity = past_key.shape[2], hd = past_key.shape[3];
  if (past_key.shape[0] != batch || kv_heads != kernel.kv_heads)
    throw OpError("input past_key has shape " + shape_text(past_key.shape) + ", expected [" + std::to_string(batch) +
                  ", " + std::to_string(kernel.kv_heads) + ", capacity, head_size]");
  if (hd <= 0 || hd % kLanes != 0 || hd > kMaxHeadSize)
    throw OpError("head size " + std::to_string(hd) + " is not a positive multiple of " + std::to_string(kLanes) +
                  " up to " + std::to_string(kMaxHeadSize));
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
  const PresentCache present = present_cache(context, past_key, past_value, needed);  // max(capacity, past + T) rows
  float *present_key = present.key, *present_value = present.value;
  if (batch == 0 || slots == 0) return;

  Problem p{};
  p.batch = int(batch), p.slots = int(slots), p.heads = kernel.heads, p.kv_heads = kernel.kv_heads;
  p.group = kernel.heads / kernel.kv_heads, p.hd = int(hd), p.capacity = int(needed), p.positions = int(cos.shape[0]);
  p.qkv = static_cast<const float*>(qkv.data), p.past_lengths = past_lengths, p.position_ids = position_ids;
  p.mask = static_cast<const bool*>(mask.data);
  p.cos = static_cast<const float*>(cos.data), p.sin = static_cast<const float*>(sin.data);
  p.key = present_key, p.value = present_value, p.out = out;

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
  const size_t units = size_t(p.batch) * p.kv_heads * p.splits;
  parallel_for(context, units, p.mode, [&p](size_t unit) { run_unit(p, unit); });
}

// ---- the OrtCustomOp callbacks --------------------------------------------------------------------------------------
OrtStatus* create_kernel(const OrtCustomOp*, const OrtApi* api, const OrtKernelInfo* info, void** kernel) noexcept {
  if (g_api == nullptr) g_api = api;
  return guarded(kOpName, [&] {
    int heads = 0, kv_heads = 0;
    attention_heads(api, info, heads, kv_heads);
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
        if (shape.size() == 4 && shape[3] > 0 && (shape[3] % kLanes != 0 || shape[3] > kMaxHeadSize))
          throw OpError("head size " + std::to_string(shape[3]) + " (past_key's last dimension) is not a multiple of " +
                        std::to_string(kLanes) + " up to " + std::to_string(kMaxHeadSize));
      }
    } catch (...) {
      api->ReleaseTypeInfo(type);
      throw;
    }
    api->ReleaseTypeInfo(type);
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

const OrtCustomOp* tree_attention_op() { return &g_record.op; }

}  // namespace trtspec_ops
