// Stage 1's top K1 of ℓ over the library (paper Eq. 12), on the CPU as an XLA FFI custom call:
// the indices jax.lax.top_k returns, in its order. Loaded by
// hyset_jax/inference/native/__init__.py.
//
// Why: XLA:CPU's TopK sorts each row's indices on one thread (~17 µs per row of 13,860 tools,
// ~1.1 ms of a batch of 64 on a 2-core CPU, against ~7 ms for the batch's ℓ). Here a row is
// scanned once against the current K-th key, 32 values per test, and rows are spread over
// XLA's thread pool: almost every value fails the test, so a row costs about one read of it.
//
// With the attribute by_tool, x is ℓᵀ [N, Q] (tool-major: how XLA:CPU computes a small batch's
// ℓ fastest, see pipeline.py) and the top K1 of each column is taken, the same indices in the
// same order: a task keeps kColumns queries' lists and reads their kColumns values of each
// tool's row (one cache line), testing them against the queries' K-th keys at once.

#include <cstdint>
#include <cstring>
#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kMaxK = 64;   // K1 ≤ K_pool ≤ 64 (the other kernels' bound)
constexpr int64_t kBlock = 32;  // values per threshold test
constexpr int64_t kColumns = 16;  // queries per task of the tool-major (by_tool) form

// XLA's TopK orders floats by their bits read as integers, negative ones flipped (so -0.0 <
// +0.0, NaN above +inf and -NaN below -inf: a total order) and breaks ties by the lower index.
// The flip is its own inverse: Value(Key(v)) == v.
inline int32_t Flip(int32_t b) { return b ^ ((b >> 31) & 0x7fffffff); }

inline int32_t Key(float v) {
  int32_t b;
  std::memcpy(&b, &v, sizeof(b));
  return Flip(b);
}

inline float Value(int32_t key) {
  const int32_t b = Flip(key);
  float v;
  std::memcpy(&v, &b, sizeof(v));
  return v;
}

// Whether any of x[0..kBlock) is not below t (NaN included: every comparison with it is false).
// A value below the K-th kept one cannot enter; the others go on to the exact key test (equal
// values too: +0.0 against -0.0).
inline bool AnyNotBelow(const float* x, float t) {
#if defined(__AVX__)
  const __m256 tv = _mm256_set1_ps(t);
  __m256 any = _mm256_setzero_ps();
  for (int64_t j = 0; j < kBlock; j += 8)
    any = _mm256_or_ps(any, _mm256_cmp_ps(_mm256_loadu_ps(x + j), tv, _CMP_NLT_UQ));
  return _mm256_movemask_ps(any) != 0;
#else
  bool hit = false;
  for (int64_t j = 0; j < kBlock; ++j) hit |= !(x[j] < t);
  return hit;
#endif
}

// Puts (key, i) into keys/idx, sorted by descending key and then ascending index, holding
// `*filled` ≤ k entries. Values arrive in index order, so an entry whose key equals a kept one
// goes after it, and once the list is full a key that does not beat the last one never enters.
inline void Insert(int32_t key, int32_t i, int64_t k, int32_t* keys, int32_t* idx,
                   int64_t* filled) {
  int64_t p = *filled < k ? (*filled)++ : k - 1;
  while (p > 0 && keys[p - 1] < key) {
    keys[p] = keys[p - 1];
    idx[p] = idx[p - 1];
    --p;
  }
  keys[p] = key;
  idx[p] = i;
}

// The k largest keys offered so far, descending (ties: the earlier index), once the first k
// values have filled it.
struct KeptList {
  int32_t keys[kMaxK], idx[kMaxK];
  int64_t filled = 0;

  void Fill(int32_t key, int32_t i, int64_t k) { Insert(key, i, k, keys, idx, &filled); }
  float LastValue(int64_t k) const { return Value(keys[k - 1]); }
  // Whether (key, i) entered, i.e. the k-th key changed.
  bool Offer(int32_t key, int32_t i, int64_t k) {
    if (key <= keys[k - 1]) return false;
    Insert(key, i, k, keys, idx, &filled);
    return true;
  }
};

