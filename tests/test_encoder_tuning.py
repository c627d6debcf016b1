"""Trainable encoder (top-n blocks over cached lower states, LoRA, full), joint fine-tuning
with θ, and the sentence-transformers export.

A random 3-block BERT (hidden size 8) with the MiniLM vocabulary keeps most tests fast; the
installed MiniLM checks the exactness claims on the real model with three short texts.
"""
from __future__ import annotations

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hyset_jax import config as config_lib
from hyset_jax.io import modeldir
from hyset_jax.model import parameters
from hyset_jax.training import finetune, negatives, train_data
from hyset_jax.encoder import encoder_reference, layer_cache, load_encoder, st_export, tuning
from hyset_jax.errors import UserError
from test_encoder import TINY, write_tiny_model

TINY3 = dict(TINY, num_hidden_layers=3)
TEXTS = ["get the weather in paris", "book a flight to tokyo for two people tomorrow morning",
         "", "convert " * 30]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  return load_encoder(write_tiny_model(tmp_path_factory.mktemp("tiny3") / "m", config=TINY3,
                                       pooling="mean"))


@pytest.fixture(scope="module")
def minilm():
  return load_encoder()


def close(actual, desired, atol=2e-6):
  """Equal up to float32 rounding of a different padded shape (the tiny model's vectors are
  not normalised, with entries up to ~4)."""
  np.testing.assert_allclose(actual, desired, rtol=2e-5, atol=atol)


def run(spec, frozen, trainable, batch) -> np.ndarray:
  return np.asarray(jax.jit(functools.partial(tuning.forward, spec))(frozen, trainable, batch))


# --- Exactness of the trainable views ----------------------------------------------------


@pytest.mark.parametrize("n_layers", [1, 2])
def test_top_layers_over_cached_lower_states_equal_the_full_forward(tiny, n_layers):
  table = layer_cache.tokenize_table(tiny, TEXTS)
  spec, frozen, top = tuning.split_encoder(tiny, "top_layers", n_layers=n_layers)
  assert spec.start_layer == 3 - n_layers and spec.from_hidden
  cached = layer_cache.with_lower_states(table, tiny, TEXTS, spec.start_layer, batch_size=3)
  assert cached.hidden.shape == (int(table.lengths.sum()), 8)
  fspec, ffrozen, full = tuning.split_encoder(tiny, "full")
  rows = [3, 0, 2, 1]
  from_cache = run(spec, frozen, top, cached.batch(rows))
  from_tokens = run(fspec, ffrozen, full, table.batch(rows))
  close(from_cache, from_tokens)
  close(from_cache, tiny.encode(TEXTS)[rows])
  # A row's vector does not depend on what else is in the batch (padding never leaks in).
  close(run(spec, frozen, top, cached.batch([1])), from_cache[3:4])


def test_partitions_cover_the_model_once(tiny):
  total = tuning.count_params(tuning.split_encoder(tiny, "full")[2])
  spec, frozen, top = tuning.split_encoder(tiny, "top_layers", n_layers=1)
  assert tuning.count_params(top) + tuning.count_params(frozen) == total
  assert set(top["layers"].keys()) == {2}
  spec, frozen, lora = tuning.split_encoder(tiny, "lora", lora_rank=2)
  assert tuning.count_params(frozen) == total
  assert tuning.count_params(lora) == 3 * 2 * (8 * 2 + 2 * 8)
  with pytest.raises(ValueError, match="n_layers must be in"):
    tuning.split_encoder(tiny, "top_layers", n_layers=4)


def test_lora_at_init_equals_the_frozen_encoder_exactly(minilm):
  texts = TEXTS[:3]
  table = layer_cache.tokenize_table(minilm, texts)
  batch = table.batch([0, 1, 2])
  lspec, lfrozen, lora = tuning.split_encoder(minilm, "lora", lora_rank=4)
  fspec, ffrozen, full = tuning.split_encoder(minilm, "full")
  adapted = run(lspec, lfrozen, lora, batch)
  np.testing.assert_array_equal(adapted, run(fspec, ffrozen, full, batch))  # B = 0: W + 0 = W
  np.testing.assert_allclose(adapted, minilm.encode(texts), atol=2e-6)
  # The real model's top-2 blocks over its cached block-4 inputs, too.
  spec, frozen, top = tuning.split_encoder(minilm, "top_layers", n_layers=2)
  cached = layer_cache.with_lower_states(table, minilm, texts, spec.start_layer)
  np.testing.assert_allclose(run(spec, frozen, top, cached.batch([0, 1, 2])), adapted, atol=2e-6)


