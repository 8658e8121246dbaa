// The compiled decode step's one-query attention on a CPU (sbon/attention.py): each row's query heads against its
// own cached keys and values, read in place from the KV slab's view.
//
// Why a kernel: in a decode step a row attends with one query to a few hundred keys. Written as tensor operations,
// inductor either copies every layer's keys and values out of the slab (matmuls) or recomputes the query's rotary
// embedding and a horizontal sum for every key (products and sums); here a key is loaded once for all the query
// heads that share it, and its products are summed in vector lanes.
//
// Each (row, KV head) is computed by one thread, its sums in one fixed order, so a row's result does not depend on
// the other rows of its batch or on the thread count: the coupled sampling stays exact. The scores and weights are
// rounded to the cache's type where the eager step's matmuls round them.
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

// 16 floats: one AVX-512 register, two AVX2 ones (GCC's vector extension: the compiler picks the instructions).
typedef float Lanes __attribute__((vector_size(64)));
typedef uint16_t Halves __attribute__((vector_size(32)));
typedef uint32_t Words __attribute__((vector_size(64)));
typedef int32_t Ints __attribute__((vector_size(64)));
typedef float Eight __attribute__((vector_size(32)));
typedef float Four __attribute__((vector_size(16)));
constexpr int64_t LANES = 16;

inline Lanes load(const float* p) {
  Lanes x;
  std::memcpy(&x, p, sizeof x);
  return x;
}

inline Lanes load(const c10::BFloat16* p) {  // a bfloat16 is a float's upper half
  Halves h;
  std::memcpy(&h, p, sizeof h);
  const Words w = __builtin_convertvector(h, Words) << 16;
  Lanes x;
  std::memcpy(&x, &w, sizeof x);
  return x;
}

inline float sum(Lanes x) {  // halves, quarters, then the four pairwise: one fixed order
  Eight low, high;
  std::memcpy(&low, &x, sizeof low);
  std::memcpy(&high, reinterpret_cast<const char*>(&x) + sizeof low, sizeof high);
  const Eight eight = low + high;
  Four a, b;
  std::memcpy(&a, &eight, sizeof a);
  std::memcpy(&b, reinterpret_cast<const char*>(&eight) + sizeof a, sizeof b);
  const Four four = a + b;
  return (four[0] + four[2]) + (four[1] + four[3]);
}

// Each lane in T's precision, as a T tensor would hold it: float as it is; bfloat16 rounded to nearest even, NaN to
// c10's NaN (c10::BFloat16's own rounding, on 16 lanes at once).
template <typename T>
inline Lanes rounded(Lanes x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    Words bits;
    std::memcpy(&bits, &x, sizeof bits);
    bits = (x != x) ? Words{} + 0x7FC00000u : (bits + (((bits >> 16) & 1u) + 0x7FFFu)) & 0xFFFF0000u;
    std::memcpy(&x, &bits, sizeof x);
    return x;
  }
}

// e^x for x <= 0 (a score minus its head's largest), 0 below -87 (and for -inf, a masked key): Cephes' expf, 2^n
// times a polynomial, on 16 lanes at once.
inline Lanes exp_nonpositive(Lanes x) {
  const Ints under = x < -87.f;
  x = under ? -87.f : x;
  const Lanes t = x * 1.44269504088896341f + 0.5f;
  Lanes n = __builtin_convertvector(__builtin_convertvector(t, Ints), Lanes);  // toward zero, then down: floor(t)
  n += __builtin_convertvector(n > t, Lanes);  // (a true comparison is -1)
  const Lanes r = x - n * 0.693359375f + n * 2.12194440e-4f;
  Lanes p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const Lanes y = p * r * r + r + 1.f;
  const Ints bits = (__builtin_convertvector(n, Ints) + 127) << 23;
  Lanes two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return under ? 0.f : y * two_n;
}

