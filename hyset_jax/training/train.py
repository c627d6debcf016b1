"""Training HYSET (paper §2.4, Algorithm 1): ``train_and_evaluate(config, workdir)``.

One ``jax.jit`` step over the named (``data``, ``tools``) ``Mesh`` of ``config.mesh``: the batch
sharded on ``data``; Z and its optimiser state sharded on ``tools``, the rest of θ replicated
(no ``pmap``; see hyset_jax.training.sharding). ``tools = 1`` is plain data parallelism. Several hosts join
through ``jax.distributed``; each process builds the candidate pools of its share of the global
batch, and pools depend only on (seed, step, global row), so results do not depend on the number
of devices or processes. The workdir's layout is in hyset_jax.training.workdir.

Read top to bottom: the train state and step, then the loop's named steps (create the state,
restore it, validate and keep the best, save), then ``train_and_evaluate``.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import pathlib
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from hyset_jax import choices
from hyset_jax import config as config_lib
from hyset_jax.errors import UserError
from hyset_jax.evaluation import evaluator
from hyset_jax.evaluation.evaluator import evaluate_split
from hyset_jax.inference import enumeration, pipeline, subsets
from hyset_jax.model import parameters, scoring
from hyset_jax.training import (batches, checkpoints, curves, losses, post_theta, rewards,
                                sharding, step_cost, warm_start)
from hyset_jax.training import workdir as workdir_lib
from hyset_jax.training.train_data import TrainingData, prepare_data, validation_parts

log = logging.getLogger("hyset_jax.training.train")


class TrainState(NamedTuple):
  theta: dict[str, Any]     # the trained leaves of θ (parameters.init_theta)
  opt_state: Any


@dataclasses.dataclass(frozen=True)
class LoopState:
  """What the loop carries between steps besides θ; checkpointed as JSON beside it."""
  step: int = 0
  best_recall5: float = -1.0
  best_step: int = -1
  stale_evals: int = 0
  rewards: batches.RewardCache = dataclasses.field(default_factory=dict)

  def to_json(self) -> dict:
    return dict(dataclasses.asdict(self),
                rewards={str(k): [list(e), rho] for k, (e, rho) in self.rewards.items()})

  @classmethod
  def from_json(cls, d: dict) -> LoopState:
    return cls(d["step"], d["best_recall5"], d["best_step"], d["stale_evals"],
               {int(k): (tuple(v[0]), float(v[1])) for k, v in d["rewards"].items()})


def make_optimizer(tc: config_lib.TrainConfig) -> optax.GradientTransformation:
  schedule = optax.warmup_cosine_decay_schedule(
      0.0, tc.learning_rate, min(tc.warmup_steps, max(1, tc.num_steps - 1)), tc.num_steps,
      end_value=0.05 * tc.learning_rate)
  return optax.chain(optax.clip_by_global_norm(1.0), optax.adam(schedule))


def shortlist_subset_scores(params: scoring.HysetParams, query: jax.Array,
                            tools: jax.Array) -> jax.Array:
  """F of every subset (1 ≤ |E| ≤ M) of each query's shortlist, differentiable in θ.

  Args:
    params: θ with M − 1 interaction matrices.
    query: f32[B, d_r].
    tools: int32[B, K] the shortlist's tool rows.

  Returns:
    f32[B, C(K, ≤ M)] in the enumeration's table order (under its ℓ reordering).
  """
  logits = jnp.einsum("bd,bkd->bk", scoring.query_vectors(params, query),
                      params.tool_embeddings[tools])
  pairs = scoring.shortlist_pairs(params, query, tools)
  table = subsets.subset_table(tools.shape[1], params.max_set_size)
  # The differentiable JAX form (the native kernel has no gradient).
  return enumeration.score_subsets(logits, pairs, table, choices.PORTABLE_METHOD).scores


def objective(theta: dict[str, Any], query: jax.Array, members: jax.Array, mask: jax.Array,
              selected: jax.Array, reward: jax.Array, shortlist: jax.Array | None = None, *,
              mc: config_lib.ModelConfig,
              tc: config_lib.TrainConfig) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The training loss: L_ret + η L_self + λ Σ‖M_m‖² (Eq. 10) plus μ · the per-tool loss and
  ν · the exhaustive-shortlist loss.

  Args:
    theta: the trained leaves of θ.
    query: f32[B, d_r] query embeddings (frozen, or from a trainable encoder: finetune.py).
    members, mask: int32/bool[B, K_neg, M] candidate pools, the gold set at position 0.
    selected, reward: int32[B] pool position of Ê and f32[B] its ρ (0: no L_self).
    shortlist: int32[B, K_pool] each query's shortlist (needed when ν > 0).

  Returns:
    (loss f32[], its parts).
  """
  if not mc.train_tool_embeddings:
    theta = dict(theta, z=jax.lax.stop_gradient(theta["z"]))
  tool_params = parameters.materialize(theta, mc)
  # The per-tool loss reads Z as trained; the set losses read it frozen when asked to.
  params = tool_params if tc.set_losses_train_z else tool_params._replace(
      tool_embeddings=jax.lax.stop_gradient(tool_params.tool_embeddings))
  scores = scoring.set_scores(params, query, members, mask)                 # [B, K_neg]
  penalty_on = theta.get("m", jnp.zeros((0,), params.tool_embeddings.dtype))
  loss, parts = losses.total_loss(scores, selected, reward, penalty_on, eta=tc.eta,
                                  l2=tc.interaction_l2)
  if tc.tool_loss_weight:
    logits = scoring.query_logits(tool_params, query)
    parts["loss_tool"] = losses.tool_loss(logits, members[:, 0], mask[:, 0])
    loss = loss + tc.tool_loss_weight * parts["loss_tool"]
    parts["loss"] = loss
  if tc.exhaustive_loss_weight:
    gold, gold_mask = members[:, 0], mask[:, 0]
    in_list = jnp.any(gold[:, :, None] == shortlist[:, None, :], axis=-1)     # [B, M]
    parts["loss_enum"] = losses.exhaustive_loss(
        shortlist_subset_scores(params, query, shortlist), scores[:, 0],
        jnp.all(in_list | ~gold_mask, axis=-1))
    loss = loss + tc.exhaustive_loss_weight * parts["loss_enum"]
    parts["loss"] = loss
  parts["pool_acc"] = jnp.mean(jnp.argmax(scores, axis=-1) == 0)  # the gold set is at 0
  return loss, parts


