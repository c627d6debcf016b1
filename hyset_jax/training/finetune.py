"""Joint training of θ and the query encoder: ``finetune(config, tune, out)``.

The query embedding r(x) of the HYSET score comes from a trainable encoder
(:mod:`hyset_jax.encoder.tuning`: its top n blocks, LoRA adapters, or all of it) instead of
the frozen cache, and the HYSET objective (``losses.total_loss`` over
``scoring.set_scores`` on candidate pools from ``batches.make_batch``, plus the optional
per-tool loss) trains both. θ keeps the main config's optimiser (``train.make_optimizer``);
the encoder gets its own AdamW with its own learning rate, through ``optax.multi_transform``.

Tool side: only the query tower is fine-tuned. The tool embeddings Z are already free
parameters of θ (initialised from the frozen encoder, trained when
``model.train_tool_embeddings``), so encoding the tool texts with the trainable encoder
would add no capacity for the tools training sees, and would cost the whole library
(ToolLens: 464 texts, more than a batch of queries) through the encoder at every step.

Mode ``frozen`` runs the same loop without an encoder — the control that tells the effect
of fine-tuning from the effect of the extra θ steps.

Negatives that need the current query embedding (shortlist negatives) use each training
query's embedding from the last step it was in (the frozen one before that): the step
returns them for free, and a pool is only a sample of negatives, so a stale vector changes
which negatives are drawn, never the loss of a drawn pool.

Out directory::

  encoder/        the fine-tuned encoder, a sentence-transformers directory (not for frozen)
  model/          θ after the last step, a model directory whose query_encoder is
                  encoder/ (absolute path), so ``hyset predict --model out/model`` uses it
  metrics.json    validation/test metrics before and after, step timings, the configs
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import pathlib
import time
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from hyset_jax.model import parameters
from hyset_jax.training import batches, train, warm_start, workdir
from hyset_jax import config as config_lib
from hyset_jax.errors import UserError
from hyset_jax.evaluation.evaluator import evaluate_split
from hyset_jax.training.train_data import QuerySet, TrainingData, prepare_data

log = logging.getLogger("hyset_jax.training.finetune")

TUNE_MODES = ("frozen", "top_layers", "lora", "full")


@dataclasses.dataclass(frozen=True)
class EncoderTuneConfig:
  """How the query encoder trains beside θ (the main config's ``train`` section drives θ,
  the batch size and the step count).

  Attributes:
    mode: ``frozen`` (θ only: the control), ``top_layers``, ``lora`` or ``full``.
    n_layers: trainable top blocks for ``top_layers`` (MiniLM has 6).
    lora_rank, lora_alpha: r and α for ``lora`` (the update is scaled by α / r).
    learning_rate: the encoder's peak learning rate (θ keeps ``train.learning_rate``).
    warmup_steps: linear warm-up of the encoder's rate, then cosine decay to 5%.
    weight_decay: AdamW decay of the encoder's trainable weights (0 for LoRA factors is
      common; decay pulls ``A B`` toward 0, i.e. toward the frozen encoder).
    max_grad_norm: clip of the encoder's gradient (θ clips its own at 1.0).
    cache_batch_size: rows per forward when building caches and embedding eval splits.
    temperature, set_weight, head_learning_rate: the label objective's softmax temperature,
      set-head weight (0: tool head only) and heads' learning rate (:mod:`hyset_jax.training.label_tuning`).
  """
  mode: Literal["frozen", "top_layers", "lora", "full"] = "top_layers"
  n_layers: int = 2
  lora_rank: int = 8
  lora_alpha: float = 16.0
  learning_rate: float = 5e-5
  warmup_steps: int = 20
  weight_decay: float = 0.01
  max_grad_norm: float = 1.0
  cache_batch_size: int = 64
  temperature: float = 0.05
  set_weight: float = 1.0
  head_learning_rate: float = 1e-3


def validate_tune(tune: EncoderTuneConfig, config: config_lib.Config) -> None:
  """Cross-checks before any data is read; UserError naming the field at fault."""
  if tune.mode not in TUNE_MODES:
    raise UserError(f"tune.mode must be one of {', '.join(TUNE_MODES)}, got {tune.mode!r}")
  for name in ("n_layers", "lora_rank", "cache_batch_size"):
    if getattr(tune, name) < 1:
      raise UserError(f"tune.{name} must be ≥ 1, got {getattr(tune, name)}")
  if tune.learning_rate <= 0 or tune.lora_alpha <= 0 or tune.max_grad_norm <= 0:
    raise UserError("tune.learning_rate, tune.lora_alpha and tune.max_grad_norm must be > 0")
  if tune.weight_decay < 0 or tune.warmup_steps < 0:
    raise UserError("tune.weight_decay and tune.warmup_steps must be ≥ 0")
  if config.train.eta > 0:
    raise UserError("train.eta > 0 (L_self with rewards) is not supported by encoder "
                    "fine-tuning; set train.eta=0")
  if config.train.query_noise:
    # The tuned encoder produces the query vectors here; noise on cached ones would be unused.
    raise UserError("train.query_noise is a setting of hyset train over fixed query vectors, "
                    "not of encoder fine-tuning; drop it here and pass it to the hyset train "
                    "that follows")


# --------------------------------------------------------------------------- the step

class JointState(NamedTuple):
  """params: ``{"theta": θ's trained leaves (parameters.init_theta), "encoder": the encoder's
  trainable pytree or None}``; opt_state: the multi-transform state."""
  params: dict[str, Any]
  opt_state: Any


def encoder_optimizer(tune: EncoderTuneConfig, steps: int) -> optax.GradientTransformation:
  """The encoder's: clip, AdamW, linear warm-up then cosine decay to 5% of its rate."""
  schedule = optax.warmup_cosine_decay_schedule(
      0.0, tune.learning_rate, min(tune.warmup_steps, max(1, steps - 1)), max(steps, 2),
      end_value=0.05 * tune.learning_rate)
  return optax.chain(optax.clip_by_global_norm(tune.max_grad_norm),
                     optax.adamw(schedule, weight_decay=tune.weight_decay))


