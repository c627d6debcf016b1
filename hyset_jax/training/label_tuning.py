"""Fine-tuning the query encoder on the training labels, before θ is trained over it.

``tune_on_labels(config, tune, out)`` trains the query encoder — its top n blocks over cached
lower-block states, LoRA adapters or all of it (:mod:`hyset_jax.encoder.tuning`) — under two
softmax heads over the training queries, then throws the heads away and exports the encoder:

- **tool head**: −mean over a query's gold tools t of log softmax(r(x)ᵀ W / τ)_t over the
  whole library; W's rows start as the tools' frozen embeddings, so step 0 ranks tools as the
  dense retriever does;
- **set head**: −log softmax over the distinct gold sets of the training split (each row starts
  as the normalised mean of its members' embeddings), weighted by ``tune.set_weight``; 0
  switches it off (libraries whose test sets are new combinations of tools).

The exported sentence-transformers directory is then an ordinary encoder: ``hyset train --set
model.encoder=OUT/encoder`` embeds queries and tools with it and trains θ over those vectors
(the model directory records the encoder's absolute path, so ``hyset predict`` embeds with it
too). The two stages cost one encoder pass per training query per epoch, against the joint
objective's (:mod:`hyset_jax.training.finetune`) encoder pass at every θ step; docs/encoder_finetuning.md
has the measurements behind the choice.

Out directory (written atomically; ``--force`` replaces only an earlier label-tuning output)::

  encoder/            the tuned encoder (sentence-transformers directory)
  label_tuning.json   settings, per-epoch validation (loss, tool-head R@5, set-head exact),
                      the chosen epoch, timings
  curves.png          training loss and the validation numbers against step
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import pathlib
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from hyset_jax.training import batches
from hyset_jax import config as config_lib
from hyset_jax.errors import UserError
from hyset_jax.training.finetune import EncoderTuneConfig, encoder_optimizer
from hyset_jax.training.train_data import QuerySet, TrainingData, prepare_data

log = logging.getLogger("hyset_jax.training.label_tuning")

MARKER = "label_tuning.json"


class Labels(NamedTuple):
  """One split's targets, padded.

  gold: int32[n, G] tool rows, padded with 0; gold_mask: bool[n, G]; set_id: int32[n], the row
  of the query's gold set in the set head, −1 when that set is not a training set.
  """
  gold: np.ndarray
  gold_mask: np.ndarray
  set_id: np.ndarray


def training_sets(train: QuerySet) -> dict[tuple[int, ...], int]:
  """The distinct gold sets of the training split, numbered in order of first occurrence."""
  sets: dict[tuple[int, ...], int] = {}
  for g in train.gold:
    sets.setdefault(tuple(g), len(sets))
  return sets


def labels_of(qs: QuerySet, sets: dict[tuple[int, ...], int]) -> Labels:
  """Padded gold tools and set-head rows of a split (see :class:`Labels`)."""
  width = max(len(g) for g in qs.gold)
  gold = batches.pad_sets(qs.gold, width)
  mask = np.arange(width)[None, :] < np.array([len(g) for g in qs.gold])[:, None]
  set_id = np.array([sets.get(tuple(g), -1) for g in qs.gold], np.int32)
  return Labels(gold, mask, set_id)


def init_heads(tool_embeddings: np.ndarray, sets: dict[tuple[int, ...], int],
               with_sets: bool) -> dict[str, jax.Array]:
  """``{"tools": f32[N, d], "sets": f32[S, d]}`` (``sets`` only ``with_sets``).

  Rows are unit vectors: a tool's frozen embedding, a set's normalised mean of its members'.
  """
  unit = lambda x: x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
  heads = {"tools": jnp.asarray(unit(np.asarray(tool_embeddings, np.float32)))}
  if with_sets:
    members = [None] * len(sets)
    for s, i in sets.items():
      members[i] = np.asarray(tool_embeddings, np.float32)[list(s)].mean(axis=0)
    heads["sets"] = jnp.asarray(unit(np.stack(members)))
  return heads


def label_loss(heads: dict[str, jax.Array], query: jax.Array, gold: jax.Array,
               gold_mask: jax.Array, set_id: jax.Array, *, temperature: float,
               set_weight: float) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The two heads' cross-entropies.

  Args:
    heads: :func:`init_heads`' pytree (trained).
    query: f32[B, d] encoder outputs r(x).
    gold, gold_mask: int32[B, G], bool[B, G] the gold tools.
    set_id: int32[B] set-head rows; −1 (not a training set) contributes no set loss.
    temperature: τ of both softmaxes.
    set_weight: the set term's weight (the tool term's is 1).

  Returns:
    (loss f32[], {"tool_loss", "set_loss"} f32[]).
  """
  log_p = jax.nn.log_softmax(query @ heads["tools"].T / temperature, axis=-1)  # [B, N]
  picked = jnp.take_along_axis(log_p, gold, axis=1)                           # [B, G]
  per_query = -(picked * gold_mask).sum(-1) / jnp.maximum(gold_mask.sum(-1), 1)
  tool_loss = per_query.mean()
  parts = {"tool_loss": tool_loss}
  loss = tool_loss
  if "sets" in heads:
    log_s = jax.nn.log_softmax(query @ heads["sets"].T / temperature, axis=-1)  # [B, S]
    known = set_id >= 0
    nll = -jnp.take_along_axis(log_s, jnp.maximum(set_id, 0)[:, None], axis=1)[:, 0]
    set_loss = jnp.where(known, nll, 0.0).sum() / jnp.maximum(known.sum(), 1)
    parts["set_loss"] = set_loss
    loss = loss + set_weight * set_loss
  return loss, parts


