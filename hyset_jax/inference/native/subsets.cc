// Stage 2 of HYSET (paper Eq. 14) on the CPU as XLA FFI custom calls: every subset of size
// 1..M of a K-tool shortlist scored by a depth-first walk over the subsets (DepthFirst), and
// either the best subset per query or every score. Loaded by
// hyset_jax/inference/native/__init__.py, which compiles this file once per machine (see
// docs/speed.md, "The native CPU kernels").
//
// Why a kernel of our own: XLA:CPU runs the enumeration as a chain of fusions that write each
// level of subsets to memory and gather it back, on one core; here a group of kLanes queries
// is scored together with queries on the vector lanes, the walk's whole state stays in L1, and
// groups are spread over XLA's intra-op thread pool.
//
// The best-set output branches and bounds: a subtree of the walk whose sets cannot be the
// first maximum (an upper bound on them, rounding slack included, is at most a score already
// reached) is not scored (Prunable, BuildBounds); the answer is the same set and score.
//
// Numbers and ties: the shortlist is reordered by ascending ℓ (a stable sort; `order` reports
// it), a subset's softmax sums are kept relative to its largest logit t (every weight
// exp(ℓ_i − ℓ_t) ≤ 1), F(E) = P_|E|(E) + S1(E) / S0(E); the scores equal those of
// hyset_jax.inference.enumeration's forms to float rounding, and the best-set and every-score
// outputs compute each score with the same operations, so the best set's score is bit for bit
// its entry in every score. Rows follow hyset_jax.inference.subsets.SubsetTable: sizes
// ascending, colex within a size, so the best set is the first maximum in table order (a NaN
// score wins, as in jnp.argmax).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "parallel.h"
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kLanes = 16;     // queries scored together, one per vector lane
constexpr int kMaxPool = 62;   // K limit: binomials below fit int64 for every M
constexpr int kSeedPool = 7;   // the floor of the pruning scores every subset of the top 7


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


// Per-thread working memory. Kept by each thread between calls (ForThread): allocating and
// zeroing its megabytes on every call cost ~1 ms, more than scoring one group (measured).
struct Scratch {
  std::vector<float> ell;                   // [K][L]
  std::vector<float> expo, expo_ell;        // [K(K−1)/2][L] each, by Pair
  std::vector<float> g;                     // [M−1][K(K−1)/2][L], by Pair
  std::vector<int32_t> order;               // [L][K]
  std::vector<int32_t> order_t;             // [K][L]
  std::vector<float> node_pairs, node_rows; // depth-first state: [M][M+1][L], [M][M+1][K][L]
  std::vector<float> scores;                // [n][L] (every-score output only)
  std::vector<float> tri_max;               // [K+1][L]: max G_M[i, a] over i < a < low
  std::vector<float> col_max;               // [K][L]: max G_M[i, a] over i < a
  std::vector<float> slack;                 // [L]: rounding allowance of the bounds
  std::vector<float> floor;                 // [L]: a score reached for sure (BuildBounds)

  // This thread's scratch, grown to fit p (never shrunk: a server sees the same shapes).
  static Scratch& ForThread(const Problem& p, bool all_scores) {
    static thread_local Scratch s;
    const int64_t K = p.k, M = p.sizes, T = K * (K - 1) / 2;
    Grow(s.ell, K * kLanes);
    Grow(s.expo, T * kLanes);
    Grow(s.expo_ell, T * kLanes);
    Grow(s.g, (M - 1) * T * kLanes);
    Grow(s.order, kLanes * K);
    Grow(s.order_t, K * kLanes);
    Grow(s.node_pairs, M * (M + 1) * kLanes);
    Grow(s.node_rows, M * (M + 1) * K * kLanes);
    if (all_scores) Grow(s.scores, p.n * kLanes);
    Grow(s.tri_max, (K + 1) * kLanes);
    Grow(s.col_max, K * kLanes);
    Grow(s.slack, kLanes);
    Grow(s.floor, kLanes);
    return s;
  }