def train_step(state: TrainState, batch: batches.Batch, *, mc: config_lib.ModelConfig,
               tc: config_lib.TrainConfig, optimizer: optax.GradientTransformation,
               shard_grads=lambda g: g) -> tuple[TrainState, dict[str, jax.Array]]:
  """One update on a global batch: ``(state, batch) -> (state, metrics)`` (shapes: Batch).

  ``shard_grads`` places the gradient (make_step_fn: like θ, so Z's lives on ``tools``).
  """
  def loss_fn(theta):
    return objective(theta, batch.query, batch.members, batch.mask, batch.selected,
                     batch.reward, batch.shortlist, mc=mc, tc=tc)

  (_, parts), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.theta)
  grads = shard_grads(grads)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.theta)
  theta = parameters.constrain(optax.apply_updates(state.theta, updates))
  parts["grad_norm"] = optax.tree.norm(grads)
  return TrainState(theta, opt_state), parts


def make_step_fn(mesh: jax.sharding.Mesh, mc: config_lib.ModelConfig,
                 tc: config_lib.TrainConfig, optimizer: optax.GradientTransformation,
                 state_shardings=None):
  """:func:`train_step` jitted over ``mesh``: batch rows sharded on ``data``, the state (and the
  gradient) under ``state_shardings`` (sharding.state_shardings; default: replicated)."""
  replicated, rows = sharding.replicated(mesh), sharding.batch_rows(mesh)
  state_shardings = state_shardings or replicated

  def shard_grads(grads):
    return jax.lax.with_sharding_constraint(grads, sharding.state_shardings(grads, mesh))
  return jax.jit(functools.partial(train_step, mc=mc, tc=tc, optimizer=optimizer,
                                   shard_grads=shard_grads),
                 in_shardings=(state_shardings, rows), out_shardings=(state_shardings, replicated),
                 donate_argnums=(0,))


def training_mesh(config: config_lib.Config, num_devices: int | None = None,
                  devices=None) -> jax.sharding.Mesh:
  """The (data, tools) mesh of ``config.mesh`` over the job's devices."""
  return sharding.make_mesh(num_devices, config.mesh.data, config.mesh.tools, devices=devices)


def init_state(tool_embeddings, query_dim: int, mc, tc, optimizer) -> TrainState:
  """θ at the natural start from f32[N, d_z] tool embeddings, and its optimiser state."""
  theta = parameters.init_theta(tool_embeddings, query_dim, mc, tc.seed)
  return TrainState(theta, optimizer.init(theta))


