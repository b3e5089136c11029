// BlockMatMul (domain com.trtspec, CPU): y = x · W^T for W stored as MatMulNBits stores it (4- or 8-bit codes in
// blocks of 32, a float scale per block and output column), computed as MatMulNBits does at accuracy level 4: each
// row of x rounded to int8 per block of 32 (scale max|x| / 127, round to nearest even), every block's integer dot
// product exact, then scaled by the two scales and added up in float over the blocks in order.
//
// Inputs   0 x       float [..., K]                K = blocks · 32
//          1 codes   uint8 [N, blocks, 16 | 32]    MatMulNBits' B: code = value + 8 (4-bit, two a byte, low nibble
//                                                  first) or value + 128 (8-bit)
//          2 scales  float [N · blocks]            MatMulNBits' scales
// Output   0 y       float [..., N], or [..., N / 2] with gated = 1
// Attribute gated    int, default 0. 1: y = silu(g) · u for g = the product's first N / 2 columns and u = the rest
//                    (SwiGLU's gate and up in one matrix; N / 2 a multiple of 16), so the product is never stored
//
// Why: ONNX Runtime's many-row path is slow on CPUs with AVX-512 VNNI, and a verify step's or a prompt's rows are
// many. The codes are regrouped once (on the first call, shared by every kernel that reads the same matrix) so that
// one vector load holds 4 bytes of each of 16 columns; the bytes stay as stored (a 4-bit code stays a nibble), so a
// one-row call reads no more than MatMulNBits does. vpdpbusd adds code · q to a block's integer sum started at
// -offset · sum(q), which leaves the exact sum of value · q. Elsewhere a portable loop computes the same numbers,
// slowly. A row's numbers depend on nothing but the row: per output column, acc = fma(float(sum_b), scale_w ·
// scale_x, acc) over the blocks in order from zero, on every path and in any tile; gated, silu(g) = g · sigmoid(g),
// elementwise (sigmoid_of in op_support.h). Built with -ffp-contract=off, as the library.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "op_support.h"