 private:
  template <class V>
  static void Grow(V& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(n);
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

// Whether any lane of a mask is set.
inline bool Any(VI m) {
#if defined(__AVX512F__)
  __m512i x;
  std::memcpy(&x, &m, sizeof(x));
  return _mm512_test_epi32_mask(x, x) != 0;
#elif defined(__AVX2__)
  __m256i lo, hi;  // two compares' masks: OR the halves, then one test
  std::memcpy(&lo, &m, sizeof(lo));
  std::memcpy(&hi, reinterpret_cast<const char*>(&m) + sizeof(lo), sizeof(hi));
  const __m256i x = _mm256_or_si256(lo, hi);
  return !_mm256_testz_si256(x, x);
#else
  int32_t acc = 0;
  for (int l = 0; l < kLanes; ++l) acc |= m[l];
  return acc != 0;
#endif
}

// Whether a > b on any lane (one compare into a mask register on AVX-512).
inline bool AnyGreater(VF a, VF b) {
#if defined(__AVX512F__)
  __m512 x, y;
  std::memcpy(&x, &a, sizeof(x));
  std::memcpy(&y, &b, sizeof(y));
  return _mm512_cmp_ps_mask(x, y, _CMP_GT_OQ) != 0;
#else
  return Any(a > b);
#endif
}

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
  inline void Update(VF f, VI r) {
    VI take = f > score;
    if (kNanAware) take |= (f != f) & (score == score);
    score = take ? f : score;
    row = take ? r : row;
  }
};

// Index of the pair (a, c), a < c, among the K(K−1)/2 pairs ordered by c, then a: the pairs
// of a given larger element c are contiguous, which the depth-first walk reads.
inline int64_t Pair(int64_t a, int64_t c) { return c * (c - 1) / 2 + a; }

inline VF Max(VF a, VF b);

// The group's tables for the bounds of DepthFirst's pruning: col_max[a] = max G_M[i, a] over
// i < a, tri_max[low] = max G_M[i, a] over i < a < low (−inf for low < 2), and slack = (M + 4)² · 2^−21 · (C(M, 2)·max|G| + M·max|ℓ|),
// per lane: a set's score and a bound are sums of at most C(M, 2) pair entries and a softmax
// mean of M logits, each computed with fewer than (M + 4)² roundings of at most 2^−24 times
// that scale, so a bound plus slack is at least the computed score of every set it covers.
void BuildBounds(const Problem& p, Scratch& s) {
  const int64_t K = p.k, M = p.sizes, T = K * (K - 1) / 2;
  const float* gm = s.g.data() + (M - 2) * T * kLanes;
  VF most = Splat(-std::numeric_limits<float>::infinity());
  Store(s.tri_max.data(), most);
  for (int64_t c = 0; c < K; ++c) {
    VF col = Splat(-std::numeric_limits<float>::infinity());
    for (int64_t a = 0; a < c; ++a) col = Max(col, Load(gm + Pair(a, c) * kLanes));
    Store(s.col_max.data() + c * kLanes, col);
    most = Max(most, col);
    Store(s.tri_max.data() + (c + 1) * kLanes, most);
  }
  VF gabs = Splat(0.0f), labs = Splat(0.0f);
  for (int64_t i = 0; i < (M - 1) * T; ++i) {
    const VF v = Load(s.g.data() + i * kLanes);
    gabs = Max(gabs, v < 0.0f ? -v : v);
  }
  for (int64_t j = 0; j < K; ++j) {
    const VF v = Load(s.ell.data() + j * kLanes);
    labs = Max(labs, v < 0.0f ? -v : v);
  }
  const float rel = static_cast<float>((M + 4) * (M + 4)) * 0x1p-21f;
  const VF slack = (gabs * static_cast<float>(M * (M - 1) / 2) + labs * static_cast<float>(M) +
                    std::numeric_limits<float>::min()) * rel;
  Store(s.slack.data(), slack);
  // The floor: a score some set reaches for sure, so that sets bounded at or below it can be
  // passed over. The largest logit (the size-1 set {K − 1}, computed as the walk does), and the
  // best set among the kSeedPool largest logits, computed in another order and lowered by
  // 3·slack (each computation is within slack of the exact score), so that it lies strictly
  // below that set's score in the walk: a bound at or below it is below a set that wins.
  const float* ell = s.ell.data();
  VF floor = Load(ell + (K - 1) * kLanes);
  const int64_t pool = std::min<int64_t>(K, kSeedPool), first = K - pool;
  for (uint32_t bits = 3; bits < (1u << pool); ++bits) {
    const int size = __builtin_popcount(bits);
    if (size < 2 || size > M) continue;
    int members[kSeedPool], n = 0;
    for (int64_t b = 0; b < pool; ++b)
      if (bits >> b & 1) members[n++] = static_cast<int>(first + b);
    const int t = members[n - 1];
    const float* gm = s.g.data() + (size - 2) * T * kLanes;
    VF pair_sum = Splat(0.0f), s0 = Splat(1.0f), s1 = Load(ell + t * kLanes);
    for (int i = 0; i + 1 < n; ++i) {
      s0 += Load(s.expo.data() + Pair(members[i], t) * kLanes);
      s1 += Load(s.expo_ell.data() + Pair(members[i], t) * kLanes);
      for (int j = i + 1; j < n; ++j) pair_sum += Load(gm + Pair(members[i], members[j]) * kLanes);
    }
    floor = Max(floor, (pair_sum + s1 / s0) - slack * 3.0f);
  }
  Store(s.floor.data(), floor);
}

// v[l] = base[index[l]] on every lane: one gather instruction on AVX-512.
inline VF Gather(const float* base, VI index) {
#if defined(__AVX512F__)
  static_assert(kLanes == 16);
  __m512i i;
  std::memcpy(&i, &index, sizeof(i));
  const __m512 v = _mm512_i32gather_ps(i, base, 4);
  VF out;
  std::memcpy(&out, &v, sizeof(out));
  return out;
#elif defined(__AVX2__)
  __m256i lo, hi;  // two 8-lane gathers
  std::memcpy(&lo, &index, sizeof(lo));
  std::memcpy(&hi, reinterpret_cast<const char*>(&index) + sizeof(lo), sizeof(hi));
  const __m256 a = _mm256_i32gather_ps(base, lo, 4), b = _mm256_i32gather_ps(base, hi, 4);
  VF out;
  std::memcpy(&out, &a, sizeof(a));
  std::memcpy(reinterpret_cast<char*>(&out) + sizeof(a), &b, sizeof(b));
  return out;
#else
  VF out;
  for (int l = 0; l < kLanes; ++l) out[l] = base[index[l]];
  return out;
#endif
}

// Whether a lane's value is not a finite float below 1e30 in magnitude.
inline VI Immoderate(VF v) { return ~((v < 0.0f ? -v : v) < 1e30f); }

// Builds the group's lane-interleaved tables in ascending-ℓ order: ell [K][L]; by Pair (a < c),
// expo = exp(ℓ_a − ℓ_c), expo_ell = expo·ℓ_a and g [M−1][K(K−1)/2][L] = G_m[a, c]; lanes past nq
// repeat query q0. Returns whether every input read is finite and below 1e30 in magnitude
// (then no score is NaN). Everything is computed with queries on the lanes: the sort as ranks
// (K² vector compares), the pair tables as gathers through each lane's order.
bool BuildTables(const Problem& p, int64_t q0, int64_t nq, Scratch& s) {
  const int64_t K = p.k, M = p.sizes, KK = K * K, T = K * (K - 1) / 2;
  VI lane = VI{};  // the query of each lane, relative to q0
  for (int l = 0; l < kLanes; ++l) lane[l] = l < nq ? l : 0;
  VI bad = VI{};   // an OR reduction vectorises; a running max with NaN tests does not
  VF x[kMaxPool];
  for (int64_t j = 0; j < K; ++j) {
    x[j] = Gather(p.logits + q0 * K, lane * static_cast<int32_t>(K) + static_cast<int32_t>(j));
    bad |= Immoderate(x[j]);
  }
  // Stable sort by ℓ with NaN after +inf (jnp.argsort's order): the rank of j counts the i
  // before it, i.e. ℓ_i < ℓ_j, or equal (both NaN included) with i < j.
  auto before = [](VF a, VF b) { return (a < b) | ((a == a) & (b != b)); };
  int32_t* ord_t = s.order_t.data();  // [K][L]: the original position at each sorted one
  for (int64_t j = 0; j < K; ++j) {
    VI rank = VI{};
    for (int64_t i = 0; i < K; ++i) {
      const VI earlier = i < j ? ~before(x[j], x[i]) : before(x[i], x[j]);
      rank -= earlier;  // a true mask is −1
    }
    for (int l = 0; l < kLanes; ++l) {
      ord_t[rank[l] * kLanes + l] = static_cast<int32_t>(j);
      s.ell[rank[l] * kLanes + l] = x[j][l];
      s.order[l * K + rank[l]] = static_cast<int32_t>(j);
    }
  }
  // g[m][Pair(a, c)] = G_m[ord a, ord c] of each lane's query.
  const float* pairs = p.pairs + q0 * (M - 1) * KK;
  const VI lane_base = lane * static_cast<int32_t>((M - 1) * KK);
  float* g = s.g.data();
  for (int64_t m = 0; m < M - 1; ++m)
    for (int64_t c = 1; c < K; ++c) {
      VI col;
      std::memcpy(&col, ord_t + c * kLanes, sizeof(col));
      col += lane_base + static_cast<int32_t>(m * KK);
      for (int64_t a = 0; a < c; ++a) {
        VI row;
        std::memcpy(&row, ord_t + a * kLanes, sizeof(row));
        const VF v = Gather(pairs, col + row * static_cast<int32_t>(K));
        bad |= Immoderate(v);  // only the entries read count
        Store(g + (m * T + Pair(a, c)) * kLanes, v);
      }
    }
  const float* ell = s.ell.data();
  for (int64_t c = 1; c < K; ++c)
    for (int64_t a = 0; a < c; ++a) {
      const VF la = Load(ell + a * kLanes);
      const VF d = la - Load(ell + c * kLanes);
      const VF e = ExpNonPositive(d < 0.0f ? d : Splat(0.0f));
      Store(s.expo.data() + Pair(a, c) * kLanes, e);
      Store(s.expo_ell.data() + Pair(a, c) * kLanes, e * la);
    }
  return !Any(bad);
}

inline VF Max(VF a, VF b) {
#if defined(__AVX512F__)
  static_assert(kLanes == 16);
  __m512 x, y;
  std::memcpy(&x, &a, sizeof(x));
  std::memcpy(&y, &b, sizeof(y));
  x = _mm512_max_ps(x, y);
  std::memcpy(&a, &x, sizeof(a));
  return a;
#else
  return b > a ? b : a;
#endif
}

// The score of leaf i of a run (see DepthFirst): sums s0 + w[i], s1 + wl[i], pair sum
// pm + (r[i] + gm[i]). The one formula both outputs use, so that their scores agree bit for bit.
inline VF Leaf(int64_t i, VF s0, VF s1, VF pm, const float* __restrict r,
               const float* __restrict gm, const float* __restrict w,
               const float* __restrict wl) {
  const VF c0 = s0 + Load(w + i * kLanes);
  const VF c1 = s1 + Load(wl + i * kLanes);
  return (pm + (Load(r + i * kLanes) + Load(gm + i * kLanes))) + c1 / c0;
}

// Scores the leaves i < n of a run (Leaf), rows row0 + i, into best. Without NaNs, the loop keeps only a running max (one instruction per
// leaf instead of a compare and two selects: the loop is bound by its vector instructions) and,
// in the rare runs that raise a lane's best, scores the run again to find the first row that
// reaches it, so the result is that of the compare-and-select.
template <bool kNanAware>
inline void LeafRun(int64_t n, VF s0, VF s1, VF pm, const float* __restrict r,
                    const float* __restrict gm, const float* __restrict w,
                    const float* __restrict wl, int32_t row0, Best<kNanAware>& best) {
  auto leaf = [&](int64_t i) { return Leaf(i, s0, s1, pm, r, gm, w, wl); };
  if constexpr (kNanAware) {
    Best<kNanAware> b = best;
    VI row = VI{} + row0;
    for (int64_t i = 0; i < n; ++i, row += 1) b.Update(leaf(i), row);
    best = b;
    return;
  }
  VF most = best.score;
  for (int64_t i = 0; i < n; ++i) most = Max(most, leaf(i));
  if (!AnyGreater(most, best.score)) return;
  VI open = most > best.score;  // lanes whose best this run raises, until their row is found
  VF score = best.score;
  VI row = best.row;
  for (int64_t i = 0; i < n && Any(open); ++i) {
    const VF f = leaf(i);
    const VI take = open & (f == most);
    score = take ? f : score;
    row = take ? (VI{} + static_cast<int32_t>(row0 + i)) : row;
    open &= ~take;
  }
  best.score = score;
  best.row = row;
}

// Every subset scored by a depth-first walk, which keeps its whole state in L1 (a level-by-level
// recurrence streams megabytes of level state through the caches: at K = 20, M = 5 level 4
// alone is 1.2 MB per group of queries). Subsets are grown downwards: a node E (its largest
// element t first, then smaller ones) has children E ∪ {a} for every a < min E, visited with a
// ascending, so each size's subsets arrive in colex order, i.e. in table order. kScores writes
// every score to its row; otherwise one running best per size with a strict > keeps each
// size's first maximum, and merging the sizes in ascending order keeps the first maximum of the
// table. With ℓ sorted ascending, t has the largest logit of every subset below it, and the
// softmax sums are relative to it:
//   S0(E ∪ {a}) = S0(E) + exp(ℓ_a − ℓ_t),   S1(E ∪ {a}) = S1(E) + exp(ℓ_a − ℓ_t)·ℓ_a
//   P_m(E ∪ {a}) = P_m(E) + R_m(E, a),      R_m(E ∪ {a}, a') = R_m(E, a') + G_m[a', a]
// where R_m(E, a) = Σ_{x∈E} G_m[a, x] is kept for every a < min E and every m > |E|. The last
// two sizes are one loop per node of size M − 2 (LastTwo), each leaf scored from that node's
// R_M row. The sets' arithmetic is the same in both outputs, so the best set's score is bit for
// bit its entry among every score.
template <bool kNanAware, bool kScores>
class DepthFirst {
 public:
  DepthFirst(const Problem& p, Scratch& s)
      : p_(p), K_(p.k), M_(p.sizes), T_(p.k * (p.k - 1) / 2), ell_(s.ell.data()),
        expo_(s.expo.data()), expo_ell_(s.expo_ell.data()), g_(s.g.data()),
        node_pairs_(s.node_pairs.data()), node_rows_(s.node_rows.data()),
        scores_(kScores ? s.scores.data() : nullptr), tri_max_(s.tri_max.data()),
        col_max_(s.col_max.data()),
        slack_(Load(s.slack.data())), floor_(Load(s.floor.data())) {}