class LabelState(NamedTuple):
  """params: ``{"encoder": the trainable pytree, "heads": init_heads' pytree}``."""
  params: dict[str, Any]
  opt_state: Any


def make_optimizer(tune: EncoderTuneConfig, steps: int) -> optax.GradientTransformation:
  """The encoder's AdamW (:func:`hyset_jax.training.finetune.encoder_optimizer`) and Adam for the
  heads at ``tune.head_learning_rate``, both warmed up and cosine-decayed over ``steps``."""
  heads = optax.adam(optax.warmup_cosine_decay_schedule(
      0.0, tune.head_learning_rate, min(tune.warmup_steps, max(1, steps - 1)), max(steps, 2),
      end_value=0.05 * tune.head_learning_rate))
  return optax.multi_transform({"encoder": encoder_optimizer(tune, steps), "heads": heads},
                               {"encoder": "encoder", "heads": "heads"})


def label_step(state: LabelState, frozen, text: dict[str, jax.Array], labels: Labels, *, spec,
               temperature: float, set_weight: float, optimizer: optax.GradientTransformation
               ) -> tuple[LabelState, dict[str, jax.Array]]:
  """One update of the encoder and the heads on a batch: ``text`` is the encoder's input
  (:func:`hyset_jax.encoder.tuning.forward`), ``labels`` the batch's rows of :class:`Labels`."""
  from hyset_jax.encoder import tuning

  def loss_fn(params):
    query = tuning.forward(spec, frozen, params["encoder"], text)
    return label_loss(params["heads"], query, labels.gold, labels.gold_mask, labels.set_id,
                      temperature=temperature, set_weight=set_weight)

  (loss, parts), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  parts = dict(parts, loss=loss, grad_norm_encoder=optax.tree.norm(grads["encoder"]))
  return LabelState(optax.apply_updates(state.params, updates), opt_state), parts


def head_metrics(heads: dict[str, jax.Array], query: np.ndarray, labels: Labels, *,
                 temperature: float, set_weight: float) -> dict[str, float]:
  """A split's loss, the tool head's Recall@5 and the set head's exact-set rate (queries whose
  gold set is not a training set count as misses)."""
  loss, parts = label_loss(heads, jnp.asarray(query), labels.gold, labels.gold_mask,
                           labels.set_id, temperature=temperature, set_weight=set_weight)
  scores = np.asarray(jnp.asarray(query) @ heads["tools"].T)
  top5 = np.argsort(-scores, axis=1, kind="stable")[:, :5]
  hits = (labels.gold[:, :, None] == top5[:, None, :]).any(-1) & labels.gold_mask
  out = {"loss": float(loss), "tool_loss": float(parts["tool_loss"]),
         "tool_recall@5": float(np.mean(hits.sum(1) / labels.gold_mask.sum(1)))}
  if "sets" in heads:
    best = np.asarray(jnp.argmax(jnp.asarray(query) @ heads["sets"].T, axis=1))
    out["set_loss"] = float(parts["set_loss"])
    out["set_exact"] = float(np.mean((best == labels.set_id) & (labels.set_id >= 0)))
  return out


