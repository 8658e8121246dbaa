// The matmuls of the int4-bf16dot weight format (sbon/int4.py), for CPUs with AVX-512 BF16: its 4-bit Linear layers,
// and further down its 8-bit LM head.
//
// Why: torch's 4-bit CPU kernel widens every weight to float32 and multiplies with one FMA per weight and row, so
// beyond one row a decode step is bound by that arithmetic. Here a block of 32 weights (Q4_1: w = d q + m) is
//   sum_k a_k w_k = d * sum_k a_k (128 + q_k) + (m - 128 d) * sum_k a_k,
// where 128 + q_k is a bfloat16 whose bits are 0x4300 | q_k (an OR, no conversion), and the products with the
// bfloat16 activations go through VDPBF16PS: two weights per lane and instruction, twice the FMA's work. Each
// product is exact in float32; only the sums round.
//
// A row's numbers are its own: every row runs the same instructions in the same order whatever the row count, the
// thread count or the row's place in the batch (a block of ROWS rows only shares the weights it loads).
//
// Layouts (made by sbon.int4.pack_bf16dot):
//   packed  uint8 (N / 16, K * 8): per 16 output columns, per 4 inputs k = 4j..4j+3, 32 bytes; byte 2c + e holds
//           column c's q at k = 4j + e in its low nibble and at k = 4j + 2 + e in its high one;
//   scales  float16 (N / 16, K / 32 * 32): per 16 columns and block of 32 inputs, the 16 d, then the 16 m.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>
#include <torch/library.h>

#include <vector>

namespace {

constexpr int64_t GROUP = 32;  // inputs per block (a scale and a minimum each)
constexpr int MAX_ROWS = 8;    // rows that share one pass over the weights
// Every loop over rows and columns unrolled: the sums live in registers, indexed by constants.
#define UNROLL _Pragma("GCC unroll 16")

// A block of up to MAX_ROWS rows' activations pair by pair, the rows side by side (one pointer reaches every row's).
std::vector<int32_t> side_by_side(const at::Tensor& x) {
  const int64_t M = x.size(0), K = x.size(1);
  const int32_t* xs = reinterpret_cast<const int32_t*>(x.data_ptr<at::BFloat16>());
  std::vector<int32_t> pairs(M * K / 2);
  for (int64_t m = 0; m < M; m += MAX_ROWS) {
    const int64_t rows = std::min<int64_t>(MAX_ROWS, M - m);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < K / 2; ++k) pairs[m * K / 2 + k * rows + r] = xs[(m + r) * K / 2 + k];
  }
  return pairs;
}

// A tile's sums set to zero.
template <int ROWS, int COLS>
inline void zero(__m512 (&sums)[ROWS][COLS]) {
  UNROLL
  for (int r = 0; r < ROWS; ++r)
    UNROLL
    for (int c = 0; c < COLS; ++c) sums[r][c] = _mm512_setzero_ps();
}

// ROWS rows times COLS blocks of 16 columns: each (row, column) sums in its own register, so that enough sums are
// in flight to hide VDPBF16PS's latency at one row; which (ROWS, COLS) runs never changes a sum's order.
template <int ROWS, int COLS>
void tile(const uint8_t* w, const at::Half* scales, int64_t block_stride, const int32_t* a, const float* sums,
          int64_t groups, at::BFloat16* out, int64_t out_stride) {
  const __m512i nibble = _mm512_set1_epi16(0x000F);
  const __m512i bias = _mm512_set1_epi16(0x4300);  // bfloat16 128: | q gives 128 + q for q in 0..15
  const __m512 k128 = _mm512_set1_ps(128.0f);
  __m512 block[ROWS][COLS], total[ROWS][COLS];
  zero(total);
  for (int64_t g = 0; g < groups; ++g) {
    zero(block);
    const int32_t* pairs = a + g * (GROUP / 2) * ROWS;  // the rows' activations, two bfloat16 per int32
#pragma GCC unroll 8
    for (int j = 0; j < GROUP / 4; ++j) {
      UNROLL
      for (int c = 0; c < COLS; ++c) {
        const uint8_t* wj = w + c * block_stride + (g * (GROUP / 4) + j) * 32;
        __m512i bytes = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wj)));
        __m512i low = _mm512_ternarylogic_epi32(bytes, nibble, bias, 0xEA);  // (bytes & 0xF) | bias
        __m512i high = _mm512_or_si512(_mm512_srli_epi16(bytes, 4), bias);
        UNROLL
        for (int r = 0; r < ROWS; ++r) {
          block[r][c] = _mm512_dpbf16_ps(block[r][c], (__m512bh)_mm512_set1_epi32(pairs[2 * j * ROWS + r]),
                                         (__m512bh)low);
          block[r][c] = _mm512_dpbf16_ps(block[r][c], (__m512bh)_mm512_set1_epi32(pairs[(2 * j + 1) * ROWS + r]),
                                         (__m512bh)high);
        }
      }
    }
    UNROLL
    for (int c = 0; c < COLS; ++c) {
      // d and m as the file has them (float16); m - 128 d in float32
      const at::Half* dm = scales + c * (block_stride / 8) + g * 32;
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dm)));
      const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dm + 16)));
      const __m512 offset = _mm512_fnmadd_ps(k128, d, m);
      UNROLL
      for (int r = 0; r < ROWS; ++r) {
        total[r][c] = _mm512_fmadd_ps(d, block[r][c], total[r][c]);
        total[r][c] = _mm512_fmadd_ps(offset, _mm512_set1_ps(sums[g * ROWS + r]), total[r][c]);
      }
    }
  }
  UNROLL
  for (int r = 0; r < ROWS; ++r)
    UNROLL
    for (int c = 0; c < COLS; ++c)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * out_stride + c * 16),
                          (__m256i)_mm512_cvtneps_pbh(total[r][c]));
}

