"""Fine-tuning the query encoder on the training labels (hyset_jax.training.label_tuning, `hyset
finetune`), and training θ over the tuned encoder.

The random 3-block BERT of test_encoder_tuning keeps the loop fast; the CLI test runs the
whole path on ToolLens' first queries (`--config tiny`): tune, train over the tuned encoder,
predict from another working directory.
"""
from __future__ import annotations

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hyset_jax import cli
from hyset_jax.io import modeldir
from hyset_jax.training import finetune, label_tuning
from hyset_jax.encoder import DEFAULT_MODEL_NAME, encoder_reference, layer_cache, load_encoder
from hyset_jax.encoder import tuning
from hyset_jax.errors import UserError
from test_encoder import write_tiny_model
from test_encoder_tuning import TEXTS, TINY3, tiny_config, tiny_data


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  return load_encoder(write_tiny_model(tmp_path_factory.mktemp("tiny3") / "m", config=TINY3,
                                       pooling="mean"))


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_label_loss_matches_a_direct_computation():
  rng = np.random.default_rng(0)
  heads = {"tools": rng.normal(size=(7, 4)).astype(np.float32),
           "sets": rng.normal(size=(3, 4)).astype(np.float32)}
  query = rng.normal(size=(3, 4)).astype(np.float32)
  gold = np.array([[1, 4, 0], [2, 0, 0], [5, 6, 3]], np.int32)   # padded with 0
  mask = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1]], bool)
  set_id = np.array([2, -1, 0], np.int32)                         # query 1: not a training set
  loss, parts = label_tuning.label_loss(
      jax.tree.map(jnp.asarray, heads), jnp.asarray(query), gold, mask, set_id,
      temperature=0.5, set_weight=0.3)
  lt = _log_softmax(query @ heads["tools"].T / 0.5)
  tool = np.mean([-(lt[0, 1] + lt[0, 4]) / 2, -lt[1, 2], -(lt[2, 5] + lt[2, 6] + lt[2, 3]) / 3])
  ls = _log_softmax(query @ heads["sets"].T / 0.5)
  sets = (-ls[0, 2] - ls[2, 0]) / 2                               # the unknown set left out
  np.testing.assert_allclose(float(parts["tool_loss"]), tool, rtol=1e-5)
  np.testing.assert_allclose(float(parts["set_loss"]), sets, rtol=1e-5)
  np.testing.assert_allclose(float(loss), tool + 0.3 * sets, rtol=1e-5)
  # Without a set head the loss is the tool term alone.
  alone, parts = label_tuning.label_loss({"tools": jnp.asarray(heads["tools"])},
                                         jnp.asarray(query), gold, mask, set_id,
                                         temperature=0.5, set_weight=0.3)
  assert set(parts) == {"tool_loss"}
  np.testing.assert_allclose(float(alone), tool, rtol=1e-5)


def test_labels_and_heads_of_a_split(tiny):
  data = tiny_data(tiny)
  train = data.splits["train"]
  sets = label_tuning.training_sets(train)
  assert sets == {(0,): 0, (1, 2): 1, (3, 4): 2}
  labels = label_tuning.labels_of(train, sets)
  assert labels.gold.shape == (24, 2) and labels.gold_mask[:3].tolist() == [
      [True, False], [True, True], [True, True]]
  assert labels.set_id[:3].tolist() == [0, 1, 2]
  unseen = dataclasses.replace(train, gold=((0, 5),) + train.gold[1:])
  assert label_tuning.labels_of(unseen, sets).set_id[0] == -1
  heads = label_tuning.init_heads(data.tool_embeddings, sets, with_sets=True)
  unit = lambda x: x / np.linalg.norm(x)
  np.testing.assert_allclose(np.asarray(heads["sets"][1]),
                             unit(data.tool_embeddings[[1, 2]].mean(0)), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(heads["tools"][3]), unit(data.tool_embeddings[3]),
                             rtol=1e-5)
  assert "sets" not in label_tuning.init_heads(data.tool_embeddings, sets, with_sets=False)