def host_copy(tree: Any) -> Any:
  """A pytree's arrays copied to host memory. Not ``np.asarray``: that may view the device
  buffer, which the next (donating) step overwrites."""
  return jax.tree.map(lambda a: np.array(a, copy=True), tree)


def validate(tune: EncoderTuneConfig, config: config_lib.Config) -> None:
  """Checks the label objective adds to :func:`hyset_jax.training.finetune.validate_tune`."""
  from hyset_jax.training.finetune import validate_tune
  validate_tune(tune, config)
  if tune.mode == "frozen":
    raise UserError("mode 'frozen' trains no encoder; the label objective needs top_layers, "
                    "lora or full")
  if not tune.temperature > 0 or not tune.head_learning_rate > 0:
    raise UserError("tune.temperature and tune.head_learning_rate must be > 0")
  if tune.set_weight < 0:
    raise UserError(f"tune.set_weight must be ≥ 0, got {tune.set_weight}")
  if config.train.num_steps < 1 or config.train.batch_size < 1:
    raise UserError("train.num_steps and train.batch_size must be ≥ 1")


def _plot(rows: list[dict], evals: list[dict], path: pathlib.Path) -> None:
  """Training loss and the validation numbers against step, as a PNG."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  from hyset_jax.training.curves import save_png
  fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
  ax[0].plot([r["step"] for r in rows], [r["loss"] for r in rows])
  ax[0].plot([e["step"] for e in evals], [e["loss"] for e in evals], marker="o",
             label="validation")
  ax[0].set(xlabel="step", ylabel="loss", title="label loss (tool + set heads)")
  ax[0].legend()
  for key in ("tool_recall@5", "set_exact"):
    if all(key in e for e in evals):
      ax[1].plot([e["step"] for e in evals], [e[key] for e in evals], marker="o", label=key)
  ax[1].set(xlabel="step", ylabel="validation", ylim=(0, 1), title="validation (heads)")
  ax[1].legend()
  save_png(fig, path)


class _EncoderSide(NamedTuple):
  """The encoder being tuned: the loaded encoder, :func:`tuning.split_encoder`'s parts
  (params: the trainable pytree before any step) and the "train" and "validation" texts as
  :class:`TextTable`s."""
  encoder: Any
  spec: Any
  frozen: Any
  params: Any
  tables: dict[str, Any]


class _Tuned(NamedTuple):
  """The training loop's result: the evaluations (step 0 first), the step and host copy of
  the encoder with the lowest validation loss, per-step training rows and seconds, and the
  loop's wall time in seconds."""
  evals: list[dict[str, float]]
  best_step: int
  best_encoder: Any
  rows: list[dict]
  step_seconds: list[float]
  seconds: float


def tune_on_labels(config: config_lib.Config, tune: EncoderTuneConfig, out: str | pathlib.Path,
                   *, data: TrainingData | None = None, force: bool = False,
                   progress: bool = True) -> dict[str, Any]:
  """Tunes the query encoder on the training labels for ``config.train.num_steps`` steps of
  ``config.train.batch_size`` queries, keeping the encoder of the evaluation (every
  ``config.train.eval_every`` steps and the last) with the lowest validation loss; a log line
  every ``config.train.log_every`` steps.

  Args:
    config: data, model (``model.encoder``: the encoder to start from) and ``train``'s
      ``num_steps``, ``batch_size``, ``eval_every``, ``log_every``, ``seed``.
    tune: the encoder's side (mode, layers, learning rates, τ, set weight).
    out: output directory (module docstring).
    data: already prepared data (default: ``prepare_data(config)``).

  Returns:
    The summary written to ``label_tuning.json``.
  """
  from hyset_jax.io_utils import output_dir

  config_lib.validate(config)
  validate(tune, config)
  output_dir(out, force, marker=MARKER, what="label-tuning output")  # before any work
  data = data or prepare_data(config)
  names = {"train": config.data.train_split, "validation": config.data.val_split}
  missing = [n for n in names.values() if n not in data.splits]
  if missing:
    raise UserError(f"{config.data.spec}: no {' or '.join(missing)} split to tune on")
  train_qs, val_qs = (data.splits[names[k]] for k in ("train", "validation"))

  t0 = time.perf_counter()
  side = _encoder_side(config, tune, train_qs, val_qs, progress)
  t_cache = time.perf_counter() - t0
  sets = training_sets(train_qs)
  tuned = _train(side, tune, config.train, data.tool_embeddings, sets,
                 labels_of(train_qs, sets), labels_of(val_qs, sets), progress)
  summary = _summary(config, tune, side, sets, train_qs, val_qs, tuned, t_cache)
  _write(out, force, side, tuned, summary)
  return summary


