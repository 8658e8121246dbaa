// The matmuls of the int4-fma weight format (sbon/int4.py), for CPUs with AVX2 and FMA but no bfloat16 dot
// products: its 4-bit Linear layers, and further down its 8-bit LM head, both with float32 activations.
//
// Why: torch's 4-bit CPU kernel takes bfloat16 activations only, and on a CPU without bfloat16 instructions its
// conversions and one FMA per weight and row bound a decode step of several rows; float32 weights read eight times
// the bytes. Here each weight is widened once per pass (w = d q + m for Q4_1, w = d q for Q8_0, one rounding) and
// multiplied by every row's float32 activation with one FMA per row: a float32 matmul with the dequantized weights.
//
// A row's numbers are its own: each (row, column) sums its products in one register, input by input in order, so
// every row runs the same operations in the same order whatever the row count, the thread count or the row's place
// in the batch (a tile of ROWS rows only shares the weights it widens).
//
// Layouts (made by sbon.int4.pack_fma and pack_q8_fma):
//   4-bit   packed  int32 (N / 8, K): per 8 output columns and input k, one word; column c's q in bits 4c..4c+3;
//           scales  float16 (N / 8, K / 32 * 16): per 8 columns and block of 32 inputs, the 8 d, then the 8 m;
//   8-bit   packed  int8 (N / 8, K * 8): per 8 columns and input k, 8 bytes, column c's q in byte c;
//           scales  float16 (N / 8, K / 32 * 8): per 8 columns and block of 32 inputs, the 8 d.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>
#include <torch/library.h>

namespace {

constexpr int64_t GROUP = 32;  // inputs per block (a scale, and for Q4_1 a minimum, each)
constexpr int64_t COLUMNS = 8;  // output columns per vector
constexpr int MAX_ROWS = 8;     // rows that share one widening of the weights (within the 16 vector registers)
#define UNROLL _Pragma("GCC unroll 16")

// 8 columns' Q4_1 weights at one input, widened: d q + m.
struct Q4 {
  static constexpr int64_t SCALES = 16;  // float16 per 8 columns and block: d, then m
  using Word = int32_t;
  static constexpr int64_t WORDS = 1;  // per 8 columns and input
  __m256 d, m;
  inline void block(const at::Half* s) {
    d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
    m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 8)));
  }
  inline __m256 widen(const Word* w) const {
    const __m256i q = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(*w), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                       _mm256_set1_epi32(0xF));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), d, m);
  }
};

// 8 columns' Q8_0 weights at one input, widened: d q.
struct Q8 {
  static constexpr int64_t SCALES = 8;
  using Word = int8_t;
  static constexpr int64_t WORDS = 8;
  __m256 d;
  inline void block(const at::Half* s) { d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s))); }
  inline __m256 widen(const Word* w) const {
    const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w)));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(q), d);
  }
};

// ROWS rows times COLS blocks of 8 columns, each (row, column) summing in its own register.
template <typename Q, int ROWS, int COLS>
void tile(const typename Q::Word* w, const at::Half* scales, int64_t K, const float* x, float* out,
          int64_t out_stride) {
  const int64_t groups = K / GROUP;
  __m256 sums[ROWS][COLS];
  UNROLL
  for (int r = 0; r < ROWS; ++r)
    UNROLL
    for (int c = 0; c < COLS; ++c) sums[r][c] = _mm256_setzero_ps();
  Q q[COLS];
  for (int64_t g = 0; g < groups; ++g) {
    UNROLL
    for (int c = 0; c < COLS; ++c) q[c].block(scales + c * groups * Q::SCALES + g * Q::SCALES);
#pragma GCC unroll 4
    for (int64_t k = g * GROUP; k < (g + 1) * GROUP; ++k) {
      UNROLL
      for (int c = 0; c < COLS; ++c) {
        const __m256 wk = q[c].widen(w + (c * K + k) * Q::WORDS);
        UNROLL
        for (int r = 0; r < ROWS; ++r) sums[r][c] = _mm256_fmadd_ps(_mm256_broadcast_ss(x + r * K + k), wk, sums[r][c]);
      }
    }
  }
  UNROLL
  for (int r = 0; r < ROWS; ++r)
    UNROLL
    for (int c = 0; c < COLS; ++c) _mm256_storeu_ps(out + r * out_stride + c * COLUMNS, sums[r][c]);
}