void RowTopK(const float* x, int64_t n, int64_t k, int32_t* out) {
  KeptList top;
  int64_t i = 0;
  for (; i < k; ++i) top.Fill(Key(x[i]), static_cast<int32_t>(i), k);
  float last_value = top.LastValue(k);
  auto offer = [&](int64_t j) {  // value j against the K-th kept one
    if (top.Offer(Key(x[j]), static_cast<int32_t>(j), k)) last_value = top.LastValue(k);
  };
  for (; i + kBlock <= n; i += kBlock)
    if (AnyNotBelow(x + i, last_value))
      for (int64_t j = i; j < i + kBlock; ++j) offer(j);
  for (; i < n; ++i) offer(i);
  std::memcpy(out, top.idx, k * sizeof(int32_t));
}

// Whether any of x[c] is not below t[c], c < kColumns (NaN included), as AnyNotBelow.
inline bool AnyColumnNotBelow(const float* x, const float* t) {
#if defined(__AVX__)
  __m256 any = _mm256_setzero_ps();
  for (int64_t c = 0; c < kColumns; c += 8)
    any = _mm256_or_ps(any, _mm256_cmp_ps(_mm256_loadu_ps(x + c), _mm256_loadu_ps(t + c),
                                          _CMP_NLT_UQ));
  return _mm256_movemask_ps(any) != 0;
#else
  bool hit = false;
  for (int64_t c = 0; c < kColumns; ++c) hit |= !(x[c] < t[c]);
  return hit;
#endif
}

// RowTopK for the `width` ≤ kColumns columns q0.. of x [N, Q] (row stride q): out[c] is column
// q0 + c's list. The same per-value steps as RowTopK, so the same answers.
void ColumnsTopK(const float* x, int64_t n, int64_t q, int64_t q0, int64_t width, int64_t k,
                 int32_t* out) {
  KeptList top[kColumns];
  float last_value[kColumns];  // contiguous: one vector test per tool
  int64_t i = 0;
  for (; i < k; ++i)
    for (int64_t c = 0; c < width; ++c)
      top[c].Fill(Key(x[i * q + q0 + c]), static_cast<int32_t>(i), k);
  for (int64_t c = 0; c < width; ++c) last_value[c] = top[c].LastValue(k);
  for (; i < n; ++i) {
    const float* row = x + i * q + q0;
    if (width == kColumns && !AnyColumnNotBelow(row, last_value)) continue;
    for (int64_t c = 0; c < width; ++c)
      if (top[c].Offer(Key(row[c]), static_cast<int32_t>(i), k))
        last_value[c] = top[c].LastValue(k);
  }
  for (int64_t c = 0; c < width; ++c) std::memcpy(out + c * k, top[c].idx, k * sizeof(int32_t));
}

ffi::Error TopKImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                    ffi::ResultBuffer<ffi::S32> out, bool by_tool) {
  auto xd = x.dimensions(), od = out->dimensions();
  if (xd.size() != 2 || od.size() != 2 || xd[by_tool ? 1 : 0] != od[0])
    return ffi::Error::InvalidArgument(by_tool ? "expected x [N, Q] and out [Q, k]"
                                               : "expected x [Q, N] and out [Q, k]");
  const int64_t q = od[0], n = xd[by_tool ? 0 : 1], k = od[1];
  if (k < 1 || k > kMaxK || k > n)
    return ffi::Error::InvalidArgument("the top-k kernel takes 1 <= k <= min(64, N)");
  const float* xs = x.typed_data();
  int32_t* os = out->typed_data();
  if (by_tool)
    hyset::ParallelFor(pool, (q + kColumns - 1) / kColumns, [xs, os, n, q, k](int64_t t) {
      const int64_t q0 = t * kColumns, width = q - q0 < kColumns ? q - q0 : kColumns;
      ColumnsTopK(xs, n, q, q0, width, k, os + q0 * k);
    });
  else
    hyset::ParallelFor(pool, q,
                       [xs, os, n, k](int64_t r) { RowTopK(xs + r * n, n, k, os + r * k); });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(HysetTopK, TopKImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Attr<bool>("by_tool"));
