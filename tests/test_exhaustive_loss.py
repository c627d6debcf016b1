"""The exhaustive-shortlist loss (train.exhaustive_loss_weight): its subset scores against brute
force, its gradient, and a training run that uses it."""
import itertools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hyset_jax import config as config_lib
from hyset_jax.training import losses, train
from test_model_extensions import brute_score, random_params


def test_shortlist_subset_scores_are_every_subset_and_the_loss_matches_brute_force():
  rng = np.random.default_rng(3)
  params = random_params(rng, n=14, d=6, max_size=3)
  r = rng.normal(size=(2, 6)).astype(np.float32)
  tools = np.array([[0, 3, 5, 7, 9, 11], [1, 2, 4, 6, 8, 13]], np.int32)
  got = np.asarray(train.shortlist_subset_scores(params, r, tools))      # [2, C(6, ≤ 3)]
  assert got.shape == (2, 6 + 15 + 20)
  gold = [(3, 7, 9), (2, 12)]     # query 1's gold set is not inside its shortlist
  for q in range(2):
    want = [brute_score(params, r[q], e) for m in (1, 2, 3)
            for e in itertools.combinations(tools[q].tolist(), m)]
    np.testing.assert_allclose(np.sort(got[q]), np.sort(want), rtol=1e-4, atol=1e-4)
  gold_score = np.array([brute_score(params, r[q], gold[q]) for q in range(2)], np.float32)
  loss = float(losses.exhaustive_loss(got, gold_score, np.array([True, False])))
  lse0 = np.log(np.exp(got[0].astype(np.float64)).sum())
  lse1 = np.log(np.exp(got[1].astype(np.float64)).sum() + np.exp(gold_score[1]))
  assert loss == pytest.approx(((lse0 - gold_score[0]) + (lse1 - gold_score[1])) / 2, rel=1e-4)


def test_exhaustive_loss_has_a_gradient_through_the_enumeration():
  rng = np.random.default_rng(4)
  params = random_params(rng, n=14, d=6, max_size=3)
  r = rng.normal(size=(2, 6)).astype(np.float32)
  tools = np.array([[0, 3, 5, 7, 9, 11], [1, 2, 4, 6, 8, 13]], np.int32)

  def f(z):
    p = params._replace(tool_embeddings=z)
    return jax.nn.logsumexp(train.shortlist_subset_scores(p, r, tools))
  g = np.asarray(jax.jit(jax.grad(f))(jnp.asarray(params.tool_embeddings)))
  assert np.all(np.isfinite(g))
  listed = np.unique(tools)
  assert np.abs(g[listed]).sum() > 0
  assert np.abs(np.delete(g, listed, axis=0)).sum() == 0   # only shortlisted tools score
  eps, t, k = 1e-3, 5, 2
  zp, zm = params.tool_embeddings.copy(), params.tool_embeddings.copy()
  zp[t, k] += eps
  zm[t, k] -= eps
  jf = jax.jit(f)
  numeric = (float(jf(jnp.asarray(zp))) - float(jf(jnp.asarray(zm)))) / (2 * eps)
  assert g[t, k] == pytest.approx(numeric, rel=2e-2, abs=2e-3)


@pytest.mark.heavy
def test_tiny_training_with_the_exhaustive_loss_logs_it_and_learns(tmp_path):
  cfg = config_lib.resolve("tiny", ["train.exhaustive_loss_weight=1", "train.num_steps=20",
                                    "train.log_every=5", "train.eval_every=20",
                                    "train.checkpoint_every=20"])
  # One device: this test is about the loss (the sharded step: test_train's 1-vs-8 test).
  summary = train.train_and_evaluate(cfg, tmp_path / "w", progress=False, num_devices=1)
  rows = [json.loads(line) for line in (tmp_path / "w" / "metrics.jsonl").read_text().splitlines()]
  enum = [r["loss_enum"] for r in rows if "loss_enum" in r]
  assert enum and all(np.isfinite(enum))
  assert enum[-1] < enum[0]
  assert summary["test"]["recall@5"] > 0
