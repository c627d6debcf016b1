"""train.init_model: training that starts from a saved model, carried onto the data's tools."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from hyset_jax.errors import UserError
from hyset_jax.io import modeldir
from hyset_jax.testing import small_config, synthetic_data
from hyset_jax.training import train, warm_start
from hyset_jax.training.train_data import QuerySet


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A 12-step synthetic run; its final/ is the model the tests start from."""
  work = tmp_path_factory.mktemp("a")
  data = dataclasses.replace(synthetic_data(), tool_texts=tuple(f"text {i}" for i in range(40)))
  train.train_and_evaluate(small_config(), work, data=data, progress=False, num_devices=1)
  return work / "final", data


def _regrown(data):
  """The same queries over a library that lists the tools in reverse, lacks t5 and adds two."""
  keep = [i for i in reversed(range(40)) if i != 5]
  rng = np.random.default_rng(7)
  new = rng.normal(size=(2, data.tool_embeddings.shape[1])).astype(np.float32)
  ids = tuple(data.tool_ids[i] for i in keep) + ("n0", "n1")
  rows = {old: new_row for new_row, old in enumerate(keep)}

  def remap(qs: QuerySet) -> QuerySet:
    kept = [i for i, g in enumerate(qs.gold) if 5 not in g]
    return QuerySet(tuple(qs.ids[i] for i in kept), tuple(qs.texts[i] for i in kept),
                    qs.embeddings[kept], tuple(tuple(sorted(rows[t] for t in qs.gold[i]))
                                               for i in kept))

  return dataclasses.replace(
      data, tool_ids=ids, tool_embeddings=np.concatenate([data.tool_embeddings[keep], new]),
      tool_texts=tuple(data.tool_texts[i] for i in keep) + ("new 0", "new 1"),
      splits={k: remap(v) for k, v in data.splits.items()})


def test_theta_is_the_model_carried_onto_the_data(trained):
  final, data = trained
  saved = modeldir.load_model_dir(final)
  other = _regrown(data)
  theta = warm_start.theta_from_model(final, other, small_config().model)
  z_saved = dict(zip(saved.tool_ids, np.asarray(saved.params.tool_embeddings)))
  for row, tool in enumerate(other.tool_ids[:-2]):
    np.testing.assert_array_equal(theta["z"][row], z_saved[tool], err_msg=tool)
  new = other.tool_embeddings[-2:]
  np.testing.assert_allclose(theta["z"][-2:], new / np.linalg.norm(new, axis=1, keepdims=True),
                             rtol=1e-6)
  np.testing.assert_array_equal(theta["p"], saved.params.projection)
  np.testing.assert_array_equal(theta["m"], saved.params.interactions)


def test_training_continues_from_the_model(trained, tmp_path):
  final, data = trained
  # One step at a learning rate that cannot move θ: the run ends where the model was.
  c = small_config(init_model=str(final), num_steps=1, learning_rate=1e-12, warmup_steps=0,
                   eval_every=1, log_every=1, checkpoint_every=1)
  # A data set without a test split trains too (a held-out-tools split's train folder).
  no_test = dataclasses.replace(data, splits={k: v for k, v in data.splits.items()
                                              if k != "test"})
  summary = train.train_and_evaluate(c, tmp_path / "b", data=no_test, progress=False,
                                     num_devices=1)
  assert "test" not in summary and summary["steps"] == 1
  start, end = modeldir.load_model_dir(final), modeldir.load_model_dir(tmp_path / "b" / "final")
  np.testing.assert_allclose(end.params.tool_embeddings, start.params.tool_embeddings, atol=1e-6)
  np.testing.assert_allclose(end.params.interactions, start.params.interactions, atol=1e-6)
  # The step-0 validation (the starting point) is the model's: its last validation in run A.
  read = lambda d: [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
  at = lambda rows, step: next(r for r in rows if r["step"] == step)
  for k in ("val_recall@5", "val_comp@5", "val_ndcg@5"):
    assert at(read(tmp_path / "b"), 0)[k] == pytest.approx(at(read(final.parent), 12)[k]), k


def test_a_model_of_another_layout_is_refused(trained):
  final, data = trained
  mc = small_config().model
  with pytest.raises(UserError, match="max_set_size"):
    warm_start.theta_from_model(final, data, dataclasses.replace(mc, max_set_size=4))
  with pytest.raises(UserError, match="query tower"):
    warm_start.theta_from_model(final, data, dataclasses.replace(mc, tower_depth=1))
  with pytest.raises(UserError, match="query encoder"):
    warm_start.theta_from_model(final, dataclasses.replace(data, query_encoder="other"), mc)
  no_texts = dataclasses.replace(_regrown(data), tool_texts=())
  with pytest.raises(UserError, match="no tool texts"):
    warm_start.theta_from_model(final, no_texts, mc)


def test_keep_last_makes_the_last_step_best_without_early_stop(trained, tmp_path):
  final, data = trained
  # patience 0 would stop at the first evaluation that is not better; keep=last never stops
  # and best/ is the last step's θ (with the post-θ fits chosen on it).
  c = small_config(init_model=str(final), num_steps=6, warmup_steps=0, eval_every=2,
                   log_every=1, checkpoint_every=6, patience=0, keep="last")
  summary = train.train_and_evaluate(c, tmp_path / "c", data=data, progress=False,
                                     num_devices=1)
  assert summary["steps"] == 6 and summary["best_step"] == 6
  best = modeldir.load_model_dir(tmp_path / "c" / "best")
  last = modeldir.load_model_dir(tmp_path / "c" / "final")
  start = modeldir.load_model_dir(final)
  np.testing.assert_array_equal(best.params.tool_embeddings, last.params.tool_embeddings)
  np.testing.assert_array_equal(best.params.interactions, last.params.interactions)
  assert not np.allclose(best.params.interactions, start.params.interactions)
  with pytest.raises(UserError, match="train.keep must be best or last"):
    small_config(keep="first")