def make_optimizer(config: config_lib.Config, tune: EncoderTuneConfig
                   ) -> optax.GradientTransformation:
  """θ: ``train.make_optimizer``; encoder: :func:`encoder_optimizer`."""
  encoder = encoder_optimizer(tune, config.train.num_steps)
  return optax.multi_transform({"theta": train.make_optimizer(config.train), "encoder": encoder},
                               {"theta": "theta", "encoder": "encoder"})


def encoder_queries(spec, frozen, encoder_params, batch: dict[str, jax.Array]) -> jax.Array:
  """r(x): the trainable encoder's output, or the frozen ``batch["query"]`` without one.

  Returns f32[B, d_r].
  """
  if spec is None:
    return batch["query"]
  from hyset_jax.encoder import tuning
  return tuning.forward(spec, frozen, encoder_params, batch["text"])


def joint_loss(params: dict[str, Any], frozen, batch: dict[str, Any], *, spec,
               mc: config_lib.ModelConfig, tc: config_lib.TrainConfig
               ) -> tuple[jax.Array, tuple[dict[str, jax.Array], jax.Array]]:
  """``train.objective`` (Eq. 10 with η = 0, plus μ · the per-tool loss) with r(x)
  from the encoder.

  batch: ``members`` int32[B, K_neg, M], ``mask`` bool[B, K_neg, M] (gold at pool position
  0), ``shortlist`` int32[B, K_pool] (for the exhaustive-shortlist loss), and ``text`` (the
  encoder's input, see :func:`hyset_jax.encoder.tuning.forward`) or ``query`` f32[B, d_r].

  Returns:
    (loss f32[], (its parts, the query vectors f32[B, d_r] for the negative sampler)).
  """
  query = encoder_queries(spec, frozen, params["encoder"], batch)
  b = query.shape[0]
  # No Ê here: selected and ρ are 0, so L_self vanishes (rewards are refused in finetune).
  loss, parts = train.objective(params["theta"], query, batch["members"], batch["mask"],
                                jnp.zeros(b, jnp.int32), jnp.zeros(b, jnp.float32),
                                batch.get("shortlist"), mc=mc, tc=tc)
  return loss, (parts, jax.lax.stop_gradient(query))


def joint_step(state: JointState, frozen, batch: dict[str, Any], *, spec,
               mc: config_lib.ModelConfig, tc: config_lib.TrainConfig,
               optimizer: optax.GradientTransformation
               ) -> tuple[JointState, dict[str, jax.Array], jax.Array]:
  """One update of θ and the encoder: ``(state, frozen, batch) -> (state, parts, query)``.

  ``frozen`` (the encoder's frozen ``nnx.State``) is an argument, not a closure, so its
  weights are not baked into the executable; it is never differentiated.
  """
  (_, (parts, query)), grads = jax.value_and_grad(joint_loss, has_aux=True)(
      state.params, frozen, batch, spec=spec, mc=mc, tc=tc)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  params = dict(params, theta=parameters.constrain(params["theta"]))
  parts["grad_norm_theta"] = optax.tree.norm(grads["theta"])
  if grads["encoder"] is not None:
    parts["grad_norm_encoder"] = optax.tree.norm(grads["encoder"])
  return JointState(params, opt_state), parts, query


