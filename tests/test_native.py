"""The native CPU kernel of stage 2 (hyset_jax/inference/native) against the JAX forms: the same scores
(float rounding), positions, best sets and ties; its build cache; and what happens where it
cannot be built (``auto`` falls back to gather, an explicit ``native`` is a clear error)."""
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hyset_jax import choices
from hyset_jax.inference import enumeration, native, rankings, subsets
from hyset_jax.errors import UserError

REPO = pathlib.Path(__file__).resolve().parents[1]


def random_inputs(rng, q, k, m, scale=0.3):
  logits = rng.normal(size=(q, k)).astype(np.float32)
  pairs = rng.normal(size=(q, m - 1, k, k)).astype(np.float32) * scale
  return logits, (pairs + pairs.transpose(0, 1, 3, 2)) / 2   # G_m is symmetric


def assert_same_as_gather(logits, pairs, k, m):
  table = subsets.subset_table(k, m)
  want = enumeration.score_subsets(logits, pairs, table, "gather")
  got = enumeration.score_subsets(logits, pairs, table, "native")
  np.testing.assert_array_equal(np.asarray(got.positions), np.asarray(want.positions))
  np.testing.assert_allclose(np.asarray(got.scores), np.asarray(want.scores), rtol=1e-5,
                             atol=1e-5)
  best_want = enumeration.best_subset(logits, pairs, table, "gather")
  best_got = enumeration.best_subset(logits, pairs, table, "native")
  np.testing.assert_array_equal(np.asarray(best_got.positions), np.asarray(best_want.positions))
  np.testing.assert_array_equal(np.asarray(best_got.mask), np.asarray(best_want.mask))
  np.testing.assert_allclose(np.asarray(best_got.scores), np.asarray(best_want.scores),
                             rtol=1e-6, atol=1e-6)


def test_the_kernel_runs_here():
  """CI has a C++ compiler: the kernel must build, and "auto" must pick it."""
  assert native.unavailable_reason() is None
  assert enumeration.resolve_method("auto") == "native"
  assert enumeration.resolve_method("colex") == "colex"


# Batches around the kernel's 16-query groups (1, a partial group, several groups over the
# thread pool), and shortlists from tiny to K = 30 and M = K.
@pytest.mark.parametrize("k,m,q", [(20, 5, 1), (20, 5, 37), (5, 2, 3), (8, 8, 16),
                                   (30, 4, 20), (12, 3, 130)])
def test_native_equals_gather(k, m, q):
  logits, pairs = random_inputs(np.random.default_rng(k * 100 + q), q, k, m)
  assert_same_as_gather(logits, pairs, k, m)


def test_native_ties_resolve_as_gather():
  """Exact ties between sizes and within a size: duplicated logits, zero pair scores, a
  query whose logits are all equal. Sets must be the very ones gather picks."""
  rng = np.random.default_rng(7)
  k, m, q = 10, 4, 40
  logits, pairs = random_inputs(rng, q, k, m)
  logits[::3, 1] = logits[::3, 0]
  logits[1::5] = np.round(logits[1::5], 1)
  logits[4] = 0.5
  pairs[::2] = 0.0
  assert_same_as_gather(logits, pairs, k, m)


# The best-only kernel passes over subtrees whose bound cannot beat a set already scored
# (subsets.cc, Prunable): its answer must stay the first maximum whatever the balance of the
# pair terms against ℓ (pair terms dominant, negligible, or of ℓ's size, where the bounds are
# tight), for shortlists where the seeded floor covers all of it (K ≤ 7) or a part.
@pytest.mark.parametrize("scale", [0.0, 1e-3, 0.1, 1.0, 10.0])
@pytest.mark.parametrize("k,m", [(20, 5), (7, 4), (13, 6)])
def test_native_best_set_is_exact_for_any_balance_of_terms(scale, k, m):
  rng = np.random.default_rng(int(scale * 1000) + k)
  logits, pairs = random_inputs(rng, 48, k, m, scale=scale)
  assert_same_as_gather(logits, pairs, k, m)


