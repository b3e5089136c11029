// BlockMatMul (domain com.trtspec, CPU): y = x · W^T for W stored as MatMulNBits stores it (4- or 8-bit codes in
// blocks of 32, a float scale per block and output column), computed as MatMulNBits does at accuracy level 4: each
// row of x rounded to int8 per block of 32 (scale max|x| / 127, round to nearest even), every block's integer dot
// product exact, then scaled by the two scales and added up in float over the blocks in order.
//
// Inputs   0 x       float [..., K]                K = blocks · 32
//          1 codes   uint8 [N, blocks, 16 | 32]    MatMulNBits' B: code = value + 8 (4-bit, two a byte, low nibble
//                                                  first) or value + 128 (8-bit)
//          2 scales  float [N · blocks]            MatMulNBits' scales
// Output   0 y       float [..., N]
//
// Why: a prompt's many rows. With AVX-512 VNNI each block's sums for 8 rows x 32 columns come from vpdpbusd over
// weights repacked once (on the first call, kept by the kernel) into 16-column groups of 4-byte k-quads; ONNX
// Runtime's own many-row path is slower on such CPUs. Elsewhere a portable loop computes the same numbers, slowly.
// A row's numbers depend on nothing but the row: per output column, acc = fma(float(sum_b), scale_x · scale_w, acc)
// over the blocks in order from zero, on every path and in any tile. Built with -ffp-contract=off, as the library.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
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
constexpr int kTileRows = 8;
constexpr int64_t kInlineBelow = int64_t(1) << 20;  // multiply-adds under which one thread does it all

// W in the layout the kernels read, built once from the inputs: [pair][block][2 groups][8 quads][16 columns][4]
// signed values, the scales [pair][block][2][16] and -128 · each block's value sum (x is fed as u8 = q + 128),
// columns padded with zeros to whole pairs of groups
struct Packed {
  const void* codes = nullptr;  // the inputs it was built from
  const void* scales = nullptr;
  int64_t n = 0, k = 0, blocks = 0, pairs = 0;
  std::vector<int8_t> values;
  std::vector<float> block_scales;
  std::vector<int32_t> neg_sums;
};

void pack(Packed& p, const uint8_t* codes, const float* scales, int64_t n, int64_t blocks, int bits) {
  p.n = n, p.blocks = blocks, p.k = blocks * kBlock, p.pairs = (n + 2 * kGroup - 1) / (2 * kGroup);
  p.values.assign(size_t(p.pairs * blocks * 2 * kGroup * kBlock), 0);
  p.block_scales.assign(size_t(p.pairs * blocks * 2 * kGroup), 0.0f);
  p.neg_sums.assign(size_t(p.pairs * blocks * 2 * kGroup), 0);
  const int64_t blob = kBlock * bits / 8;
  for (int64_t col = 0; col < n; ++col) {
    const int64_t pair = col / (2 * kGroup), half = (col / kGroup) % 2, c = col % kGroup;
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* code = codes + (col * blocks + b) * blob;
      const size_t unit = size_t((pair * blocks + b) * 2 + half);
      int32_t sum = 0;
      for (int64_t i = 0; i < kBlock; ++i) {
        const int v = bits == 8 ? int(code[i]) - 128 : int((code[i / 2] >> (4 * (i % 2))) & 0x0f) - 8;
        p.values[unit * kGroup * kBlock + size_t((i / 4) * kGroup * 4 + c * 4 + i % 4)] = int8_t(v);
        sum += v;
      }
      p.neg_sums[unit * kGroup + size_t(c)] = -128 * sum;
      p.block_scales[unit * kGroup + size_t(c)] = scales[col * blocks + b];
    }
  }
}

// x's rows as u8 (q + 128) with a scale per block: q = round-to-nearest-even(x · (1 / scale)), scale = max|x| / 127
// (the AVX-512 loop computes the same numbers: max is exact, one rounding per product, the same rounding rule)
void quantize_rows(const float* x, int64_t rows, int64_t k, uint8_t* q, float* scales) {
  const int64_t blocks = k / kBlock;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      const float* v = x + r * k + b * kBlock;
      uint8_t* out = q + r * k + b * kBlock;
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
      const __m512i offset = _mm512_set1_epi32(128);
      const auto code = [&](__m512 part) {
        return _mm512_cvtepi32_epi8(_mm512_add_epi32(
            _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(part, s), _MM_FROUND_TO_NEAREST_INT)), offset));
      };
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out), code(lo));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16), code(hi));
#else
      for (int64_t i = 0; i < kBlock; ++i) out[i] = uint8_t(int(std::nearbyint(v[i] * inverse)) + 128);
#endif
    }
}

struct Problem {
  const Packed* w;
  int64_t rows;
  const uint8_t* q;   // [rows, k]
  const float* qs;    // [rows, blocks]
  float* out;         // [rows, n]
  CallerMode mode;
};

// columns [32 · pair, + 32) of R rows from r0, through a 32-float staging row (the last pair may be partial)
inline void store_pair(const Problem& p, int64_t r, int64_t pair, const float* lanes) {
  const int64_t c0 = pair * 2 * kGroup, width = std::min<int64_t>(2 * kGroup, p.w->n - c0);
  std::memcpy(p.out + r * p.w->n + c0, lanes, sizeof(float) * size_t(width));
}

