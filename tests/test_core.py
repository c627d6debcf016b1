"""The HYSET scorer, subset enumeration and two-stage inference against brute-force references."""
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hyset_jax.inference import enumeration, pipeline, subsets
from hyset_jax.model import parameters, scoring
from hyset_jax.errors import UserError
from hyset_jax.model.scoring import HysetParams

import reference_impl as ref


def random_params(rng, n, d, max_size, d_r=None, scale=1.0):
  d_r = d_r or d
  z = rng.normal(size=(n, d))
  z /= np.linalg.norm(z, axis=1, keepdims=True)
  p = rng.normal(size=(d_r, d))
  ms = rng.normal(size=(max_size - 1, d, d)) * scale
  ms = (ms + ms.transpose(0, 2, 1)) / 2
  return z, p, ms


def as_params(z, p, ms):
  return HysetParams(*(jnp.asarray(a, jnp.float32) for a in (z, p, ms)))


def test_subset_table_counts_and_colex():
  t = subsets.subset_table(20, 5)
  assert len(t) == 21699 == subsets.count_subsets(20, 5)
  for m in range(1, 6):
    block = t.members[t.offsets[m - 1]:t.offsets[m], :m]
    assert len(block) == math.comb(20, m)
    as_sets = [tuple(r) for r in block]
    assert as_sets == sorted(itertools.combinations(range(20), m), key=lambda s: s[::-1])
  assert np.all(t.mask.sum(1) == t.sizes)


