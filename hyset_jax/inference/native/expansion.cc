// The complementarity expansion of HYSET (paper Eq. 13) from the neighbour table, on the CPU
// as an XLA FFI custom call: hyset_jax.inference.neighbors.expand, one query at a time over XLA's
// intra-op pool. Same algorithm, same answers (ties included): the candidates are the table
// rows of the K1 stage-1 tools; n_ext times, the best remaining candidate by (g desc, ℓ desc,
// row asc) is picked and every entry of the picked tool removed; a boundary tie is reported
// when some row's last kept score is ≥ τ, the g of the last pick. Loaded by
// hyset_jax/inference/native/__init__.py.
//
// With the attribute by_tool, ℓ arrives tool-major, [N, Q] (stage 1's layout for small batches:
// topk.cc).
//
// Why: in XLA the n_ext picks are three reductions each over K1·W entries, a few dozen small
// kernels whose fixed costs dominate (0.05 ms per query at batch 256, 0.3-0.6 ms at batch 1,
// measured with hyset bench e2e --breakdown); here a query takes a few microseconds.

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

struct Expand {
  int64_t n, width, k1, n_ext;
  const int32_t* ids;      // [N, W]
  const float* scores;     // [N, W]
  const float* logits;     // [Q, N], or [N, Q] when by_tool
  const int32_t* s0;       // [Q, K1]
  int64_t q;               // Q
  bool by_tool;
};

// max that lets NaN through, as jnp.max does.
inline float NanMax(float a, float b) { return (a != a || a > b) ? a : b; }

void ExpandQuery(const Expand& e, int64_t q, std::vector<int32_t>& cand,
                 std::vector<float>& g, std::vector<float>& ell, int32_t* extra,
                 int32_t* tie) {
  const int64_t c = e.k1 * e.width;
  const int32_t* s0 = e.s0 + q * e.k1;
  // ℓ of query q and tool t at lq[t * stride].
  const float* lq = e.by_tool ? e.logits + q : e.logits + q * e.n;
  const int64_t stride = e.by_tool ? e.q : 1;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < e.k1; ++i)
    for (int64_t j = 0; j < e.width; ++j) {
      const int64_t at = i * e.width + j;
      const int32_t t = e.ids[static_cast<int64_t>(s0[i]) * e.width + j];
      bool in_s0 = false;
      for (int64_t a = 0; a < e.k1; ++a) in_s0 |= s0[a] == t;
      cand[at] = t;
      g[at] = in_s0 ? kNegInf : e.scores[static_cast<int64_t>(s0[i]) * e.width + j];
      ell[at] = lq[static_cast<int64_t>(t) * stride];
    }
  float best_g = kNegInf;
  for (int64_t k = 0; k < e.n_ext; ++k) {
    best_g = kNegInf;
    for (int64_t a = 0; a < c; ++a) best_g = NanMax(g[a], best_g);
    float best_l = kNegInf;
    for (int64_t a = 0; a < c; ++a)
      if (g[a] == best_g) best_l = NanMax(ell[a], best_l);
    int32_t pick = std::numeric_limits<int32_t>::max();
    for (int64_t a = 0; a < c; ++a)
      if (g[a] == best_g && ell[a] == best_l && cand[a] < pick) pick = cand[a];
    extra[q * e.n_ext + k] = pick;
    for (int64_t a = 0; a < c; ++a)
      if (cand[a] == pick) g[a] = kNegInf;
  }
  bool t = false;
  if (e.width < e.n - 1)  // a table that holds every other tool cannot miss one
    for (int64_t i = 0; i < e.k1; ++i)
      t |= e.scores[static_cast<int64_t>(s0[i]) * e.width + e.width - 1] >= best_g;
  tie[q] = t ? 1 : 0;
}

ffi::Error ExpandImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::S32> ids,
                      ffi::Buffer<ffi::F32> scores, ffi::Buffer<ffi::F32> logits,
                      ffi::Buffer<ffi::S32> s0, ffi::ResultBuffer<ffi::S32> extra,
                      ffi::ResultBuffer<ffi::S32> tie, bool by_tool) {
  auto id = ids.dimensions(), ld = logits.dimensions(), sd = s0.dimensions();
  auto ed = extra->dimensions();
  if (id.size() != 2 || scores.dimensions().size() != 2 || ld.size() != 2 || sd.size() != 2 ||
      ed.size() != 2)
    return ffi::Error::InvalidArgument("expected ids, scores [N, W], logits [Q, N] ([N, Q] "
                                       "by_tool), s0 [Q, K1] and extra [Q, n_ext]");
  const int64_t q = ld[by_tool ? 1 : 0];
  Expand e{id[0], id[1], sd[1], ed[1], ids.typed_data(), scores.typed_data(),
           logits.typed_data(), s0.typed_data(), q, by_tool};
  if (ld[by_tool ? 0 : 1] != e.n || sd[0] != q || ed[0] != q || scores.dimensions()[0] != e.n ||
      scores.dimensions()[1] != e.width)
    return ffi::Error::InvalidArgument("inconsistent shapes for the expansion");
  int32_t* out = extra->typed_data();
  int32_t* ties = tie->typed_data();
  hyset::ParallelForEach(pool, q, 16, [e, out, ties](int64_t i) {
    static thread_local std::vector<int32_t> cand;
    static thread_local std::vector<float> g, ell;
    cand.resize(e.k1 * e.width);
    g.resize(e.k1 * e.width);
    ell.resize(e.k1 * e.width);
    ExpandQuery(e, i, cand, g, ell, out, ties);
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(HysetExpand, ExpandImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Attr<bool>("by_tool"));