using Tile = void (*)(const uint8_t*, const at::Half*, int64_t, const int32_t*, const float*, int64_t, at::BFloat16*,
                      int64_t);
// By rows, the widest tile: at least four sums in flight, within the 32 registers.
constexpr int WIDEST[MAX_ROWS + 1] = {0, 4, 4, 2, 2, 1, 1, 1, 1};
// A kernel's tiles by rows (1..MAX_ROWS), then 1, 2 or 4 column blocks: those up to the rows' WIDEST, the only ones
// for_each_tile picks (no tile is made that would never run).
#define UP_TO_4(f, R) {f<R, 1>, f<R, 2>, f<R, 4>}
#define UP_TO_2(f, R) {f<R, 1>, f<R, 2>, nullptr}
#define ONLY_1(f, R) {f<R, 1>, nullptr, nullptr}
#define ALL_TILES(f) \
  {UP_TO_4(f, 1), UP_TO_4(f, 2), UP_TO_2(f, 3), UP_TO_2(f, 4), ONLY_1(f, 5), ONLY_1(f, 6), ONLY_1(f, 7), ONLY_1(f, 8)}

// Whether a table has a tile exactly where WIDEST allows one.
template <typename T>
constexpr bool follows_widest(const T (&tiles)[MAX_ROWS][3]) {
  for (int r = 1; r <= MAX_ROWS; ++r)
    for (int w = 0; w < 3; ++w)
      if (((1 << w) <= WIDEST[r]) != (tiles[r - 1][w] != nullptr)) return false;
  return true;
}
constexpr Tile TILES[MAX_ROWS][3] = ALL_TILES(tile);
static_assert(follows_widest(TILES), "a tile for every width for_each_tile picks, and none else");

// Every tile of an M x (blocks x 16) product, the column blocks split over torch's threads, each thread's in tiles
// of up to MAX_ROWS rows and the widest column blocks that fit its share: run(rows, width index, first row, first
// column block).
template <typename Run>
void for_each_tile(int64_t M, int64_t blocks, const Run& run) {
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t m = 0; m < M; m += MAX_ROWS) {
      const int64_t rows = std::min<int64_t>(MAX_ROWS, M - m);
      for (int64_t n = begin; n < end;) {
        int cols = WIDEST[rows];
        while (n + cols > end) cols /= 2;
        run(rows, cols == 1 ? 0 : cols == 2 ? 1 : 2, m, n);
        n += cols;
      }
    }
  });
}

at::Tensor int4_mm_bf16dot(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.is_contiguous(),
              "int4_mm_bf16dot: x must be a contiguous 2-D bfloat16 tensor");
  const int64_t M = x.size(0), K = x.size(1), blocks = packed.size(0), N = blocks * 16, groups = K / GROUP;
  TORCH_CHECK(K % GROUP == 0 && packed.scalar_type() == at::kByte && packed.is_contiguous() &&
                  packed.size(1) == K * 8,
              "int4_mm_bf16dot: packed must be contiguous uint8 (N / 16, K * 8)");
  TORCH_CHECK(scales.scalar_type() == at::kHalf && scales.is_contiguous() && scales.size(0) == blocks &&
                  scales.size(1) == groups * 32,
              "int4_mm_bf16dot: scales must be contiguous float16 (N / 16, K / 32 * 32)");
  at::Tensor out = at::empty({M, N}, x.options());
  // Each group's sum of a row's activations, summed in one fixed order per row, the rows side by side as their
  // activations (side_by_side).
  const std::vector<int32_t> pairs_v = side_by_side(x);
  std::vector<float> sums_v(M * groups);
  const at::BFloat16* xs = x.data_ptr<at::BFloat16>();
  const int32_t* pairs = pairs_v.data();
  float* sums = sums_v.data();
  for (int64_t m = 0; m < M; m += MAX_ROWS) {
    const int64_t rows = std::min<int64_t>(MAX_ROWS, M - m);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < groups; ++g) {
        const auto* p = reinterpret_cast<const __m256i*>(xs + (m + r) * K + g * GROUP);
        sums[m * groups + g * rows + r] = _mm512_reduce_add_ps(
            _mm512_add_ps(_mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256(p)),
                          _mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256(p + 1))));
      }
  }
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const at::Half* s = scales.data_ptr<at::Half>();
  at::BFloat16* o = out.data_ptr<at::BFloat16>();
  for_each_tile(M, blocks, [&](int64_t rows, int width, int64_t m, int64_t n) {
    TILES[rows - 1][width](w + n * K * 8, s + n * groups * 32, K * 8, pairs + m * K / 2, sums + m * groups, groups,
                           o + m * N + n * 16, N);
  });
  return out;
}