def _encoder_side(config: config_lib.Config, tune: EncoderTuneConfig, train_qs: QuerySet,
                  val_qs: QuerySet, progress: bool) -> _EncoderSide:
  """Loads and splits ``model.encoder`` and tokenizes the training and validation texts
  (with the lower blocks' states cached when only top blocks train).

  Raises:
    UserError: the encoder has fewer blocks than ``tune.n_layers``.
  """
  from hyset_jax.encoder import layer_cache, load_encoder, tuning
  encoder = load_encoder(config.model.encoder or None)
  if tune.mode == "top_layers" and tune.n_layers > encoder.config.num_hidden_layers:
    raise UserError(f"tune.n_layers = {tune.n_layers}, but {encoder.name} has "
                    f"{encoder.config.num_hidden_layers} blocks; use mode=full to train all")
  spec, frozen, enc_params = tuning.split_encoder(
      encoder, tune.mode, n_layers=tune.n_layers, lora_rank=tune.lora_rank,
      lora_alpha=tune.lora_alpha, seed=config.train.seed)
  tables = {}
  for key, qs in (("train", train_qs), ("validation", val_qs)):
    table = layer_cache.tokenize_table(encoder, qs.texts)
    if spec.from_hidden:
      log.info("caching block-%d inputs of %d %s texts", spec.start_layer, len(qs.texts), key)
      table = layer_cache.with_lower_states(table, encoder, qs.texts, spec.start_layer,
                                            tune.cache_batch_size, progress=progress)
    tables[key] = table
  return _EncoderSide(encoder, spec, frozen, enc_params, tables)


def _train(side: _EncoderSide, tune: EncoderTuneConfig, tc: config_lib.TrainConfig,
           tool_embeddings: np.ndarray, sets: dict[tuple[int, ...], int], train_labels: Labels,
           val_labels: Labels, progress: bool) -> _Tuned:
  """``tc.num_steps`` label steps from the encoder's starting weights and fresh heads,
  evaluated on validation at step 0, every ``tc.eval_every`` steps and the last. Returns
  the evaluations, the encoder with the lowest validation loss and the loop's timings.

  Raises:
    UserError: a non-finite loss.
  """
  optimizer = make_optimizer(tune, tc.num_steps)
  params = {"encoder": side.params,
            "heads": init_heads(tool_embeddings, sets, tune.set_weight > 0)}
  state = LabelState(params, optimizer.init(params))
  step_fn = jax.jit(functools.partial(label_step, spec=side.spec, temperature=tune.temperature,
                                      set_weight=tune.set_weight, optimizer=optimizer),
                    donate_argnums=(0,))
  evaluate = functools.partial(_validation, side=side, tune=tune, labels=val_labels)
  evals = [evaluate(state, 0)]
  log.info("step 0 validation: %s", evals[0])
  best = (evals[0]["loss"], 0, host_copy(state.params["encoder"]))
  rows, step_seconds = [], []
  n = len(train_labels.set_id)
  bar = None
  if progress:
    from tqdm import tqdm
    bar = tqdm(total=tc.num_steps, desc=f"label tuning ({tune.mode})", unit="step")
  t_loop = time.perf_counter()
  for step in range(1, tc.num_steps + 1):
    t_step = time.perf_counter()
    idx = np.sort(batches.batch_indices(tc.seed, step - 1, tc.batch_size, n))
    batch_labels = Labels(*(a[idx] for a in train_labels))
    state, parts = step_fn(state, side.frozen, side.tables["train"].batch(idx), batch_labels)
    loss = float(parts["loss"])
    if not math.isfinite(loss):
      raise UserError(f"non-finite label-tuning loss ({loss}) at step {step}; lower "
                      f"tune.learning_rate")
    step_seconds.append(time.perf_counter() - t_step)
    rows.append({"step": step, "loss": loss})
    if bar is not None:
      bar.update(1)
      bar.set_postfix(loss=f"{loss:.4f}")
    if step % tc.log_every == 0:
      log.info("step %d/%d: training loss %.4f (%.2f s/step)", step, tc.num_steps,
               float(np.mean([r["loss"] for r in rows[-tc.log_every:]])),
               float(np.median(step_seconds[-tc.log_every:])))
    if step % tc.eval_every == 0 or step == tc.num_steps:
      evals.append(evaluate(state, step))
      log.info("step %d: training loss %.4f, validation %s", step, loss, evals[-1])
      if evals[-1]["loss"] < best[0]:
        best = (evals[-1]["loss"], step, host_copy(state.params["encoder"]))
  if bar is not None:
    bar.close()
  return _Tuned(evals, best[1], best[2], rows, step_seconds, time.perf_counter() - t_loop)


