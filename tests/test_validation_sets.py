"""Validation of both kinds (data.validation_sets): multi-tool gold sets held out of train into
a second validation part, and model selection on the mean of both parts — on real ToolLens."""
import json

import numpy as np
import pytest

from hyset_jax import config as config_lib
from hyset_jax.data import splits
from hyset_jax.data.specs import load_dataset
from hyset_jax.errors import UserError
from hyset_jax.training import train
from hyset_jax.training.train_data import load_config_dataset


def _sets(queries):
  return {tuple(sorted(q.gold)) for q in queries}


def test_held_out_sets_leave_train_and_nothing_else_changes(shared_data):
  c = config_lib.DataConfig(spec=f"beir:{shared_data / 'toollens'}")
  before = load_config_dataset(c, 3)
  after = load_config_dataset(config_lib.DataConfig(spec=c.spec, validation_sets=12), 3)
  held = after.splits[splits.UNSEEN_VALIDATION]
  held_sets = _sets(held)
  assert len(held_sets) == 12 and all(len(s) >= 2 for s in held_sets)
  # Every query of those sets left train and validation, and nothing else did; test is as it was.
  for name in ("train", "validation"):
    assert not held_sets & _sets(after.splits[name])
    kept = {q.id for q in before.splits[name] if tuple(sorted(q.gold)) not in held_sets}
    assert [q.id for q in after.splits[name]] == [q.id for q in before.splits[name]
                                                 if q.id in kept]
  assert ({q.id for q in held} == {q.id for n in ("train", "validation")
                                    for q in before.splits[n]
                                    if tuple(sorted(q.gold)) in held_sets})
  assert [q.id for q in after.splits["test"]] == [q.id for q in before.splits["test"]]
  # Every tool of a held-out set is still trained on, in another set.
  trained = {t for q in after.splits["train"] for t in q.gold}
  assert {t for s in held_sets for t in s} <= trained
  # The draw is the seed's: the same again, another with another seed.
  again = load_config_dataset(config_lib.DataConfig(spec=c.spec, validation_sets=12), 3)
  assert _sets(again.splits[splits.UNSEEN_VALIDATION]) == held_sets
  other = load_config_dataset(
      config_lib.DataConfig(spec=c.spec, validation_sets=12, validation_sets_seed=1), 3)
  assert _sets(other.splits[splits.UNSEEN_VALIDATION]) != held_sets


def test_too_many_sets_is_a_clear_error(shared_data):
  data = load_dataset(f"beir:{shared_data / 'toollens'}", max_set_size=3)
  data = splits.with_validation(data)
  with pytest.raises(UserError, match=r"data.validation_sets = 5000 .*lower"):
    splits.with_unseen_validation(data, 5000)
  with pytest.raises(UserError, match="data.validation_sets must be ≥ 0"):
    config_lib.validate(config_lib.resolve("tiny", ["data.validation_sets=-1"]))


def test_training_selects_on_the_mean_of_both_parts(tmp_path, shared_data):
  c = config_lib.resolve("tiny", [f"data.spec=beir:{shared_data / 'toollens'}",
                                  "data.validation_sets=10", "model.set_prior=true",
                                  "train.num_steps=20", "train.eval_every=5"])
  summary = train.train_and_evaluate(c, tmp_path / "run", progress=False, num_devices=1)
  rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text()
          .splitlines()]
  evals = [r for r in rows if "val_recall@5" in r]
  seen, unseen = "val_validation/recall@5", f"val_{splits.UNSEEN_VALIDATION}/recall@5"
  for r in evals:
    assert r["val_recall@5"] == pytest.approx((r[seen] + r[unseen]) / 2)
  # Two different query sets: the held-out part is harder than the seen one.
  assert any(r[unseen] < r[seen] for r in evals)
  # best/ follows the mean: the best step is the one with the best mean of the evaluations.
  best = max(evals, key=lambda r: (r["val_recall@5"], -r["step"]))
  assert summary["best_step"] == best["step"]
  assert summary["best_val_recall@5"] == pytest.approx(best["val_recall@5"])
  # The fits after θ score candidates on the mean too, and keep each part's numbers.
  last = rows[-1]["validation_by_ranking"]
  some = next(iter(last.values()))
  assert some["comp@5"] == pytest.approx(
      np.mean([some["validation/comp@5"], some[f"{splits.UNSEEN_VALIDATION}/comp@5"]]))
  manifest = json.loads((tmp_path / "run" / "best" / "manifest.json").read_text())
  fit = manifest["fits"][0]
  chosen = last[f"prior {fit['chosen']} {fit['ranking']}"]
  assert fit["scores"][f"{fit['chosen']} {fit['ranking']}"] == pytest.approx(
      np.mean([chosen[k] for k in fit["criterion"]]))