namespace trtspec_ops {
namespace {

constexpr const char* kOpName = "BlockMatMul";
const char* const kInputNames[] = {"x", "codes", "scales"};
const ONNXTensorElementDataType kInputTypes[] = {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8,
                                                 ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT};
constexpr size_t kInputCount = sizeof(kInputTypes) / sizeof(kInputTypes[0]);
constexpr int64_t kBlock = 32;
constexpr int64_t kGroup = 16;                     // output columns a vector holds
constexpr int kTileRows = 16;
constexpr int64_t kInlineBelow = int64_t(1) << 15;  // multiply-adds under which one thread does it all

// Where element i of a block sits among the 32 bytes of x a block's codes pair with. 8-bit: in order, 4-byte quads.
// 4-bit: a column's 4-byte word j (octet j) holds elements 8j + 2t (low nibble of byte t) and 8j + 2t + 1 (high
// nibble), so x's bytes 8j..8j+3 are the octet's even elements and 8j+4..8j+7 its odd ones.
inline int64_t x_position(int64_t i, int bits) {
  return bits == 8 ? i : (i / 8) * 8 + (i % 2) * 4 + (i % 8) / 2;
}

// W in the layout the kernels read, built once from the inputs: [group][block][words][16 columns][4 bytes] of the
// stored codes (8 words of 4 codes at 8 bits, 4 words of 8 nibbles at 4), the scales [group][block][16], columns
// padded with zero codes and scales to whole groups
struct Packed {
  int64_t n = 0, k = 0, blocks = 0, groups = 0;
  int bits = 8;
  std::vector<uint8_t> words;
  std::vector<float> block_scales;
  int64_t unit_bytes() const { return kGroup * kBlock * bits / 8; }  // one group's block
};

void pack(Packed& p, const uint8_t* codes, const float* scales, int64_t n, int64_t blocks, int bits) {
  p.n = n, p.blocks = blocks, p.k = blocks * kBlock, p.groups = (n + kGroup - 1) / kGroup, p.bits = bits;
  const int64_t blob = kBlock * bits / 8, unit_bytes = p.unit_bytes();
  p.words.assign(size_t(p.groups * blocks * unit_bytes), 0);
  p.block_scales.assign(size_t(p.groups * blocks * kGroup), 0.0f);
  for (int64_t col = 0; col < n; ++col) {
    const int64_t group = col / kGroup, c = col % kGroup;
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* code = codes + (col * blocks + b) * blob;
      const size_t unit = size_t(group * blocks + b);
      uint8_t* out = p.words.data() + unit * size_t(unit_bytes);
      for (int64_t byte = 0; byte < blob; ++byte)  // stored byte `byte` is word byte / 4, byte byte % 4 of it
        out[(byte / 4) * kGroup * 4 + c * 4 + byte % 4] = code[byte];
      p.block_scales[unit * kGroup + size_t(c)] = scales[col * blocks + b];
    }
  }
}

// x's rows as signed int8 q = round-to-nearest-even(x · (1 / scale)), scale = max|x| / 127, each block's bytes at
// x_position, and -offset · sum(q) per block (offset 8 or 128: what the codes add to each value), where the block's
// sum of code · q starts so that it ends as the sum of value · q. The AVX-512 loop
// computes the same numbers: max is exact, one rounding per product, the same rounding rule, integer sums.
void quantize_rows(const float* x, int64_t rows, int64_t k, int bits, int8_t* q, float* scales, int32_t* start) {
  const int64_t blocks = k / kBlock;
  const int32_t offset = bits == 8 ? 128 : 8;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      const float* v = x + r * k + b * kBlock;
      int8_t* out = q + r * k + b * kBlock;
#if defined(__AVX512F__)
      const __m512 lo = _mm512_loadu_ps(v), hi = _mm512_loadu_ps(v + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
#else
      float amax = 0.0f;
      for (int64_t i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(v[i]));
#endif
      const float scale = amax / 127.0f, inverse = amax != 0.0f ? 1.0f / scale : 0.0f;
      scales[r * blocks + b] = scale;
#if defined(__AVX512F__)
      const __m512 s = _mm512_set1_ps(inverse);
      const __m512i q_lo = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(lo, s), _MM_FROUND_TO_NEAREST_INT));
      const __m512i q_hi = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(hi, s), _MM_FROUND_TO_NEAREST_INT));
      start[r * blocks + b] = -offset * _mm512_reduce_add_epi32(_mm512_add_epi32(q_lo, q_hi));
      __m256i bytes = _mm256_set_m128i(_mm512_cvtepi32_epi8(q_hi), _mm512_cvtepi32_epi8(q_lo));
      if (bits == 4) {  // within each 8 bytes: the even elements, then the odd ones
        const __m256i order = _mm256_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15,
                                               0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
        bytes = _mm256_shuffle_epi8(bytes, order);
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), bytes);
#else
      int32_t sum = 0;
      for (int64_t i = 0; i < kBlock; ++i) {
        const int value = int(std::nearbyint(v[i] * inverse));
        out[x_position(i, bits)] = int8_t(value);
        sum += value;
      }
      start[r * blocks + b] = -offset * sum;
#endif
    }
}

struct Problem {
  const Packed* w;
  bool gated;           // y = silu(first half) · second half
  int64_t rows;
  const int8_t* q;      // [rows, k], blocks in x_position order
  const float* qs;      // [rows, blocks]
  const int32_t* start;  // [rows, blocks]: -offset · sum(q), where each block's integer sum starts
  float* out;           // [rows, n]
  CallerMode mode;
};

// columns [16 · group, + 16) of row r, through a 16-float staging row (the last group may be partial)
inline void store_group(const Problem& p, int64_t r, int64_t group, const float* lanes) {
  const int64_t n = p.gated ? p.w->n / 2 : p.w->n, c0 = group * kGroup, width = std::min<int64_t>(kGroup, n - c0);
  std::memcpy(p.out + r * n + c0, lanes, sizeof(float) * size_t(width));
}