def _validation(state: LabelState, step: int, *, side: _EncoderSide, tune: EncoderTuneConfig,
                labels: Labels) -> dict[str, float]:
  """The heads' validation metrics (:func:`head_metrics`) at ``state``, with ``step``."""
  from hyset_jax.training.finetune import _embed_table
  query = _embed_table(side.spec, side.frozen, state.params["encoder"], side.tables["validation"],
                       tune.cache_batch_size)
  return dict(head_metrics(state.params["heads"], query, labels, temperature=tune.temperature,
                           set_weight=tune.set_weight), step=step)


def _summary(config: config_lib.Config, tune: EncoderTuneConfig, side: _EncoderSide,
             sets: dict[tuple[int, ...], int], train_qs: QuerySet, val_qs: QuerySet,
             tuned: _Tuned, t_cache: float) -> dict[str, Any]:
  """The run's ``label_tuning.json`` content."""
  from hyset_jax.encoder import tuning
  tc, n = config.train, len(train_qs.ids)
  return {
      "objective": "labels",
      "mode": tune.mode,
      "encoder_source": side.encoder.name,
      "steps": tc.num_steps,
      "batch_size": tc.batch_size,
      "epochs": round(tc.num_steps * tc.batch_size / n, 3),
      "train_queries": n,
      "validation_queries": len(val_qs.ids),
      "training_sets": len(sets),
      "encoder_trainable_params": tuning.count_params(side.params),
      "best_step": tuned.best_step,
      "validation": tuned.evals,
      "timing": {"cache_s": round(t_cache, 2), "train_s": round(tuned.seconds, 2),
                 "median_step_s": round(float(np.median(tuned.step_seconds)), 4)},
      "tune": dataclasses.asdict(tune),
      "config": config.to_dict(),
  }


def _write(out: str | pathlib.Path, force: bool, side: _EncoderSide, tuned: _Tuned,
           summary: dict[str, Any]) -> None:
  """Writes the out directory (module docstring) atomically, with the best encoder."""
  from hyset_jax.encoder import tuning
  from hyset_jax.encoder.st_export import save_sentence_transformer
  from hyset_jax.io_utils import atomic_dir, atomic_write
  tuned_model = tuning.merged_model(side.spec, side.frozen,
                                    jax.tree.map(jnp.asarray, tuned.best_encoder))
  with atomic_dir(out, force, marker=MARKER, what="label-tuning output") as tmp:
    save_sentence_transformer(tuned_model, side.encoder, tmp / "encoder", force=True)
    _plot(tuned.rows, tuned.evals, tmp / "curves.png")
    with atomic_write(tmp / MARKER) as f:
      f.write(json.dumps(summary, indent=1) + "\n")