  Best<kNanAware> Run() {
    for (int64_t t = 0; t < K_; ++t) {
      // Size 1: F = ℓ_t; P_m({t}) = 0 and R_m({t}, a) = G_m[a, t], read from g in place.
      const VF lt = Load(ell_ + t * kLanes);
      Emit(1, lt, static_cast<int32_t>(t));
      count_[1] = t + 1;
      if (t == 0) continue;
      wt_ = expo_ + Pair(0, t) * kLanes;
      wlt_ = expo_ell_ + Pair(0, t) * kLanes;
      for (int64_t m = 2; m <= M_; ++m) {
        Store(Sums(1, m), Splat(0.0f));
        rows_[1][m] = g_ + ((m - 2) * T_ + Pair(0, t)) * kLanes;
      }
      Visit(1, t, Splat(1.0f), lt);
    }
    Best<kNanAware> best = best_[1];
    for (int64_t k = 2; k <= M_; ++k) best.Update(best_[k].score, best_[k].row);
    return best;
  }

 private:
  float* Sums(int64_t k, int64_t m) { return node_pairs_ + (k * (M_ + 1) + m) * kLanes; }
  float* Rows(int64_t k, int64_t m) { return node_rows_ + (k * (M_ + 1) + m) * K_ * kLanes; }
  int32_t Row(int64_t size) { return static_cast<int32_t>(p_.offsets[size - 1] + count_[size]); }
  // The score f of a set of size k at table row `row`.
  void Emit(int64_t k, VF f, int32_t row) {
    if constexpr (kScores) Store(scores_ + static_cast<int64_t>(row) * kLanes, f);
    else best_[k].Update(f, VI{} + row);
  }

