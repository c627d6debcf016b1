"""The row blend (hyset_jax/model/terms/row_blend.py): Z blended toward the encoder's rows after
θ, α chosen by the one post-θ selection loop, undone by a refit and by a warm start. (The term's
place in every consumer — model directory, exports, reference, serve, tool edits — is
tests/test_terms.py's matrix.)"""
import dataclasses
import types

import numpy as np
import pytest

from hyset_jax import config as config_lib
from hyset_jax.errors import UserError
from hyset_jax.io import modeldir
from hyset_jax.model import parameters, terms
from hyset_jax.training import post_theta
from hyset_jax.training.train_data import QuerySet

from test_abstain import D, K, K1, M, N, _config  # the same small post-θ setting

TERM = terms.REGISTRY["row_blend"]


def _unit(x):
  return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _data(rng, rows):
  """Single-tool requests that point at ``rows`` (what the request's words mean), and encoder
  rows ``e`` drawn beside them."""
  config = _config()

  def split(n, tag):
    gold = [(int(rng.integers(N)),) for _ in range(n)]
    emb = np.stack([rows[g[0]] + 0.3 * rng.normal(size=D) for g in gold])
    return QuerySet(tuple(f"{tag}{i}" for i in range(n)), ("q",) * n, emb.astype(np.float32),
                    tuple(gold))

  return {config.data.train_split: split(40, "r"), config.data.val_split: split(120, "v")}


def _model(z):
  return modeldir.ModelDir(parameters.init_params(z, D, M), tuple(f"t{i}" for i in range(N)),
                           M, K1, K, None)


def _case(seed: int, trained_misleads: bool):
  """(model, data): encoder rows e; a trained Z that either pulled every tool toward another
  one (requests still mean e: the blend helps) or learnt what requests mean while e is noise
  (the blend hurts)."""
  rng = np.random.default_rng(seed)
  e = _unit(rng.normal(size=(N, D)))
  if trained_misleads:
    z = _unit(e + 1.6 * e[rng.permutation(N)])
    meaning, encoder = e, e
  else:
    z = e
    meaning, encoder = e, _unit(rng.normal(size=(N, D)))
  data = types.SimpleNamespace(splits=_data(rng, meaning), tool_ids=tuple(f"t{i}" for i in
                                                                         range(N)),
                               tool_embeddings=encoder)
  return _model(z), data


def test_validation_blends_a_misleading_z_and_keeps_a_right_one():
  config = _config(row_blend=True)
  model, data = _case(0, trained_misleads=True)
  chosen, ranking, table, record = post_theta.fit_term(TERM, model, data, config)
  assert record["term"] == "row_blend" and record["chosen"] != "none"
  alpha = float(chosen.params.row_blend.alpha)
  assert alpha < 1 and record["chosen"] == f"α={alpha:g}"
  assert (table[f"row_blend {record['chosen']} {ranking}"]["recall@3"]
          > table[f"row_blend none {ranking}"]["recall@3"] + 0.1)
  # Z is the blend, the term keeps Z as trained; removing the term gives it back exactly.
  want = _unit(alpha * model.params.tool_embeddings + (1 - alpha) * data.tool_embeddings)
  np.testing.assert_allclose(chosen.params.tool_embeddings, want, atol=1e-6)
  np.testing.assert_array_equal(chosen.params.row_blend.trained, model.params.tool_embeddings)
  np.testing.assert_array_equal(TERM.without(chosen).params.tool_embeddings,
                                model.params.tool_embeddings)
  # A Z that learnt what requests mean, encoder rows that do not: α = 1 (the term absent).
  model, data = _case(1, trained_misleads=False)
  chosen, _, _, record = post_theta.fit_term(TERM, model, data, config)
  assert record["chosen"] == "none" and chosen.params.row_blend is None


