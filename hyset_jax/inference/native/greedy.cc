// The paper's greedy ranking of a shortlist on the CPU as an XLA FFI custom call:
// hyset_jax.inference.pipeline.rank_tools(..., "greedy"), one query at a time over XLA's intra-op pool.
// M picks, each the tool t outside the chosen set A with the largest F(A ∪ {t}) (the first such
// t; a NaN score wins, as in jnp.argmax), then the other tools by descending ℓ (NaN last), ties
// in shortlist order. F is computed as inference.greedy_ranking does: the softmax mean of the
// members' ℓ shifted by their maximum, plus half the sum of G_|A∪{t}|[i, j] over ordered pairs
// i ≠ j of members. Loaded by hyset_jax/inference/native/__init__.py.
//
// Why: in XLA the M steps are a few dozen small kernels whose fixed costs dominate at small
// batches (0.1 ms for one query alone, most of stage 2's remainder at batch 1, measured).

#include <cmath>
#include <cstdint>
#include <limits>

#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kMaxPool = 64;

struct Greedy {
  int64_t k, sizes;        // K, M − 1
  const float* logits;     // [Q, K]
  const float* pairs;      // [Q, M−1, K, K]
  int32_t* out;            // [Q, K]
};

inline bool IsNan(float x) { return x != x; }

void RankQuery(const Greedy& g, int64_t q) {
  const int64_t K = g.k, steps = g.sizes + 1;
  const float* ell = g.logits + q * K;
  int32_t* out = g.out + q * K;
  bool chosen[kMaxPool] = {};
  int32_t members[kMaxPool];
  for (int64_t size = 1; size <= steps; ++size) {
    const float* gm = size >= 2 ? g.pairs + (q * g.sizes + size - 2) * K * K : nullptr;
    int64_t pick = 0;
    float best = 0.0f;
    for (int64_t t = 0; t < K; ++t) {
      float f = -std::numeric_limits<float>::infinity();
      if (!chosen[t]) {
        // Members: the chosen tools and t, in shortlist order.
        int64_t m = 0;
        for (int64_t i = 0; i < K; ++i)
          if (chosen[i] || i == t) members[m++] = static_cast<int32_t>(i);
        // Sums in double, rounded once: two candidates whose sets hold the same values in
        // other slots (duplicate tools) then tie exactly and the first wins, whatever order
        // the terms are added in (XLA's reductions add them in an order of their own).
        double top = -std::numeric_limits<double>::infinity();
        for (int64_t a = 0; a < m; ++a) top = std::fmax(top, ell[members[a]]);
        double num = 0.0, den = 0.0;
        for (int64_t a = 0; a < m; ++a) {
          const double w = std::exp(static_cast<double>(ell[members[a]]) - top);
          num += w * ell[members[a]];
          den += w;
        }
        f = static_cast<float>(num / den);
        if (gm != nullptr) {
          double pair_sum = 0.0;
          for (int64_t a = 0; a < m; ++a)
            for (int64_t b = 0; b < m; ++b)
              if (a != b) pair_sum += gm[members[a] * K + members[b]];
          f += 0.5f * static_cast<float>(pair_sum);
        }
      }
      if (t == 0) {
        best = f;
      } else if (f > best || (IsNan(f) && !IsNan(best))) {
        best = f;
        pick = t;
      }
    }
    out[size - 1] = static_cast<int32_t>(pick);
    chosen[pick] = true;
  }
  // The rest by descending ℓ, NaN last, ties in shortlist order (a stable insertion sort).
  int64_t n = steps;
  for (int64_t t = 0; t < K; ++t) {
    if (chosen[t]) continue;
    int64_t i = n++;
    auto before = [ell](int32_t a, int32_t b) {
      return ell[a] > ell[b] || (!IsNan(ell[a]) && IsNan(ell[b]));
    };
    while (i > steps && before(static_cast<int32_t>(t), out[i - 1])) {
      out[i] = out[i - 1];
      --i;
    }
    out[i] = static_cast<int32_t>(t);
  }
}

ffi::Error GreedyImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> logits,
                      ffi::Buffer<ffi::F32> pairs, ffi::ResultBuffer<ffi::S32> out) {
  auto ld = logits.dimensions(), pd = pairs.dimensions();
  if (ld.size() != 2 || pd.size() != 4 || pd[0] != ld[0] || pd[2] != ld[1] || pd[3] != ld[1])
    return ffi::Error::InvalidArgument("expected logits [Q, K] and pairs [Q, M-1, K, K]");
  if (ld[1] > kMaxPool || pd[1] + 1 > ld[1])
    return ffi::Error::InvalidArgument("the greedy kernel takes M <= K <= 64");
  Greedy g{ld[1], pd[1], logits.typed_data(), pairs.typed_data(), out->typed_data()};
  const int64_t q = ld[0];
  hyset::ParallelForEach(pool, q, 16, [g](int64_t i) { RankQuery(g, i); });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(HysetGreedyRanking, GreedyImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>());
