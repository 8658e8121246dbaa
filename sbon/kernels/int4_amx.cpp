// The matmuls of the int4-amx weight format (sbon/int4.py), for CPUs with AMX: its 4-bit Linear layers, and further
// down its 8-bit LM head. The same blocks, layouts and sums as int4_bf16dot.cpp, multiplied on the AMX tile unit.
//
// Why: int4_bf16dot.cpp's VDPBF16PS spends one instruction per row and 32 products, so each row a step decodes adds
// its arithmetic; one AMX TDPBF16PS multiplies up to 16 rows by a block of 32 inputs and 16 columns at once, so a
// step of 7 or 16 rows costs little more than one of a single row: reading the weights.
// Per block of 32 inputs (Q4_1: w = d q + m), as int4_bf16dot.cpp:
//   sum_k a_k w_k = d * sum_k a_k (128 + q_k) + (m - 128 d) * sum_k a_k,
// 128 + q_k a bfloat16 made with an OR, the products exact in float32 and summed by the tile unit, then scaled per
// row with two FMAs.
//
// A row's numbers are its own: the tile unit computes each row of its result from that row of A alone, every row
// runs the same instructions in the same order whatever the row count or its place in the batch, and the per-row
// scaling is the same FMAs in the same order.
//
// Layouts (made by sbon.int4.pack_bf16dot and pack_q8_bf16dot, as int4_bf16dot.cpp's): the 32 bytes of 4 inputs
// k = 4j..4j+3 widened to 16-bit words are, OR-ed with 0x4300, the tile unit's rows of input pairs (4j, 4j+1)
// (low nibbles) and (4j + 2, 4j + 3) (high ones) for 16 columns, as its B operand takes them.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>
#include <torch/library.h>

#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <vector>

namespace {

constexpr int64_t GROUP = 32;  // inputs per block, and the depth of one tile product in bfloat16
constexpr int MAX_ROWS = 16;   // rows of one tile
constexpr int COLS = 4;        // blocks of 16 columns whose float32 totals one pass keeps (in `totals`)

// Linux lends a process the tile registers' state only once asked (ARCH_REQ_XCOMP_PERM for XTILEDATA), once.
bool tiles_permitted() {
  static const bool permitted = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return permitted;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// The three tiles a pass uses, each 64 bytes wide: C, one block of 16 columns' sums (rows x 16 float32); A, the rows'
// activations for a block of inputs (rows x 32 bfloat16); B, one block of 16 columns' weights (16 input pairs x 16
// columns x 2 bfloat16). Macros, not constants: the tile intrinsics paste their register numbers into the assembly.
#define TILE_C 0
#define TILE_A 1
#define TILE_B 2
void configure(int rows) {
  TileConfig cfg;
  for (int t : {TILE_C, TILE_A, TILE_B}) {
    cfg.rows[t] = t == TILE_B ? 16 : rows;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

// Each row's sum of its activations per block of inputs, in one fixed order per row: sums[r * groups + g].
void block_sums(const at::BFloat16* x, int64_t rows, int64_t K, float* sums) {
  const int64_t groups = K / GROUP;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const auto* p = reinterpret_cast<const __m256i*>(x + r * K + g * GROUP);
      sums[r * groups + g] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256(p)),
                                                                _mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256(p + 1))));
    }
}

// B for one block of 32 inputs and 16 columns of the 4-bit layout: 16 rows of 64 bytes.
inline void unpack4(const uint8_t* w, uint16_t* b) {
  const __m512i nibble = _mm512_set1_epi16(0x000F);
  const __m512i bias = _mm512_set1_epi16(0x4300);  // bfloat16 128: | q gives 128 + q for q in 0..15
#pragma GCC unroll 8
  for (int j = 0; j < GROUP / 4; ++j) {
    __m512i bytes = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + j * 32)));
    _mm512_store_si512(b + (2 * j) * 32, _mm512_ternarylogic_epi32(bytes, nibble, bias, 0xEA));
    _mm512_store_si512(b + (2 * j + 1) * 32, _mm512_or_si512(_mm512_srli_epi16(bytes, 4), bias));
  }
}

// B for one block of 32 inputs and 16 columns of the 8-bit layout, q widened to bfloat16 (exact: |q| <= 128).
inline void unpack8(const int8_t* w, uint16_t* b) {
#pragma GCC unroll 4
  for (int p = 0; p < GROUP / 2; ++p) {
    const int8_t* wp = w + p * 32;
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wp))));
    const __m512 hi =
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wp + 16))));
    _mm512_store_si512(b + p * 32, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
  }
}