@pytest.mark.parametrize("mode", ["top_layers", "lora", "full"])
def test_a_few_label_steps_lower_the_loss(tiny, mode):
  data = tiny_data(tiny)
  train = data.splits["train"]
  tune = finetune.EncoderTuneConfig(mode=mode, n_layers=1, lora_rank=2, learning_rate=3e-2,
                                    warmup_steps=0, head_learning_rate=1e-9, temperature=0.5)
  spec, frozen, enc = tuning.split_encoder(tiny, mode, n_layers=1, lora_rank=2)
  table = layer_cache.tokenize_table(tiny, train.texts)
  if spec.from_hidden:
    table = layer_cache.with_lower_states(table, tiny, train.texts, spec.start_layer)
  sets = label_tuning.training_sets(train)
  labels = label_tuning.labels_of(train, sets)
  rows = np.arange(12)
  optimizer = label_tuning.make_optimizer(tune, 100)
  params = {"encoder": enc,
            "heads": label_tuning.init_heads(data.tool_embeddings, sets, with_sets=True)}
  state = label_tuning.LabelState(params, optimizer.init(params))
  step = jax.jit(functools.partial(label_tuning.label_step, spec=spec, temperature=0.5,
                                   set_weight=1.0, optimizer=optimizer))
  losses = []
  for _ in range(8):
    state, parts = step(state, frozen, table.batch(rows), label_tuning.Labels(
        *(a[rows] for a in labels)))
    losses.append(float(parts["loss"]))
  assert losses[-1] < 0.9 * losses[0], losses
  # The heads barely moved (learning rate 1e-9): the encoder lowered the loss.
  np.testing.assert_allclose(np.asarray(state.params["heads"]["tools"]),
                             np.asarray(params["heads"]["tools"]), atol=1e-6)