def abstract_state(num_tools: int, tool_dim: int, query_dim: int, mc, tc, optimizer,
                   mesh: jax.sharding.Mesh) -> TrainState:
  """The train state as ShapeDtypeStructs carrying their shardings (no array is allocated)."""
  init = functools.partial(init_state, query_dim=query_dim, mc=mc, tc=tc, optimizer=optimizer)
  shapes = jax.eval_shape(init, jax.ShapeDtypeStruct((num_tools, tool_dim), jnp.float32))
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes,
                      sharding.state_shardings(shapes, mesh))


def create_train_state(data: TrainingData, query_dim: int, mc, tc, optimizer,
                       mesh: jax.sharding.Mesh) -> TrainState:
  """θ at the natural start (every process from process 0's encoder output), or the model of
  ``tc.init_model`` (:mod:`hyset_jax.training.warm_start`), and a fresh optimiser state, placed
  as :func:`abstract_state` says (Z on ``tools``)."""
  tools = np.asarray(sharding.from_first_process(data.tool_embeddings), np.float32)
  abstract = abstract_state(tools.shape[0], tools.shape[1], query_dim, mc, tc, optimizer, mesh)
  if tc.init_model:
    theta = warm_start.theta_from_model(tc.init_model, data, mc)
    placed = jax.tree.map(lambda a, s: jax.make_array_from_callback(a.shape, s, lambda i: a[i]),
                          theta, jax.tree.map(lambda x: x.sharding, abstract.theta))
    return TrainState(placed, jax.jit(optimizer.init, out_shardings=jax.tree.map(
        lambda x: x.sharding, abstract.opt_state))(placed))
  # Each device receives only its rows of the encoder output (a multi-process job too).
  z_sharding = abstract.theta["z"].sharding
  tools = jax.make_array_from_callback(tools.shape, z_sharding, lambda idx: tools[idx])
  init = functools.partial(init_state, query_dim=query_dim, mc=mc, tc=tc, optimizer=optimizer)
  return jax.jit(init, in_shardings=z_sharding,
                 out_shardings=jax.tree.map(lambda x: x.sharding, abstract))(tools)


def restore_or_keep(mngr, state: TrainState, mesh) -> tuple[TrainState, LoopState]:
  """The newest readable checkpoint onto this run's mesh, or ``state`` at step 0."""
  shardings = jax.tree.map(lambda x: x.sharding, state)
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                          state)
  restored = checkpoints.restore_latest(mngr, abstract)
  if restored is None:
    return state, LoopState()
  log.info("resumed from step %d", restored[1]["step"])
  return jax.device_put(restored[0], shardings), LoopState.from_json(restored[1])


def validate_and_keep_best(state: TrainState, loop: LoopState, done: int, *, data: TrainingData,
                           config: config_lib.Config, workdir: pathlib.Path
                           ) -> tuple[LoopState, dict[str, float]]:
  """Validation metrics at ``done`` steps; best/ and the patience count follow Recall@5 (with
  ``data.validation_sets``: its mean over both validation parts), or, with ``train.keep=last``,
  every evaluation replaces best/ (the last step is always evaluated)."""
  mc = config.model
  params = sharding.to_host(parameters.materialize(state.theta, mc))  # Z may be split over hosts
  # During training "auto" validates with the paper's greedy ranking; the method is chosen once,
  # on the best model, at the end (_finish).
  ranking = pipeline.DEFAULT_RANKING if mc.ranking == "auto" else mc.ranking
  vm = evaluator.evaluate_parts(params, validation_parts(data, config.data), data.tool_ids, mc,
                                config.train.eval_batch_size, (ranking,))[ranking]
  keep = config.train.keep == "last" or vm["recall@5"] > loop.best_recall5
  if sharding.first_process_decides(keep):
    loop = dataclasses.replace(loop, best_recall5=vm["recall@5"], best_step=done, stale_evals=0)
    if jax.process_index() == 0:
      workdir_lib.export_model(params, data.tool_ids, data.query_encoder, mc, workdir / "best",
                               force=True)
  else:
    loop = dataclasses.replace(loop, stale_evals=loop.stale_evals + 1)
  log.info("step %d: val recall@5 %.4f comp@5 %.4f (best %.4f at %d)", done, vm["recall@5"],
           vm["comp@5"], loop.best_recall5, loop.best_step)
  return loop, {f"val_{k}": v for k, v in vm.items()}


def save_checkpoint(mngr, state: TrainState, loop: LoopState) -> None:
  checkpoints.save(mngr, loop.step, state, loop.to_json())