template <typename Q>
using Tile = void (*)(const typename Q::Word*, const at::Half*, int64_t, const float*, float*, int64_t);
// By rows, the widest tile within the registers: ROWS x COLS sums, COLS widened weights, a broadcast activation.
constexpr int WIDEST[MAX_ROWS + 1] = {0, 4, 2, 2, 2, 1, 1, 1, 1};
template <typename Q>
constexpr Tile<Q> TILES[MAX_ROWS][3] = {{tile<Q, 1, 1>, tile<Q, 1, 2>, tile<Q, 1, 4>},
                                        {tile<Q, 2, 1>, tile<Q, 2, 2>, nullptr},
                                        {tile<Q, 3, 1>, tile<Q, 3, 2>, nullptr},
                                        {tile<Q, 4, 1>, tile<Q, 4, 2>, nullptr},
                                        {tile<Q, 5, 1>, nullptr, nullptr},
                                        {tile<Q, 6, 1>, nullptr, nullptr},
                                        {tile<Q, 7, 1>, nullptr, nullptr},
                                        {tile<Q, 8, 1>, nullptr, nullptr}};

// x (M, K) float32 times the packed weights: (M, N) float32. The column blocks are split over torch's threads, each
// thread's share in tiles of up to MAX_ROWS rows and the widest column blocks that fit it.
template <typename Q>
at::Tensor mm(const char* name, const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
              at::ScalarType word) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(),
              name, ": x must be a contiguous 2-D float32 tensor");
  const int64_t M = x.size(0), K = x.size(1), blocks = packed.size(0), N = blocks * COLUMNS;
  TORCH_CHECK(K % GROUP == 0 && packed.scalar_type() == word && packed.is_contiguous() &&
                  packed.size(1) == K * Q::WORDS,
              name, ": packed does not have the kernel's layout for K = ", K);
  TORCH_CHECK(scales.scalar_type() == at::kHalf && scales.is_contiguous() && scales.size(0) == blocks &&
                  scales.size(1) == K / GROUP * Q::SCALES,
              name, ": scales do not have the kernel's layout for K = ", K);
  at::Tensor out = at::empty({M, N}, x.options());
  const auto* w = reinterpret_cast<const typename Q::Word*>(packed.data_ptr());
  const at::Half* s = scales.data_ptr<at::Half>();
  const float* xs = x.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t m = 0; m < M; m += MAX_ROWS) {
      const int64_t rows = std::min<int64_t>(MAX_ROWS, M - m);
      for (int64_t n = begin; n < end;) {
        int cols = WIDEST[rows];
        while (n + cols > end) cols /= 2;
        TILES<Q>[rows - 1][cols == 1 ? 0 : cols == 2 ? 1 : 2](w + n * K * Q::WORDS, s + n * (K / GROUP) * Q::SCALES, K,
                                                               xs + m * K, o + m * N + n * COLUMNS, N);
        n += cols;
      }
    }
  });
  return out;
}

at::Tensor int4_mm_fma(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales) {
  return mm<Q4>("int4_mm_fma", x, packed, scales, at::kInt);
}

at::Tensor int8_mm_fma(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales) {
  return mm<Q8>("int8_mm_fma", x, packed, scales, at::kChar);
}

}  // namespace

// The schema is defined in sbon/int4.py (with the shape function torch.compile traces it with).
TORCH_LIBRARY_IMPL(sbon, CPU, m) {
  m.impl("int4_mm_fma", &int4_mm_fma);
  m.impl("int8_mm_fma", &int8_mm_fma);
}
