// Stage 2 of HYSET (paper Eq. 14) on the CPU as XLA FFI custom calls: every subset of size
// 1..M of a K-tool shortlist scored by the colex level recurrence, and either the best subset
// per query or every score. Loaded by hyset_jax/native/__init__.py, which compiles this file
// once per machine (see docs/speed.md, "The native CPU kernels").
//
// Why a kernel of our own: XLA:CPU runs the same recurrence as a chain of fusions that write
// each level to memory and gather it back, on one core; here a group of kLanes queries is
// scored together with queries on the vector lanes, every level is a run of contiguous loads
// and stores that stays in cache, and groups are spread over XLA's intra-op thread pool.
//
// Numbers and ties are those of hyset_jax.enumeration's colex form: the shortlist is reordered
// by ascending ℓ (a stable sort; `order` reports it), a subset's softmax sums are kept relative
// to its largest logit c (every weight exp(ℓ_i − ℓ_c) ≤ 1), and
//   S0(E) = 1 + e_bc·S0(p),  S1(E) = ℓ_c + e_bc·S1(p)       (E = p ∪ {c}, b = max p)
//   D_m(E) = D_m(p \ {b} ∪ {c}) + G_m[b, c],  P_m(E) = P_m(p) + D_m(E)
//   F(E) = P_|E|(E) + S1(E) / S0(E).
// Rows follow enumeration.SubsetTable: sizes ascending, colex within a size, so the best set
// is the first maximum in table order (a NaN score wins, as in jnp.argmax).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kLanes = 16;     // queries scored together, one per vector lane
constexpr int kMaxPool = 62;   // K limit: binomials below fit int64 for every M


struct Binomials {
  int64_t c[kMaxPool + 2][kMaxPool + 2];
  Binomials() {
    std::memset(c, 0, sizeof(c));
    for (int n = 0; n <= kMaxPool + 1; ++n) {
      c[n][0] = 1;
      for (int k = 1; k <= n; ++k) c[n][k] = c[n - 1][k - 1] + (k < n ? c[n - 1][k] : 0);
    }
  }
  int64_t operator()(int n, int k) const { return (k < 0 || k > n) ? 0 : c[n][k]; }
};

const Binomials& Binom() {
  static const Binomials* b = new Binomials();
  return *b;
}

struct Problem {
  int64_t q, k, sizes;   // queries, K, M
  int64_t n;             // subsets
  const float* logits;   // [Q, K]
  const float* pairs;    // [Q, M−1, K, K]
  int64_t offsets[kMaxPool + 2];  // first table row of each size
};

// A level's state: S0, S1, then P_m and D_m for every m > k (each [C(K, k)][L]).
inline int64_t LevelFloats(const Problem& p, int k) {
  return Binom()(p.k, k) * kLanes * (2 + 2 * (p.sizes - k));
}

// Per-thread working memory. Kept by each thread between calls (ForThread): allocating and
// zeroing its megabytes on every call cost ~1 ms, more than scoring one group (measured).
struct Scratch {
  std::vector<float> ell, expo, g;          // [K][L], [K][K][L], [M−1][K(K−1)/2][L]
  std::vector<int32_t> order;               // [L][K]
  std::vector<float> lane_pairs;            // [L][M−1][K(K−1)/2]
  std::vector<float> prev, cur;             // two levels' state, see LevelView
  std::vector<float> scores;                // [n][L] (every-score output only)

  // This thread's scratch, grown to fit p (never shrunk: a server sees the same shapes).
  static Scratch& ForThread(const Problem& p, bool all_scores) {
    static thread_local Scratch s;
    const int64_t K = p.k, M = p.sizes, T = K * (K - 1) / 2;
    int64_t most = 0;
    for (int k = 1; k < M; ++k) most = std::max(most, LevelFloats(p, k));
    Grow(s.ell, K * kLanes);
    Grow(s.expo, K * K * kLanes);
    Grow(s.g, (M - 1) * T * kLanes);
    Grow(s.order, kLanes * K);
    Grow(s.lane_pairs, kLanes * (M - 1) * T);
    Grow(s.prev, most);
    Grow(s.cur, most);
    if (all_scores) Grow(s.scores, p.n * kLanes);
    return s;
  }