def test_native_best_set_where_the_bounds_are_tight():
  """Equal logits and near-constant pair terms per size: every set of a size scores within
  1e-3 of the others and of its bound, so a bound that passes over too much loses the best."""
  rng = np.random.default_rng(12)
  k, m, q = 14, 5, 64
  logits = np.repeat(rng.normal(size=(q, 1)), k, axis=1).astype(np.float32)
  level = rng.normal(scale=0.05, size=(q, m - 1, 1, 1))
  pairs = (level + rng.normal(scale=1e-3, size=(q, m - 1, k, k))).astype(np.float32)
  assert_same_as_gather(logits, (pairs + pairs.transpose(0, 1, 3, 2)) / 2, k, m)


def test_native_best_set_with_exact_ties_across_sizes():
  """Small integers: many sets of different sizes score exactly the same, so a set the bounds
  pass over may tie the best; the first maximum in table order must still win."""
  rng = np.random.default_rng(11)
  k, m, q = 16, 5, 64
  logits = rng.integers(-1, 2, size=(q, k)).astype(np.float32)
  logits[::4] = 1.0                         # every softmax mean the same
  pairs = rng.integers(-1, 2, size=(q, m - 1, k, k)).astype(np.float32)
  pairs = np.triu(pairs, 1) + np.triu(pairs, 1).transpose(0, 1, 3, 2)
  pairs[1::4] = 0.0                        # pair terms all zero: the size-1 set wins ties
  assert_same_as_gather(logits, pairs, k, m)


def test_native_on_logits_far_apart():
  """The softmax sums are kept relative to each set's largest logit: exact for any range (a
  spread of 400 underflows exp(ℓ − max ℓ) for the query-shift matmul form)."""
  rng = np.random.default_rng(3)
  logits, pairs = random_inputs(rng, 20, 12, 4)
  logits *= 100.0
  assert_same_as_gather(logits, pairs, 12, 4)


def test_native_nan_wins_the_argmax_like_jnp():
  """A NaN score is the best, as jnp.argmax and lax.top_k have it; the reported order sorts
  NaN last, as jnp.argsort does."""
  rng = np.random.default_rng(5)
  k, m = 8, 3
  table = subsets.subset_table(k, m)
  logits, pairs = random_inputs(rng, 4, k, m)
  logits[1, 2] = np.nan
  pairs[2, 0, 3, 5] = pairs[2, 0, 5, 3] = np.nan
  logits[3, 4] = np.inf
  scores = enumeration.score_subsets(logits, pairs, table, "native")
  np.testing.assert_array_equal(np.asarray(scores.positions),
                                np.asarray(jnp.argsort(jnp.asarray(logits), axis=1)))
  want = subsets.best_sets(scores, table)
  got = enumeration.best_subset(logits, pairs, table, "native")
  for a, b in zip(got, want):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert np.isnan(np.asarray(got.scores)[[1, 2], 0]).all()
  assert np.isfinite(np.asarray(got.scores)[0, 0])


def test_native_under_jit_vmap_and_inside_predict():
  rng = np.random.default_rng(11)
  logits, pairs = random_inputs(rng, 6, 10, 3)
  table = subsets.subset_table(10, 3)
  want = enumeration.best_subset(logits, pairs, table, "gather")
  batched = jax.vmap(lambda lg, pr: native.best_rows(lg, pr))(logits.reshape(2, 3, 10),
                                                               pairs.reshape(2, 3, 2, 10, 10))
  rows = np.asarray(batched[1]).reshape(6)
  members = np.take_along_axis(np.asarray(batched[2]).reshape(6, 10), table.members[rows], 1)
  np.testing.assert_array_equal(np.where(table.mask[rows], members, 0),
                                np.asarray(want.positions[:, 0]))


def test_build_is_cached_and_keyed(tmp_path, monkeypatch):
  """The build cache, on a one-line library: what it keys and keeps is the same for any source,
  and the kernel's own build (40 s at -O3) is what every other test here loads."""
  monkeypatch.setenv("HYSET_CACHE", str(tmp_path / "cache"))
  source, header = tmp_path / "probe.cc", tmp_path / "probe.h"
  source.write_text('extern "C" int hyset_probe() { return 1; }\n')
  header.write_text("// v1\n")
  monkeypatch.setattr(native, "SOURCES", (source,))
  monkeypatch.setattr(native, "HEADERS", (header,))
  first = native.build()
  assert first.is_relative_to(tmp_path / "cache" / "native") and first.exists()
  mtime = first.stat().st_mtime_ns
  assert native.build() == first and first.stat().st_mtime_ns == mtime   # not rebuilt
  assert native.build(force=True) == first and first.stat().st_mtime_ns != mtime
  assert [p.name for p in first.parent.iterdir()] == [first.name]        # no temporaries left
  header.write_text("// v2\n")                                          # a header is keyed too
  second = native.build()
  assert second != first and second.exists() and first.exists()