#if defined(__AVX512VNNI__) && defined(__AVX512F__)
template <int R>
void tile(const Problem& p, int64_t r0, int64_t pair) {
  const Packed& w = *p.w;
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t b = 0; b < w.blocks; ++b) {
    const size_t unit = size_t((pair * w.blocks + b) * 2);
    const int8_t* v0 = w.values.data() + unit * kGroup * kBlock;
    const int8_t* v1 = v0 + kGroup * kBlock;
    const __m512i n0 = _mm512_loadu_si512(w.neg_sums.data() + unit * kGroup);
    const __m512i n1 = _mm512_loadu_si512(w.neg_sums.data() + (unit + 1) * kGroup);
    const __m512 s0 = _mm512_loadu_ps(w.block_scales.data() + unit * kGroup);
    const __m512 s1 = _mm512_loadu_ps(w.block_scales.data() + (unit + 1) * kGroup);
    for (int r = 0; r < R; ++r) {
      const uint8_t* a = p.q + (r0 + r) * w.k + b * kBlock;
      __m512i i0 = n0, i1 = n1;
      for (int j = 0; j < 8; ++j) {
        int32_t quad;
        std::memcpy(&quad, a + 4 * j, 4);
        const __m512i x = _mm512_set1_epi32(quad);
        i0 = _mm512_dpbusd_epi32(i0, x, _mm512_loadu_si512(v0 + 64 * j));
        i1 = _mm512_dpbusd_epi32(i1, x, _mm512_loadu_si512(v1 + 64 * j));
      }
      const __m512 sx = _mm512_set1_ps(p.qs[(r0 + r) * w.blocks + b]);
      acc[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i0), _mm512_mul_ps(s0, sx), acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i1), _mm512_mul_ps(s1, sx), acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float lanes[2 * kGroup];
    _mm512_storeu_ps(lanes, acc[r][0]);
    _mm512_storeu_ps(lanes + kGroup, acc[r][1]);
    store_pair(p, r0 + r, pair, lanes);
  }
}
#else
// the same numbers, one row at a time: integer sums exact, then fma(float(sum), scale_w · scale_x, acc)
template <int R>
void tile(const Problem& p, int64_t r0, int64_t pair) {
  const Packed& w = *p.w;
  for (int r = 0; r < R; ++r) {
    float acc[2 * kGroup] = {};
    for (int64_t b = 0; b < w.blocks; ++b) {
      const size_t unit = size_t((pair * w.blocks + b) * 2);
      const uint8_t* a = p.q + (r0 + r) * w.k + b * kBlock;
      const float sx = p.qs[(r0 + r) * w.blocks + b];
      for (int c = 0; c < 2 * kGroup; ++c) {
        const size_t u = unit + size_t(c / kGroup), lane = size_t(c % kGroup);
        const int8_t* v = w.values.data() + u * kGroup * kBlock;
        int32_t sum = w.neg_sums[u * kGroup + lane];
        for (int i = 0; i < kBlock; ++i) sum += int32_t(a[i]) * int32_t(v[(i / 4) * kGroup * 4 + lane * 4 + i % 4]);
        acc[c] = std::fma(float(sum), w.block_scales[u * kGroup + lane] * sx, acc[c]);
      }
    }
    store_pair(p, r0 + r, pair, acc);
  }
}
#endif

void run_unit(const Problem& p, size_t pair) {
  int64_t r = 0;
  for (; r + kTileRows <= p.rows; r += kTileRows) tile<kTileRows>(p, r, int64_t(pair));
  for (; r < p.rows; ++r) tile<1>(p, r, int64_t(pair));
}

struct Kernel {
  std::mutex lock;  // guards `packed` while it is (re)built
  std::shared_ptr<const Packed> packed;
};

std::shared_ptr<const Packed> packed_weights(Kernel& kernel, const TensorView& codes, const TensorView& scales,
                                             int64_t n, int64_t blocks, int bits) {
  std::lock_guard<std::mutex> guard(kernel.lock);
  if (!kernel.packed || kernel.packed->codes != codes.data || kernel.packed->scales != scales.data ||
      kernel.packed->n != n || kernel.packed->blocks != blocks) {
    auto p = std::make_shared<Packed>();
    pack(*p, static_cast<const uint8_t*>(codes.data), static_cast<const float*>(scales.data), n, blocks, bits);
    p->codes = codes.data, p->scales = scales.data;
    kernel.packed = std::move(p);
  }
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
  std::vector<int64_t> out_shape(x.shape.begin(), x.shape.end() - 1);
  out_shape.push_back(n);
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < x.shape.size(); ++i) rows *= x.shape[i];
  float* out = output(context, 0, out_shape);
  if (rows == 0 || n == 0) return;

  const std::shared_ptr<const Packed> w = packed_weights(kernel, codes, scales, n, blocks, int(blob * 8 / kBlock));
  thread_local std::vector<uint8_t> q;
  thread_local std::vector<float> qs;
  q.resize(size_t(rows * k));
  qs.resize(size_t(rows * blocks));
  quantize_rows(static_cast<const float*>(x.data), rows, k, q.data(), qs.data());
  Problem p{w.get(), rows, q.data(), qs.data(), out, CallerMode{}};
  const size_t units = size_t(w->pairs);
  if (units == 1 || rows * n * k < kInlineBelow) {  // small: the calling thread, the same arithmetic
    for (size_t unit = 0; unit < units; ++unit) run_unit(p, unit);
    return;
  }
  parallel_for(context, units, p.mode, [&p](size_t unit) { run_unit(p, unit); });
}

OrtStatus* create_kernel(const OrtCustomOp*, const OrtApi* api, const OrtKernelInfo* info, void** kernel) noexcept {
  if (g_api == nullptr) g_api = api;
  return guarded(kOpName, [&] {
    size_t inputs = 0;
    check(api->KernelInfo_GetInputCount(info, &inputs));
    if (inputs != kInputCount) throw OpError("expects 3 inputs, got " + std::to_string(inputs));
    *kernel = new Kernel{};
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
