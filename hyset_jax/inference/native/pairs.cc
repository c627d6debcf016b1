// The pair matrices of a shortlist, G_m[a, c] = z_aᵀ M_m z_c for m = 2..M (paper Eq. 3), from
// the prepared model's Z M_m rows, on the CPU as an XLA FFI custom call: what
// hyset_jax.inference.pipeline.pair_matrices_prepared computes with a batched einsum. Loaded by
// hyset_jax/inference/native/__init__.py.
//
// Why: XLA:CPU runs the per-query [K·(M−1), d]·[d, K] products at 20-25 GFLOP/s in every
// layout tried (docs/speed.md); here each query's rows are read once and M_m's symmetry is
// used: G_m[a, c] is computed for a ≤ c and mirrored (half the products; G_m is then exactly
// symmetric, where the einsum's two triangles differ by rounding).

#include <cstdint>
#include <cstring>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kWidth = 16;  // floats per step of a dot product (its 16 partial sums)
// Without AVX-512 a 16-float GCC vector is lowered through the stack (measured on a 2-core
// AVX2 EPYC: 6x slower); two 8-float halves hold the same 16 partial sums in registers, so
// the arithmetic, and every result bit, is that of the 16-lane form.
constexpr int kHalf = kWidth / 2;
typedef float VH __attribute__((vector_size(kHalf * sizeof(float))));
struct VF {
  VH lo, hi;
};

inline VF Load(const float* p) {
  VF v;
  std::memcpy(&v.lo, p, sizeof(v.lo));
  std::memcpy(&v.hi, p + kHalf, sizeof(v.hi));
  return v;
}

inline float Sum(VF v) {
  float s = 0.0f;
  for (int i = 0; i < kHalf; ++i) s += v.lo[i];
  for (int i = 0; i < kHalf; ++i) s += v.hi[i];
  return s;
}

// acc + x·y on every lane: one fused instruction where the CPU has FMA (the build turns off
// contraction for subsets.cc's sake; a pair entry only needs its float rounding).
inline VH MulAddHalf(VH x, VH y, VH acc) {
#if defined(__AVX512F__)
  __m256 a, b, c;
  std::memcpy(&a, &x, sizeof(a));
  std::memcpy(&b, &y, sizeof(b));
  std::memcpy(&c, &acc, sizeof(c));
  c = _mm256_fmadd_ps(a, b, c);
  std::memcpy(&acc, &c, sizeof(c));
  return acc;
#else
  return acc + x * y;
#endif
}

inline VF MulAdd(VF x, VF y, VF acc) {
  return VF{MulAddHalf(x.lo, y.lo, acc.lo), MulAddHalf(x.hi, y.hi, acc.hi)};
}

// Four dot products of x with y0..y3 (length d), sharing the loads of x; `next` (the row the
// caller reads after x) is prefetched meanwhile: the rows are scattered over a table of
// N·(M−1)·d floats, so each is a fresh trip to memory.
inline void Dot4(const float* x, const float* const* y, int64_t d, float* out,
                 const float* next) {
  VF acc0{}, acc1{}, acc2{}, acc3{};
  int64_t i = 0;
  for (; i + kWidth <= d; i += kWidth) {
    __builtin_prefetch(next + i);
    const VF xv = Load(x + i);
    acc0 = MulAdd(xv, Load(y[0] + i), acc0);
    acc1 = MulAdd(xv, Load(y[1] + i), acc1);
    acc2 = MulAdd(xv, Load(y[2] + i), acc2);
    acc3 = MulAdd(xv, Load(y[3] + i), acc3);
  }
  const VF acc[4] = {acc0, acc1, acc2, acc3};
  for (int j = 0; j < 4; ++j) {
    out[j] = Sum(acc[j]);
    for (int64_t r = i; r < d; ++r) out[j] += x[r] * y[j][r];
  }
}

inline float Dot(const float* x, const float* y, int64_t d) {
  VF acc{};
  int64_t i = 0;
  for (; i + kWidth <= d; i += kWidth) {
    const VF xv = Load(x + i), yv = Load(y + i);
    acc = VF{acc.lo + xv.lo * yv.lo, acc.hi + xv.hi * yv.hi};
  }
  float s = Sum(acc);
  for (; i < d; ++i) s += x[i] * y[i];
  return s;
}

struct Pairs {
  int64_t n, sizes, d, k;   // N, M − 1, d, K
  const float* keyed;       // [N, M−1, d]
  const float* z;           // [N, d]
  const int32_t* tools;     // [Q, K]
  float* out;               // [Q, M−1, K, K]
};

void QueryPairs(const Pairs& p, int64_t q) {
  const int32_t* t = p.tools + q * p.k;
  const int64_t K = p.k;
  for (int64_t c = 0; c < K; ++c)
    if (t[c] < 0 || t[c] >= p.n) {  // only a NaN model's expansion yields such rows
      for (int64_t i = 0; i < p.sizes * K * K; ++i)
        p.out[q * p.sizes * K * K + i] = __builtin_nanf("");
      return;
    }
  const float* zc[64];
  for (int64_t c = 0; c < K; ++c) zc[c] = p.z + static_cast<int64_t>(t[c]) * p.d;
  // Tool a's M − 1 rows of Z M_m are contiguous: read them one after the other (a outer).
  for (int64_t a = 0; a < K; ++a) {
    const float* row = p.keyed + static_cast<int64_t>(t[a]) * p.sizes * p.d;
    const float* next = a + 1 < K ? p.keyed + static_cast<int64_t>(t[a + 1]) * p.sizes * p.d : row;
    for (int64_t m = 0; m < p.sizes; ++m) {
      const float* ka = row + m * p.d;
      float* g = p.out + (q * p.sizes + m) * K * K;
      int64_t c = a;
      float v[4];
      for (; c + 4 <= K; c += 4) {
        Dot4(ka, zc + c, p.d, v, next + m * p.d);
        for (int j = 0; j < 4; ++j) g[a * K + c + j] = g[(c + j) * K + a] = v[j];
      }
      for (; c < K; ++c) g[a * K + c] = g[c * K + a] = Dot(ka, zc[c], p.d);
    }
  }
}

ffi::Error PairsImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> keyed, ffi::Buffer<ffi::F32> z,
                     ffi::Buffer<ffi::S32> tools, ffi::ResultBuffer<ffi::F32> out) {
  auto kd = keyed.dimensions(), zd = z.dimensions(), td = tools.dimensions();
  if (kd.size() != 3 || zd.size() != 2 || td.size() != 2 || kd[0] != zd[0] || kd[2] != zd[1])
    return ffi::Error::InvalidArgument("expected keyed [N, M-1, d], z [N, d], tools [Q, K]");
  if (td[1] > 64) return ffi::Error::InvalidArgument("the pair kernel takes K <= 64");
  Pairs p{kd[0], kd[1], kd[2], td[1], keyed.typed_data(), z.typed_data(), tools.typed_data(),
          out->typed_data()};
  const int64_t q = td[0];
  hyset::ParallelFor(pool, q, [p](int64_t i) { QueryPairs(p, i); });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(HysetPairMatrices, PairsImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