def run_cli(args, env):
  return subprocess.run([sys.executable, "-m", "hyset_jax.cli", *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=300)


def test_without_a_compiler_auto_falls_back_and_native_is_a_clear_error(tmp_path):
  env = {**os.environ, "CXX": str(tmp_path / "no-such-compiler"),
         "HYSET_CACHE": str(tmp_path / "cache")}
  import json
  # Asked for by name, the benchmark reports it as not run, like torch where torch is missing.
  done = run_cli(["bench", "enumerate", "--impl", "jax-native", "--batch", "4", "--repeats",
                  "1", "--json", str(tmp_path / "n.json")], env)
  assert done.returncode == 0, done.stderr
  status = json.loads((tmp_path / "n.json").read_text())["status"]
  assert status.startswith("not run: the native kernel could not be built")
  assert "no-such-compiler" in status and "no-such-compiler" in done.stdout
  # predict, asked for it: exit 2 with the reason, no traceback; by default it runs.
  from test_predict_cli import D, write_model_dir
  write_model_dir(tmp_path / "model")
  np.save(tmp_path / "q.npy", np.random.default_rng(0).normal(size=(3, D)).astype(np.float32))
  args = ["predict", "--model", str(tmp_path / "model"), "--query-embeddings",
          str(tmp_path / "q.npy"), "--out", str(tmp_path / "p.jsonl")]
  done = run_cli(args + ["--method", "native"], env)
  assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
  assert "native kernel could not be built" in done.stderr
  done = run_cli(args, env)
  assert done.returncode == 0 and len((tmp_path / "p.jsonl").read_text().splitlines()) == 3
  # The default runs the gather form.
  done = run_cli(["bench", "enumerate", "--batch", "4", "--repeats", "1", "--k-pool", "8",
                  "--max-size", "3", "--json", str(tmp_path / "b.json")], env)
  assert done.returncode == 0, done.stderr
  assert json.loads((tmp_path / "b.json").read_text())["method"] == choices.PORTABLE_METHOD


def test_auto_falls_back_in_process(monkeypatch):
  monkeypatch.setattr(native, "_state", {"error": "simulated"})
  assert enumeration.resolve_method("auto") == choices.PORTABLE_METHOD
  with pytest.raises(UserError, match="could not be built: simulated"):
    enumeration.resolve_method("native")


@pytest.mark.parametrize("kind", ["random", "trained-like", "zero-m"])
def test_native_expansion_equals_jax(kind):
  """The native kernel's picks and boundary ties are neighbors.expand's: a random model, a
  clustered one with duplicate tools (ties in g and at row boundaries), and M = 0 (every g
  ties, the order falls to ℓ)."""
  from hyset_jax.inference import pipeline, neighbors
  from test_speed import make_params, trained_like
  rng = np.random.default_rng(4)
  params = (trained_like(rng, 300, 12, 3) if kind == "trained-like"
            else make_params(rng, 300, 12, 3))
  if kind == "zero-m":
    params = params._replace(interactions=jnp.zeros_like(params.interactions))
  prep = pipeline.prepare(params, max_size=3, k_pool=10)
  r = jnp.asarray(rng.normal(size=(50, 12)), jnp.float32)
  logits, s0 = pipeline.stage1_prepared(prep, r, 6)
  want = neighbors.expand(prep.neighbors, logits, s0, 4)
  extra, tie = jax.jit(native.expand, static_argnums=4)(prep.neighbors.ids,
                                                        prep.neighbors.scores, logits, s0, 4)
  np.testing.assert_array_equal(np.asarray(extra), np.asarray(want.extra))
  np.testing.assert_array_equal(np.asarray(tie), np.asarray(want.tie))
  assert kind != "zero-m" or np.asarray(tie).all()
  # ℓ given tool-major ([N, Q], stage 1's layout for small batches): the same answers.
  extra_t, tie_t = jax.jit(native.expand, static_argnums=(4, 5))(
      prep.neighbors.ids, prep.neighbors.scores, logits.T, s0, 4, True)
  np.testing.assert_array_equal(np.asarray(extra_t), np.asarray(want.extra))
  np.testing.assert_array_equal(np.asarray(tie_t), np.asarray(want.tie))
  # And through the whole shortlist: the native path equals the full scan.
  full = pipeline.shortlist(params, r, 6, 10, 3)
  fast = pipeline.shortlist_prepared(prep, r, 6, 10, "native")
  np.testing.assert_array_equal(np.asarray(fast.tools), np.asarray(full.tools))


def test_native_pair_matrices_equal_the_einsum():
  """G_m from the native kernel against the prepared path's einsum: equal to rounding,
  exactly symmetric; and a whole prediction through the native kernels equals the JAX path."""
  from hyset_jax.inference import pipeline
  from test_speed import assert_same_prediction, make_params
  rng = np.random.default_rng(9)
  params = make_params(rng, 200, 37, 4, d_r=11)             # d = 37: a partial vector at the end
  prep = pipeline.prepare(params, max_size=4, k_pool=12)
  tools = jnp.asarray(rng.integers(0, 200, size=(19, 12)), jnp.int32)
  want = pipeline.pair_matrices_prepared(prep, None, tools, "gather")
  got = jax.jit(native.pair_matrices)(prep.keyed, prep.params.tool_embeddings, tools)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(got).transpose(0, 1, 3, 2))
  r = rng.normal(size=(40, 11)).astype(np.float32)
  kw = dict(k1=5, k_pool=12, max_size=4, ranking="set-first")
  assert_same_prediction(pipeline.predict_prepared(prep, r, method="native", **kw),
                         pipeline.predict(params, r, method="gather", **kw))