def test_lora_merge_adds_the_scaled_product(tiny):
  spec, frozen, lora = tuning.split_encoder(tiny, "lora", lora_rank=2, lora_alpha=3.0)
  lora = jax.tree.map(lambda x: x + 0.1, lora)  # B ≠ 0
  merged = tuning.merged_model(spec, frozen, lora)
  original = tiny.model()
  for i in range(3):
    for target in ("query", "value", "key"):
      want = getattr(original.layers[i].attention, target).kernel.get_value()
      if target in lora["layers"][i]:
        ab = lora["layers"][i][target]
        want = want + 1.5 * ab["a"] @ ab["b"]  # α / r = 3 / 2
      np.testing.assert_allclose(getattr(merged.layers[i].attention, target).kernel.get_value(),
                                 want, atol=1e-6)


# --- Joint optimisation ----------------------------------------------------------------------


def tiny_data(encoder) -> train_data.TrainingData:
  """6 tools, 24 training queries over 3 gold sets, 8 validation and 8 test queries."""
  tools = ["weather forecast for a city", "book flights and hotels", "currency exchange rates",
           "calendar events and reminders", "send an email message", "translate text"]
  gold_by_kind = [(0,), (1, 2), (3, 4)]
  phrases = ["what is the weather in", "book a trip and pay in euros to",
             "schedule a meeting and email"]
  cities = ["paris", "tokyo", "rome", "oslo", "lima", "cairo", "delhi", "quito"]

  def split(n, offset):
    texts, gold = [], []
    for i in range(n):
      kind = i % 3
      texts.append(f"{phrases[kind]} {cities[(i + offset) % len(cities)]} {i}")
      gold.append(gold_by_kind[kind])
    emb = encoder.encode(texts)
    return train_data.QuerySet(tuple(f"q{offset}-{i}" for i in range(n)), tuple(texts), emb,
                          tuple(gold))

  return train_data.TrainingData(tuple(f"t{i}" for i in range(6)), encoder.encode(tools),
                            encoder_reference(encoder.model_dir),
                            {"train": split(24, 0), "validation": split(8, 3),
                             "test": split(8, 5)})


def tiny_config(steps: int = 4) -> config_lib.Config:
  return config_lib.Config(
      name="tiny-finetune",
      model=config_lib.ModelConfig(max_set_size=2, k1=2, k_pool=3, init_scale=5.0),
      train=config_lib.TrainConfig(batch_size=8, num_steps=steps, learning_rate=1e-2,
                                   warmup_steps=1, k_neg=6, hard_neighbors=2,
                                   tool_loss_weight=1.0, shortlist_negatives=0.3,
                                   eval_batch_size=8))


@pytest.mark.parametrize("mode", ["top_layers", "lora", "full", "frozen"])
def test_a_few_joint_steps_lower_the_loss(tiny, mode):
  data = tiny_data(tiny)
  config = tiny_config()
  tc, mc = config.train, config.model
  tune = finetune.EncoderTuneConfig(mode=mode, n_layers=1, lora_rank=2, learning_rate=3e-2,
                                    warmup_steps=1)
  qs = data.splits["train"]
  rows = np.arange(8)
  gold = [qs.gold[i] for i in rows]
  neighbors = np.zeros((8, 2, 2), np.int32)
  pools = negatives.sample_pools(gold, list(range(8)), num_tools=6, k_neg=6, max_size=2,
                                 mix=tc.negative_mix, neighbors=neighbors, seed=0, step=0)
  batch = {"members": pools.members, "mask": pools.mask}
  spec = frozen = enc = None
  if mode == "frozen":
    batch["query"] = qs.embeddings[rows]
  else:
    spec, frozen, enc = tuning.split_encoder(tiny, mode, n_layers=1, lora_rank=2)
    table = layer_cache.tokenize_table(tiny, qs.texts)
    if spec.from_hidden:
      table = layer_cache.with_lower_states(table, tiny, qs.texts, spec.start_layer)
    batch["text"] = table.batch(rows)
  theta = parameters.init_theta(data.tool_embeddings, 8, mc, 0)
  # θ frozen here (learning rate ~0 through a huge warm-up) except in the control, so the
  # drop in loss is the encoder's doing.
  if mode != "frozen":
    config = dataclasses.replace(config, train=dataclasses.replace(tc, warmup_steps=10**6,
                                                                   num_steps=10**6 + 1))
  optimizer = finetune.make_optimizer(config, dataclasses.replace(tune, warmup_steps=0))
  state = finetune.JointState({"theta": theta, "encoder": enc},
                              optimizer.init({"theta": theta, "encoder": enc}))
  step = jax.jit(functools.partial(finetune.joint_step, spec=spec, mc=mc, tc=tc,
                                   optimizer=optimizer))
  start_enc = jax.tree.map(np.asarray, enc)
  losses = []
  for _ in range(6):
    state, parts, query = step(state, frozen, batch)
    losses.append(float(parts["loss"]))
  assert losses[-1] < (0.97 if mode == "frozen" else 0.9) * losses[0], losses
  assert query.shape == (8, 8)
  if mode != "frozen":
    moved = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - b).max()),
                         state.params["encoder"], start_enc)
    assert max(jax.tree.leaves(moved)) > 1e-4
    np.testing.assert_allclose(np.asarray(state.params["theta"]["p"]), np.asarray(theta["p"]),
                               atol=1e-5)  # θ did not move: the encoder lowered the loss