 private:
  template <class V>
  static void Grow(V& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  }
};

struct LevelView {
  float *s0, *s1;
  float* pm[kMaxPool + 2];  // indexed by m
  float* dm[kMaxPool + 2];
  LevelView(float* base, const Problem& p, int k) {
    int64_t rows = Binom()(p.k, k) * kLanes;
    s0 = base;
    s1 = base + rows;
    float* next = base + 2 * rows;
    for (int m = k + 1; m <= p.sizes; ++m) {
      pm[m] = next;
      dm[m] = next + rows;
      next += 2 * rows;
    }
  }
};

// One value per lane: GCC/Clang vector types, so every operation below is one vector
// instruction on AVX-512 (two on AVX2, four on SSE or NEON) whatever the auto-vectoriser does.
typedef float VF __attribute__((vector_size(kLanes * sizeof(float))));
typedef int32_t VI __attribute__((vector_size(kLanes * sizeof(int32_t))));

inline VF Load(const float* p) {
  VF v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void Store(float* p, VF v) { std::memcpy(p, &v, sizeof(v)); }
inline VF Splat(float x) { return VF{} + x; }

// exp(x) for x ≤ 0 on every lane: Cephes' single-precision polynomial (≤ 2 ulp), in vector
// operations (libm's expf and floorf would be scalar calls); 0 below the float range.
inline VF ExpNonPositive(VF x) {
  const VF lo = Splat(-87.33654f);
  const VF xc = x < lo ? lo : x;
  // Round x·log2(e) to the nearest integer by adding and removing 1.5·2^23 (|x·log2 e| < 2^22).
  const VF magic = Splat(12582912.0f);
  const VF fx = (xc * 1.44269504088896341f + magic) - magic;
  const VF r = xc - fx * 0.693359375f + fx * 2.12194440e-4f;
  VF y = Splat(1.9875691500e-4f);
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  const VI bits = (__builtin_convertvector(fx, VI) + 127) << 23;
  VF scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return x < lo ? Splat(0.0f) : y * scale;
}

// Visit orders. kTableOrder visits subsets in table order (level by level, colex within a
// level), so a strict > keeps the first maximum: what the best-set output uses. kBlocked
// visits level k by the parents' largest element b, then the new element c, kTile parents at a
// time, so a tile of parents stays in L1 while every c reads it: rows arrive out of order,
// which only the every-score output can afford (measured: 34k -> 44k queries/s on one core at
// K = 20, M = 5; no gain for the best set, which is not bound by these reads).
enum class Order { kTableOrder, kBlocked };
constexpr int64_t kTile = 64;

// Transposes a kLanes × kLanes block held as kLanes vectors: log2(kLanes) stages, each
// swapping the off-diagonal w × w sub-blocks of every 2w × 2w block (w = kLanes/2, ..., 1).
template <int w, size_t... I>
inline VF SwapLow(VF a, VF b, std::index_sequence<I...>) {   // a's left w, b's left w
  return __builtin_shufflevector(a, b, ((I & w) ? kLanes + I - w : I)...);
}
template <int w, size_t... I>
inline VF SwapHigh(VF a, VF b, std::index_sequence<I...>) {  // a's right w, b's right w
  return __builtin_shufflevector(a, b, ((I & w) ? kLanes + I : I + w)...);
}
template <int w>
inline void TransposeStage(VF* v) {
  if constexpr (w >= 1) {
    const auto idx = std::make_index_sequence<kLanes>();
    for (int i = 0; i < kLanes; ++i) {
      if (i & w) continue;
      const VF a = v[i], b = v[i + w];
      v[i] = SwapLow<w>(a, b, idx);
      v[i + w] = SwapHigh<w>(a, b, idx);
    }
    TransposeStage<w / 2>(v);
  }
}
inline void Transpose(VF* v) { TransposeStage<kLanes / 2>(v); }

// Keeps, per lane, the largest score so far and its table row: the first maximum in table
// order. kNanAware also lets a NaN score win, as jnp.argmax does; only groups with an input
// that is not a finite float of moderate size need it (otherwise no score is NaN).
template <bool kNanAware>
struct Best {
  VF score = Splat(-std::numeric_limits<float>::infinity());
  VI row = VI{};
  inline void Update(VF f, int32_t r) {
    VI take = f > score;
    if (kNanAware) take |= (f != f) & (score == score);
    score = take ? f : score;
    row = take ? (VI{} + r) : row;
  }
};

// Level k of the recurrence for the parents of largest element b and the new element c (see
// the file comment): parent rows [lo, hi) of level k − 1 → rows out0 + [lo, hi) of level k.
// kFirst: k = 2 (parents are single tools: no pair sums yet); kLast: k = M (no state kept);
// kBest: track the best set; kScores: write every score to scores ([n][L]).
template <bool kFirst, bool kLast, bool kBest, bool kScores, class BestT>
inline void LevelRun(const Problem& p, int k, int64_t lo, int64_t hi, int64_t sib, int64_t out0,
                     int64_t row0, VF e, VF lc, const VF* gbc, const LevelView& pv,
                     const LevelView& cv, BestT& best, float* scores) {
  // Everything the loop reads is copied into locals first: stores through float* could alias
  // any of them, and the compiler would reload (or spill) them on every iteration.
  const int64_t M = p.sizes;
  const VF one = Splat(1.0f);
  const float* __restrict ps0 = pv.s0;
  const float* __restrict ps1 = pv.s1;
  const float* __restrict ppk = kFirst ? nullptr : pv.pm[k];
  const float* __restrict pdk = kFirst ? nullptr : pv.dm[k];
  float* __restrict cs0 = kLast ? nullptr : cv.s0;
  float* __restrict cs1 = kLast ? nullptr : cv.s1;
  const VF gk = gbc[k];
  auto score = [&](int64_t i, BestT& acc) {
    const int64_t r = out0 + i;
    const VF s0 = one + e * Load(ps0 + i * kLanes);
    const VF s1 = lc + e * Load(ps1 + i * kLanes);
    const VF pk = kFirst ? gk : Load(ppk + i * kLanes) + (Load(pdk + (i + sib) * kLanes) + gk);
    const VF f = pk + s1 / s0;
    if (kBest) acc.Update(f, static_cast<int32_t>(row0 + r));
    if (kScores) Store(scores + (row0 + r) * kLanes, f);
    if (!kLast) {
      Store(cs0 + r * kLanes, s0);
      Store(cs1 + r * kLanes, s1);
    }
  };
  // One accumulator, in a local: four interleaved ones (so that consecutive compare-and-selects
  // do not wait on each other) measured the same on this CPU.
  BestT b = best;
  for (int64_t i = lo; i < hi; ++i) score(i, b);
  if (kBest) best = b;
  if (kLast) return;
  // The pair sums of every larger size m, one contiguous pass each.
  for (int64_t m = k + 1; m <= M; ++m) {
    const VF gm = gbc[m];
    float* __restrict cp = cv.pm[m];
    float* __restrict cd = cv.dm[m];
    if (kFirst) {
      for (int64_t i = lo; i < hi; ++i) {
        Store(cp + (out0 + i) * kLanes, gm);
        Store(cd + (out0 + i) * kLanes, gm);
      }
    } else {
      const float* __restrict pp = pv.pm[m];
      const float* __restrict pd = pv.dm[m];
      for (int64_t i = lo; i < hi; ++i) {
        const VF d = Load(pd + (i + sib) * kLanes) + gm;
        Store(cd + (out0 + i) * kLanes, d);
        Store(cp + (out0 + i) * kLanes, Load(pp + i * kLanes) + d);
      }
    }
  }
}

// Index of the pair (a, c), a < c, among the K(K−1)/2 pairs in row-major order.
inline int64_t Pair(int64_t K, int64_t a, int64_t c) { return a * (2 * K - a - 1) / 2 + c - a - 1; }

// Builds the group's lane-interleaved tables in ascending-ℓ order: ell [K][L], expo [K][K][L]
// (a < c: exp(ℓ_a − ℓ_c)) and g [M−1][K(K−1)/2][L] (G_m[a, c] of the pair a < c, Pair); lanes past nq repeat query
// q0. Returns whether every input read is finite and below 1e30 in magnitude (then no score
// is NaN).
bool BuildTables(const Problem& p, int64_t q0, int64_t nq, Scratch& s) {
  const int64_t K = p.k, M = p.sizes, KK = K * K, T = K * (K - 1) / 2;
  float* ell = s.ell.data();
  float* g = s.g.data();
  float* lanes = s.lane_pairs.data();  // [L][M−1][T]: lane l's G_m[a, c], a < c, sorted order
  int bad = 0;  // an OR reduction vectorises; a running max with NaN tests does not
  for (int l = 0; l < kLanes; ++l) {
    const int64_t lane = l < nq ? l : 0;
    const float* lg = p.logits + (q0 + lane) * K;
    int32_t* ord = s.order.data() + l * K;
    // Stable insertion sort by ℓ, NaN after +inf (jnp.argsort's order).
    auto before = [](float x, float y) { return x < y || (x == x && y != y); };
    for (int64_t j = 0; j < K; ++j) {
      int64_t i = j;
      while (i > 0 && before(lg[j], lg[ord[i - 1]])) {
        ord[i] = ord[i - 1];
        --i;
      }
      ord[i] = static_cast<int32_t>(j);
    }
    for (int64_t j = 0; j < K; ++j) ell[j * kLanes + l] = lg[ord[j]];
    for (int64_t j = 0; j < K; ++j) bad |= !(std::fabs(lg[j]) < 1e30f);
    // This query's G_m (6.4 KB at K = 20, M = 5, read into L1 once) permuted to the sorted
    // positions, upper triangle only, written contiguously.
    const float* pq = p.pairs + (q0 + lane) * (M - 1) * KK;
    float* t = lanes + l * (M - 1) * T;
    for (int64_t m = 0; m < M - 1; ++m)
      for (int64_t a = 0; a < K; ++a) {
        const float* row = pq + (m * K + ord[a]) * K;
        for (int64_t c = a + 1; c < K; ++c) *t++ = row[ord[c]];
      }
  }
  // Interleave the lanes: g[m][pair][l] (pairs a < c in row-major order, TriangleIndex).
  for (int64_t i = 0; i < (M - 1) * T; ++i)
    for (int l = 0; l < kLanes; ++l) g[i * kLanes + l] = lanes[l * (M - 1) * T + i];
  // Only the entries read count (G_m's diagonal and lower triangle never do).
  for (int64_t i = 0; i < (M - 1) * T * kLanes; ++i) bad |= !(std::fabs(g[i]) < 1e30f);
  for (int64_t a = 0; a < K; ++a)
    for (int64_t c = a + 1; c < K; ++c) {
      const VF d = Load(ell + a * kLanes) - Load(ell + c * kLanes);
      Store(s.expo.data() + (a * K + c) * kLanes, ExpNonPositive(d < 0.0f ? d : Splat(0.0f)));
    }
  return !bad;
}

// Every subset of the group's shortlists (tables from BuildTables), level by level: the best
// score and row per lane (kBest) and every score into s.scores, [n][L] (kScores).
template <Order kOrder, bool kBest, bool kNanAware, bool kScores>
Best<kNanAware> Enumerate(const Problem& p, Scratch& s) {
  const int64_t K = p.k, M = p.sizes, T = K * (K - 1) / 2;
  const Binomials& C = Binom();
  const float* ell = s.ell.data();
  const float* expo = s.expo.data();
  const float* g = s.g.data();
  float* scores = kScores ? s.scores.data() : nullptr;
  float* prev = s.prev.data();
  float* cur = s.cur.data();
  Best<kNanAware> best;
  // Size 1: F = ℓ. The level-1 state is S0 = 1, S1 = ℓ (no pairs yet).
  {
    LevelView lv(prev, p, 1);
    for (int64_t j = 0; j < K; ++j) {
      const VF lj = Load(ell + j * kLanes);
      Store(lv.s0 + j * kLanes, Splat(1.0f));
      Store(lv.s1 + j * kLanes, lj);
      if (kBest) best.Update(lj, static_cast<int32_t>(j));
      if (kScores) Store(scores + j * kLanes, lj);
    }
  }
  VF gbc[kMaxPool + 2];
  for (int k = 2; k <= M; ++k) {
    const bool last = k == M;
    const LevelView pv(prev, p, k - 1);
    const LevelView cv(last ? prev : cur, p, k);
    const int64_t row0 = p.offsets[k - 1];
    // One (b, c) block: parents with largest element b, rows [C(b, k−1), C(b+1, k−1)) of level
    // k − 1, each joined with c. The sibling p \ {b} ∪ {c} of parent row i is row
    // i − C(b, k−1) + C(c, k−1); the new subset's row in level k is C(c, k) + i.
    auto block = [&](int64_t b, int64_t c, int64_t lo, int64_t hi) {
      const int64_t sib = C(c, k - 1) - C(b, k - 1), out0 = C(c, k);
      const VF e = Load(expo + (b * K + c) * kLanes);
      const VF lc = Load(ell + c * kLanes);
      for (int64_t m = k; m <= M; ++m) gbc[m] = Load(g + ((m - 2) * T + Pair(K, b, c)) * kLanes);
      if (k == 2 && last)
        LevelRun<true, true, kBest, kScores>(p, k, lo, hi, sib, out0, row0, e, lc, gbc, pv, cv,
                                             best, scores);
      else if (k == 2)
        LevelRun<true, false, kBest, kScores>(p, k, lo, hi, sib, out0, row0, e, lc, gbc, pv, cv,
                                              best, scores);
      else if (last)
        LevelRun<false, true, kBest, kScores>(p, k, lo, hi, sib, out0, row0, e, lc, gbc, pv, cv,
                                              best, scores);
      else
        LevelRun<false, false, kBest, kScores>(p, k, lo, hi, sib, out0, row0, e, lc, gbc, pv,
                                               cv, best, scores);
    };
    if (kOrder == Order::kTableOrder) {
      for (int64_t c = k - 1; c < K; ++c)
        for (int64_t b = k - 2; b < c; ++b) block(b, c, C(b, k - 1), C(b + 1, k - 1));
    } else {
      // kTile parent rows at a time, so the tile stays in L1 while every c reads it.
      for (int64_t b = k - 2; b < K - 1; ++b)
        for (int64_t lo = C(b, k - 1), end = C(b + 1, k - 1); lo < end; lo += kTile)
          for (int64_t c = b + 1; c < K; ++c) block(b, c, lo, std::min(lo + kTile, end));
    }
    if (!last) std::swap(prev, cur);
  }
  return best;
}

// Scores the group of queries [q0, q0 + nq) and writes its outputs.
template <bool kAllScores>
void ScoreGroup(const Problem& p, int64_t q0, int64_t nq, Scratch& s, float* best_out,
                int32_t* row_out, int32_t* order_out, float* scores_out) {
  const int64_t K = p.k;
  const bool moderate = BuildTables(p, q0, nq, s);
  if (kAllScores) {
    Enumerate<Order::kBlocked, false, false, true>(p, s);
  } else {
    VF score;
    VI row;
    if (moderate) {
      const Best<false> b = Enumerate<Order::kTableOrder, true, false, false>(p, s);
      score = b.score, row = b.row;
    } else {
      const Best<true> b = Enumerate<Order::kTableOrder, true, true, false>(p, s);
      score = b.score, row = b.row;
    }
    for (int64_t l = 0; l < nq; ++l) {
      best_out[q0 + l] = score[l];
      row_out[q0 + l] = row[l];
    }
  }
  for (int64_t l = 0; l < nq; ++l)
    std::memcpy(order_out + (q0 + l) * K, s.order.data() + l * K, K * sizeof(int32_t));
  if (kAllScores) {
    // The group's [n][L] scores into its rows of the [Q, n] output, 16 × 16 blocks transposed
    // in registers (a scalar copy cost more than the scoring, measured).
    const float* scores = s.scores.data();
    int64_t i0 = 0;
    for (; i0 + kLanes <= p.n; i0 += kLanes) {
      VF block[kLanes];
      for (int r = 0; r < kLanes; ++r) block[r] = Load(scores + (i0 + r) * kLanes);
      Transpose(block);
      for (int64_t l = 0; l < nq; ++l) Store(scores_out + (q0 + l) * p.n + i0, block[l]);
    }
    for (int64_t l = 0; l < nq; ++l)
      for (int64_t i = i0; i < p.n; ++i) scores_out[(q0 + l) * p.n + i] = scores[i * kLanes + l];
  }
}

// Groups of kLanes queries spread over XLA's intra-op pool (parallel.h).
template <bool kAllScores>
void ScoreAll(ffi::ThreadPool& pool, const Problem& p, float* best_out, int32_t* row_out,
              int32_t* order_out, float* scores_out) {
  const int64_t groups = (p.q + kLanes - 1) / kLanes;
  hyset::ParallelFor(pool, groups, [p, best_out, row_out, order_out, scores_out](int64_t gi) {
    Scratch& scratch = Scratch::ForThread(p, kAllScores);
    const int64_t q0 = gi * kLanes;
    const int64_t nq = p.q - q0 < kLanes ? p.q - q0 : kLanes;
    ScoreGroup<kAllScores>(p, q0, nq, scratch, best_out, row_out, order_out, scores_out);
  });
}

ffi::Error CheckAndDescribe(const ffi::Buffer<ffi::F32>& logits,
                            const ffi::Buffer<ffi::F32>& pairs, Problem* p) {
  auto ld = logits.dimensions();
  auto pd = pairs.dimensions();
  if (ld.size() != 2 || pd.size() != 4)
    return ffi::Error::InvalidArgument("expected logits [Q, K] and pairs [Q, M-1, K, K]");
  p->q = ld[0];
  p->k = ld[1];
  p->sizes = pd[1] + 1;
  if (pd[0] != p->q || pd[2] != p->k || pd[3] != p->k)
    return ffi::Error::InvalidArgument("pairs must be [Q, M-1, K, K] for logits [Q, K]");
  if (p->k > kMaxPool || p->sizes < 2 || p->sizes > p->k)
    return ffi::Error::InvalidArgument("need 2 <= M <= K <= " + std::to_string(kMaxPool));
  p->offsets[0] = 0;
  for (int m = 1; m <= p->sizes; ++m) p->offsets[m] = p->offsets[m - 1] + Binom()(p->k, m);
  p->n = p->offsets[p->sizes];
  if (p->n > std::numeric_limits<int32_t>::max())
    return ffi::Error::InvalidArgument("too many subsets for int32 rows");
  p->logits = logits.typed_data();
  p->pairs = pairs.typed_data();
  return ffi::Error::Success();
}

ffi::Error BestSubsetImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> logits,
                          ffi::Buffer<ffi::F32> pairs, ffi::ResultBuffer<ffi::F32> best,
                          ffi::ResultBuffer<ffi::S32> row, ffi::ResultBuffer<ffi::S32> order) {
  Problem p;
  if (ffi::Error err = CheckAndDescribe(logits, pairs, &p); err.failure()) return err;
  if (p.q == 0) return ffi::Error::Success();
  ScoreAll<false>(pool, p, best->typed_data(), row->typed_data(), order->typed_data(), nullptr);
  return ffi::Error::Success();
}

ffi::Error SubsetScoresImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> logits,
                            ffi::Buffer<ffi::F32> pairs, ffi::ResultBuffer<ffi::F32> scores,
                            ffi::ResultBuffer<ffi::S32> order) {
  Problem p;
  if (ffi::Error err = CheckAndDescribe(logits, pairs, &p); err.failure()) return err;
  if (p.q == 0) return ffi::Error::Success();
  ScoreAll<true>(pool, p, nullptr, nullptr, order->typed_data(), scores->typed_data());
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(HysetBestSubset, BestSubsetImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(HysetSubsetScores, SubsetScoresImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>());