def test_beyond_the_kernels_limits_auto_runs_gather():
  """K_pool above the kernel's 62 (or a working set above its limit): ``auto`` runs the gather
  form, an explicit ``native`` says why it cannot."""
  assert native.fits(20, 5) and native.fits(30, 5, all_scores=True)
  assert not native.fits(63, 2) and not native.fits(40, 12)          # 5.6e9 rows: over int32
  # The best set keeps no per-subset state (22 million subsets, 0.3 MB); every score does.
  assert native.fits(40, 7) and not native.fits(40, 7, all_scores=True)
  assert enumeration.resolve_method("auto", 63, 2) == choices.PORTABLE_METHOD
  assert enumeration.resolve_method("auto", 20, 5) == "native"
  table = subsets.subset_table(63, 2)
  logits, pairs = random_inputs(np.random.default_rng(2), 3, 63, 2)
  best = enumeration.best_subset(logits, pairs, table)              # auto: gather here
  want = enumeration.best_subset(logits, pairs, table, "gather")
  np.testing.assert_array_equal(np.asarray(best.positions), np.asarray(want.positions))
  with pytest.raises(UserError, match="beyond the native kernel"):
    enumeration.best_subset(logits, pairs, table, "native")


@pytest.mark.parametrize("k,m,q", [(20, 5, 37), (6, 3, 5), (10, 4, 40)])
def test_native_greedy_ranking_equals_jax(k, m, q):
  """The whole greedy ranking (M picks, then the rest by ℓ) against rank_tools' JAX form;
  with duplicated logits and zero pair scores for exact ties in both parts."""
  from hyset_jax.inference import pipeline
  rng = np.random.default_rng(k + q)
  logits, pairs = random_inputs(rng, q, k, m)
  logits[::3, 1] = logits[::3, 0]
  logits[1::4, -1] = logits[1::4, 2]
  pairs[::5] = 0.0
  pos = jnp.zeros((q, m), jnp.int32)                        # greedy does not read Ê
  want = rankings.rank_tools(logits, pairs, pos, "greedy", m, "gather")
  got = rankings.rank_tools(logits, pairs, pos, "greedy", m, "native")
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_native_top_k_equals_lax_top_k():
  """Stage 1's top K1 from the native kernel is ``jax.lax.top_k``'s indices, order and ties:
  random rows, rows of few distinct values (ties everywhere), the values XLA orders specially
  (±0.0, ±inf, NaN), masked tools (-inf) and rows shorter than one 32-value block; and a filtered
  prediction (fewer allowed tools than K1) through the native backend equals the JAX one."""
  from hyset_jax.inference import pipeline
  from hyset_jax.model.query_inputs import QueryInputs
  from test_speed import assert_same_prediction, make_params
  rng = np.random.default_rng(21)
  top_k = jax.jit(native.top_k, static_argnums=(1, 2))
  special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.0], np.float32)
  for trial in range(160):
    # Every fifth trial by tool (x given as [N, Q]) with up to 40 queries: the kernel's tasks
    # of 16 queries, a partial last one, and a batch of fewer than 16.
    by_tool = trial % 5 == 4
    q, n = int(rng.integers(1, 41 if by_tool else 6)), int(rng.integers(1, 400))
    k = int(rng.integers(1, min(native.MAX_TOP_K, n) + 1))
    x = [rng.normal(size=(q, n)), rng.integers(-3, 3, (q, n)).astype(float),
         rng.choice(special, size=(q, n)), np.where(rng.random((q, n)) < 0.4, -np.inf,
                                                    rng.normal(size=(q, n)))][trial % 4]
    x = jnp.asarray(np.asarray(x, np.float32))
    got = top_k(x.T, k, True) if by_tool else top_k(x, k, False)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jax.lax.top_k(x, k)[1]),
                                  err_msg=f"trial {trial}: q={q} n={n} k={k} by_tool={by_tool}")
  with pytest.raises(ValueError, match="1 ≤ k ≤ min"):
    native.top_k(jnp.zeros((1, 10)), 11)
  params = make_params(rng, 150, 16, 3)
  prep = pipeline.prepare(params, max_size=3, k_pool=10)
  r = rng.normal(size=(12, 16)).astype(np.float32)
  allowed = np.zeros((12, 150), bool)
  allowed[:, :40] = True
  allowed[::3] = False
  allowed[::3, [7, 90, 149]] = True                     # 3 tools for these: fewer than K1 = 6
  x = QueryInputs(embedding=r, allowed=allowed)
  kw = dict(k1=6, k_pool=10, max_size=3)
  assert_same_prediction(pipeline.predict_prepared(prep, x, method="native", **kw),
                         pipeline.predict_prepared(prep, x, method="gather", **kw))


