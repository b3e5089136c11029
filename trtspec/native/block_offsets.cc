// AddBlockOffsets (domain com.trtspec, CPU, float32): the part of an int4 product with a minimum per block (the
// `min` scheme, llama.cpp's Q4_1) that MatMulNBits does not compute, added to its output in one op.
//
// Inputs   0 product  float [..., N]        MatMulNBits' x · ((u - 8) · d)^T
//          1 x        float [..., K]        the product's input (same leading dimensions), K = blocks · block_size
//          2 offsets  float16 [blocks, N]   o[b, n] = min[n, b] + 8 d[n, b], rounded to half
// Output   0 y        float [..., N]        product + sum_b blocksum_b(x) · offsets[b, :]
// block_size = K / blocks (a multiple of 16); blocksum_b(x) = x[b · block_size] + ... + x[(b + 1) · block_size - 1].
//
// It replaces three nodes a product (a MatMul with a 0 / 1 matrix for the block sums, a MatMul with float32 offsets,
// an Add), twelve a decoder layer; with it and the offsets in half precision SmolLM2-135M's min-scheme engine decodes
// 11-13% faster (README, "Block minima in one op").
//
// A row's numbers do not depend on the call's shape (so a slot of a verify step computes as a plain step): a block
// sum is 16-float partial sums over the block's chunks in order, then the 16 lanes added in one fixed tree; an
// output is the offsets' fused multiply-adds over the blocks in order, from zero, then the product added. Columns
// are split across threads in whole 16-float groups; the last group of a row whose N is not a multiple of 16 runs
// the same code on zero-padded copies. Built with -fno-fast-math -ffp-contract=off, as the library is.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "op_support.h"

