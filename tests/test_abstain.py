"""Abstention ("no tool needed", hyset_jax/model/terms/abstain.py): the rule in the prediction
path, its choice after θ by the one post-θ selection loop, on synthetic data and on BFCL's real
irrelevance requests."""
import dataclasses
import types

import numpy as np
import pytest

from hyset_jax import config as config_lib
from hyset_jax.errors import UserError
from hyset_jax.evaluation.evaluator import evaluate_split
from hyset_jax.inference import pipeline
from hyset_jax.io import modeldir
from hyset_jax.model import parameters, terms
from hyset_jax.model.scoring import Abstention
from hyset_jax.model.terms import abstain
from hyset_jax.training import post_theta
from hyset_jax.training.train_data import QuerySet

N, D, M, K1, K = 24, 8, 3, 4, 8
TERM = terms.REGISTRY["abstain"]


def _config(**model):
  c = config_lib.resolve("tiny", [f"model.k1={K1}", f"model.k_pool={K}",
                                  f"model.max_set_size={M}", "train.eval_batch_size=16"])
  return config_lib.validate(dataclasses.replace(c, model=dataclasses.replace(c.model, **model)))


def _synthetic(rng):
  """Relevant queries that point at their gold tool; requests that need no tool share a style
  (a direction v of the embedding space, as chit-chat shares its words)."""
  z = rng.normal(size=(N, D)).astype(np.float32)
  z /= np.linalg.norm(z, axis=1, keepdims=True)
  v = rng.normal(size=D).astype(np.float32)
  v /= np.linalg.norm(v)

  def relevant(n, tag):
    gold = [(int(t),) for t in rng.integers(0, N, n)]
    emb = np.stack([z[g[0]] + 0.3 * rng.normal(size=D) for g in gold]).astype(np.float32)
    return QuerySet(tuple(f"{tag}{i}" for i in range(n)), ("q",) * n, emb, tuple(gold))

  def irrelevant(n, tag):
    emb = (2.0 * v + 0.2 * rng.normal(size=(n, D))).astype(np.float32)
    return QuerySet(tuple(f"{tag}{i}" for i in range(n)), ("i",) * n, emb, ((),) * n)

  config = _config()
  # 100 validation queries: one costs 1 point of R@5, half the budget.
  splits = {config.data.train_split: relevant(80, "r"), config.data.val_split: relevant(100, "v"),
            abstain.irrelevant_split(config, config.data.train_split): irrelevant(60, "ir"),
            abstain.irrelevant_split(config): irrelevant(30, "iv")}
  ids = tuple(f"t{i}" for i in range(N))
  return z, ids, splits


def test_the_rule_empties_the_set_and_keeps_the_ranking():
  z, ids, splits = _synthetic(np.random.default_rng(0))
  qs = splits["validation"]
  params = parameters.init_params(z, D, M)
  plain = pipeline.predict_batched(params, qs.embeddings, k1=K1, k_pool=K, max_size=M,
                                   ranking="logit")
  w = np.random.default_rng(1).normal(size=D).astype(np.float32)
  u = qs.embeddings @ w
  ab = Abstention(w, np.float32(0), np.float32(np.median(u)))
  got = pipeline.predict_batched(params._replace(abstain=ab), qs.embeddings, k1=K1,
                                 k_pool=K, max_size=M, ranking="logit")
  none = u >= ab.threshold
  assert 0 < none.sum() < len(none)
  np.testing.assert_array_equal(np.asarray(got.set_size) == 0, none)
  np.testing.assert_array_equal(np.asarray(got.set_tools)[none], -1)
  np.testing.assert_array_equal(np.asarray(got.set_tools)[~none],
                                np.asarray(plain.set_tools)[~none])
  np.testing.assert_array_equal(got.ranking, plain.ranking)      # the ranking still comes
  np.testing.assert_array_equal(got.set_score, plain.set_score)
  # Metrics count an abstained relevant query as retrieving nothing.
  m = evaluate_split(params._replace(abstain=ab), qs, ids, _config().model, 16, ranking="logit")
  full = evaluate_split(params, qs, ids, _config().model, 16, ranking="logit")
  assert m["abstained"] == pytest.approx(none.mean()) and "abstained" not in full
  assert m["recall@5"] < full["recall@5"]


def test_validation_chooses_the_most_abstention_within_the_recall_budget():
  z, ids, splits = _synthetic(np.random.default_rng(1))
  config = _config()
  data = types.SimpleNamespace(splits=splits, tool_ids=ids)
  model = modeldir.ModelDir(parameters.init_params(z, D, M), ids, M, K1, K, None)
  chosen, ranking, table, record = post_theta.fit_term(TERM, model, data, config)
  assert record["term"] == "abstain" and record["chosen"] != "none"
  tau = float(chosen.params.abstain.threshold)
  assert record["chosen"] == f"τ={tau:.6g}"
  picked = table[f"abstain {record['chosen']} {ranking}"]
  plain = table[f"abstain none {ranking}"]
  assert plain[abstain.IRRELEVANT_ABSTAINED] == 0
  assert picked[abstain.IRRELEVANT_ABSTAINED] >= 0.9     # they share a style the classifier sees
  assert plain["recall@5"] - picked["recall@5"] <= abstain.MAX_RECALL_LOSS + 1e-9
  admissible = {k: v for k, v in record["scores"].items() if v is not None}
  assert record["scores"][f"{record['chosen']} {ranking}"] == max(admissible.values())
  # A candidate that costs more than the budget is not admissible, however much it abstains.
  assert abstain.objective({"recall@5": 0.5, abstain.IRRELEVANT_ABSTAINED: 1.0},
                           {"recall@5": 0.53}) is None
  assert abstain.objective({"recall@5": 0.52, abstain.IRRELEVANT_ABSTAINED: 0.7},
                           {"recall@5": 0.53}) == 0.7
  # Missing irrelevant requests: a clear error naming the split it needs.
  no_irr = types.SimpleNamespace(splits={k: v for k, v in splits.items()
                                         if not k.startswith("irrelevant")}, tool_ids=ids)
  with pytest.raises(UserError, match="requests that need no tool, split 'irrelevant_"):
    post_theta.fit_term(TERM, model, no_irr, config)