@pytest.mark.parametrize("k_pool,max_size", [(5, 2), (7, 3), (9, 4), (10, 5)])
@pytest.mark.parametrize("method", ["colex", "gather", "matmul"])
def test_enumeration_matches_bruteforce(k_pool, max_size, method):
  rng = np.random.default_rng(k_pool * 10 + max_size)
  z, p, ms = random_params(rng, k_pool, 6, max_size, scale=0.7)
  r = rng.normal(size=(3, 6))
  params = as_params(z, p, ms)
  table = subsets.subset_table(k_pool, max_size)
  tools = jnp.broadcast_to(jnp.arange(k_pool), (3, k_pool))
  logits = scoring.tool_logits(jnp.asarray(r, jnp.float32), params.projection, params.tool_embeddings)
  pairs = scoring.pair_matrices(params.tool_embeddings[tools], params.interactions)
  out = enumeration.score_subsets(logits, pairs, table, method)
  best = subsets.best_sets(out, table, k=3)
  for q in range(3):
    # Every subset's score, not just the best.
    pos = np.asarray(out.positions[q])
    scores = np.asarray(out.scores[q])
    for i in range(0, len(table), max(1, len(table) // 50)):
      members = tuple(sorted(pos[table.members[i, :table.sizes[i]]]))
      assert scores[i] == pytest.approx(ref.score(r[q], z, p, ms, members), abs=1e-5)
    want, want_score = ref.best_subset(r[q], z, p, ms, range(k_pool), max_size)
    got = tuple(sorted(np.asarray(best.positions[q, 0])[np.asarray(best.mask[q, 0])]))
    assert got == want
    assert float(best.scores[q, 0]) == pytest.approx(want_score, abs=1e-5)
    assert np.all(np.diff(np.asarray(best.scores[q])) <= 0)


@pytest.mark.parametrize("method", ["colex", "gather"])
def test_colex_is_exact_for_huge_logit_ranges(method):
  # ℓ spread of ~400: a shortlist-wide softmax shift would underflow to 0/0 here.
  rng = np.random.default_rng(1)
  z, p, ms = random_params(rng, 8, 4, 3)
  p *= 200.0
  r = rng.normal(size=(2, 4))
  params = as_params(z, p, ms)
  table = subsets.subset_table(8, 3)
  tools = jnp.broadcast_to(jnp.arange(8), (2, 8))
  logits = scoring.tool_logits(jnp.asarray(r, jnp.float32), params.projection, params.tool_embeddings)
  pairs = scoring.pair_matrices(params.tool_embeddings[tools], params.interactions)
  a = enumeration.score_subsets(logits, pairs, table, method)
  assert np.all(np.isfinite(np.asarray(a.scores)))
  for q in range(2):
    pos = np.asarray(a.positions[q])
    for i in range(len(table)):
      members = tuple(pos[table.members[i, :table.sizes[i]]])
      assert float(a.scores[q, i]) == pytest.approx(ref.score(r[q], z, p, ms, members),
                                                    rel=1e-5, abs=1e-3)


def _shortlist_inputs(seed, k_pool, max_size, logit_scale=1.0):
  rng = np.random.default_rng(seed)
  z, p, ms = random_params(rng, k_pool, 4, max_size, scale=0.5)
  p *= logit_scale
  r = rng.normal(size=(2, 4))
  params = as_params(z, p, ms)
  tools = jnp.broadcast_to(jnp.arange(k_pool), (2, k_pool))
  logits = scoring.tool_logits(jnp.asarray(r, jnp.float32), params.projection, params.tool_embeddings)
  pairs = scoring.pair_matrices(params.tool_embeddings[tools], params.interactions)
  return r, z, p, ms, logits, pairs


def test_matmul_shift_is_safe_for_huge_logit_ranges():
  # One shift per query: exact for sets near the top logit, never NaN for the rest (their
  # F_align falls back to their largest member's logit).
  r, z, p, ms, logits, pairs = _shortlist_inputs(1, 8, 3, logit_scale=200.0)
  table = subsets.subset_table(8, 3)
  out = enumeration.score_subsets(logits, pairs, table, "matmul")
  scores = np.asarray(out.scores)
  assert np.all(np.isfinite(scores))
  ell = np.asarray(logits)
  for q in range(2):
    for i in range(len(table)):
      members = tuple(table.members[i, :table.sizes[i]])
      if ell[q].max() - ell[q, list(members)].max() < 60:
        assert scores[q, i] == pytest.approx(ref.score(r[q], z, p, ms, members), rel=1e-5, abs=1e-3)


def test_matmul_bf16_is_close_to_f32():
  r, z, p, ms, logits, pairs = _shortlist_inputs(2, 8, 3)
  table = subsets.subset_table(8, 3)
  f32 = np.asarray(enumeration.score_subsets(logits, pairs, table, "matmul").scores)
  bf16 = np.asarray(enumeration.score_subsets(logits, pairs, table, "matmul_bf16").scores)
  np.testing.assert_allclose(bf16, f32, atol=0.05 * (1 + np.abs(f32).max()))


@pytest.mark.parametrize("n,k1,k_pool,max_size", [(30, 4, 8, 3), (40, 6, 10, 4), (25, 15, 20, 5)])
def test_two_stage_matches_bruteforce(n, k1, k_pool, max_size):
  rng = np.random.default_rng(n + k1)
  z, p, ms = random_params(rng, n, 8, max_size, d_r=5, scale=0.8)
  r = rng.normal(size=(2, 5))
  pred = pipeline.predict(as_params(z, p, ms), jnp.asarray(r, jnp.float32), k1=k1,
                           k_pool=k_pool, max_size=max_size)
  for q in range(2):
    shortlist, best, best_score, greedy = ref.two_stage(r[q], z, p, ms, k1, k_pool, max_size)
    assert list(np.asarray(pred.shortlist[q])) == shortlist
    got = tuple(sorted(t for t in np.asarray(pred.set_tools[q]) if t >= 0))
    assert got == best and int(pred.set_size[q]) == len(best)
    assert float(pred.set_score[q]) == pytest.approx(best_score, abs=1e-5)
    ranking = list(np.asarray(pred.ranking[q]))
    assert ranking[:max_size] == greedy
    ell = z @ (r[q] @ p)
    rest = [t for t in shortlist if t not in greedy]
    assert ranking[max_size:] == sorted(rest, key=lambda t: -ell[t])
    assert sorted(ranking) == sorted(shortlist)


def test_gather_and_colex_agree_at_paper_scale():
  rng = np.random.default_rng(7)
  z, p, ms = random_params(rng, 60, 8, 5, scale=0.3)
  r = rng.normal(size=(5, 8))
  params = as_params(z, p, ms)
  a = pipeline.predict(params, jnp.asarray(r, jnp.float32), k1=15, k_pool=20, max_size=5,
                        method="colex")
  b = pipeline.predict(params, jnp.asarray(r, jnp.float32), k1=15, k_pool=20, max_size=5,
                        method="gather")
  np.testing.assert_array_equal(a.set_tools, b.set_tools)
  np.testing.assert_allclose(a.set_score, b.set_score, atol=1e-5)
  np.testing.assert_array_equal(a.ranking, b.ranking)


def test_theorem_1_mobius_coefficients():
  """F_set is pairwise-decomposable iff all M_m agree (paper Theorem 1)."""
  rng = np.random.default_rng(3)
  n, d, max_size = 7, 4, 5   # |V| ≥ M + 2
  z, _, ms = random_params(rng, n, d, max_size)
  p0 = np.zeros((d, d))      # P = 0 makes F_align ≡ 0, leaving F_set alone

  def f_set_fn(interactions):
    params = as_params(z, p0, interactions)
    cache = {}

    def f(e):
      if e not in cache:
        members = np.zeros((1, 1, max_size), np.int32)
        members[0, 0, :len(e)] = e
        mask = np.arange(max_size)[None, None] < len(e)
        cache[e] = float(scoring.set_scores(params, jnp.zeros((1, d)), members, mask)[0, 0])
      return cache[e]
    return f

  universe = tuple(range(max_size))
  shared = np.broadcast_to(ms[0], ms.shape)
  coeffs = ref.mobius(f_set_fn(shared), universe)
  assert max(abs(v) for e, v in coeffs.items() if len(e) >= 3) < 1e-5
  assert max(abs(v) for e, v in coeffs.items() if len(e) == 2) > 1e-2

  distinct = np.array(shared)
  distinct[1] = ms[1]        # M_3 ≠ M_2
  coeffs = ref.mobius(f_set_fn(distinct), universe)
  assert max(abs(v) for e, v in coeffs.items() if len(e) == 3) > 1e-2
  # The order-3 coefficient is Σ_pairs z_iᵀ (M_3 − M_2) z_j (paper §2.4).
  e = (0, 1, 2)
  want = sum(z[i] @ (distinct[1] - distinct[0]) @ z[j] for i, j in itertools.combinations(e, 2))
  assert coeffs[e] == pytest.approx(want, abs=1e-5)


def test_padding_never_changes_a_score():
  rng = np.random.default_rng(4)
  z, p, ms = random_params(rng, 12, 6, 4)
  params = as_params(z, p, ms)
  r = jnp.asarray(rng.normal(size=(2, 6)), jnp.float32)
  members = np.array([[[0, 3, 5, 0], [7, 0, 0, 0]], [[1, 2, 0, 0], [4, 8, 9, 11]]])
  mask = np.array([[[1, 1, 1, 0], [1, 0, 0, 0]], [[1, 1, 0, 0], [1, 1, 1, 1]]], bool)
  set_scores = jax.jit(scoring.set_scores, static_argnums=4)  # eager: one compile per primitive
  base = set_scores(params, r, members, mask)
  junk = np.where(mask, members, rng.integers(0, 12, members.shape))
  np.testing.assert_allclose(set_scores(params, r, junk, mask), base, atol=1e-6)
  wide_m = np.concatenate([members, np.zeros((2, 2, 3), int)], axis=2)
  wide_k = np.concatenate([mask, np.zeros((2, 2, 3), bool)], axis=2)
  np.testing.assert_allclose(set_scores(params, r, wide_m, wide_k), base, atol=1e-6)
  for method in ("gram", "keyed", "gather"):   # every evaluation order, padding included
    np.testing.assert_allclose(set_scores(params, r, junk, mask, method), base, atol=1e-5)
  for b in range(2):
    for c in range(2):
      e = tuple(members[b, c][mask[b, c]])
      assert float(base[b, c]) == pytest.approx(ref.score(np.asarray(r[b]), z, p, ms, e), abs=1e-5)


@pytest.mark.parametrize("symmetric", [True, False])
def test_keyed_order_matches_gather_on_a_large_library(symmetric):
  """set_scores' "keyed" order (Z M_m for the batch's (card, tool) pairs only: what training
  and "auto" use at large libraries) gives the gather order's values and gradients — z's
  taken through the gathered rows alone (symmetric_interaction_scores), exact for any M since
  F_set reads only M's symmetric part (an M that is not symmetric checks that)."""
  rng = np.random.default_rng(0)
  n, d, b, c, m = 3000, 16, 4, 32, 4
  z = rng.normal(size=(n, d)).astype(np.float32)
  ms = 0.1 * rng.normal(size=(m - 1, d, d)).astype(np.float32)
  params = scoring.HysetParams(jnp.asarray(z / np.linalg.norm(z, axis=1, keepdims=True)),
                               jnp.eye(d), jnp.asarray(ms + ms.transpose(0, 2, 1) if symmetric
                                                       else 2 * ms))
  query = rng.normal(size=(b, d)).astype(np.float32)
  members = rng.integers(0, n, (b, c, m)).astype(np.int32)
  members[:, 1::3] = members[:, :1]            # repeated sets: shared (card, tool) pairs
  mask = np.arange(m) < rng.integers(1, m + 1, (b, c))[..., None]
  assert not scoring.gram_is_cheaper(m - 1, n, d, (b, c, m))   # "auto" picks "keyed" here

  def run(fn):
    return jax.jit(jax.value_and_grad(
        lambda p: jnp.sum(jnp.sin(fn(p, query, members, mask)))))(params)
  want = run(lambda *a: scoring.set_scores(*a, "gather"))
  got = run(lambda *a: scoring.set_scores(*a, "keyed"))
  keyed = str(jax.make_jaxpr(
      lambda p: scoring.set_scores(p, query, members, mask, "keyed"))(params))
  assert "while" in keyed and "while" not in str(jax.make_jaxpr(   # "auto" takes the loop
      lambda p: scoring.set_scores(p, query, members, mask, "gather"))(params))
  assert str(jax.make_jaxpr(lambda p: scoring.set_scores(p, query, members, mask))(params)) == keyed
  for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    np.testing.assert_allclose(g, w, atol=1e-5 * float(np.max(np.abs(w))))


def test_interaction_gradient_is_symmetric_and_init_has_unit_rows():
  rng = np.random.default_rng(5)
  emb = rng.normal(size=(10, 6)) * 3
  params = parameters.init_params(emb, query_dim=6, max_set_size=3)
  np.testing.assert_allclose(np.linalg.norm(params.tool_embeddings, axis=1), 1.0, atol=1e-6)
  np.testing.assert_array_equal(params.projection, np.eye(6))
  assert not np.any(params.interactions)
  members = rng.integers(0, 10, (4, 5, 3))
  mask = np.ones((4, 5, 3), bool)
  mask[:, :2, 2] = False
  r = jnp.asarray(rng.normal(size=(4, 6)), jnp.float32)
  # jit: one compilation instead of one per primitive of the eager gradient.
  grad = jax.jit(jax.grad(lambda ms: jnp.sum(scoring.set_scores(
      params._replace(interactions=ms), r, members, mask))))(params.interactions + 0.1)
  assert np.any(grad)
  np.testing.assert_allclose(grad, np.swapaxes(grad, 1, 2), atol=1e-6)
  # Non-square projection: a length-preserving random map.
  params = parameters.init_params(emb, query_dim=9, max_set_size=3)
  assert params.projection.shape == (9, 6)
  np.testing.assert_allclose(params.projection.T @ params.projection, np.eye(6), atol=1e-5)


def test_untrained_model_is_the_dense_retriever():
  rng = np.random.default_rng(6)
  emb = rng.normal(size=(60, 8))
  params = parameters.init_params(emb, query_dim=8, max_set_size=5)
  r = rng.normal(size=(5, 8))
  r /= np.linalg.norm(r, axis=1, keepdims=True)
  pred = pipeline.predict(params, jnp.asarray(r, jnp.float32), k1=15, k_pool=20, max_size=5)
  cos = r @ (emb / np.linalg.norm(emb, axis=1, keepdims=True)).T
  order = np.argsort(-cos, axis=1, kind="stable")[:, :20]
  np.testing.assert_array_equal(pred.ranking, order)
  np.testing.assert_array_equal(pred.shortlist, order)
  np.testing.assert_array_equal(pred.set_tools[:, 0], order[:, 0])
  assert np.all(pred.set_size == 1)
  np.testing.assert_allclose(pred.set_score, cos[np.arange(5), order[:, 0]], atol=1e-6)


def test_shape_and_size_errors_are_clear():
  table = subsets.subset_table(6, 3)
  with pytest.raises(ValueError, match=r"expected logits \[Q, 6\]"):
    enumeration.score_subsets(jnp.zeros((2, 5)), jnp.zeros((2, 2, 5, 5)), table)
  with pytest.raises(UserError, match="2 ≤ M ≤ k_pool"):
    subsets.subset_table(4, 5)
  with pytest.raises(UserError, match="k1 must satisfy"):
    subsets.validate_sizes(20, 5, k1=20)
  with pytest.raises(UserError, match="fewer than k_pool"):
    subsets.validate_sizes(20, 5, k1=15, num_tools=19)
  with pytest.raises(UserError, match="unknown enumeration method"):
    enumeration.score_subsets(jnp.zeros((1, 6)), jnp.zeros((1, 2, 6, 6)), table, "magic")
  with pytest.raises(UserError, match="max_set_size must be ≥ 2"):
    parameters.init_params(np.eye(3), 3, 1)


def test_predict_batched_pads_and_validates():
  rng = np.random.default_rng(9)
  z, p, ms = random_params(rng, 30, 6, 3)
  params = as_params(z, p, ms)
  r = rng.normal(size=(7, 6)).astype(np.float32)
  full = pipeline.predict(params, r, k1=4, k_pool=8, max_size=3)
  chunked = pipeline.predict_batched(params, r, k1=4, k_pool=8, max_size=3, batch_size=3)
  for a, b in zip(full, chunked):
    # Scores to the contract's 1e-5: the prepared path forms G_m another way (from Z M_m,
    # and natively its mirrored upper triangle), a few ulp apart.
    np.testing.assert_allclose(np.asarray(a), b, atol=1e-5)
  np.testing.assert_array_equal(np.asarray(full.set_tools), chunked.set_tools)
  with pytest.raises(UserError, match="fewer than k_pool"):
    pipeline.predict_batched(params, r, k1=4, k_pool=40, max_size=3)