# --------------------------------------------------------------------------- the run

def _embed_table(spec, frozen, encoder_params, table, batch_size: int) -> np.ndarray:
  """The tuned encoder over every row of a :class:`TextTable`: f32[n, d_r].

  Rows go longest first in batches padded to a fixed row count, so only a handful of
  (rows, bucket) shapes compile.
  """
  fn = _jit_forward(spec)
  order = np.argsort(-table.lengths, kind="stable")
  out = None
  for start in range(0, len(order), batch_size):
    rows = order[start:start + batch_size]
    padded = np.concatenate([rows, np.full(batch_size - len(rows), rows[-1])])
    vectors = np.asarray(fn(frozen, encoder_params, table.batch(padded)))[:len(rows)]
    if out is None:
      out = np.zeros((len(table), vectors.shape[1]), np.float32)
    out[rows] = vectors
  return out


@functools.lru_cache(maxsize=8)
def _jit_forward(spec):
  """:func:`tuning.forward` jitted once per spec (specs are hashable)."""
  from hyset_jax.encoder import tuning
  return jax.jit(functools.partial(tuning.forward, spec))


class _EncoderSide(NamedTuple):
  """The trainable query encoder of a run; all None (and no tables) for mode ``frozen``.

  encoder: the loaded encoder; spec, frozen, params: :func:`tuning.split_encoder`'s parts
  (params: the trainable pytree before any step); tables: per split role ("train",
  "validation", "test"), its texts as a :class:`TextTable`.
  """
  encoder: Any
  spec: Any
  frozen: Any
  params: Any
  tables: dict[str, Any]


class _Run(NamedTuple):
  """What the steps of one :func:`finetune` call read: the configs, the data, the split names
  by role (only the roles the data has), the training queries and the encoder side."""
  config: config_lib.Config
  tune: EncoderTuneConfig
  data: TrainingData
  splits: dict[str, str]
  train_qs: QuerySet
  side: _EncoderSide


class _Trained(NamedTuple):
  """The training loop's result: the final state, each step's seconds and loss, and the
  loop's wall time in seconds."""
  state: JointState
  step_seconds: list[float]
  losses: list[float]
  seconds: float


def finetune(config: config_lib.Config, tune: EncoderTuneConfig, out: str | pathlib.Path, *,
             data: TrainingData | None = None, init_model: str | pathlib.Path | None = None,
             force: bool = False, progress: bool = True, export: bool = True) -> dict[str, Any]:
  """Trains θ and the query encoder jointly for ``config.train.num_steps`` steps.

  Args:
    config: the main config (data, model, θ's training); validated here.
    tune: the encoder's side.
    out: the output directory (see the module docstring); refused if it exists and is not
      empty, unless ``force``.
    data: already prepared data (default: ``train_data.prepare_data(config)``).
    init_model: start θ from this model directory instead of the dense start
      (:func:`warm_start.theta_from_model`: carried onto the data set's tools).
    progress: show progress bars.
    export: write encoder/ and model/ (tests of the loop alone skip it).

  Returns:
    The summary written to ``metrics.json``: ``before``/``after`` metrics per split
    (``validation``/``test`` names from the config), ``timing`` (seconds: cache building,
    median step, total), the trainable parameter count and the configs.
  """
  from hyset_jax.encoder import tuning
  from hyset_jax.io_utils import atomic_write, check_target, ensure_writable_dir

  config_lib.validate(config)
  validate_tune(tune, config)
  out = check_target(pathlib.Path(out), force)
  ensure_writable_dir(out, "output folder")  # before the run: a finished run must not fail here
  data = data or prepare_data(config)
  splits = {"train": config.data.train_split, "validation": config.data.val_split,
            "test": config.data.test_split}
  splits = {k: v for k, v in splits.items() if v in data.splits}
  train_qs = data.splits[splits["train"]]

  t_start = time.perf_counter()
  side = _encoder_side(tune, config.model, data, splits, config.train.seed, progress)
  t_cache = time.perf_counter() - t_start
  run = _Run(config, tune, data, splits, train_qs, side)

  theta = _initial_theta(run, init_model)
  # Step 0: every mode starts as the frozen encoder (LoRA's B = 0), so the frozen vectors
  # give the "before" numbers (tests/test_encoder_tuning.py checks the equality).
  before = _evaluate(run, theta, None)
  # Counted before the loop: the first step donates these buffers.
  n_encoder_params = tuning.count_params(side.params) if side.params is not None else 0
  trained = _train_loop(run, theta, progress)
  after = _evaluate(run, trained.state.params["theta"], trained.state.params["encoder"])
  summary = _summary(run, init_model, n_encoder_params, before, after, trained, t_cache)
  if export:
    _export(run, trained.state, out)
  with atomic_write(out / "metrics.json") as f:
    f.write(json.dumps(summary, indent=1) + "\n")
  return summary


