"""model.fit_margin (hyset_jax/training/post_theta.py): a fitted term replaces its absence only
when its gain on validation exceeds that many standard errors of the paired per-query
difference; 0 keeps the choice by mean alone."""
import numpy as np
import pytest

from hyset_jax import config as config_lib
from hyset_jax.errors import UserError
from hyset_jax.evaluation import evaluator
from hyset_jax.model import terms
from hyset_jax.training import post_theta, workdir

from test_row_blend import _case, _config

TERM = terms.REGISTRY["row_blend"]


def _fit(margin):
  model, data = _case(0, trained_misleads=True)  # the blend gains on validation
  return model, post_theta.fit_term(TERM, model, data, _config(row_blend=True,
                                                               fit_margin=margin))


def _plain_ranking(table):
  """The ranking the model without the term chose (the rank metrics' best mean)."""
  return evaluator.best_ranking({k.split()[-1]: v for k, v in table.items()
                                 if k.startswith("row_blend none ")})


def test_the_margin_is_the_gain_the_choice_saw_in_standard_errors():
  _, (chosen, ranking, table, record) = _fit(0.0)
  assert "margin" not in record and record["chosen"] != "none"
  _, (_, ranking1, _, record1) = _fit(1.0)
  m = record1["margin"]
  assert record1["chosen"] == record["chosen"] == m["candidate"] and m["kept"]
  assert ranking1 == ranking and m["fit_margin"] == 1.0
  # The paired gain is the difference of the criterion means the choice compared: the
  # candidate's against the model without the term under that model's own ranking.
  base = _plain_ranking(table)
  want = record["scores"][f"{record['chosen']} {ranking}"] - record["scores"][f"none {base}"]
  assert m["gain"] == pytest.approx(want, abs=1e-12)
  assert 0 < m["se"] < m["gain"]


def test_a_gain_within_the_margin_keeps_the_term_out():
  _, (_, _, _, record) = _fit(1.0)
  z = record["margin"]["gain"] / record["margin"]["se"]  # how many standard errors it gained
  model, (chosen, ranking, table, below) = _fit(z * 1.01)
  assert below["chosen"] == "none" and not below["margin"]["kept"]
  assert chosen is model and chosen.params.row_blend is None
  assert below["scores"] == record["scores"]            # every candidate still recorded
  _, (kept, _, _, above) = _fit(z * 0.99)
  assert above["chosen"] == record["chosen"] and kept.params.row_blend is not None
  # Without the term, the ranking is the one the model without it had chosen.
  assert ranking == _plain_ranking(table)

def test_paired_gain_on_two_parts():
  a = {"x": {"m": np.array([1.0, 1.0, 0.0])}, "y": {"m": np.array([1.0, 1.0])}}
  b = {"x": {"m": np.array([0.0, 1.0, 0.0])}, "y": {"m": np.array([0.0, 0.0])}}
  gain, se = post_theta.paired_gain(a, b, ("m",))
  assert gain == pytest.approx((1 / 3 + 1.0) / 2)       # the mean over parts, as the choice
  d = np.array([1.0, 0.0, 0.0])
  assert se == pytest.approx(np.sqrt(d.var(ddof=1) / 3 + 0.0) / 2)


def test_per_query_metrics_are_what_the_summary_means():
  model, data = _case(0, trained_misleads=True)
  config = _config()
  qs = data.splits[config.data.val_split]
  per = evaluator.query_metrics(model.params, qs, data.tool_ids, config.model, 16)
  summed = evaluator.evaluate_rankings(model.params, qs, data.tool_ids, config.model, 16)
  for r, m in per.items():
    assert all(len(v) == len(qs.ids) for v in m.values())
    assert summed[r] == {k: float(v.mean()) for k, v in m.items()} | {"n_queries": len(qs.ids)}


def test_the_margin_is_checked_and_only_rechooses():
  with pytest.raises(UserError, match="model.fit_margin must be ≥ 0"):
    config_lib.resolve("tiny", ["model.fit_margin=-1"])
  with pytest.raises(UserError, match="model.fit_margin: expected float"):
    config_lib.resolve("tiny", ["model.fit_margin=nan"])
  assert "model.fit_margin" in workdir.AFTER_TRAINING
  assert config_lib.resolve("tiny", ["model.fit_margin=1"]).model.fit_margin == 1.0