  // The children of the node of size k whose smallest element is `low` (its sums S0, S1; its
  // P_m in Sums(k, m) and R_m rows in rows_[k][m], m > k).
  void Visit(int64_t k, int64_t low, VF s0, VF s1) {
    if (k + 2 == M_) return LastTwo(k, low, s0, s1);
    for (int64_t a = 0; a < low; ++a) {
      const VF c0 = s0 + Load(wt_ + a * kLanes);
      const VF c1 = s1 + Load(wlt_ + a * kLanes);
      const VF pc = Load(Sums(k, k + 1)) + Load(rows_[k][k + 1] + a * kLanes);
      Emit(k + 1, pc + c1 / c0, Row(k + 1));
      ++count_[k + 1];
      if (k + 1 == M_ || a == 0) continue;
      const float* gm = g_ + Pair(0, a) * kLanes;  // G_m[·, a] of size m at gm + (m − 2)·T·L
      for (int64_t m = k + 2; m <= M_; ++m) {
        Store(Sums(k + 1, m), Load(Sums(k, m)) + Load(rows_[k][m] + a * kLanes));
        const float* __restrict r = rows_[k][m];
        const float* __restrict gma = gm + (m - 2) * T_ * kLanes;
        float* __restrict out = Rows(k + 1, m);
        for (int64_t i = 0; i < a; ++i)
          Store(out + i * kLanes, Load(r + i * kLanes) + Load(gma + i * kLanes));
        rows_[k + 1][m] = out;
      }
      Visit(k + 1, a, c0, c1);
    }
  }