def _encoder_side(tune: EncoderTuneConfig, mc: config_lib.ModelConfig, data: TrainingData,
                  splits: dict[str, str], seed: int, progress: bool) -> _EncoderSide:
  """Loads and splits the encoder and tokenizes every split (with the lower blocks' states
  cached when only top blocks train). Returns the run's :class:`_EncoderSide`.

  Raises:
    UserError: the encoder is not the one the data was encoded with, or has fewer blocks
      than ``tune.n_layers``.
  """
  if tune.mode == "frozen":
    return _EncoderSide(None, None, None, None, {})
  from hyset_jax.encoder import encoder_reference, layer_cache, load_encoder, tuning
  encoder = load_encoder(mc.encoder or None)
  if encoder_reference(mc.encoder or None) != data.query_encoder:
    raise UserError(f"the prepared data was encoded with {data.query_encoder!r}, but "
                    f"model.encoder loads {encoder_reference(mc.encoder or None)!r}")
  layers = encoder.config.num_hidden_layers
  if tune.mode == "top_layers" and tune.n_layers > layers:
    raise UserError(f"tune.n_layers = {tune.n_layers}, but {encoder.name} has {layers} "
                    f"blocks; use mode=full to train all of them")
  spec, frozen, enc_params = tuning.split_encoder(
      encoder, tune.mode, n_layers=tune.n_layers, lora_rank=tune.lora_rank,
      lora_alpha=tune.lora_alpha, seed=seed)
  tables: dict[str, Any] = {}
  for key, name in splits.items():
    texts = data.splits[name].texts
    table = layer_cache.tokenize_table(encoder, texts)
    if spec.from_hidden:
      log.info("caching block-%d inputs of %d %s texts", spec.start_layer, len(texts), name)
      table = layer_cache.with_lower_states(table, encoder, texts, spec.start_layer,
                                            tune.cache_batch_size, progress=progress)
    tables[key] = table
  return _EncoderSide(encoder, spec, frozen, enc_params, tables)


def _initial_theta(run: _Run, init_model: str | pathlib.Path | None) -> dict[str, jax.Array]:
  """θ's starting leaves: those of ``init_model``, or the dense start."""
  mc, data = run.config.model, run.data
  if init_model is not None:
    return warm_start.theta_from_model(init_model, data, mc)
  return parameters.init_theta(data.tool_embeddings, run.train_qs.embeddings.shape[1], mc,
                               run.config.train.seed)


def _evaluate(run: _Run, theta, encoder_params) -> dict[str, dict[str, float]]:
  """Metrics per split role ("validation", "test": those the data has) of θ, with queries
  embedded by the encoder at ``encoder_params`` (None: the frozen vectors)."""
  mc, side = run.config.model, run.side
  hp = parameters.materialize(theta, mc)
  result = {}
  for key in ("validation", "test"):
    if key not in run.splits:
      continue
    qs = run.data.splits[run.splits[key]]
    if side.spec is not None and encoder_params is not None:
      qs = dataclasses.replace(qs, embeddings=_embed_table(side.spec, side.frozen,
                                                           encoder_params, side.tables[key],
                                                           run.tune.cache_batch_size))
    result[key] = evaluate_split(hp, qs, run.data.tool_ids, mc, run.config.train.eval_batch_size)
  return result