// The LM head of the same format: a GGUF file's 8-bit blocks (Q8_0: w = d q, q in -128..127, one d per 32 inputs),
// q widened to bfloat16 (exact) and multiplied as above; float32 logits out. Layouts (sbon.int4.pack_q8_bf16dot):
//   packed  int8 (N / 16, K * 16): per 16 columns and 2 inputs k = 2p, 2p + 1, 32 bytes; byte 2c + e is column c's
//           q at k = 2p + e;
//   scales  float16 (N / 16, K / 32 * 16): per 16 columns and block of 32 inputs, the 16 d.
template <int ROWS, int COLS>
void tile8(const int8_t* w, const at::Half* scales, int64_t block_stride, const int32_t* a, int64_t groups,
           float* out, int64_t out_stride) {
  __m512 block[ROWS][COLS], total[ROWS][COLS];
  zero(total);
  for (int64_t g = 0; g < groups; ++g) {
    zero(block);
    const int32_t* pairs = a + g * (GROUP / 2) * ROWS;
#pragma GCC unroll 4
    for (int p = 0; p < GROUP / 2; ++p) {
      UNROLL
      for (int c = 0; c < COLS; ++c) {
        const int8_t* wp = w + c * block_stride + (g * (GROUP / 2) + p) * 32;
        const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wp))));
        const __m512 hi =
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wp + 16))));
        const __m512bh q = _mm512_cvtne2ps_pbh(hi, lo);  // exact: |q| <= 128
        UNROLL
        for (int r = 0; r < ROWS; ++r)
          block[r][c] = _mm512_dpbf16_ps(block[r][c], (__m512bh)_mm512_set1_epi32(pairs[p * ROWS + r]), q);
      }
    }
    UNROLL
    for (int c = 0; c < COLS; ++c) {
      const __m512 d = _mm512_cvtph_ps(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + c * (block_stride / 32) + g * 16)));
      UNROLL
      for (int r = 0; r < ROWS; ++r) total[r][c] = _mm512_fmadd_ps(d, block[r][c], total[r][c]);
    }
  }
  UNROLL
  for (int r = 0; r < ROWS; ++r)
    UNROLL
    for (int c = 0; c < COLS; ++c) _mm512_storeu_ps(out + r * out_stride + c * 16, total[r][c]);
}

using Tile8 = void (*)(const int8_t*, const at::Half*, int64_t, const int32_t*, int64_t, float*, int64_t);
constexpr Tile8 TILES8[MAX_ROWS][3] = ALL_TILES(tile8);
static_assert(follows_widest(TILES8), "a tile for every width for_each_tile picks, and none else");

at::Tensor int8_mm_bf16dot(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.is_contiguous(),
              "int8_mm_bf16dot: x must be a contiguous 2-D bfloat16 tensor");
  const int64_t M = x.size(0), K = x.size(1), blocks = packed.size(0), N = blocks * 16, groups = K / GROUP;
  TORCH_CHECK(K % GROUP == 0 && packed.scalar_type() == at::kChar && packed.is_contiguous() &&
                  packed.size(1) == K * 16,
              "int8_mm_bf16dot: packed must be contiguous int8 (N / 16, K * 16)");
  TORCH_CHECK(scales.scalar_type() == at::kHalf && scales.is_contiguous() && scales.size(0) == blocks &&
                  scales.size(1) == groups * 16,
              "int8_mm_bf16dot: scales must be contiguous float16 (N / 16, K / 32 * 16)");
  at::Tensor out = at::empty({M, N}, x.options().dtype(at::kFloat));
  const std::vector<int32_t> pairs = side_by_side(x);
  const int8_t* w = packed.data_ptr<int8_t>();
  const at::Half* s = scales.data_ptr<at::Half>();
  float* o = out.data_ptr<float>();
  for_each_tile(M, blocks, [&](int64_t rows, int width, int64_t m, int64_t n) {
    TILES8[rows - 1][width](w + n * K * 16, s + n * groups * 16, K * 16, pairs.data() + m * K / 2, groups,
                            o + m * N + n * 16, N);
  });
  return out;
}

}  // namespace

// The schema is defined in sbon/int4.py (with the shape function torch.compile traces it with).
TORCH_LIBRARY_IMPL(sbon, CPU, m) {
  m.impl("int4_mm_bf16dot", &int4_mm_bf16dot);
  m.impl("int8_mm_bf16dot", &int8_mm_bf16dot);
}