def test_tune_on_labels_end_to_end(tiny, tmp_path):
  data = tiny_data(tiny)
  config = tiny_config(steps=6)
  config = dataclasses.replace(
      config, model=dataclasses.replace(config.model, encoder=str(tiny.model_dir)),
      train=dataclasses.replace(config.train, eval_every=3))
  tune = finetune.EncoderTuneConfig(mode="top_layers", n_layers=1, learning_rate=3e-2,
                                    warmup_steps=0, temperature=0.5)
  out = tmp_path / "run"
  summary = label_tuning.tune_on_labels(config, tune, out, data=data, progress=False)
  assert [e["step"] for e in summary["validation"]] == [0, 3, 6]
  losses = {e["step"]: e["loss"] for e in summary["validation"]}
  assert summary["best_step"] == min(losses, key=losses.get)
  assert summary["best_step"] > 0, losses  # the tuned encoder beat the start on validation
  assert set(summary["validation"][0]) >= {"loss", "tool_recall@5", "set_exact"}
  assert json.loads((out / "label_tuning.json").read_text())["training_sets"] == 3
  assert (out / "curves.png").stat().st_size > 1000
  tuned = load_encoder(out / "encoder")
  assert np.abs(tuned.encode(TEXTS) - tiny.encode(TEXTS)).max() > 1e-4
  with pytest.raises(UserError, match="exists and is not empty; pass --force"):
    label_tuning.tune_on_labels(config, tune, out, data=data, progress=False)
  other = tmp_path / "other"
  other.mkdir()
  (other / "notes.txt").write_text("mine")
  with pytest.raises(UserError, match="not a label-tuning output"):
    label_tuning.tune_on_labels(config, tune, other, data=data, force=True, progress=False)
  assert (other / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("change, message", [
    (dict(mode="frozen"), "trains no encoder"),
    (dict(temperature=0.0), "must be > 0"),
    (dict(set_weight=-1.0), "set_weight must be ≥ 0"),
])
def test_bad_label_settings(change, message):
  with pytest.raises(UserError, match=message):
    label_tuning.validate(finetune.EncoderTuneConfig(**change), tiny_config())


def test_query_noise_is_refused_by_both_tuning_objectives():
  config = tiny_config()
  config.train.query_noise = 0.6
  for validate in (label_tuning.validate, finetune.validate_tune):
    with pytest.raises(UserError, match="query_noise is a setting of hyset train"):
      validate(finetune.EncoderTuneConfig(), config)


def test_encoder_reference_is_loadable_from_anywhere(tiny, tmp_path, monkeypatch):
  assert encoder_reference(None) == encoder_reference("") == DEFAULT_MODEL_NAME
  monkeypatch.chdir(tiny.model_dir.parent)
  ref = encoder_reference(tiny.model_dir.name)     # a relative path ...
  assert ref == str(tiny.model_dir.resolve())      # ... recorded absolute
  monkeypatch.chdir(tmp_path)
  assert load_encoder(ref).dim == 8
  with pytest.raises(UserError, match="no such model directory"):
    encoder_reference("missing-dir")


def test_finetune_train_predict_from_the_command_line(tiny, tmp_path, monkeypatch):
  """`hyset finetune` on ToolLens' first queries, `hyset train` over the tuned encoder,
  `hyset predict` from another working directory embeds with that encoder."""
  out, work = tmp_path / "ft", tmp_path / "work"
  base = ["--config", "tiny", "--set", f"model.encoder={tiny.model_dir}"]
  assert cli.main(["finetune", *base, "--out", str(out), "--steps", "4", "--batch-size", "16",
                   "--encoder-lr", "1e-2", "--n-layers", "1", "--no-progress"]) == 0
  summary = json.loads((out / "label_tuning.json").read_text())
  assert summary["steps"] == 4 and summary["batch_size"] == 16 and summary["train_queries"] > 100
  # The same output again needs --force; --init-model belongs to the joint objective.
  assert cli.main(["finetune", *base, "--out", str(out), "--steps", "1"]) == 2
  assert cli.main(["finetune", *base, "--out", str(tmp_path / "x"), "--init-model", "m"]) == 2
  monkeypatch.chdir(tmp_path)  # a relative --set model.encoder, recorded absolute
  assert cli.main(["train", "--config", "tiny", "--set", "model.encoder=ft/encoder", "--set",
                   "train.num_steps=2", "--set", "train.eval_every=2", "--workdir", str(work),
                   "--no-progress"]) == 0
  model = modeldir.load_model_dir(work / "best")
  assert model.query_encoder == str((out / "encoder").resolve())
  queries = tmp_path / "q.jsonl"
  queries.write_text(json.dumps({"_id": "a", "text": "weather in paris tomorrow"}) + "\n")
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  monkeypatch.chdir(elsewhere)
  assert cli.main(["predict", "--model", str(work / "best"), "--queries", str(queries),
                   "--out", "pred.jsonl"]) == 0
  assert json.loads((elsewhere / "pred.jsonl").read_text().splitlines()[0])["query_id"] == "a"


def test_finetune_joint_objective_from_the_command_line(tiny, tmp_path):
  """`--objective joint`: θ and the encoder together; OUT/model predicts with OUT/encoder."""
  out = tmp_path / "joint"
  assert cli.main(["finetune", "--config", "tiny", "--set", f"model.encoder={tiny.model_dir}",
                   "--objective", "joint", "--out", str(out), "--steps", "2", "--batch-size",
                   "16", "--n-layers", "1", "--no-progress"]) == 0
  metrics = json.loads((out / "metrics.json").read_text())
  assert metrics["steps"] == 2 and metrics["mode"] == "top_layers"
  assert set(metrics["after"]) == {"validation", "test"}
  assert modeldir.load_model_dir(out / "model").query_encoder == str((out / "encoder").resolve())