@pytest.mark.parametrize("queries", [5, 40, 70])
def test_stage1_by_tool_equals_by_query(queries):
  """The native backend's stage 1 takes ℓ tool-major (ℓᵀ [N, Q]) for batches up to
  ``backends.NATIVE_BY_TOOL_QUERIES`` queries (70: the [Q, N] path): the shortlist's tools and
  their ℓ', lexical term included, are the JAX backend's (ℓ [Q, N] always), and so is the
  whole prediction."""
  from hyset_jax.inference import backends, pipeline
  from hyset_jax.model.query_inputs import QueryInputs
  from test_speed import assert_same_prediction, make_params
  assert (queries <= backends.NATIVE_BY_TOOL_QUERIES) == (queries < 64)
  rng = np.random.default_rng(33)
  params = make_params(rng, 400, 16, 3)._replace(lexical_weight=np.float32(0.7))
  prep = pipeline.prepare(params, max_size=3, k_pool=10)
  x = QueryInputs(embedding=rng.normal(size=(queries, 16)).astype(np.float32),
                  lexical_scores=np.where(rng.random((queries, 400)) < 0.05,
                                          rng.random((queries, 400)) * 3, 0).astype(np.float32))
  shortlist = jax.jit(pipeline.shortlist_prepared, static_argnums=(2, 3, 4))
  fast, ref = shortlist(prep, x, 6, 10, "native"), shortlist(prep, x, 6, 10, "gather")
  np.testing.assert_array_equal(np.asarray(fast.tools), np.asarray(ref.tools))
  np.testing.assert_allclose(np.asarray(fast.logits), np.asarray(ref.logits), rtol=1e-5,
                             atol=1e-6)
  kw = dict(k1=6, k_pool=10, max_size=3, ranking="greedy")
  assert_same_prediction(pipeline.predict_prepared(prep, x, method="native", **kw),
                         pipeline.predict_prepared(prep, x, method="gather", **kw))