#if defined(__AVX512VNNI__) && defined(__AVX512F__)
template <int R, int Bits>
void tile(const Problem& p, int64_t r0, int64_t group, float (*lanes)[kGroup]) {
  const Packed& w = *p.w;
  constexpr int kWords = Bits == 8 ? 8 : 4;
  const __m512i nibble = _mm512_set1_epi8(0x0f);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < w.blocks; ++b) {
    const size_t unit = size_t(group * w.blocks + b);
    const uint8_t* words = w.words.data() + unit * size_t(kGroup * kBlock * Bits / 8);
    // codes[i]: the 16 columns' codes paired with x bytes 4i..4i+3 of the block
    __m512i codes[8];
    for (int j = 0; j < kWords; ++j) {
      const __m512i raw = _mm512_loadu_si512(words + 64 * j);
      if (Bits == 8) {
        codes[j] = raw;
      } else {
        codes[2 * j] = _mm512_and_si512(raw, nibble);
        codes[2 * j + 1] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nibble);
      }
    }
    const __m512 s = _mm512_loadu_ps(w.block_scales.data() + unit * kGroup);
    for (int r = 0; r < R; ++r) {
      const int8_t* a = p.q + (r0 + r) * w.k + b * kBlock;
      __m512i sum = _mm512_set1_epi32(p.start[(r0 + r) * w.blocks + b]);
      for (int i = 0; i < 8; ++i) {
        int32_t quad;
        std::memcpy(&quad, a + 4 * i, 4);
        sum = _mm512_dpbusd_epi32(sum, codes[i], _mm512_set1_epi32(quad));
      }
      const __m512 sx = _mm512_set1_ps(p.qs[(r0 + r) * w.blocks + b]);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(s, sx), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(lanes[r], acc[r]);
}
#else
// the same numbers, one row at a time: integer sums exact, then fma(float(sum), scale_w · scale_x, acc)
template <int R, int Bits>
void tile(const Problem& p, int64_t r0, int64_t group, float (*lanes)[kGroup]) {
  const Packed& w = *p.w;
  for (int r = 0; r < R; ++r) {
    float* acc = lanes[r];
    std::fill(acc, acc + kGroup, 0.0f);
    for (int64_t b = 0; b < w.blocks; ++b) {
      const int8_t* a = p.q + (r0 + r) * w.k + b * kBlock;
      const float sx = p.qs[(r0 + r) * w.blocks + b];
      const size_t unit = size_t(group * w.blocks + b);
      const uint8_t* words = w.words.data() + unit * size_t(kGroup * kBlock * Bits / 8);
      for (int64_t c = 0; c < kGroup; ++c) {
        int32_t sum = p.start[(r0 + r) * w.blocks + b];
        for (int64_t i = 0; i < kBlock; ++i) {
          const int64_t byte = i * Bits / 8;  // the stored byte holding element i
          const uint8_t stored = words[(byte / 4) * kGroup * 4 + c * 4 + byte % 4];
          const int code = Bits == 8 ? stored : (stored >> (4 * (i % 2))) & 0x0f;
          sum += int32_t(code) * int32_t(a[x_position(i, Bits)]);
        }
        acc[c] = std::fma(float(sum), w.block_scales[unit * kGroup + size_t(c)] * sx, acc[c]);
      }
    }
  }
}
#endif

// rows r0 .. r0 + R of output group `group`: the product's columns, or gated, silu of the gate's times the up's
template <int R, int Bits>
void output_tile(const Problem& p, int64_t r0, int64_t group) {
  float lanes[R][kGroup];
  tile<R, Bits>(p, r0, group, lanes);
  if (p.gated) {
    float up[R][kGroup];
    tile<R, Bits>(p, r0, group + p.w->groups / 2, up);
    for (int r = 0; r < R; ++r) {
      const Vec g = load(lanes[r]);
      store(lanes[r], (g * sigmoid_of(g)) * load(up[r]));
    }
  }
  for (int r = 0; r < R; ++r) store_group(p, r0 + r, group, lanes[r]);
}

template <int Bits, int R = 1>
void rest(const Problem& p, int64_t r0, int64_t group, int64_t rows) {  // one tile of `rows` < kTileRows rows
  if constexpr (R < kTileRows) {
    if (rows == R) return output_tile<R, Bits>(p, r0, group);
    rest<Bits, R + 1>(p, r0, group, rows);
  }
}

template <int Bits>
void run_rows(const Problem& p, size_t group) {
  int64_t r = 0;
  for (; r + kTileRows <= p.rows; r += kTileRows) output_tile<kTileRows, Bits>(p, r, int64_t(group));
  if (r < p.rows) rest<Bits>(p, r, int64_t(group), p.rows - r);
}