  // Visit for k = M − 2: the children E ∪ {a} (size M − 1, rows consecutive) and each one's
  // children E ∪ {a, a'}, a' < a (size M, LeafRun), with the state in locals: this is where
  // nearly all the subsets are.
  void LastTwo(int64_t k, int64_t low, VF s0, VF s1) {
    const float* __restrict w = wt_;
    const float* __restrict wl = wlt_;
    const float* __restrict r1 = rows_[k][M_ - 1];
    const float* __restrict rm = rows_[k][M_];
    const float* gm = g_ + (M_ - 2) * T_ * kLanes;
    const VF p1 = Load(Sums(k, M_ - 1)), pm = Load(Sums(k, M_));
    // Pruning (best-only output without NaNs; see Prunable): the whole node, else each run.
    constexpr bool kPrune = !kScores && !kNanAware;
    VF smaller = floor_, top = VF{}, rm_prefix = Splat(-std::numeric_limits<float>::infinity());
    if constexpr (kPrune) {
      for (int64_t j = 1; j + 1 < M_; ++j) smaller = Max(smaller, best_[j].score);
      top = s1 / s0 + slack_;
      if (Prunable(low, top, smaller, p1, pm, r1, rm)) {
        count_[M_ - 1] += low;
        count_[M_] += low * (low - 1) / 2;
        return;
      }
    }
    Best<kNanAware> b1 = best_[M_ - 1], bm = best_[M_];
    const int32_t row1 = Row(M_ - 1);
    int32_t rowm = Row(M_);
    for (int64_t a = 0; a < low; ++a) {
      const VF pa = pm + Load(rm + a * kLanes);
      const float* __restrict ga = gm + Pair(0, a) * kLanes;
      if constexpr (kPrune) {
        // Children E ∪ {a} and E ∪ {a, i}, i < a: pair sums at most p1 + R_{M−1}(E, a) and
        // pa + max R_M(E, i) + max G_M[i, a]; softmax means at most the node's, then at most
        // E ∪ {a}'s (ℓ_i is at most every logit of E ∪ {a}). The division is skipped with
        // the pair.
        const VF r1a = Load(r1 + a * kLanes);
        const VF run = pa + (rm_prefix + Load(col_max_ + a * kLanes));
        rm_prefix = Max(rm_prefix, Load(rm + a * kLanes));
        const VF earlier = Max(smaller, b1.score);
        if (!AnyGreater(Max((p1 + r1a) + top, run + top), Max(earlier, bm.score))) {
          rowm += static_cast<int32_t>(a);
          continue;
        }
        const VF c0 = s0 + Load(w + a * kLanes);
        const VF c1 = s1 + Load(wl + a * kLanes);
        const VF mean = c1 / c0;
        b1.Update((p1 + r1a) + mean, VI{} + static_cast<int32_t>(row1 + a));
        if (AnyGreater(run + (mean + slack_), Max(Max(smaller, b1.score), bm.score)))
          LeafRun<kNanAware>(a, c0, c1, pa, rm, ga, w, wl, rowm, bm);
      } else {
        const VF c0 = s0 + Load(w + a * kLanes);
        const VF c1 = s1 + Load(wl + a * kLanes);
        const VF f1 = (p1 + Load(r1 + a * kLanes)) + c1 / c0;
        if constexpr (kScores) {
          float* __restrict out = scores_ + static_cast<int64_t>(rowm) * kLanes;
          Store(scores_ + (row1 + a) * kLanes, f1);
          for (int64_t i = 0; i < a; ++i)
            Store(out + i * kLanes, Leaf(i, c0, c1, pa, rm, ga, w, wl));
        } else {
          b1.Update(f1, VI{} + static_cast<int32_t>(row1 + a));
          LeafRun<kNanAware>(a, c0, c1, pa, rm, ga, w, wl, rowm, bm);
        }
      }
      rowm += static_cast<int32_t>(a);
    }
    best_[M_ - 1] = b1;
    best_[M_] = bm;
    count_[M_ - 1] += low;
    count_[M_] += low * (low - 1) / 2;
  }