def check_finite(loss: float, step: int, mngr, workdir: pathlib.Path) -> None:
  if not math.isfinite(loss):
    raise UserError(f"non-finite training loss ({loss}) at step {step}; the last good "
                    f"checkpoint is step {mngr.latest_step()} in {workdir / 'checkpoints'}. "
                    f"Lower train.learning_rate or check the inputs")


def train_and_evaluate(config: config_lib.Config, workdir: str | os.PathLike, *,
                       data: TrainingData | None = None, num_devices: int | None = None,
                       progress: bool = True, stop_after: int | None = None) -> dict[str, Any]:
  """Train, evaluate, checkpoint; resume automatically from the workdir.

  Args:
    config: a validated config.
    workdir: where the run lives (hyset_jax.training.workdir).
    data: already prepared data (default: read and encode ``config.data.spec``).
    num_devices: use only the first n devices (tests compare 1 and 8).
    progress: show a progress bar.
    stop_after: stop (with a checkpoint) after this many steps of this invocation — for tests
      of interrupted runs.

  Returns:
    Final summary: steps run, best step, best validation metrics, test metrics.
  """
  config_lib.validate(config)
  sharding.maybe_initialize_distributed()
  workdir = pathlib.Path(workdir).absolute()  # Orbax wants absolute paths
  workdir_lib.check(workdir, config)
  provider = rewards.make_provider(config.rewards.provider, config.rewards.path,
                                   config.rewards.command)
  # The data is read before the workdir is created: bad data leaves nothing behind.
  data = data or prepare_data(config)
  workdir_lib.create(workdir)
  with workdir_lib.lock(workdir):
    return _train(config, workdir, data, provider, num_devices, progress, stop_after)


def _train(config, workdir, data, provider, num_devices, progress, stop_after
           ) -> dict[str, Any]:
  tc, mc = config.train, config.model
  mesh = training_mesh(config, num_devices)
  data_size = sharding.axis_size(mesh, sharding.DATA_AXIS)
  if tc.batch_size % data_size:
    raise UserError(f"train.batch_size = {tc.batch_size} must be a multiple of the mesh's data "
                    f"axis ({data_size} = devices / mesh.tools)")
  workdir_lib.write_config(workdir, config)
  train = data.splits[config.data.train_split]
  sharding.check_tool_rows(len(data.tool_ids), mesh)
  rows_sharding = sharding.batch_rows(mesh)
  local_rows = sharding.process_rows(rows_sharding, tc.batch_size)
  optimizer = make_optimizer(tc)
  mngr = checkpoints.manager(workdir)
  query_dim = train.embeddings.shape[1]
  state = create_train_state(data, query_dim, mc, tc, optimizer, mesh)
  state, loop = restore_or_keep(mngr, state, mesh)
  # Compiled ahead of time, as --dry-run does: the same per-device numbers go to the log and
  # to metrics.jsonl's header, and the loop calls this executable (one compilation).
  step_fn, report = step_cost.compile_step(
      make_step_fn(mesh, mc, tc, optimizer, jax.tree.map(lambda x: x.sharding, state)), state,
      step_cost.abstract_batch(tc, mc, query_dim, mesh), mesh)
  for line in report.lines():
    log.info("%s", line)
  mlog = workdir_lib.MetricsLog(workdir / workdir_lib.METRICS_FILE, loop.step,
                                header={"step": -1, "memory": report.to_json()})
  bar = _progress_bar(progress, tc.num_steps, loop.step, config.name)
  evaluate = functools.partial(validate_and_keep_best, data=data, config=config, workdir=workdir)

  if loop.step == 0:
    # The starting point (= the dense retriever) competes for best/ too: if training does not
    # beat it on validation, best/ stays the untrained model.
    loop, val = evaluate(state, loop, 0)
    mlog.write({"step": 0, **val})
  # Durations on the monotonic clock: a wall clock stepped back (NTP, a resumed VM) would make
  # them negative (examples_per_s < 0) or zero (a division by zero).
  t0, start, interrupted = time.monotonic(), loop.step, False
  # A run that stopped early is finished: a rerun (e.g. to rechoose what follows θ) must not
  # train on from its last checkpoint, one step per rerun.
  while loop.step < tc.num_steps and not _stopped_early(loop, tc):
    if stop_after is not None and loop.step - start >= stop_after:
      interrupted = True
      break
    params = parameters.materialize(state.theta, mc)
    if provider is not None and loop.step % config.rewards.refresh_every == 0:
      loop = dataclasses.replace(loop, rewards=rewards.refresh(
          provider, sharding.to_host(params), train, data.tool_ids, mc, tc,
          config.rewards.refresh_size, loop.step))
    with jax.set_mesh(mesh):  # hard-negative neighbours: a top-k per tools shard, then merged
      batch = batches.make_batch(loop.step, params, train, local_rows,
                                 num_tools=len(data.tool_ids), mc=mc, tc=tc, rewards=loop.rewards)
    batch = batches.Batch(**sharding.global_batch(batch._asdict(), rows_sharding, tc.batch_size))
    state, parts = step_fn(state, batch)
    loop = dataclasses.replace(loop, step=loop.step + 1)
    loss = float(parts["loss"])
    check_finite(loss, loop.step, mngr, workdir)
    done, row = loop.step, {}
    if done % tc.log_every == 0 or done == tc.num_steps:
      row = {k: float(v) for k, v in parts.items()}
      row["examples_per_s"] = (done - start) * tc.batch_size / max(time.monotonic() - t0,
                                                                   1e-9)
    if done % tc.eval_every == 0 or done == tc.num_steps:
      loop, val = evaluate(state, loop, done)
      row.update(val)
      _report(bar, done, loss, val)
    if row:
      mlog.write({"step": done, **row})
    _advance(bar, loss)
    if done % tc.checkpoint_every == 0 or done == tc.num_steps:
      save_checkpoint(mngr, state, loop)
    if _stopped_early(loop, tc) and done < tc.num_steps:
      log.info("early stop at step %d: no better val recall@5 for %d evaluations", done,
               loop.stale_evals)
      break
  save_checkpoint(mngr, state, loop)
  if bar is not None:
    bar.close()
  if interrupted:
    return {"interrupted_at": loop.step}
  return _finish(state, loop, data, config, workdir, mlog, time.monotonic() - t0)