def test_a_refit_starts_from_the_trained_rows(tmp_path):
  model, data = _case(0, trained_misleads=True)
  blended = TERM.fit.candidates(model, data, _config(row_blend=True))
  stale = dict(blended)["α=0.25"]
  modeldir.save_model_dir(tmp_path / "m", stale)
  back = modeldir.load_model_dir(tmp_path / "m")
  assert back.terms == ("row_blend",)
  # Switched off on a rerun: the blend is stripped, Z is as trained again.
  sel = post_theta.select(back, data, _config(row_blend=False))
  assert sel.model.params.row_blend is None
  np.testing.assert_array_equal(sel.model.params.tool_embeddings, model.params.tool_embeddings)
  # Switched on: blended from the trained rows, not from the stale blend.
  sel = post_theta.select(back, data, _config(row_blend=True))
  record = next(f for f in sel.fits if f["term"] == "row_blend")
  assert record["chosen"] != "none"
  np.testing.assert_array_equal(sel.model.params.row_blend.trained, model.params.tool_embeddings)


def test_a_warm_start_takes_z_as_trained(tmp_path):
  from hyset_jax.training import warm_start
  model, data = _case(0, trained_misleads=True)
  stale = dict(TERM.fit.candidates(model, data, _config(row_blend=True)))["α=0.5"]
  modeldir.save_model_dir(tmp_path / "m", stale)
  data = types.SimpleNamespace(**vars(data), query_encoder=None, tool_texts=())
  config = _config(row_blend=True, tower_depth=0, conditioned=False)  # the model's layout
  theta = warm_start.theta_from_model(tmp_path / "m", data, config.model)
  np.testing.assert_allclose(theta["z"], model.params.tool_embeddings, atol=1e-6)


def test_the_blend_needs_a_trained_z():
  with pytest.raises(UserError, match="row_blend=true needs model.train_tool_embeddings"):
    _config(row_blend=True, train_tool_embeddings=False)
  # The shipped presets: on where Z is trained, off where it is the encoder's.
  for name, on in (("toollens", True), ("ultratool", True), ("bfcl", False),
                   ("seal_tools", False), ("paper", False)):
    c = config_lib.resolve(name, [])
    assert c.model.row_blend is on and (not on or c.model.train_tool_embeddings), name


def test_the_blend_follows_its_tools_through_edits():
  from hyset_jax.io import tooledit
  model, data = _case(0, trained_misleads=True)
  md = dict(TERM.fit.candidates(model, data, _config(row_blend=True)))["α=0.5"]
  new = np.random.default_rng(3).normal(size=(1, D))
  added = tooledit.add_tools(md, ["new"], new)
  row = added.tool_ids.index("new")
  # A new tool's trained row is its encoder row, the one Z gives it.
  np.testing.assert_allclose(added.params.row_blend.trained[row], _unit(new)[0], atol=1e-6)
  np.testing.assert_array_equal(added.params.row_blend.trained[row],
                                added.params.tool_embeddings[row])
  gone = tooledit.remove_tools(added, ["t3"])
  keep = [i for i in range(N) if i != 3]
  np.testing.assert_array_equal(gone.params.row_blend.trained[:N - 1],
                                md.params.row_blend.trained[keep])
  assert dataclasses.replace(gone).terms == ("row_blend",)


def test_switching_the_blend_on_a_finished_run_rechooses_without_retraining(tmp_path):
  """model.row_blend and model.set_prior are chosen after θ: a finished workdir accepts them
  (the workdir check takes every post-θ switch from the term registry) and only rechooses,
  the blend from the run's own Z and its data set's encoder rows."""
  import json
  from hyset_jax.training import train
  short = ["train.num_steps=20"]  # what is tested happens after θ: a short θ will do
  first = train.train_and_evaluate(config_lib.resolve("tiny", short), tmp_path / "run",
                                   progress=False, num_devices=1)
  z = modeldir.load_model_dir(tmp_path / "run" / "best").params.tool_embeddings
  on = config_lib.resolve("tiny", short + ["model.row_blend=true", "model.set_prior=true"])
  again = train.train_and_evaluate(on, tmp_path / "run", progress=False, num_devices=1)
  assert again["steps"] == first["steps"]          # nothing trained again
  rows = [json.loads(line) for line in
          (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  assert [f["term"] for f in rows[-1]["fits"]] == ["row_blend", "prior"]
  assert {k.split()[1] for k in rows[-1]["validation_by_ranking"]
          if k.startswith("row_blend")} == {"none", "α=0.75", "α=0.5", "α=0.25"}
  best = modeldir.load_model_dir(tmp_path / "run" / "best")
  kept = best.params.row_blend.trained if best.params.row_blend is not None else \
      best.params.tool_embeddings
  np.testing.assert_array_equal(kept, z)
