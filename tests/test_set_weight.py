"""The set term's weight γ (hyset_jax/model/terms/set_weight.py): the rule in stage 2 and its
choice after θ by the one post-θ selection loop. (The term's place in every consumer — model
directory, exports, reference, serve, tool edits — is tests/test_terms.py's matrix.)"""
import dataclasses
import types

import numpy as np

from hyset_jax.inference import pipeline
from hyset_jax.io import modeldir
from hyset_jax.model import parameters, terms
from hyset_jax.training import post_theta
from hyset_jax.training.train_data import QuerySet

from test_abstain import D, K, K1, M, N, _config  # the same small post-θ setting

TERM = terms.REGISTRY["set_weight"]


def _data(rng, pairs: bool):
  """Queries that point at their gold set: one tool (``pairs`` False) or two (True)."""
  z = rng.normal(size=(N, D)).astype(np.float32)
  z /= np.linalg.norm(z, axis=1, keepdims=True)

  def split(n, tag):
    gold = [tuple(sorted(rng.choice(N, 2 if pairs else 1, replace=False).tolist()))
            for _ in range(n)]
    emb = np.stack([z[list(g)].sum(0) + 0.2 * rng.normal(size=D) for g in gold])
    return QuerySet(tuple(f"{tag}{i}" for i in range(n)), ("q",) * n, emb.astype(np.float32),
                    tuple(gold))

  config = _config()
  splits = {config.data.train_split: split(40, "r"), config.data.val_split: split(80, "v")}
  return z, tuple(f"t{i}" for i in range(N)), splits


def _model(z, ids, pair_bonus: float):
  """θ with M_m = b·I (b = ``pair_bonus``), so each pair adds b·z_aᵀz_b: a large b makes
  sets of near tools outscore any single tool."""
  params = parameters.init_params(z, D, M)
  return modeldir.ModelDir(params._replace(
      interactions=np.stack([pair_bonus * np.eye(D, dtype=np.float32)] * (M - 1))),
      ids, M, K1, K, None)


def test_the_weight_scales_the_pair_term_of_stage_2():
  z, ids, splits = _data(np.random.default_rng(0), pairs=False)
  qs = splits["validation"]
  model = _model(z, ids, 50.0)
  kw = dict(k1=K1, k_pool=K, max_size=M, ranking="logit")
  plain = pipeline.predict_batched(model.params, qs.embeddings, **kw)
  one = pipeline.predict_batched(model.params._replace(set_weight=np.float32(1)),
                                 qs.embeddings, **kw)
  off = pipeline.predict_batched(model.params._replace(set_weight=np.float32(0)),
                                 qs.embeddings, **kw)
  no_pairs = pipeline.predict_batched(model.params._replace(
      interactions=np.zeros_like(model.params.interactions)), qs.embeddings, **kw)
  for a, b in ((plain, one), (off, no_pairs)):  # γ = 1 is θ; γ = 0 is θ without F_set
    np.testing.assert_array_equal(a.set_tools, b.set_tools)
    np.testing.assert_allclose(a.set_score, b.set_score, rtol=1e-6)
  # The expansion keeps M_M as trained: the shortlist is θ's.
  np.testing.assert_array_equal(off.shortlist, plain.shortlist)
  assert not np.array_equal(off.shortlist, no_pairs.shortlist)
  assert np.mean(np.asarray(plain.set_size) == M) > 0.9     # the bonus fills every set
  assert np.all(np.asarray(off.set_size) == 1)              # F_align alone: the best tool


def test_validation_turns_a_misjudging_set_term_down_and_keeps_a_right_one():
  config = _config(set_weight=True)
  # Single-tool gold sets, a pair term that makes every set as large as it can: γ = 0 wins.
  z, ids, splits = _data(np.random.default_rng(1), pairs=False)
  data = types.SimpleNamespace(splits=splits, tool_ids=ids)
  chosen, ranking, table, record = post_theta.fit_term(TERM, _model(z, ids, 50.0), data, config)
  assert record["term"] == "set_weight" and record["chosen"] == "γ=0"
  assert float(chosen.params.set_weight) == 0
  assert (table[f"set_weight γ=0 {ranking}"]["set_exact"]
          > table[f"set_weight none {ranking}"]["set_exact"] + 0.5)
  # Gold pairs, no pair term at all: every γ scales zero, so all tie and the paper's model
  # (the term absent) is kept.
  z, ids, splits = _data(np.random.default_rng(2), pairs=True)
  data = types.SimpleNamespace(splits=splits, tool_ids=ids)
  chosen, _, _, record = post_theta.fit_term(TERM, _model(z, ids, 0.0), data, config)
  assert record["chosen"] == "none" and chosen.params.set_weight is None
  # Through the selection loop: switched off, nothing is fitted and a stale γ is stripped.
  stale = _model(z, ids, 0.0)
  stale = dataclasses.replace(stale, params=stale.params._replace(set_weight=np.float32(3)))
  sel = post_theta.select(stale, data, _config(set_weight=False))
  assert sel.model.params.set_weight is None and sel.fits == []