def test_select_runs_every_enabled_fit_in_registry_order():
  """The loop strips every post-θ term, then fits those switched on in registry order: lexical,
  the set weight, abstain."""
  z, ids, splits = _synthetic(np.random.default_rng(2))
  config = _config(abstain=True, lexical=True, set_weight=True)
  texts = tuple(f"tool number {i}" for i in range(N))
  data = types.SimpleNamespace(splits=splits, tool_ids=ids, tool_texts=texts)
  stale = parameters.init_params(z, D, M)._replace(
      abstain=Abstention(np.zeros(D, np.float32), np.float32(0), np.float32(-1e9)),
      set_weight=np.float32(7))
  model = modeldir.ModelDir(stale, ids, M, K1, K, None)
  sel = post_theta.select(model, data, config)
  assert [f["term"] for f in sel.fits] == ["lexical", "set_weight", "abstain"]
  assert float(sel.model.params.abstain.threshold) > -1e9       # the stale one was refitted
  assert sel.model.params.set_weight in (None, 0, 0.25, 0.5, 2)  # the stale 7 is gone
  assert all(k.split()[0] in ("lexical", "set_weight", "abstain") for k in sel.table)
  written = post_theta.with_record(sel)
  assert written.manifest()["fits"] == sel.fits and written.ranking == sel.ranking


@pytest.mark.heavy
def test_on_real_bfcl_irrelevance_requests(shared_data):
  """BFCL's irrelevance requests, the encoder's dense retriever (θ untrained: cosine ranking): the
  classifier fitted on irrelevant_train, τ chosen on irrelevant_validation, abstains on most
  held-out irrelevant_test requests, and the relevant test queries keep their recall within the
  budget plus sampling noise."""
  del shared_data
  from hyset_jax.training.train_data import prepare_data
  config = config_lib.resolve("bfcl", ["data.max_eval_queries=200"])
  data = prepare_data(config)
  mc = config.model
  params = parameters.init_params(data.tool_embeddings, data.tool_embeddings.shape[1],
                                  mc.max_set_size)
  model = modeldir.ModelDir(params, data.tool_ids, mc.max_set_size, mc.k1, mc.k_pool, None,
                            ranking="greedy")
  config = dataclasses.replace(config, model=dataclasses.replace(mc, ranking="greedy"))
  chosen, _, _, record = post_theta.fit_term(TERM, model, data, config)
  assert record["chosen"] != "none"
  u = abstain.no_tool_scores(chosen.params.abstain, data.splits[
      f"irrelevant_{config.data.test_split}"].embeddings)
  test_irr = data.splits[f"irrelevant_{config.data.test_split}"]
  pred = pipeline.predict_batched(chosen.params, test_irr.embeddings, k1=mc.k1,
                                  k_pool=mc.k_pool, max_size=mc.max_set_size)
  rate = float(np.mean(np.asarray(pred.set_size) == 0))
  assert rate > 0.25, rate         # held-out irrelevant requests too (0.34 measured, 12-03)
  np.testing.assert_array_equal(np.asarray(pred.set_size) == 0,
                                u >= chosen.params.abstain.threshold)
  test = data.splits[config.data.test_split]
  with_tau = evaluate_split(chosen.params, test, data.tool_ids, mc, 64, ranking="greedy")
  without = evaluate_split(params, test, data.tool_ids, mc, 64, ranking="greedy")
  assert without["recall@5"] - with_tau["recall@5"] <= 0.06
  # BFCL's own setting (benchmarks/abstention.py --within-candidates): each request answered over
  # the functions BFCL offers with it. The gold calls are always among them, so recall can only
  # rise against the union library, and every answer stays inside the request's candidates.
  from benchmarks import abstention as bench
  from hyset_jax.data import bfcl
  cands = bfcl.candidate_functions()
  within = bench.sweep(chosen, data, config, cands)
  assert within["without"]["recall@5"] >= without["recall@5"]  # the union library's
  assert within["without"]["recall@5"] > 0.9
  x = bench._Inputs(chosen, data, config, cands)
  sets = np.asarray(x.rel.set_tools)
  for qid, row, size in zip(test.ids, sets, np.asarray(x.rel.set_size)):
    assert {data.tool_ids[t] for t in row[:size]} <= set(cands[qid]), qid
  curve = within["curves"]["best_set_score"]
  assert [p["irrelevant_abstained"] for p in curve] == sorted(
      (p["irrelevant_abstained"] for p in curve), reverse=True)