// The product of `rows` rows (x, row stride K) and `cols` (1..COLS) blocks of 16 columns starting at the weights
// w / scales of its first block, into float32 totals (rows x cols x 16, row stride COLS * 16). EIGHT: the 8-bit
// layout (w = d q), else the 4-bit one.
template <bool EIGHT>
void pass(const at::BFloat16* x, int64_t K, int rows, const void* w, const at::Half* scales, int64_t block_stride,
          int cols, const float* sums, float* totals) {
  const int64_t groups = K / GROUP;
  alignas(64) uint16_t b[16 * 32];
  alignas(64) float c[MAX_ROWS * 16];
  std::memset(totals, 0, sizeof(float) * MAX_ROWS * COLS * 16);
  const __m512 k128 = _mm512_set1_ps(128.0f);
  for (int64_t g = 0; g < groups; ++g) {
    _tile_loadd(TILE_A, x + g * GROUP, K * 2);
    for (int cb = 0; cb < cols; ++cb) {
      const at::Half* dm;
      if constexpr (EIGHT) {
        unpack8(static_cast<const int8_t*>(w) + cb * block_stride + g * (GROUP / 2) * 32, b);
        dm = scales + cb * (block_stride / 32) + g * 16;
      } else {
        unpack4(static_cast<const uint8_t*>(w) + cb * block_stride + g * (GROUP / 4) * 32, b);
        dm = scales + cb * (block_stride / 8) + g * 32;
      }
      _tile_loadd(TILE_B, b, 64);
      _tile_zero(TILE_C);
      _tile_dpbf16ps(TILE_C, TILE_A, TILE_B);
      _tile_stored(TILE_C, c, 64);
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dm)));
      float* t = totals + cb * 16;
      if constexpr (EIGHT) {
        for (int r = 0; r < rows; ++r)
          _mm512_store_ps(t + r * COLS * 16, _mm512_fmadd_ps(d, _mm512_load_ps(c + r * 16),
                                                             _mm512_load_ps(t + r * COLS * 16)));
      } else {
        const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dm + 16)));
        const __m512 offset = _mm512_fnmadd_ps(k128, d, m);
        for (int r = 0; r < rows; ++r) {
          __m512 total = _mm512_fmadd_ps(d, _mm512_load_ps(c + r * 16), _mm512_load_ps(t + r * COLS * 16));
          total = _mm512_fmadd_ps(offset, _mm512_set1_ps(sums[r * groups + g]), total);
          _mm512_store_ps(t + r * COLS * 16, total);
        }
      }
    }
  }
}

// Every pass of an M x (blocks x 16) product: the column blocks split over torch's threads, each thread's in tiles of
// up to MAX_ROWS rows and COLS column blocks. store(row, first row, first column block, cols, totals).
template <bool EIGHT, typename Store>
void product(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales, int64_t block_stride,
             const Store& store) {
  const int64_t M = x.size(0), K = x.size(1), blocks = packed.size(0), groups = K / GROUP;
  const char* op = EIGHT ? "int8_mm_amx" : "int4_mm_amx";
  TORCH_CHECK(K % GROUP == 0 && packed.scalar_type() == (EIGHT ? at::kChar : at::kByte) && packed.is_contiguous() &&
                  packed.size(1) == block_stride,
              op, ": packed must be contiguous ", EIGHT ? "int8 (N / 16, K * 16)" : "uint8 (N / 16, K * 8)");
  TORCH_CHECK(scales.scalar_type() == at::kHalf && scales.is_contiguous() && scales.size(0) == blocks &&
                  scales.size(1) == groups * (EIGHT ? 16 : 32),
              op, ": scales must be contiguous float16 (N / 16, K / 32 * ", EIGHT ? 16 : 32, ")");
  TORCH_CHECK(tiles_permitted(), "the kernel could not have the CPU's AMX tiles (arch_prctl refused)");
  const at::BFloat16* xs = x.data_ptr<at::BFloat16>();
  const char* w = static_cast<const char*>(packed.data_ptr());
  const at::Half* s = scales.data_ptr<at::Half>();
  const int64_t scale_stride = scales.size(1);
  std::vector<float> sums(EIGHT ? 0 : M * groups);
  if (!EIGHT) block_sums(xs, M, K, sums.data());
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    alignas(64) float totals[MAX_ROWS * COLS * 16];
    int configured = 0;
    for (int64_t m = 0; m < M; m += MAX_ROWS) {
      const int rows = static_cast<int>(std::min<int64_t>(MAX_ROWS, M - m));
      if (rows != configured) configure(configured = rows);
      for (int64_t n = begin; n < end; n += COLS) {
        const int cols = static_cast<int>(std::min<int64_t>(COLS, end - n));
        pass<EIGHT>(xs + m * K, K, rows, w + n * block_stride, s + n * scale_stride, block_stride, cols,
                    EIGHT ? nullptr : sums.data() + m * groups, totals);
        store(rows, m, n, cols, totals);
      }
    }
    _tile_release();
  });
}

at::Tensor int4_mm_amx(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.is_contiguous(),
              "int4_mm_amx: x must be a contiguous 2-D bfloat16 tensor");
  const int64_t M = x.size(0), K = x.size(1), N = packed.size(0) * 16;
  at::Tensor out = at::empty({M, N}, x.options());
  at::BFloat16* o = out.data_ptr<at::BFloat16>();
  product<false>(x, packed, scales, K * 8, [&](int rows, int64_t m, int64_t n, int cols, const float* totals) {
    for (int r = 0; r < rows; ++r)
      for (int cb = 0; cb < cols; ++cb)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + (m + r) * N + (n + cb) * 16),
                            (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(totals + r * COLS * 16 + cb * 16)));
  });
  return out;
}

at::Tensor int8_mm_amx(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.is_contiguous(),
              "int8_mm_amx: x must be a contiguous 2-D bfloat16 tensor");
  const int64_t M = x.size(0), K = x.size(1), N = packed.size(0) * 16;
  at::Tensor out = at::empty({M, N}, x.options().dtype(at::kFloat));
  float* o = out.data_ptr<float>();
  product<true>(x, packed, scales, K * 16, [&](int rows, int64_t m, int64_t n, int cols, const float* totals) {
    for (int r = 0; r < rows; ++r)
      std::memcpy(o + (m + r) * N + n * 16, totals + r * COLS * 16, sizeof(float) * cols * 16);
  });
  return out;
}

}  // namespace

// The schema is defined in sbon/int4.py (with the shape function torch.compile traces it with).
TORCH_LIBRARY_IMPL(sbon, CPU, m) {
  m.impl("int4_mm_amx", &int4_mm_amx);
  m.impl("int8_mm_amx", &int8_mm_amx);
}