def test_finetune_end_to_end_exports_a_loadable_encoder(tiny, tmp_path):
  data = tiny_data(tiny)
  config = tiny_config(steps=3)
  config = dataclasses.replace(config, model=dataclasses.replace(
      config.model, encoder=str(tiny.model_dir)))
  tune = finetune.EncoderTuneConfig(mode="top_layers", n_layers=1, learning_rate=1e-2)
  out = tmp_path / "run"
  summary = finetune.finetune(config, tune, out, data=data, progress=False)
  assert summary["steps"] == 3 and summary["encoder_trainable_params"] > 0
  assert set(summary["after"]) == {"validation", "test"}
  assert json.loads((out / "metrics.json").read_text())["mode"] == "top_layers"
  saved = modeldir.load_model_dir(out / "model")
  assert saved.query_encoder == str((out / "encoder").resolve())
  tuned = load_encoder(saved.query_encoder)
  assert tuned.name == "encoder" and tuned.dim == 8
  moved = np.abs(tuned.encode(TEXTS) - tiny.encode(TEXTS)).max()
  assert moved > 1e-4  # the exported weights are the trained ones, not the source's
  with pytest.raises(UserError, match="exists and is not empty; pass --force"):
    finetune.finetune(config, tune, out, data=data, progress=False)


@pytest.mark.parametrize("change, message", [
    (dict(mode="partial"), "tune.mode must be one of"),
    (dict(n_layers=0), r"tune.n_layers must be ≥ 1"),
    (dict(learning_rate=0.0), "must be > 0"),
])
def test_bad_tune_config(change, message):
  with pytest.raises(UserError, match=message):
    finetune.validate_tune(finetune.EncoderTuneConfig(**change), tiny_config())


def test_more_layers_than_the_encoder_has(tiny, tmp_path):
  config = tiny_config()
  config = dataclasses.replace(config, model=dataclasses.replace(
      config.model, encoder=str(tiny.model_dir)))
  with pytest.raises(UserError, match="tune.n_layers = 4, but .* has 3 blocks"):
    finetune.finetune(config, finetune.EncoderTuneConfig(n_layers=4), tmp_path / "out",
                      data=tiny_data(tiny), progress=False)


def test_rewards_refused():
  config = tiny_config()
  config.train.eta = 0.5
  with pytest.raises(UserError, match="train.eta > 0"):
    finetune.validate_tune(finetune.EncoderTuneConfig(), config)


# --- Export ------------------------------------------------------------------------------------


def test_export_round_trips_with_lora_merged(tiny, tmp_path):
  spec, frozen, lora = tuning.split_encoder(tiny, "lora", lora_rank=2)
  keys = iter(jax.random.split(jax.random.key(1), 100))
  lora = jax.tree.map(lambda x: x + 0.3 * jax.random.normal(next(keys), x.shape), lora)
  table = layer_cache.tokenize_table(tiny, TEXTS)
  expected = run(spec, frozen, lora, table.batch(range(len(TEXTS))))
  out = st_export.save_sentence_transformer(tuning.merged_model(spec, frozen, lora), tiny,
                                            tmp_path / "st")
  reloaded = load_encoder(out)
  close(reloaded.encode(TEXTS), expected)
  assert np.abs(expected - tiny.encode(TEXTS)).max() > 1e-3  # the adapters changed the model
  modules = json.loads((out / "modules.json").read_text())
  assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Pooling"]
  pooling = json.loads((out / "1_Pooling" / "config.json").read_text())
  assert pooling["pooling_mode_mean_tokens"] and not pooling["pooling_mode_cls_token"]
  assert pooling["word_embedding_dimension"] == 8
  assert json.loads((out / "sentence_bert_config.json").read_text())["max_seq_length"] == 32
  from safetensors.numpy import load_file
  tensors = load_file(out / "model.safetensors")
  assert tensors["encoder.layer.0.intermediate.dense.weight"].shape == (16, 8)  # (out, in)
  with pytest.raises(UserError, match="pass --force"):
    st_export.save_sentence_transformer(tiny.model(), tiny, out)
  st_export.save_sentence_transformer(tiny.model(), tiny, out, force=True)
  np.testing.assert_array_equal(load_encoder(out).encode(TEXTS), tiny.encode(TEXTS))


def test_export_of_minilm_keeps_its_pipeline(minilm, tmp_path):
  out = st_export.save_sentence_transformer(minilm.model(), minilm, tmp_path / "st")
  again = load_encoder(out)
  assert (again.pipeline.pooling, again.pipeline.normalize, again.max_seq_length) == \
      (minilm.pipeline.pooling, minilm.pipeline.normalize, minilm.max_seq_length)
  assert again.name == "st"  # not the source's id: the cache must not mix the two
  np.testing.assert_array_equal(again.encode(TEXTS[:3]), minilm.encode(TEXTS[:3]))
