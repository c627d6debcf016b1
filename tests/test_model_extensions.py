"""The query tower and the query-conditioned set term against brute force, their identity at
initialisation (their travel through every export: tests/test_terms.py)."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hyset_jax.inference import pipeline
from hyset_jax.model import parameters, scoring
from hyset_jax.model.scoring import HysetParams, QueryInteraction, QueryTower


def random_params(rng, n=14, d=6, max_size=3, depth=2, hidden=5, rank=3) -> HysetParams:
  z = rng.normal(size=(n, d))
  z /= np.linalg.norm(z, axis=1, keepdims=True)
  ms = rng.normal(size=(max_size - 1, d, d)) * 0.5
  ms = 0.5 * (ms + np.swapaxes(ms, 1, 2))
  f = lambda *s: rng.normal(size=s).astype(np.float32) * 0.5
  tower = QueryTower(f(depth, d, hidden), f(depth, hidden), f(depth, hidden, d), f(depth, d))
  cond = QueryInteraction(f(max_size - 1, d, rank), f(max_size - 1, d, rank), f(max_size - 1, d),
                          f(max_size - 1))
  return jax.tree.map(lambda a: np.asarray(a, np.float32),
                      HysetParams(z, rng.normal(size=(d, d)), ms, tower, cond))


def brute_score(params: HysetParams, r: np.ndarray, members) -> float:
  """F(x, E) straight from the definitions, float64, one set at a time."""
  p64 = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  h = r.astype(np.float64)
  t = p64.tower
  for layer in range(t.w_in.shape[0]):
    h = h + np.maximum(h @ t.w_in[layer] + t.b_in[layer], 0) @ t.w_out[layer] + t.b_out[layer]
  ell = np.array([h @ p64.projection @ p64.tool_embeddings[j] for j in members])
  a = np.exp(ell - ell.max())
  score = float((a / a.sum() * ell).sum())
  m = len(members)
  if m >= 2:
    z, qi = p64.tool_embeddings, p64.conditioned
    c = h @ qi.w[m - 2]
    for i, j in itertools.combinations(members, 2):
      score += z[i] @ p64.interactions[m - 2] @ z[j]
      score += float(np.sum(c * (z[i] @ qi.u[m - 2]) * (z[j] @ qi.u[m - 2])))
    score += float(h @ qi.v[m - 2] + qi.b[m - 2])
  return score


@pytest.mark.parametrize("n", [14, 40])  # 40 tools > the 18 member slots: Z U_m by slot
def test_set_scores_with_tower_and_conditioned_term_match_brute_force(n):
  rng = np.random.default_rng(0)
  params = random_params(rng, n=n)
  r = rng.normal(size=(2, 6)).astype(np.float32)
  members = np.array([[[0, 3, 5], [7, 0, 0], [2, 9, 0]], [[1, 2, 0], [4, 8, 11], [13, 0, 0]]])
  mask = np.array([[[1, 1, 1], [1, 0, 0], [1, 1, 0]], [[1, 1, 0], [1, 1, 1], [1, 0, 0]]], bool)
  for method in ("gram", "keyed", "gather"):
    got = np.asarray(scoring.set_scores(params, r, members, mask, method))
    for b, c in itertools.product(range(2), range(3)):
      e = tuple(members[b, c][mask[b, c]])
      assert got[b, c] == pytest.approx(brute_score(params, r[b], e), rel=1e-4, abs=1e-4)


def test_member_factors_by_slot_equal_the_whole_library_with_their_gradients():
  rng = np.random.default_rng(5)
  z = jnp.asarray(rng.normal(size=(30, 6)), jnp.float32)
  u = jnp.asarray(rng.normal(size=(3, 6, 4)), jnp.float32)
  members = jnp.asarray(rng.integers(30, size=(2, 5, 4)))
  card = jnp.asarray(rng.integers(3, size=(2, 5)))
  w = jnp.asarray(rng.normal(size=(2, 5, 4, 4)), jnp.float32)
  loss = lambda z, u, by_slot: jnp.sum(w * scoring.member_factors(z, u, members, card, by_slot))
  want, got = (jax.value_and_grad(loss, argnums=(0, 1))(z, u, b) for b in (False, True))
  np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
  for g, h in zip(got[1], want[1]):
    np.testing.assert_allclose(g, h, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(scoring.member_factors(z, u, members, card, True)[1, 2, 3],
                             z[members[1, 2, 3]] @ u[card[1, 2]], rtol=1e-5)


def test_shortlist_pairs_sum_to_the_set_term():
  rng = np.random.default_rng(1)
  params = random_params(rng, max_size=4)
  r = rng.normal(size=(3, 6)).astype(np.float32)
  tools = np.stack([rng.permutation(14)[:7] for _ in range(3)])
  pairs = np.asarray(scoring.shortlist_pairs(params, r, tools))          # [Q, M-1, K, K]
  for q in range(3):
    for subset in [(0, 1), (2, 4, 6), (0, 1, 3, 5)]:
      members = tools[q, list(subset)]
      m = len(subset)
      from_pairs = sum(pairs[q, m - 2, i, j] for i, j in itertools.combinations(subset, 2))
      f_align = float(jax.jit(scoring.set_scores)(params._replace(
          interactions=0 * params.interactions, conditioned=None), r[q:q + 1],
          members[None, None], np.ones((1, 1, m), bool))[0, 0])
      assert from_pairs + f_align == pytest.approx(brute_score(params, r[q], members), abs=1e-3)


def test_two_stage_argmax_is_exact_with_extensions():
  rng = np.random.default_rng(2)
  params = random_params(rng, n=20, max_size=3)
  r = rng.normal(size=(4, 6)).astype(np.float32)
  pred = pipeline.predict(params, r, k1=5, k_pool=8, max_size=3)
  for q in range(4):
    shortlist = np.asarray(pred.shortlist[q])
    best = max((s for m in (1, 2, 3) for s in itertools.combinations(shortlist, m)),
               key=lambda s: brute_score(params, r[q], s))
    got = np.asarray(pred.set_tools[q])[:int(pred.set_size[q])]
    assert sorted(got.tolist()) == sorted(int(t) for t in best)
    assert float(pred.set_score[q]) == pytest.approx(brute_score(params, r[q], best), abs=1e-3)


def test_initial_tower_and_conditioned_term_are_the_paper_model():
  rng = np.random.default_rng(3)
  emb = rng.normal(size=(30, 8))
  plain = parameters.init_params(emb, 8, 3, jax.random.key(1), scale=20.0)
  extended = parameters.init_params(emb, 8, 3, jax.random.key(1), scale=20.0, tower_depth=2,
                               tower_hidden=16, conditioned_rank=4)
  assert extended.tower.w_in.shape == (2, 8, 16) and extended.conditioned.u.shape == (2, 8, 4)
  r = jnp.asarray(rng.normal(size=(5, 8)), jnp.float32)
  a = pipeline.predict(plain, r, k1=6, k_pool=10, max_size=3)
  b = pipeline.predict(extended, r, k1=6, k_pool=10, max_size=3)
  for x, y in zip(a, b):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-5)


def test_gradients_reach_the_tower_and_the_conditioned_term():
  rng = np.random.default_rng(4)
  emb = rng.normal(size=(12, 6))
  params = parameters.init_params(emb, 6, 3, tower_depth=1, conditioned_rank=2)
  r = jnp.asarray(rng.normal(size=(2, 6)), jnp.float32)
  members = rng.integers(0, 12, (2, 4, 3))
  mask = np.ones((2, 4, 3), bool)
  grads = jax.jit(jax.grad(lambda p: jnp.sum(scoring.set_scores(p, r, members, mask) ** 2)))(
      params)
  assert np.any(grads.tower.w_out) and np.any(grads.conditioned.w)
  assert np.any(grads.conditioned.v) and np.any(grads.conditioned.b)