  // Whether no child of this node (size M − 1 or M) can be the first maximum of the table, on
  // any lane. A child's score is at most its pair sums' bound plus the node's softmax mean
  // (a child adds logits at most the node's smallest, which cannot raise the mean) plus slack
  // (BuildBounds). A set can be passed over when an earlier set in table order scores at least
  // as much: a smaller set (`smaller`: the best of sizes below M − 1 and the largest logit,
  // the size-1 set {K − 1}) or an earlier set of its own size; a size-M set also when a size
  // M − 1 set scores strictly more.
  bool Prunable(int64_t low, VF top, VF smaller, VF p1, VF pm, const float* __restrict r1,
                const float* __restrict rm) {
    const VF ninf = Splat(-std::numeric_limits<float>::infinity());
    VF r1_most = ninf, rm_most = ninf;
    for (int64_t a = 0; a < low; ++a) {
      r1_most = Max(r1_most, Load(r1 + a * kLanes));
      rm_most = Max(rm_most, Load(rm + a * kLanes));
    }
    const VF bound1 = (p1 + r1_most) + top;
    const VF boundm =
        low < 2 ? ninf : (pm + (rm_most + rm_most + Load(tri_max_ + low * kLanes))) + top;
    const VF same1 = best_[M_ - 1].score, samem = best_[M_].score;
    const VI keep1 = (bound1 > Max(smaller, same1)) & (bound1 >= samem);
    const VI keepm = boundm > Max(Max(smaller, same1), samem);
    return !Any(keep1 | keepm);
  }