// one output group of every row (gated: the gate's group and the up's)
void run_unit(const Problem& p, size_t group) { p.w->bits == 8 ? run_rows<8>(p, group) : run_rows<4>(p, group); }

struct Kernel {
  bool gated = false;  // the gated attribute
  std::mutex lock;  // guards `packed` while it is (re)built
  std::shared_ptr<const Packed> packed;
  const void* codes = nullptr;  // the inputs `packed` was found for
  const void* scales = nullptr;
};

// Kernels share one regrouped copy of the same matrix: an engine's context and generation graphs read the same
// blocks, each session from its own copy of the initializers. A matrix is known by its shape and two independent
// 64-bit hashes of its codes and scales (computed once per kernel, at its first call).
struct Identity {
  int64_t n, blocks;
  int bits;
  uint64_t first, second;
  bool operator<(const Identity& o) const {
    return std::tie(n, blocks, bits, first, second) < std::tie(o.n, o.blocks, o.bits, o.first, o.second);
  }
};

void hash_bytes(const void* data, size_t size, uint64_t& first, uint64_t& second) {
  const uint8_t* bytes = static_cast<const uint8_t*>(data);
  size_t i = 0;
  const auto mix = [&](uint64_t word) {
    first = (first ^ word) * 0x9e3779b97f4a7c15ull, first ^= first >> 29;
    second = (second + word) * 0xc2b2ae3d27d4eb4full, second ^= second >> 31;
  };
  for (; i + 8 <= size; i += 8) {
    uint64_t word;
    std::memcpy(&word, bytes + i, 8);
    mix(word);
  }
  uint64_t rest = size;  // the length, then the last bytes
  std::memcpy(&rest, bytes + i, size - i);
  mix(rest ^ (uint64_t(size) << 56));
}

std::mutex g_shared_lock;
std::map<Identity, std::weak_ptr<const Packed>> g_shared;  // guarded by g_shared_lock

std::shared_ptr<const Packed> packed_weights(Kernel& kernel, const TensorView& codes, const TensorView& scales,
                                             int64_t n, int64_t blocks, int bits) {
  std::lock_guard<std::mutex> guard(kernel.lock);
  if (kernel.packed && kernel.codes == codes.data && kernel.scales == scales.data && kernel.packed->n == n &&
      kernel.packed->blocks == blocks && kernel.packed->bits == bits)
    return kernel.packed;
  Identity id{n, blocks, bits, 0x243f6a8885a308d3ull, 0x13198a2e03707344ull};
  hash_bytes(codes.data, size_t(n * blocks * kBlock * bits / 8), id.first, id.second);
  hash_bytes(scales.data, size_t(n * blocks) * sizeof(float), id.first, id.second);
  std::shared_ptr<const Packed> shared;
  {
    std::lock_guard<std::mutex> registry(g_shared_lock);
    auto found = g_shared.find(id);
    if (found != g_shared.end()) shared = found->second.lock();
  }
  if (!shared) {
    auto p = std::make_shared<Packed>();
    pack(*p, static_cast<const uint8_t*>(codes.data), static_cast<const float*>(scales.data), n, blocks, bits);
    shared = std::move(p);
    std::lock_guard<std::mutex> registry(g_shared_lock);
    for (auto it = g_shared.begin(); it != g_shared.end();)  // forget matrices no kernel holds any more
      it = it->second.expired() ? g_shared.erase(it) : std::next(it);
    g_shared[id] = shared;
  }
  kernel.packed = std::move(shared), kernel.codes = codes.data, kernel.scales = scales.data;
  return kernel.packed;
}