namespace trtspec_ops {
namespace {

constexpr const char* kOpName = "AddBlockOffsets";
const char* const kInputNames[] = {"product", "x", "offsets"};
const ONNXTensorElementDataType kInputTypes[] = {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
                                                 ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16};
constexpr size_t kInputCount = sizeof(kInputTypes) / sizeof(kInputTypes[0]);
constexpr size_t kOutputCount = 1;
constexpr int64_t kColumnsPerUnit = 256;      // a work unit: 16 vectors of columns, every row (offsets stay in L1)
constexpr int64_t kInlineBelow = int64_t(1) << 18;  // multiply-adds under which one thread does it all

struct Problem {
  int64_t rows, n, blocks;
  const float* product;
  const float* sums;  // [rows, blocks]
  const uint16_t* offsets;  // halves
  float* out;
  CallerMode mode;
};

// Every output column's arithmetic: acc = 0; acc = fma(sum_b, offset[b, column], acc) for b in order; + product.
// Tiles of R rows x G 16-float groups run R x G of those chains side by side (independent fused multiply-adds, each
// offset vector converted once for the R rows); a column computes the same in any tile.
template <int R, int G>
inline void tile(const Problem& p, int64_t r0, int64_t c) {
  Vec acc[R][G];
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) acc[r][g] = Vec{};
  for (int64_t b = 0; b < p.blocks; ++b) {
    Vec o[G];
    for (int g = 0; g < G; ++g) o[g] = load_half(p.offsets + b * p.n + c + g * kWidth);
    for (int r = 0; r < R; ++r) {
      const Vec s = splat(p.sums[(r0 + r) * p.blocks + b]);
      for (int g = 0; g < G; ++g) acc[r][g] = fma(s, o[g], acc[r][g]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) {
      const int64_t at = (r0 + r) * p.n + c + g * kWidth;
      store(p.out + at, load(p.product + at) + acc[r][g]);
    }
}

// the last `width` (< 16) columns from c of row r, through zero-padded copies: the same chain as a tile's
void partial_group(const Problem& p, int64_t r, int64_t c, int width) {
  Vec acc{};
  uint16_t halves[kWidth];
  float lane[kWidth];
  for (int64_t b = 0; b < p.blocks; ++b) {
    std::memset(halves, 0, sizeof(halves));
    std::memcpy(halves, p.offsets + b * p.n + c, sizeof(uint16_t) * width);
    acc = fma(splat(p.sums[r * p.blocks + b]), load_half(halves), acc);
  }
  std::memset(lane, 0, sizeof(lane));
  std::memcpy(lane, p.product + r * p.n + c, sizeof(float) * width);
  store(lane, load(lane) + acc);
  std::memcpy(p.out + r * p.n + c, lane, sizeof(float) * width);
}

constexpr int kTileRows = 2;
constexpr int kTileGroups = 8;

template <int R>
void rows_of(const Problem& p, int64_t r0, int64_t begin, int64_t end) {
  int64_t c = begin;
  for (; c + kTileGroups * kWidth <= end; c += kTileGroups * kWidth) tile<R, kTileGroups>(p, r0, c);
  for (; c + kWidth <= end; c += kWidth) tile<R, 1>(p, r0, c);
  if (c < end)
    for (int r = 0; r < R; ++r) partial_group(p, r0 + r, c, int(end - c));
}

// columns [unit · kColumnsPerUnit, + kColumnsPerUnit) of every row
void run_unit(const Problem& p, size_t unit) {
  const int64_t begin = int64_t(unit) * kColumnsPerUnit, end = std::min(p.n, begin + kColumnsPerUnit);
  int64_t r = 0;
  for (; r + kTileRows <= p.rows; r += kTileRows) rows_of<kTileRows>(p, r, begin, end);
  for (; r < p.rows; ++r) rows_of<1>(p, r, begin, end);
}

void compute(OrtKernelContext* context) {
  expect_input_count(context, kInputCount);
  const TensorView product = input(context, 0, -1, kInputNames[0]), x = input(context, 1, -1, kInputNames[1]);
  const TensorView offsets = input(context, 2, 2, kInputNames[2]);
  for (size_t i = 0; i < kInputCount; ++i) {
    const TensorView* views[] = {&product, &x, &offsets};
    if (views[i]->type != kInputTypes[i])
      throw OpError(std::string("input ") + kInputNames[i] + " is not " + (i == 2 ? "float16" : "float32"));
  }
  if (product.shape.empty() || product.shape.size() != x.shape.size() ||
      !std::equal(product.shape.begin(), product.shape.end() - 1, x.shape.begin()))
    throw OpError("inputs product " + shape_text(product.shape) + " and x " + shape_text(x.shape) +
                  " must have the same leading dimensions");
  const int64_t n = product.shape.back(), k = x.shape.back(), blocks = offsets.shape[0];
  if (offsets.shape[1] != n)
    throw OpError("input offsets has shape " + shape_text(offsets.shape) + ", expected [blocks, " + std::to_string(n) +
                  "] (the product's columns)");
  if (blocks <= 0 || k % blocks != 0 || k / blocks == 0 || (k / blocks) % kWidth != 0)
    throw OpError("x's " + std::to_string(k) + " inputs are not " + std::to_string(blocks) +
                  " blocks of a multiple of " + std::to_string(kWidth));
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < product.shape.size(); ++i) rows *= product.shape[i];
  float* out = output(context, 0, product.shape);
  if (rows == 0 || n == 0) return;

  // the block sums of every row: 16-float partial sums over the block's chunks in order, then one fixed lane tree
  const int64_t block_size = k / blocks;
  const float* xs = static_cast<const float*>(x.data);
  thread_local std::vector<float> sums;  // reused call after call (the op runs 120 times a decode step)
  sums.resize(size_t(rows * blocks));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      const float* block = xs + r * k + b * block_size;
      Vec acc = load(block);
      for (int64_t i = kWidth; i < block_size; i += kWidth) acc = acc + load(block + i);
      sums[size_t(r * blocks + b)] = lane_sum(acc);
    }

  Problem p{rows, n, blocks, static_cast<const float*>(product.data), sums.data(),
            static_cast<const uint16_t*>(offsets.data), out, CallerMode{}};
  const size_t units = size_t((n + kColumnsPerUnit - 1) / kColumnsPerUnit);
  if (units == 1 || rows * n * blocks < kInlineBelow) {  // small: the calling thread, the same arithmetic
    for (size_t unit = 0; unit < units; ++unit) run_unit(p, unit);
    return;
  }
  parallel_for(context, units, p.mode, [&p](size_t unit) { run_unit(p, unit); });
}

struct Kernel {};  // no state: everything comes from the inputs

OrtStatus* create_kernel(const OrtCustomOp*, const OrtApi* api, const OrtKernelInfo* info, void** kernel) noexcept {
  if (g_api == nullptr) g_api = api;
  return guarded(kOpName, [&] {
    size_t inputs = 0;
    check(api->KernelInfo_GetInputCount(info, &inputs));
    if (inputs != kInputCount) throw OpError("expects 3 inputs, got " + std::to_string(inputs));
    *kernel = new Kernel{};
  });
}

OrtStatus* compute_kernel(void*, OrtKernelContext* context) noexcept {
  return guarded(kOpName, [&] { compute(context); });
}

void destroy_kernel(void* kernel) noexcept { delete static_cast<Kernel*>(kernel); }

const OpRecord g_record = make_record(kOpName, kInputTypes, kInputCount, kOutputCount, create_kernel, compute_kernel,
                                      destroy_kernel);

}  // namespace

const OrtCustomOp* add_block_offsets_op() { return &g_record.op; }

}  // namespace trtspec_ops