  const Problem& p_;
  const int64_t K_, M_, T_;
  const float *ell_, *expo_, *expo_ell_, *g_;
  float *node_pairs_, *node_rows_, *scores_;
  const float *wt_ = nullptr, *wlt_ = nullptr;  // exp(ℓ_a − ℓ_t) and its ·ℓ_a, a < t
  const float *tri_max_, *col_max_;   // BuildBounds' tables
  const VF slack_, floor_;   // BuildBounds' slack and floor
  const float* rows_[kMaxPool + 2][kMaxPool + 2] = {};
  Best<kNanAware> best_[kMaxPool + 2];
  int64_t count_[kMaxPool + 2] = {};
};

#if defined(__AVX512F__)
// The group's [n][L] scores into its rows of the [Q, n] output, each row written in whole
// aligned cache lines with streaming stores (a line is two blocks' halves when the row does not
// start on a line): ordinary stores first read every line of the output (89 MB at batch 1024)
// into the cache, which cost more than the scoring (measured, docs/speed.md).
void StreamScores(const Problem& p, int64_t q0, int64_t nq, const float* scores, float* out) {
  static_assert(kLanes == 16);
  const int64_t n = p.n, blocks = n / kLanes;
  __m512i shift[kLanes];   // lane l's line: the previous block from h_l on, then this one
  int head[kLanes];        // h_l: the elements of a block before lane l's next line starts
  __m512 prev[kLanes];
  for (int64_t l = 0; l < nq; ++l) {
    const int off = static_cast<int>((reinterpret_cast<uintptr_t>(out + (q0 + l) * n) / 4) % 16);
    head[l] = off == 0 ? 0 : 16 - off;
    shift[l] = _mm512_add_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2,
                                                 1, 0), _mm512_set1_epi32(head[l]));
  }
  for (int64_t b = 0; b < blocks; ++b) {
    VF block[kLanes];
    for (int r = 0; r < kLanes; ++r) block[r] = Load(scores + (b * kLanes + r) * kLanes);
    Transpose(block);
    for (int64_t l = 0; l < nq; ++l) {
      float* row = out + (q0 + l) * n;
      __m512 v;
      std::memcpy(&v, &block[l], sizeof(v));
      if (head[l] == 0) {
        _mm512_stream_ps(row + b * kLanes, v);
      } else if (b == 0) {
        _mm512_mask_storeu_ps(row, static_cast<__mmask16>((1u << head[l]) - 1), v);
      } else {
        _mm512_stream_ps(row + (b - 1) * kLanes + head[l],
                         _mm512_permutex2var_ps(prev[l], shift[l], v));
      }
      prev[l] = v;
    }
  }
  if (blocks > 0)
    for (int64_t l = 0; l < nq; ++l)
      if (head[l] != 0)  // the last block's elements from h_l on
        _mm512_mask_storeu_ps(out + (q0 + l) * n + (blocks - 1) * kLanes,
                              static_cast<__mmask16>(~((1u << head[l]) - 1)), prev[l]);
  for (int64_t l = 0; l < nq; ++l)
    for (int64_t i = blocks * kLanes; i < n; ++i) out[(q0 + l) * n + i] = scores[i * kLanes + l];
  _mm_sfence();  // streaming stores are weakly ordered: done before the output is read
}
#endif

// Scores the group of queries [q0, q0 + nq) and writes its outputs.
template <bool kAllScores>
void ScoreGroup(const Problem& p, int64_t q0, int64_t nq, Scratch& s, float* best_out,
                int32_t* row_out, int32_t* order_out, float* scores_out) {
  const int64_t K = p.k;
  const bool moderate = BuildTables(p, q0, nq, s);
  if (kAllScores) {
    DepthFirst<false, true>(p, s).Run();
  } else {
    VF score;
    VI row;
    if (moderate) {
      BuildBounds(p, s);  // for the pruning, which needs finite scores
      const Best<false> b = DepthFirst<false, false>(p, s).Run();
      score = b.score, row = b.row;
    } else {
      const Best<true> b = DepthFirst<true, false>(p, s).Run();
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
#if defined(__AVX512F__)
    StreamScores(p, q0, nq, s.scores.data(), scores_out);
#else
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
#endif
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
