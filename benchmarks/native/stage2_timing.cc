// One-core timing of the native stage-2 kernel's own functions, without XLA around them: the
// per-group tables alone (BuildTables), and whole groups (ScoreGroup: tables, the walk and the
// outputs) for the best set and for every score.
// Compiled and run by benchmarks/native_stage2.py, which includes hyset_jax/inference/native/subsets.cc
// (SUBSETS_CC) into this file. Prints one JSON line.
#include SUBSETS_CC

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>

namespace {

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t Q = argc > 1 ? std::atoll(argv[1]) : 1024;
  const int64_t K = argc > 2 ? std::atoll(argv[2]) : 20;
  const int64_t M = argc > 3 ? std::atoll(argv[3]) : 5;
  const int reps = argc > 4 ? std::atoi(argv[4]) : 20;
  // The inputs of `hyset bench enumerate`: ℓ ~ N(0, 1), symmetric G_m ~ N(0, 0.1²); or, with
  // a fifth argument, read from that file: f32 ℓ [Q, K] then G [Q, M−1, K, K], native order.
  std::vector<float> logits(Q * K), pairs(Q * (M - 1) * K * K);
  if (argc > 5) {
    FILE* f = std::fopen(argv[5], "rb");
    if (f == nullptr || std::fread(logits.data(), 4, logits.size(), f) != logits.size() ||
        std::fread(pairs.data(), 4, pairs.size(), f) != pairs.size()) {
      std::fprintf(stderr, "cannot read %lld + %lld floats from %s\n", (long long)logits.size(),
                   (long long)pairs.size(), argv[5]);
      return 2;
    }
    std::fclose(f);
  } else {
    std::mt19937 rng(0);
    std::normal_distribution<float> normal;
    for (float& x : logits) x = normal(rng);
    for (int64_t i = 0; i < Q * (M - 1); ++i)
      for (int64_t a = 0; a < K; ++a)
        for (int64_t c = 0; c <= a; ++c)
          pairs[(i * K + a) * K + c] = pairs[(i * K + c) * K + a] = 0.1f * normal(rng);
  }
  Problem p;
  p.q = Q, p.k = K, p.sizes = M, p.logits = logits.data(), p.pairs = pairs.data();
  p.offsets[0] = 0;
  for (int m = 1; m <= M; ++m) p.offsets[m] = p.offsets[m - 1] + Binom()(K, m);
  p.n = p.offsets[M];
  std::vector<float> scores(Q * p.n), best_score(Q);
  std::vector<int32_t> best_row(Q), order(Q * K);
  Scratch& s = Scratch::ForThread(p, true);
  double build = 1e30, best = 1e30, every = 1e30;
  float sink = 0;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t q0 = 0; q0 < Q; q0 += kLanes) BuildTables(p, q0, std::min<int64_t>(kLanes, Q - q0), s);
    auto t1 = std::chrono::steady_clock::now();
    for (int64_t q0 = 0; q0 < Q; q0 += kLanes)
      ScoreGroup<false>(p, q0, std::min<int64_t>(kLanes, Q - q0), s, best_score.data(),
                        best_row.data(), order.data(), nullptr);
    auto t2 = std::chrono::steady_clock::now();
    for (int64_t q0 = 0; q0 < Q; q0 += kLanes)
      ScoreGroup<true>(p, q0, std::min<int64_t>(kLanes, Q - q0), s, nullptr, nullptr,
                       order.data(), scores.data());
    auto t3 = std::chrono::steady_clock::now();
    sink += best_score[Q - 1] + scores[Q * p.n - 1];
    build = std::min(build, Seconds(t0, t1));
    best = std::min(best, Seconds(t1, t2));
    every = std::min(every, Seconds(t2, t3));
  }
  std::printf("{\"queries\": %lld, \"k_pool\": %lld, \"max_size\": %lld, \"repeats\": %d, "
              "\"tables_us_per_query\": %.4f, \"best_us_per_query\": %.4f, "
              "\"scores_us_per_query\": %.4f, \"checksum\": %.6g}\n",
              (long long)Q, (long long)K, (long long)M, reps, build / Q * 1e6, best / Q * 1e6,
              every / Q * 1e6, sink);
  return 0;
}