void compute(Kernel& kernel, OrtKernelContext* context) {
  expect_input_count(context, kInputCount);
  const TensorView x = input(context, 0, -1, kInputNames[0]), codes = input(context, 1, 3, kInputNames[1]);
  const TensorView scales = input(context, 2, -1, kInputNames[2]);
  const TensorView* views[] = {&x, &codes, &scales};
  for (size_t i = 0; i < kInputCount; ++i)
    if (views[i]->type != kInputTypes[i])
      throw OpError(std::string("input ") + kInputNames[i] + " is not " + (i == 1 ? "uint8" : "float32"));
  if (x.shape.empty()) throw OpError("input x must have at least one dimension");
  const int64_t n = codes.shape[0], blocks = codes.shape[1], blob = codes.shape[2], k = x.shape.back();
  if (blob != kBlock / 2 && blob != kBlock)
    throw OpError("input codes has shape " + shape_text(codes.shape) + ": blocks of 32 need 16 bytes (4-bit) or 32 "
                  "(8-bit) each");
  if (k != blocks * kBlock)
    throw OpError("x has " + std::to_string(k) + " inputs, codes " + std::to_string(blocks) + " blocks of 32");
  int64_t scale_count = 1;
  for (int64_t d : scales.shape) scale_count *= d;
  if (scale_count != n * blocks)
    throw OpError("input scales has " + std::to_string(scale_count) + " values, expected " +
                  std::to_string(n * blocks) + " (N x blocks)");
  if (kernel.gated && n % (2 * kGroup) != 0)
    throw OpError("gated = 1 needs N a multiple of 32 (gate and up of 16-column groups), codes has N = " +
                  std::to_string(n));
  std::vector<int64_t> out_shape(x.shape.begin(), x.shape.end() - 1);
  out_shape.push_back(kernel.gated ? n / 2 : n);
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < x.shape.size(); ++i) rows *= x.shape[i];
  float* out = output(context, 0, out_shape);
  if (rows == 0 || n == 0) return;

  const int bits = int(blob * 8 / kBlock);
  const std::shared_ptr<const Packed> w = packed_weights(kernel, codes, scales, n, blocks, bits);
  thread_local std::vector<int8_t> q;
  thread_local std::vector<float> qs;
  thread_local std::vector<int32_t> start;
  q.resize(size_t(rows * k));
  qs.resize(size_t(rows * blocks));
  start.resize(size_t(rows * blocks));
  const float* xs = static_cast<const float*>(x.data);
  Problem p{w.get(), kernel.gated, rows, q.data(), qs.data(), start.data(), out, CallerMode{}};
  const size_t units = size_t(kernel.gated ? w->groups / 2 : w->groups);
  if (units == 1 || rows * n * k < kInlineBelow) {  // small: the calling thread, the same arithmetic
    quantize_rows(xs, rows, k, bits, q.data(), qs.data(), start.data());
    for (size_t unit = 0; unit < units; ++unit) run_unit(p, unit);
    return;
  }
  // x's rows in chunks (each row's numbers its own; into this thread's buffers), then the products
  const int64_t chunks = (rows + kTileRows - 1) / kTileRows;
  int8_t* const q_rows = q.data();
  float* const q_scales = qs.data();
  int32_t* const q_starts = start.data();
  parallel_for(context, size_t(chunks), p.mode, [=](size_t chunk) {
    const int64_t r = int64_t(chunk) * kTileRows, count = std::min<int64_t>(kTileRows, rows - r);
    quantize_rows(xs + r * k, count, k, bits, q_rows + r * k, q_scales + r * blocks, q_starts + r * blocks);
  });
  parallel_for(context, units, p.mode, [&p](size_t unit) { run_unit(p, unit); });
}

OrtStatus* create_kernel(const OrtCustomOp*, const OrtApi* api, const OrtKernelInfo* info, void** kernel) noexcept {
  if (g_api == nullptr) g_api = api;
  return guarded(kOpName, [&] {
    size_t inputs = 0;
    check(api->KernelInfo_GetInputCount(info, &inputs));
    if (inputs != kInputCount) throw OpError("expects 3 inputs, got " + std::to_string(inputs));
    const int64_t gated = optional_int_attribute(api, info, "gated", 0);
    if (gated != 0 && gated != 1) throw OpError("attribute gated is " + std::to_string(gated) + ", not 0 or 1");
    auto* k = new Kernel{};
    k->gated = gated == 1;
    *kernel = k;
  });
}

OrtStatus* compute_kernel(void* kernel, OrtKernelContext* context) noexcept {
  return guarded(kOpName, [&] { compute(*static_cast<Kernel*>(kernel), context); });
}

void destroy_kernel(void* kernel) noexcept { delete static_cast<Kernel*>(kernel); }

const OpRecord g_record = make_record(kOpName, kInputTypes, kInputCount, 1, create_kernel, compute_kernel,
                                      destroy_kernel);

}  // namespace

const OrtCustomOp* block_matmul_op() { return &g_record.op; }

}  // namespace trtspec_ops
