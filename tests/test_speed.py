"""The fast inference paths against the reference paths: neighbour-table expansion, prepared
model, best-only stage 2, and the tool-ranking methods (hand-checked and brute force)."""
import itertools
import json

import jax.numpy as jnp
import numpy as np
import pytest

from hyset_jax import choices
from hyset_jax.inference import enumeration, pipeline, neighbors, rankings, subsets
from hyset_jax.benchmarking import workload
from hyset_jax.model.scoring import HysetParams

import reference_impl as ref


def make_params(rng, n, d, max_size, scale=0.5, d_r=None):
  d_r = d_r or d
  z = rng.normal(size=(n, d))
  z /= np.linalg.norm(z, axis=1, keepdims=True)
  p = rng.normal(size=(d_r, d))
  ms = rng.normal(size=(max_size - 1, d, d)) * scale
  ms = (ms + ms.transpose(0, 2, 1)) / 2
  return as_params(z, p, ms)


def as_params(z, p, ms):
  return HysetParams(tool_embeddings=jnp.asarray(z, jnp.float32),
                     projection=jnp.asarray(p, jnp.float32),
                     interactions=jnp.asarray(ms, jnp.float32))


def trained_like(rng, n, d, max_size):
  """Clustered tools with exact duplicates and a low-rank M, as trained models have: many
  equal and near-equal g values, and ties at the table's row boundaries."""
  centres = rng.normal(size=(n // 6, d))
  z = centres[rng.integers(0, len(centres), n)] + 0.05 * rng.normal(size=(n, d))
  z[1::7] = z[0::7][:len(z[1::7])]                  # exact duplicates
  z /= np.linalg.norm(z, axis=1, keepdims=True)
  u = rng.normal(size=(max_size - 1, d, 2))
  ms = np.einsum("mdr,mer->mde", u, u) * 0.3
  return as_params(z, np.eye(d), ms)


def assert_same_prediction(a, b):
  np.testing.assert_array_equal(np.asarray(a.shortlist), np.asarray(b.shortlist))
  np.testing.assert_array_equal(np.asarray(a.set_tools), np.asarray(b.set_tools))
  np.testing.assert_array_equal(np.asarray(a.set_size), np.asarray(b.set_size))
  np.testing.assert_allclose(np.asarray(a.set_score), np.asarray(b.set_score), atol=1e-5)
  np.testing.assert_array_equal(np.asarray(a.ranking), np.asarray(b.ranking))


def expansion(params, r, k1, k_pool, max_size, table):
  prep = pipeline.prepare(params, max_size=max_size, k_pool=k_pool, neighbor_table=False)
  prep = prep._replace(neighbors=table)
  return pipeline.shortlist_prepared(prep, r, k1, k_pool)


@pytest.mark.parametrize("kind", ["random", "trained-like"])
def test_neighbor_expansion_equals_the_full_scan(kind):
  rng = np.random.default_rng(0)
  params = (make_params(rng, 300, 12, 3) if kind == "random" else trained_like(rng, 300, 12, 3))
  r = jnp.asarray(rng.normal(size=(40, 12)), jnp.float32)
  k1, k_pool = 6, 10
  full = pipeline.shortlist(params, r, k1, k_pool, 3)
  prep = pipeline.prepare(params, max_size=3, k_pool=k_pool)
  assert prep.neighbors.ids.shape == (300, k_pool)
  fast = pipeline.shortlist_prepared(prep, r, k1, k_pool)
  np.testing.assert_array_equal(np.asarray(fast.tools), np.asarray(full.tools))
  np.testing.assert_allclose(np.asarray(fast.logits), np.asarray(full.logits), atol=1e-5)
  # The table answered (no fallback) for most queries of a random model.
  logits = r @ prep.logit_weights.T
  s0 = jnp.argsort(-logits, axis=1)[:, :k1].astype(jnp.int32)
  exp = neighbors.expand(prep.neighbors, logits, s0, k_pool - k1)
  if kind == "random":
    assert not np.any(np.asarray(exp.tie))


@pytest.mark.parametrize("kind", ["random", "trained-like", "untrained", "filtered"])
def test_the_distinct_tool_scan_equals_the_full_scan(kind):
  # Training's shortlist (pipeline.shortlist_distinct): queries that share their stage-1 tools
  # (near-duplicate requests), so the batch's S0 slots repeat tools; padding rows repeat one.
  rng = np.random.default_rng(3)
  n, d, k1, k_pool = 300, 12, 6, 10
  params = {"random": make_params, "trained-like": trained_like, "filtered": make_params,
            "untrained": make_params}[kind](rng, n, d, 3)
  if kind == "untrained":  # M = 0: every g ties, the order falls back to ℓ, then the row
    params = params._replace(interactions=jnp.zeros_like(params.interactions))
  base = rng.normal(size=(7, d))
  r = jnp.asarray(base[rng.integers(7, size=70)] + 0.01 * rng.normal(size=(70, d)), jnp.float32)
  x = r
  if kind == "filtered":
    x = pipeline.QueryInputs(r, allowed=jnp.asarray(rng.random((70, n)) < 0.5))
  full = pipeline.shortlist(params, x, k1, k_pool, 3)
  got = pipeline.shortlist_distinct(params, x, k1, k_pool, 3)
  slots = np.asarray(full.tools)[:, :k1]
  assert len(np.unique(slots)) < slots.size / 3 and len(np.unique(slots)) % 64
  np.testing.assert_array_equal(np.asarray(got.tools), np.asarray(full.tools))
  np.testing.assert_array_equal(np.asarray(got.logits), np.asarray(full.logits))


def test_the_train_shortlist_benchmark_checks_its_answer_and_its_outputs(tmp_path, capsys):
  from benchmarks import train_shortlist
  argv = ["--sizes", "300", "--repeats", "1", "--tag", "t", "--results", str(tmp_path)]
  assert train_shortlist.main(argv) == 0
  doc = json.loads((tmp_path / "train_shortlist_t.json").read_text())
  (r,) = doc["rows"]
  assert r["tools"] == 300 and 0 < r["distinct_s0_tools"] < 256 * 15
  assert r["distinct_speedup"] == pytest.approx(r["scan_s"] / r["distinct_s"])
  assert "| 300 |" in (tmp_path / "train_shortlist_t.md").read_text()
  assert train_shortlist.main(argv) == 2  # the results exist: --force replaces them
  assert "--force" in capsys.readouterr().err
  assert train_shortlist.main([*argv[:-2], "--results", str(tmp_path / "missing")]) == 2
  assert train_shortlist.main(["--sizes", "10", "--results", str(tmp_path)]) == 2


def test_every_g_ties_when_m_is_zero_and_the_order_falls_back_to_logits():
  rng = np.random.default_rng(1)
  params = make_params(rng, 80, 8, 3)._replace(interactions=jnp.zeros((2, 8, 8)))
  r = jnp.asarray(rng.normal(size=(5, 8)), jnp.float32)
  prep = pipeline.prepare(params, max_size=3, k_pool=10)
  logits = np.asarray(r @ prep.logit_weights.T)
  s0 = jnp.asarray(np.argsort(-logits, axis=1)[:, :4], jnp.int32)
  assert np.all(np.asarray(neighbors.expand(prep.neighbors, jnp.asarray(logits), s0, 6).tie))
  fast = pipeline.shortlist_prepared(prep, r, 4, 10)
  np.testing.assert_array_equal(np.asarray(fast.tools),
                                np.argsort(-logits, axis=1, kind="stable")[:, :10])


def test_a_tie_at_the_row_boundary_is_detected_and_scanned():
  """Tool 0 is S0's only member; tools 1..N-1 all tie in g. The table's row holds W of them and
  misses the one of largest ℓ; the expansion must still pick by ℓ."""
  n, d = 30, 4
  z = np.zeros((n, d), np.float32)
  z[0] = [1, 0, 0, 0]
  z[1:] = [0.6, 0.8, 0, 0]                          # equal z_0ᵀ M z_t for every t ≥ 1
  z[1:, 2] = np.linspace(-0.1, 0.1, n - 1)         # distinct ℓ along axis 2
  z /= np.linalg.norm(z, axis=1, keepdims=True)
  # Row 0's g ties exactly only if the varying axis does not enter M: M acts on axes 0-1.
  m = np.zeros((1, d, d), np.float32)
  m[0, 0, 1] = m[0, 1, 0] = 1.0
  z[1:, :2] = [0.6, 0.8]
  params = as_params(z, np.eye(d), m)
  r = jnp.asarray([[5.0, 0, 1.0, 0]], jnp.float32)   # tool 0 first by ℓ, then by axis 2
  full = pipeline.shortlist(params, r, 1, 4, 2)
  table = pipeline.prepare(params, max_size=2, k_pool=4).neighbors
  fast = expansion(params, r, 1, 4, 2, table)
  np.testing.assert_array_equal(np.asarray(fast.tools), np.asarray(full.tools))
  assert int(full.tools[0, 1]) == n - 1              # largest ℓ among the tied tools


@pytest.mark.parametrize("method", [m for m in choices.ENUMERATION_METHODS if m != "gather"])
def test_prepared_predict_equals_the_reference_path(method):
  rng = np.random.default_rng(2)
  params = make_params(rng, 120, 10, 4, scale=0.3, d_r=7)
  r = rng.normal(size=(70, 7)).astype(np.float32)
  kw = dict(k1=5, k_pool=10, max_size=4, method=method, ranking="greedy")
  want = pipeline.predict(params, r, **kw)
  got = pipeline.predict_prepared(pipeline.prepare(params, max_size=4, k_pool=10), r, **kw)
  assert_same_prediction(got, want)


def test_prepared_predict_with_every_ranking_equals_the_reference_path():
  """predict_batched with ``rankings`` (predict_prepared_rankings per chunk: one stage 2 for
  every ranking) gives what the reference path gives for each ranking alone."""
  rng = np.random.default_rng(2)
  params = make_params(rng, 120, 10, 4, scale=0.3, d_r=7)
  r = rng.normal(size=(70, 7)).astype(np.float32)      # 70 = two chunks of 32 + a remainder
  kw = dict(k1=5, k_pool=10, max_size=4, method="gather")
  want = [pipeline.predict(params, r, ranking=name, **kw) for name in choices.RANKINGS]
  batched = pipeline.predict_batched(params, r, batch_size=32, rankings=choices.RANKINGS, **kw)
  assert len(batched) == len(choices.RANKINGS)
  for b, w in zip(batched, want):
    assert_same_prediction(b, w)
  assert not np.array_equal(want[0].ranking, want[1].ranking)   # the rankings do differ here
  with pytest.raises(ValueError, match="ranking or rankings"):
    pipeline.predict_batched(params, r, ranking="logit", rankings=("greedy",), **kw)


@pytest.mark.parametrize("k_pool,max_size,batch", [(8, 3, 5), (20, 5, 66), (10, 4, 64)])
def test_best_subset_is_the_argmax_of_every_score(k_pool, max_size, batch):
  w = workload.make_workload(k_pool, max_size, batch, seed=4)
  table = subsets.subset_table(k_pool, max_size)
  # Exact ties between sizes and within a size: duplicated logits and zero pair scores.
  logits = w.logits.copy()
  logits[::3, 1] = logits[::3, 0]
  pairs = w.pairs.copy()
  pairs[::4] = 0.0
  # At the paper's scale the default method and the matmul form (colex and bf16 compile
  # slowly there; the smaller cases cover every method).
  methods = ((choices.DEFAULT_METHOD, "matmul") if k_pool == 20
             else choices.ENUMERATION_METHODS)
  for method in methods:
    want = subsets.best_sets(enumeration.score_subsets(logits, pairs, table, method), table)
    got = enumeration.best_subset(logits, pairs, table, method)
    for a, b in zip(got, want):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_rankings_on_a_hand_checkable_case():
  """Three tools, M = 2. ℓ = (3, 2, 1); a strong pair bonus for {1, 2} makes Ê = {1, 2}."""
  logits = jnp.asarray([[3.0, 2.0, 1.0]])
  g = np.zeros((1, 1, 3, 3), np.float32)
  g[0, 0, 1, 2] = g[0, 0, 2, 1] = 5.0
  pairs = jnp.asarray(g)
  table = subsets.subset_table(3, 2)
  best = enumeration.best_subset(logits, pairs, table)
  pos = jnp.sort(jnp.where(best.mask[:, 0], best.positions[:, 0], 3), axis=1)
  assert np.asarray(pos).tolist() == [[1, 2]]
  rank = {name: np.asarray(rankings.rank_tools(logits, pairs, pos, name, 2)).tolist()
          for name in choices.RANKINGS}
  assert rank["logit"] == [[0, 1, 2]]
  assert rank["set-first"] == [[1, 2, 0]]             # Ê by ℓ, then the rest
  # Greedy: the best singleton (tool 0, ℓ = 3), then the best pair containing it — {0, 2}:
  # the softmax average of (3, 1) is 2.76, of (3, 2) 2.73 — then the rest.
  assert rank["greedy"] == [[0, 2, 1]]
  assert rank["set-mean"] == [[1, 2, 0]]  # means 2.83, 3.82, 3.50 (F{1,2} = 6.73)
  # With a bonus of 2.5, F{1,2} = 4.23: tool 1 (2 + 2.73 + 4.23) / 3 = 2.99 > tool 0 (3 + 2.73 +
  # 2.76) / 3 = 2.83 > tool 2 (1 + 2.76 + 4.23) / 3 = 2.66 — unlike ℓ, Ê-first and greedy.
  weaker = pairs * 0.5
  got = rankings.rank_tools(logits, weaker, pos, "set-mean", 2)
  assert np.asarray(got).tolist() == [[1, 0, 2]]
  np.testing.assert_allclose(rankings.set_mean(logits, weaker, 2),
                             [[(3 + 2.7311 + 2.7616) / 3, (2 + 2.7311 + 4.2311) / 3,
                               (1 + 2.7616 + 4.2311) / 3]], atol=1e-3)
  with pytest.raises(Exception, match="unknown ranking"):
    rankings.rank_tools(logits, pairs, pos, "magic", 2)


def test_set_mean_of_the_numpy_reference_matches():
  from hyset_jax.io import reference
  rng = np.random.default_rng(8)
  logits = rng.normal(size=(3, 8)).astype(np.float32)
  g = rng.normal(size=(3, 2, 8, 8)).astype(np.float32)
  g = g + np.swapaxes(g, 2, 3)
  np.testing.assert_allclose(reference.set_mean(logits, g, 3),
                             rankings.set_mean(jnp.asarray(logits), jnp.asarray(g), 3),
                             rtol=1e-5, atol=1e-5)


def test_rankings_match_brute_force():
  rng = np.random.default_rng(5)
  n, d, k1, k_pool, m = 30, 6, 4, 8, 3
  params = make_params(rng, n, d, m, scale=0.8)
  r = rng.normal(size=(3, d))
  preds = pipeline.predict_batched(params, r.astype(np.float32), k1=k1, k_pool=k_pool,
                                    max_size=m, rankings=choices.RANKINGS)
  z, p, ms = (np.asarray(a, np.float64) for a in (params.tool_embeddings, params.projection,
                                                   params.interactions))
  for q in range(3):
    shortlist, best, _, greedy = ref.two_stage(r[q], z, p, ms, k1, k_pool, m)
    ell = z @ (r[q] @ p)
    by_ell = lambda ts: sorted(ts, key=lambda t: -ell[t])
    for ranking, pred in zip(choices.RANKINGS, preds):
      if ranking == "logit":
        want = shortlist
      elif ranking == "set-first":
        want = by_ell(best) + by_ell([t for t in shortlist if t not in best])
      elif ranking in ("set-mean", "set-max"):
        sets = [e for size in range(1, m + 1) for e in itertools.combinations(shortlist, size)]
        f = {e: ref.score(r[q], z, p, ms, list(e)) for e in sets}
        pool = np.mean if ranking == "set-mean" else np.max
        per_tool = {t: pool([v for e, v in f.items() if t in e]) for t in shortlist}
        want = sorted(shortlist, key=lambda t: (-per_tool[t], -ell[t], shortlist.index(t)))
      else:
        want = greedy + by_ell([t for t in shortlist if t not in greedy])
      assert list(pred.ranking[q]) == want, ranking
      assert tuple(sorted(t for t in pred.set_tools[q] if t >= 0)) == best


def test_neighbor_table_cache_is_keyed_and_rebuilt_when_bad(tmp_path):
  rng = np.random.default_rng(6)
  params = make_params(rng, 50, 6, 3)
  prep = pipeline.prepare(params, max_size=3, k_pool=8, cache_dir=tmp_path)
  files = list(tmp_path.glob("neighbors-*.npz"))
  assert len(files) == 1
  again = pipeline.prepare(params, max_size=3, k_pool=8, cache_dir=tmp_path)
  np.testing.assert_array_equal(np.asarray(again.neighbors.ids), np.asarray(prep.neighbors.ids))
  files[0].write_bytes(b"not an npz")
  neighbors._LAST.clear()  # the process's last table would answer before the file is read
  rebuilt = pipeline.prepare(params, max_size=3, k_pool=8, cache_dir=tmp_path)
  np.testing.assert_array_equal(np.asarray(rebuilt.neighbors.ids), np.asarray(prep.neighbors.ids))
  other = params._replace(interactions=params.interactions * 2)
  pipeline.prepare(other, max_size=3, k_pool=8, cache_dir=tmp_path)
  assert len(list(tmp_path.glob("neighbors-*.npz"))) == 2
  # The table matches a direct top-W of z_iᵀ M z_t without self.
  s = np.array(params.tool_embeddings @ params.interactions[1] @ params.tool_embeddings.T)
  np.fill_diagonal(s, -np.inf)
  np.testing.assert_allclose(np.asarray(prep.neighbors.scores), -np.sort(-s, axis=1)[:, :8],
                             atol=1e-5)


def test_the_last_table_is_reused_for_the_same_z_and_m_only(monkeypatch):
  # Choosing what follows θ scores many models that share Z and M_M: one build serves them.
  rng = np.random.default_rng(8)
  params = make_params(rng, 60, 6, 3)
  built = []
  real = neighbors.build
  monkeypatch.setattr(neighbors, "build", lambda *a, **k: built.append(1) or real(*a, **k))
  first = pipeline.prepare(params, max_size=3, k_pool=8)
  again = pipeline.prepare(params._replace(projection=params.projection * 2), max_size=3,
                           k_pool=8)
  assert len(built) == 1
  np.testing.assert_array_equal(np.asarray(again.neighbors.ids), np.asarray(first.neighbors.ids))
  other = params._replace(interactions=params.interactions.at[1, 0, 0].add(1.0))
  changed = pipeline.prepare(other, max_size=3, k_pool=8)
  assert len(built) == 2
  s = np.array(other.tool_embeddings @ other.interactions[1] @ other.tool_embeddings.T)
  np.fill_diagonal(s, -np.inf)
  np.testing.assert_allclose(np.asarray(changed.neighbors.scores), -np.sort(-s, axis=1)[:, :8],
                             atol=1e-5)


def test_small_library_rows_hold_every_other_tool():
  rng = np.random.default_rng(7)
  params = make_params(rng, 12, 5, 3)
  r = jnp.asarray(rng.normal(size=(4, 5)), jnp.float32)
  prep = pipeline.prepare(params, max_size=3, k_pool=12)
  assert prep.neighbors.ids.shape == (12, 11)
  np.testing.assert_array_equal(np.asarray(pipeline.shortlist_prepared(prep, r, 5, 12).tools),
                                np.asarray(pipeline.shortlist(params, r, 5, 12, 3).tools))


@pytest.mark.parametrize("conditioned", [False, True])
def test_prepared_path_with_query_tower_and_conditioned_term(conditioned):
  """The tower runs before P Zᵀ; a conditioned set term makes G_m per query: still the same
  predictions as the reference path."""
  from hyset_jax.model.scoring import QueryInteraction, QueryTower
  rng = np.random.default_rng(8)
  n, d, m, depth, hidden, rank = 60, 6, 3, 2, 5, 3
  f = lambda *shape: jnp.asarray(rng.normal(size=shape) * 0.3, jnp.float32)  # noqa: E731
  params = make_params(rng, n, d, m)._replace(
      tower=QueryTower(w_in=f(depth, d, hidden), b_in=f(depth, hidden),
                       w_out=f(depth, hidden, d), b_out=f(depth, d)))
  if conditioned:
    params = params._replace(conditioned=QueryInteraction(
        u=f(m - 1, d, rank), w=f(m - 1, d, rank), v=f(m - 1, d), b=f(m - 1)))
  r = rng.normal(size=(9, d)).astype(np.float32)
  kw = dict(k1=5, k_pool=10, max_size=m)
  want = pipeline.predict(params, r, **kw)
  assert_same_prediction(pipeline.predict_batched(params, r, neighbor_table=True, **kw), want)