// The shapes the kernel is built for (d / 16 registers per key, at most MAX_GROUP query heads per KV head): a row's
// query heads and their sums stay in registers. sbon/attention.py (KERNEL_HEAD_SIZES, KERNEL_MAX_GROUP) gives other
// shapes to the step's matmuls.
constexpr int64_t MAX_GROUP = 8;

template <typename T, int64_t CHUNKS>
void attend_unit(const T* q, int64_t qs1, const T* k, int64_t ks2, const T* v, int64_t vs2, const bool* keep,
                 int64_t ms1, int64_t length, int64_t padded, int64_t group, float scale, T* out, float* w) {
  Lanes qf[MAX_GROUP][CHUNKS];
  for (int64_t g = 0; g < group; ++g)
    for (int64_t c = 0; c < CHUNKS; ++c) {
      float tmp[LANES];
      for (int64_t l = 0; l < LANES; ++l) tmp[l] = static_cast<float>(q[g * qs1 + c * LANES + l]);
      qf[g][c] = load(tmp);
    }
  // Scores, key by key: each key loaded once for the query heads that share it.
  for (int64_t j = 0; j < length; ++j) {
    if (keep && !keep[j * ms1]) {
      for (int64_t g = 0; g < group; ++g) w[g * padded + j] = -std::numeric_limits<float>::infinity();
      continue;
    }
    Lanes kj[CHUNKS];
    for (int64_t c = 0; c < CHUNKS; ++c) kj[c] = load(k + j * ks2 + c * LANES);
    for (int64_t g = 0; g < group; ++g) {
      Lanes acc = qf[g][0] * kj[0];
      for (int64_t c = 1; c < CHUNKS; ++c) acc += qf[g][c] * kj[c];
      w[g * padded + j] = sum(acc);
    }
  }
  // Softmax per query head, in float, its weights rounded to the cache's type (each head's row of `w` is `padded`
  // long, its end -inf: whole registers).
  for (int64_t g = 0; g < group; ++g) {
    float* wg = w + g * padded;
    for (int64_t j = length; j < padded; ++j) wg[j] = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < padded; j += LANES) {  // the scores as the eager step's matmul and scaling round them
      const Lanes x = rounded<T>(rounded<T>(load(wg + j)) * scale);
      std::memcpy(wg + j, &x, sizeof x);
    }
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < length; ++j) top = std::max(top, wg[j]);
    for (int64_t j = 0; j < padded; j += LANES) {
      const Lanes e = exp_nonpositive(load(wg + j) - top);
      std::memcpy(wg + j, &e, sizeof e);
    }
    float total = 0.f;
    for (int64_t j = 0; j < length; ++j) total += wg[j];
    for (int64_t j = 0; j < padded; j += LANES) {
      const Lanes x = rounded<T>(load(wg + j) / total);
      std::memcpy(wg + j, &x, sizeof x);
    }
  }
  // The weighted values, value by value: each loaded once for the query heads that share it.
  Lanes acc[MAX_GROUP][CHUNKS] = {};
  for (int64_t j = 0; j < length; ++j) {
    if (keep && !keep[j * ms1]) continue;  // a masked key (the slab's unwritten end): its value is never read
    Lanes vj[CHUNKS];
    for (int64_t c = 0; c < CHUNKS; ++c) vj[c] = load(v + j * vs2 + c * LANES);
    for (int64_t g = 0; g < group; ++g)
      for (int64_t c = 0; c < CHUNKS; ++c) acc[g][c] += w[g * padded + j] * vj[c];
  }
  for (int64_t g = 0; g < group; ++g)
    for (int64_t c = 0; c < CHUNKS; ++c) {
      float tmp[LANES];
      std::memcpy(tmp, &acc[g][c], sizeof tmp);
      for (int64_t l = 0; l < LANES; ++l) out[g * LANES * CHUNKS + c * LANES + l] = static_cast<T>(tmp[l]);
    }
}