def _stopped_early(loop, tc) -> bool:
  """Whether validation has not improved for more than ``tc.patience`` evaluations."""
  return loop.stale_evals > tc.patience


def _finish(state, loop, data, config, workdir, mlog, seconds) -> dict[str, Any]:
  """What is chosen after θ (:mod:`hyset_jax.training.post_theta`: the fitted terms, the
  ranking), best/ and final/ with it, the curves, and the best model's test metrics."""
  from hyset_jax.io import modeldir
  mc, pid = config.model, jax.process_index()
  best = modeldir.load_model_dir(workdir / "best") if (workdir / "best").exists() else None
  ranking, chosen = (pipeline.DEFAULT_RANKING if mc.ranking == "auto" else mc.ranking), None
  if best is not None:
    chosen = post_theta.select(best, data, config)
    ranking = chosen.ranking
  params = sharding.to_host(parameters.materialize(state.theta, mc))  # on every process: a gather
  if pid == 0:
    if chosen is not None:
      modeldir.save_model_dir(workdir / "best", post_theta.with_record(chosen), force=True)
    workdir_lib.export_model(params, data.tool_ids, data.query_encoder, mc, workdir / "final",
                             ranking=ranking, force=True)
    if chosen is not None and chosen.table:
      mlog.write({"step": loop.step, "ranking": ranking, "validation_by_ranking": chosen.table,
                  "fits": chosen.fits})
    if mlog.rows:
      curves.plot_curves(mlog.rows, workdir / "curves.png")
  summary = {"steps": loop.step, "best_step": loop.best_step,
             "best_val_recall@5": loop.best_recall5, "ranking": ranking,
             "train_seconds_this_run": round(seconds, 2)}
  sharding.barrier("hyset_train_exports_written")  # process 0 wrote best/ and final/
  if chosen is not None and config.data.test_split in data.splits:
    summary["test"] = evaluate_split(chosen.model.params, data.splits[config.data.test_split],
                                     data.tool_ids, mc, config.train.eval_batch_size,
                                     ranking=ranking, lexical=chosen.model.lexical)
    if pid == 0:
      import json
      (workdir / "test_metrics.json").write_text(json.dumps(summary["test"], indent=1) + "\n")
  return summary


def _progress_bar(enabled: bool, total: int, initial: int, name: str):
  if not enabled or jax.process_index() != 0:
    return None
  from tqdm import tqdm
  return tqdm(total=total, initial=initial, desc=f"train {name}", unit="step")


def _advance(bar, loss: float) -> None:
  if bar is not None:
    bar.update(1)
    bar.set_postfix(loss=f"{loss:.4f}")


def _report(bar, done: int, loss: float, val: dict) -> None:
  if bar is not None:
    bar.write(f"step {done}: loss {loss:.4f}  val R@5 {val['val_recall@5']:.4f}  "
              f"C@5 {val['val_comp@5']:.4f}  set F1 {val['val_set_f1']:.4f}")