def _train_loop(run: _Run, theta: dict[str, jax.Array], progress: bool) -> _Trained:
  """``train.num_steps`` joint steps from θ and the encoder's starting weights.

  Returns the final state, the per-step seconds and losses, and the loop's wall time.

  Raises:
    UserError: a non-finite loss.
  """
  tc, mc, side = run.config.train, run.config.model, run.side
  optimizer = make_optimizer(run.config, run.tune)
  params = {"theta": theta, "encoder": side.params}
  state = JointState(params, optimizer.init(params))
  step_fn = jax.jit(functools.partial(joint_step, spec=side.spec, mc=mc, tc=tc,
                                      optimizer=optimizer), donate_argnums=(0,))
  current = np.array(run.train_qs.embeddings, np.float32)  # last seen r(x) per training query
  step_seconds, losses_seen = [], []
  bar = None
  if progress:
    from tqdm import tqdm
    bar = tqdm(total=tc.num_steps, desc=f"finetune {run.tune.mode}", unit="step")
  t_loop = time.perf_counter()
  for step in range(tc.num_steps):
    t0 = time.perf_counter()
    idx, batch = _joint_batch(run, state, current, step)
    state, parts, query = step_fn(state, side.frozen, batch)
    loss = float(parts["loss"])
    if not math.isfinite(loss):
      raise UserError(f"non-finite training loss ({loss}) at step {step + 1}; lower "
                      f"tune.learning_rate or train.learning_rate")
    current[idx] = np.asarray(query)
    step_seconds.append(time.perf_counter() - t0)
    losses_seen.append(loss)
    if bar is not None:
      bar.update(1)
      bar.set_postfix(loss=f"{loss:.4f}")
  if bar is not None:
    bar.close()
  return _Trained(state, step_seconds, losses_seen, time.perf_counter() - t_loop)


def _joint_batch(run: _Run, state: JointState, current: np.ndarray, step: int
                 ) -> tuple[np.ndarray, dict[str, Any]]:
  """Step ``step``'s batch for :func:`joint_step`; ``current``: the last-seen r(x) per
  training query. Returns (the batch's training-query rows, the batch)."""
  tc, mc, side = run.config.train, run.config.model, run.side
  train_qs = run.train_qs
  # The training loop's own batch: the same queries, pools and negatives for a step (its
  # shortlist negatives from the last-seen vectors).
  idx = batches.batch_indices(tc.seed, step, tc.batch_size, len(train_qs.ids))
  pooled = batches.make_batch(step, parameters.materialize(state.params["theta"], mc),
                              dataclasses.replace(train_qs, embeddings=current),
                              range(tc.batch_size), num_tools=len(run.data.tool_ids), mc=mc,
                              tc=tc, rewards={})
  batch: dict[str, Any] = {"members": pooled.members, "mask": pooled.mask,
                           "shortlist": pooled.shortlist}
  if side.spec is None:
    batch["query"] = pooled.query
  else:
    batch["text"] = side.tables["train"].batch(idx)
  return idx, batch


def _summary(run: _Run, init_model: str | pathlib.Path | None, n_encoder_params: int,
             before: dict, after: dict, trained: _Trained, t_cache: float) -> dict[str, Any]:
  """The run's ``metrics.json`` content."""
  tc, losses_seen, step_seconds = run.config.train, trained.losses, trained.step_seconds
  # The first steps compile (one executable per length bucket): the median is the cost of a
  # compiled step.
  return {
      "mode": run.tune.mode,
      "steps": tc.num_steps,
      "batch_size": tc.batch_size,
      "train_queries": len(run.train_qs.ids),
      "init_model": str(init_model) if init_model is not None else None,
      "encoder_trainable_params": n_encoder_params,
      "before": before,
      "after": after,
      "loss_first": losses_seen[0] if losses_seen else None,
      "loss_last_10": float(np.mean(losses_seen[-10:])) if losses_seen else None,
      "timing": {"cache_s": round(t_cache, 2), "train_s": round(trained.seconds, 2),
                 "median_step_s": round(float(np.median(step_seconds)), 4)
                 if step_seconds else None},
      "tune": dataclasses.asdict(run.tune),
      "config": run.config.to_dict(),
  }


def _export(run: _Run, state: JointState, out: pathlib.Path) -> None:
  """Writes out/encoder (the tuned encoder, not for mode frozen) and out/model (θ, whose
  query encoder is out/encoder's absolute path, or the data's for mode frozen)."""
  mc, side = run.config.model, run.side
  query_encoder = run.data.query_encoder
  if side.encoder is not None:
    from hyset_jax.encoder import tuning
    from hyset_jax.encoder.st_export import save_sentence_transformer
    tuned = tuning.merged_model(side.spec, side.frozen, state.params["encoder"])
    enc_dir = save_sentence_transformer(tuned, side.encoder, out / "encoder", force=True)
    query_encoder = str(enc_dir.resolve())
  workdir.export_model(parameters.materialize(state.params["theta"], mc), run.data.tool_ids,
                       query_encoder, mc, out / "model", force=True)