template <typename T, int64_t CHUNKS>
void attend(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& mask,
            double scale, at::Tensor& out) {
  const int64_t heads = query.size(1), kv_heads = key.size(1), length = key.size(2), group = heads / kv_heads;
  const T* q = query.data_ptr<T>();
  const T* k = key.data_ptr<T>();
  const T* v = value.data_ptr<T>();
  const bool* keep = mask.defined() ? mask.data_ptr<bool>() : nullptr;
  T* o = out.data_ptr<T>();
  const int64_t qs0 = query.stride(0), qs1 = query.stride(1), ks0 = key.stride(0), ks1 = key.stride(1);
  const int64_t vs0 = value.stride(0), vs1 = value.stride(1), ms0 = keep ? mask.stride(0) : 0;
  const int64_t ms1 = keep ? mask.stride(1) : 0, ks2 = key.stride(2), vs2 = value.stride(2);
  // Each (row, KV head) on one thread: its numbers do not depend on the split.
  at::parallel_for(0, query.size(0) * kv_heads, 1, [&](int64_t begin, int64_t end) {
    const int64_t padded = (length + LANES - 1) / LANES * LANES;
    std::vector<float> w(group * padded);
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t r = unit / kv_heads, h = unit % kv_heads;
      attend_unit<T, CHUNKS>(q + r * qs0 + h * group * qs1, qs1, k + r * ks0 + h * ks1, ks2, v + r * vs0 + h * vs1,
                             vs2, keep ? keep + r * ms0 : nullptr, ms1, length, padded, group, static_cast<float>(scale),
                             o + (r * heads + h * group) * LANES * CHUNKS, w.data());
    }
  });
}

template <typename T>
void dispatch(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& mask,
              double scale, at::Tensor& out) {
  switch (query.size(2) / LANES) {
    case 4: return attend<T, 4>(query, key, value, mask, scale, out);
    case 8: return attend<T, 8>(query, key, value, mask, scale, out);
    case 2: return attend<T, 2>(query, key, value, mask, scale, out);
    default: TORCH_CHECK(false, "decode_attention: head size ", query.size(2), " is not 32, 64 or 128");
  }
}

// query (rows, heads, d); key, value (rows, kv_heads, length, d), any strides with d contiguous; mask: none, or
// bool (rows or 1, length), false where a key is not read -> (rows, heads, d) in the query's type.
at::Tensor decode_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                            const c10::optional<at::Tensor>& mask, double scale) {
  TORCH_CHECK(query.dim() == 3 && key.dim() == 4 && value.sizes() == key.sizes() && key.size(0) == query.size(0) &&
                  key.size(3) == query.size(2) && query.size(1) % key.size(1) == 0,
              "decode_attention: query (rows, heads, d) and key, value (rows, kv_heads, length, d) do not match");
  TORCH_CHECK(query.scalar_type() == key.scalar_type() && key.scalar_type() == value.scalar_type() &&
                  query.stride(2) == 1 && key.stride(3) == 1 && value.stride(3) == 1 &&
                  (query.scalar_type() == at::kFloat || query.scalar_type() == at::kBFloat16),
              "decode_attention: query, key and value must be all float32 or all bfloat16, each with d contiguous");
  TORCH_CHECK(query.size(1) / key.size(1) <= MAX_GROUP, "decode_attention: more than ", MAX_GROUP,
              " query heads per KV head");
  at::Tensor keep;
  if (mask.has_value() && mask->defined()) {
    keep = mask->expand({query.size(0), key.size(2)});
    TORCH_CHECK(keep.scalar_type() == at::kBool, "decode_attention: the mask must be bool");
  }
  at::Tensor out = at::empty({query.size(0), query.size(1), query.size(2)}, query.options());
  if (query.scalar_type() == at::kFloat)
    dispatch<float>(query, key, value, keep, scale, out);
  else
    dispatch<c10::BFloat16>(query, key, value, keep, scale, out);
  return out;
}

}  // namespace

// The schema is defined in sbon/attention.py (with the shape function torch.compile traces it with).
TORCH_LIBRARY_IMPL(sbon, CPU, m) { m.impl("decode_attention", &decode_attention); }
