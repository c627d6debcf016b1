"""Training HYSET (paper §2.4, Algorithm 1): ``train_and_evaluate(config, workdir)``.

Data-parallel over every device: one ``jax.jit`` step over a named ``Mesh`` with the batch
sharded on ``data`` and θ replicated (no ``pmap``). Several hosts join through
``jax.distributed.initialize`` when the launcher's environment asks for it; each process builds
the candidate pools of its share of the global batch, and pools depend only on
(seed, step, global row), so results do not depend on the number of devices or processes.

The workdir holds everything a run needs to resume or be used:

  config.json          the resolved config (a rerun with a different one is refused)
  checkpoints/<step>/  Orbax: θ, optimiser state and the loop state (best score, patience,
                       reward cache); the newest good one is restored automatically
  best/                the best model by validation Recall@5, as a hyset/1 model directory
  final/               the parameters after the last step, likewise
  metrics.jsonl        one line per log/eval step (process 0)
  curves.png           training loss and validation Recall@5
  test_metrics.json    the best model on the test split
"""
from __future__ import annotations

import dataclasses
import functools
import json
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
from jax.sharding import NamedSharding, PartitionSpec as P

from hyset_jax import config as config_lib
from hyset_jax import inference, losses, metrics, model, modeldir, negatives, rewards, scoring
from hyset_jax.errors import UserError

log = logging.getLogger("hyset_jax.train")


# --------------------------------------------------------------------------- data

@dataclasses.dataclass(frozen=True)
class QuerySet:
  ids: tuple[str, ...]
  texts: tuple[str, ...]
  embeddings: np.ndarray            # f32[n, d_r]
  gold: tuple[tuple[int, ...], ...]  # sorted tool rows


@dataclasses.dataclass(frozen=True)
class TrainingData:
  tool_ids: tuple[str, ...]
  tool_embeddings: np.ndarray       # f32[N, d_z], encoder output
  query_encoder: str
  splits: dict[str, QuerySet]


def prepare_data(config: config_lib.Config) -> TrainingData:
  """Read the data set, encode tools and queries with the frozen encoder (cached)."""
  from hyset_jax.data.specs import load_dataset
  from hyset_jax.data.splits import with_validation
  from hyset_jax.encoder import encode_cached, load_encoder

  c = config.data
  dataset = load_dataset(c.spec, max_set_size=config.model.max_set_size)
  if c.val_split not in dataset.splits:
    dataset = with_validation(dataset, c.validation_fraction)
  if len(dataset.tools) < config.model.k_pool:
    raise UserError(f"{c.spec}: the tool library has {len(dataset.tools)} tools, fewer than "
                    f"model.k_pool = {config.model.k_pool}; lower model.k_pool and model.k1")
  encoder = load_encoder(config.model.encoder or None)
  index = dataset.tools.index()
  splits = {}
  for name, limit in ((c.train_split, c.max_train_queries), (c.val_split, c.max_eval_queries),
                      (c.test_split, c.max_eval_queries)):
    queries = dataset.split(name)
    if limit:
      queries = queries[:limit]
    missing = [q.id for q in queries if any(t not in index for t in q.gold)]
    if missing:
      raise UserError(f"{c.spec}: {len(missing)} {name} queries name gold tools missing from "
                      f"the library, e.g. {missing[:3]}")
    if not queries:
      raise UserError(f"{c.spec}: split {name!r} has no queries")
    log.info("encoding %d %s queries", len(queries), name)
    emb = encode_cached(encoder, [q.text for q in queries])
    splits[name] = QuerySet(tuple(q.id for q in queries), tuple(q.text for q in queries),
                            np.asarray(emb, np.float32),
                            tuple(tuple(sorted(index[t] for t in q.gold)) for q in queries))
  log.info("encoding %d tools", len(dataset.tools))
  tool_emb = np.asarray(encode_cached(encoder, dataset.tools.texts), np.float32)
  return TrainingData(dataset.tools.ids, tool_emb, encoder.name, splits)


# --------------------------------------------------------------------------- parameters

def init_trainable(tool_embeddings: np.ndarray, query_dim: int, mc: config_lib.ModelConfig,
                   seed: int) -> dict[str, jax.Array]:
  """The trained leaves of θ for the configured interaction mode."""
  p = model.init_params(tool_embeddings, query_dim, mc.max_set_size, jax.random.key(seed),
                        scale=mc.init_scale)
  trainable = {"z": p.tool_embeddings, "p": p.projection}
  if mc.interaction == "per_cardinality":
    trainable["m"] = p.interactions
  elif mc.interaction == "shared":
    trainable["m"] = p.interactions[:1]
  return trainable


def materialize(trainable: dict[str, jax.Array], mc: config_lib.ModelConfig) -> scoring.HysetParams:
  """Full θ (M_2..M_M) from the trained leaves: shared, identity and none are the ablations."""
  z = trainable["z"]
  d, k = z.shape[1], mc.max_set_size - 1
  if mc.interaction == "per_cardinality":
    ms = trainable["m"]
  elif mc.interaction == "shared":
    ms = jnp.broadcast_to(trainable["m"], (k, d, d))
  elif mc.interaction == "identity":
    ms = jnp.broadcast_to(jnp.eye(d, dtype=z.dtype), (k, d, d))
  else:
    ms = jnp.zeros((k, d, d), z.dtype)
  return scoring.HysetParams(z, trainable["p"], ms)


def project(trainable: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """The constraints after every update: unit rows of Z (Eq. 11), symmetric M_m."""
  out = dict(trainable, z=model.normalize_rows(trainable["z"]))
  if "m" in out:
    out["m"] = 0.5 * (out["m"] + jnp.swapaxes(out["m"], -1, -2))
  return out


class TrainState(NamedTuple):
  trainable: dict[str, jax.Array]
  opt_state: Any


def make_optimizer(tc: config_lib.TrainConfig) -> optax.GradientTransformation:
  schedule = optax.warmup_cosine_decay_schedule(
      0.0, tc.learning_rate, min(tc.warmup_steps, max(1, tc.num_steps - 1)), tc.num_steps,
      end_value=0.05 * tc.learning_rate)
  return optax.chain(optax.clip_by_global_norm(1.0), optax.adam(schedule))


def train_step(state: TrainState, batch: dict[str, jax.Array], *, mc: config_lib.ModelConfig,
               tc: config_lib.TrainConfig, optimizer: optax.GradientTransformation
               ) -> tuple[TrainState, dict[str, jax.Array]]:
  """One update on a global batch: ``(state, batch) -> (state, metrics)``.

  batch: query f32[B, d_r], members int32[B, K_neg, M], mask bool[B, K_neg, M],
  selected int32[B] (pool position of Ê), reward f32[B].
  """
  def loss_fn(trainable):
    if not mc.train_tool_embeddings:
      trainable = dict(trainable, z=jax.lax.stop_gradient(trainable["z"]))
    params = materialize(trainable, mc)
    # Pool position 0 holds each query's gold set E*.
    scores = scoring.set_scores(params, batch["query"], batch["members"], batch["mask"])
    penalty_on = trainable.get("m", jnp.zeros((0,), params.tool_embeddings.dtype))
    loss, parts = losses.total_loss(scores, batch["selected"], batch["reward"], penalty_on,
                                    eta=tc.eta, l2=tc.interaction_l2)
    if tc.tool_loss_weight:
      logits = scoring.tool_logits(batch["query"], params.projection, params.tool_embeddings)
      parts["loss_tool"] = losses.tool_loss(logits, batch["members"][:, 0], batch["mask"][:, 0])
      loss = loss + tc.tool_loss_weight * parts["loss_tool"]
      parts["loss"] = loss
    parts["pool_acc"] = jnp.mean(jnp.argmax(scores, axis=-1) == 0)
    return loss, parts

  (_, parts), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.trainable)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.trainable)
  trainable = project(optax.apply_updates(state.trainable, updates))
  parts["grad_norm"] = optax.tree.norm(grads)
  return TrainState(trainable, opt_state), parts


_shortlist_fn = jax.jit(inference.shortlist, static_argnames=("k1", "k_pool", "max_size"))


def make_step_fn(mesh: jax.sharding.Mesh, mc: config_lib.ModelConfig,
                 tc: config_lib.TrainConfig, optimizer: optax.GradientTransformation):
  """:func:`train_step` jitted over ``mesh``: θ replicated, batch rows sharded on ``data``."""
  replicated = NamedSharding(mesh, P())
  rows = NamedSharding(mesh, P("data"))
  return jax.jit(functools.partial(train_step, mc=mc, tc=tc, optimizer=optimizer),
                 in_shardings=(replicated, rows), out_shardings=(replicated, replicated),
                 donate_argnums=(0,))


@functools.partial(jax.jit, static_argnames=("k",))
def gold_neighbors(z: jax.Array, gold: jax.Array, k: int) -> jax.Array:
  """The k nearest tools (cosine under Z) of every gold member. int[B, M] -> int32[B, M, k]."""
  sims = z[gold] @ z.T                                                 # [B, M, N]
  sims = jnp.where(jnp.arange(z.shape[0]) == gold[..., None], -jnp.inf, sims)
  return jax.lax.top_k(sims, k)[1].astype(jnp.int32)


# --------------------------------------------------------------------------- distribution

def maybe_initialize_distributed() -> None:
  """Join a multi-process job when the launcher's environment asks for it.

  ``JAX_COORDINATOR_ADDRESS`` + ``JAX_NUM_PROCESSES`` + ``JAX_PROCESS_ID`` (set by
  ``launch/local.py`` and the Kubernetes template), or ``HYSET_DISTRIBUTED=auto`` to let JAX
  detect SLURM / Cloud TPU / Open MPI itself (launch/README.md). ``HYSET_INIT_TIMEOUT_S``
  bounds the wait for peers: past it JAX aborts the process, so a missing peer never hangs a
  run. On CPU the collectives are gloo (JAX's default for multi-process CPU).
  """
  if jax.distributed.is_initialized():
    return
  timeout = int(os.environ.get("HYSET_INIT_TIMEOUT_S", "300"))
  if os.environ.get("JAX_COORDINATOR_ADDRESS"):
    missing = [v for v in ("JAX_NUM_PROCESSES", "JAX_PROCESS_ID") if not os.environ.get(v)]
    if missing:
      raise UserError(f"JAX_COORDINATOR_ADDRESS is set but {' and '.join(missing)} not; set "
                      f"all three (or none, for a single-process run)")
    try:
      num, pid = int(os.environ["JAX_NUM_PROCESSES"]), int(os.environ["JAX_PROCESS_ID"])
    except ValueError:
      raise UserError("JAX_NUM_PROCESSES and JAX_PROCESS_ID must be integers") from None
    jax.distributed.initialize(coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"],
                               num_processes=num, process_id=pid,
                               initialization_timeout=timeout)
  elif os.environ.get("HYSET_DISTRIBUTED") == "auto":
    jax.distributed.initialize(initialization_timeout=timeout)


def make_mesh(num_devices: int | None = None) -> jax.sharding.Mesh:
  """A 1-D ``data`` mesh over the first ``num_devices`` devices (default: all, every host)."""
  devices = jax.devices()
  if num_devices is not None:
    devices = devices[:num_devices]
  return jax.sharding.Mesh(np.asarray(devices), ("data",))


def process_rows(sharding: NamedSharding, global_rows: int) -> list[int]:
  """The global batch rows this process supplies: the union of its devices' shards, which
  for a 1-D ``data`` mesh over ``jax.devices()`` is one contiguous block per process."""
  rows = sorted({i for idx in sharding.addressable_devices_indices_map((global_rows,)).values()
                 for i in range(global_rows)[idx[0]]})
  if rows != list(range(rows[0], rows[0] + len(rows))):
    raise UserError(f"this process's devices hold non-contiguous batch rows {rows[:8]}…; "
                    f"use a mesh whose process-local devices are adjacent")
  return rows


def _global(local: np.ndarray, sharding: NamedSharding, global_rows: int) -> jax.Array:
  return jax.make_array_from_process_local_data(sharding, local,
                                                (global_rows,) + local.shape[1:])


# --------------------------------------------------------------------------- the loop

def epoch_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
  return np.random.default_rng((seed, 0x5EED, epoch)).permutation(n)


def batch_indices(seed: int, step: int, batch_size: int, n: int) -> np.ndarray:
  """Training-query rows of a global batch: epochs of fresh permutations, stateless in step."""
  flat = step * batch_size + np.arange(batch_size)
  out = np.empty(batch_size, np.int64)
  for epoch in np.unique(flat // n):
    sel = flat // n == epoch
    out[sel] = epoch_permutation(seed, int(epoch), n)[flat[sel] % n]
  return out


def evaluate_split(params: scoring.HysetParams, qs: QuerySet, tool_ids: tuple[str, ...],
                   mc: config_lib.ModelConfig, batch_size: int) -> dict[str, float]:
  """design.md §5 metrics of the two-stage path on one split."""
  pred = inference.predict_batched(jax.device_get(params), qs.embeddings, k1=mc.k1,
                                   k_pool=mc.k_pool, max_size=mc.max_set_size,
                                   batch_size=batch_size)
  ids = np.asarray(tool_ids, dtype=object)
  rankings = [ids[r].tolist() for r in pred.ranking]
  sets = [ids[t[:n]].tolist() for t, n in zip(pred.set_tools, pred.set_size)]
  gold = [[tool_ids[t] for t in g] for g in qs.gold]
  return metrics.evaluate(rankings, gold, sets)


def refresh_rewards(provider, params, data: TrainingData, config: config_lib.Config,
                    step: int) -> dict[int, tuple[tuple[int, ...], float]]:
  """Score N_sub training queries' pools, take Ê = argmax (Eq. 7), ask the provider for ρ."""
  tc, mc = config.train, config.model
  train = data.splits[config.data.train_split]
  rng = np.random.default_rng((tc.seed, 0xBEEF, step))
  rows = rng.choice(len(train.ids), size=min(config.rewards.refresh_size, len(train.ids)),
                    replace=False)
  gold = [train.gold[r] for r in rows]
  cache = {}
  for start in range(0, len(rows), tc.eval_batch_size):
    chunk = list(range(start, min(start + tc.eval_batch_size, len(rows))))
    padded = np.zeros((len(gold), mc.max_set_size), np.int32)
    for i, g in enumerate(gold):
      padded[i, :len(g)] = g
    nbrs = np.asarray(gold_neighbors(params.tool_embeddings, padded[chunk], tc.hard_neighbors))
    nb = np.zeros((len(gold),) + nbrs.shape[1:], np.int32)
    nb[chunk] = nbrs
    pools = negatives.sample_pools(gold, chunk, num_tools=len(data.tool_ids), k_neg=tc.k_neg,
                                   max_size=mc.max_set_size, mix=tc.negative_mix, neighbors=nb,
                                   seed=tc.seed ^ 0xBEEF, step=step)
    scores = np.asarray(scoring.set_scores(params, train.embeddings[rows[chunk]],
                                           pools.members, pools.mask))
    for i, j in enumerate(chunk):
      best = int(np.argmax(scores[i]))
      e_hat = tuple(int(t) for t in pools.members[i, best][pools.mask[i, best]])
      r = int(rows[j])
      rho = provider(train.ids[r], train.texts[r], [data.tool_ids[t] for t in e_hat],
                     [data.tool_ids[t] for t in train.gold[r]])
      cache[r] = (e_hat, float(rho))
  return cache


class _MetricsLog:
  """metrics.jsonl, written by process 0; on resume, lines after the restored step are dropped."""

  def __init__(self, path: pathlib.Path, resume_step: int):
    self.path = path
    self.enabled = jax.process_index() == 0
    self.rows: list[dict] = []
    if path.exists():
      for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
          row = json.loads(line)
        except json.JSONDecodeError:
          # A process killed mid-write leaves a torn last line; the steps after the restored
          # checkpoint are replayed and logged again anyway.
          log.warning("%s:%d: dropping a torn metrics line", path, n)
          continue
        if row["step"] <= resume_step:
          self.rows.append(row)
    if self.enabled:
      from hyset_jax.io_utils import atomic_write
      with atomic_write(path) as f:
        f.writelines(json.dumps(r) + "\n" for r in self.rows)

  def write(self, row: dict) -> None:
    self.rows.append(row)
    if self.enabled:
      with open(self.path, "a") as f:
        f.write(json.dumps(row) + "\n")


def plot_curves(rows: list[dict], path: pathlib.Path) -> None:
  """Training loss and validation Recall@5 against step, as a PNG."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  train = [r for r in rows if "loss" in r]
  val = [r for r in rows if "val_recall@5" in r]
  fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
  ax[0].plot([r["step"] for r in train], [r["loss"] for r in train])
  ax[0].set(xlabel="step", ylabel="training loss", title="training loss (all terms)")
  for key in ("val_recall@5", "val_comp@5", "val_set_f1"):
    ax[1].plot([r["step"] for r in val], [r[key] for r in val], marker="o", label=key[4:])
  ax[1].set(xlabel="step", ylabel="validation", ylim=(0, 1), title="validation metrics")
  ax[1].legend()
  fig.tight_layout()
  tmp = path.with_suffix(".tmp.png")
  fig.savefig(tmp, dpi=110)
  plt.close(fig)
  os.replace(tmp, path)


def _checkpoint_manager(workdir: pathlib.Path):
  import orbax.checkpoint as ocp
  return ocp.CheckpointManager(
      workdir / "checkpoints",
      options=ocp.CheckpointManagerOptions(max_to_keep=2, create=True,
                                           enable_async_checkpointing=False))


def restore_latest(manager, abstract_state: TrainState) -> tuple[TrainState, dict] | None:
  """The newest checkpoint that restores; broken newer ones are skipped with a warning."""
  import orbax.checkpoint as ocp
  for step in sorted(manager.all_steps(), reverse=True):
    try:
      restored = manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state), loop=ocp.args.JsonRestore()))
      return restored["state"], restored["loop"]
    except Exception as e:  # noqa: BLE001 - any failure means this step is unusable
      log.warning("checkpoint step %d in %s is unreadable (%s: %s); trying an older one",
                  step, manager.directory, type(e).__name__, str(e)[:200])
  return None


def _check_workdir(workdir: pathlib.Path, config: config_lib.Config) -> None:
  """A writable workdir that holds no run of a different config."""
  from hyset_jax.io_utils import ensure_writable_dir
  ensure_writable_dir(workdir, "workdir")
  saved = workdir / "config.json"
  if saved.exists():
    previous = json.loads(saved.read_text())
    if previous != json.loads(config.to_json()):
      diff = sorted(f"{s}.{k}" for s in previous if isinstance(previous[s], dict)
                    for k in previous[s] if previous[s][k] != config.to_dict()[s].get(k))
      raise UserError(f"workdir {workdir} holds a run with a different config (differs in: "
                      f"{', '.join(diff) or 'name'}); resume with the same config or use a "
                      f"new workdir")


def train_and_evaluate(config: config_lib.Config, workdir: str | os.PathLike, *,
                       data: TrainingData | None = None, num_devices: int | None = None,
                       progress: bool = True, stop_after: int | None = None) -> dict[str, Any]:
  """Train, evaluate, checkpoint; resume automatically from the workdir.

  Args:
    config: a validated config.
    workdir: where the run lives (see the module docstring).
    data: already prepared data (default: read and encode ``config.data.spec``).
    num_devices: use only the first n devices (tests compare 1 and 8).
    progress: show a progress bar.
    stop_after: stop (with a checkpoint) after this many steps of this invocation — for tests
      of interrupted runs.

  Returns:
    Final summary: steps run, best step, best validation metrics, test metrics.
  """
  config_lib.validate(config)
  maybe_initialize_distributed()
  workdir = pathlib.Path(workdir).absolute()  # Orbax wants absolute paths
  tc, mc = config.train, config.model
  _check_workdir(workdir, config)
  n_dev = num_devices or jax.device_count()
  if tc.batch_size % n_dev:
    raise UserError(f"train.batch_size = {tc.batch_size} must be a multiple of the device "
                    f"count ({n_dev})")
  provider = rewards.make_provider(config.rewards.provider, config.rewards.path,
                                   config.rewards.command)
  data = data or prepare_data(config)
  if jax.process_index() == 0:
    # Atomic: other processes of a multi-process job may be reading it in _check_workdir.
    from hyset_jax.io_utils import atomic_write
    with atomic_write(workdir / "config.json") as f:
      f.write(config.to_json() + "\n")
  train = data.splits[config.data.train_split]
  val = data.splits[config.data.val_split]

  mesh = make_mesh(num_devices)
  replicated = NamedSharding(mesh, P())
  rows_sharding = NamedSharding(mesh, P("data"))
  optimizer = make_optimizer(tc)

  # θ is replicated, so every process must start from the same Z: with several processes,
  # process 0's encoder output is used everywhere (encoders on different hosts may differ in
  # the last bits).
  init_tools = data.tool_embeddings
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    init_tools = np.asarray(multihost_utils.broadcast_one_to_all(init_tools))

  def init():
    trainable = init_trainable(init_tools, train.embeddings.shape[1], mc, tc.seed)
    return TrainState(trainable, optimizer.init(trainable))

  state = jax.jit(init, out_shardings=replicated)()
  step_fn = make_step_fn(mesh, mc, tc, optimizer)

  manager = _checkpoint_manager(workdir)
  loop = {"step": 0, "best_recall5": -1.0, "best_step": -1, "stale_evals": 0, "rewards": {}}
  # The restore target carries the sharding explicitly: Orbax then restores onto this run's
  # mesh, so a checkpoint saved by a different process/device layout still resumes.
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
                          state)
  restored = restore_latest(manager, abstract)
  if restored is not None:
    state, loop = restored
    state = jax.device_put(state, replicated)
    log.info("resumed from step %d", loop["step"])
  reward_cache = {int(k): (tuple(v[0]), float(v[1])) for k, v in loop["rewards"].items()}
  mlog = _MetricsLog(workdir / "metrics.jsonl", loop["step"])

  # This process's rows of every global batch: the block its devices hold under the ``data``
  # sharding (what make_array_from_process_local_data expects it to supply).
  pid = jax.process_index()
  local_rows = process_rows(rows_sharding, tc.batch_size)
  local = len(local_rows)

  saved_steps = set(manager.all_steps())

  def save(step: int) -> None:
    import orbax.checkpoint as ocp
    # A step already saved (checkpoint_every, then early stop or stop_after on the same step)
    # is not saved twice: Orbax refuses an existing step.
    if step in saved_steps:
      return
    saved_steps.add(step)
    loop_json = dict(loop, step=step,
                     rewards={str(k): [list(v[0]), v[1]] for k, v in reward_cache.items()})
    manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                               loop=ocp.args.JsonSave(loop_json)), force=True)
    manager.wait_until_finished()

  start = loop["step"]
  bar = None
  if progress and pid == 0:
    from tqdm import tqdm
    bar = tqdm(total=tc.num_steps, initial=start, desc=f"train {config.name}", unit="step")

  def validate(done: int, row: dict | None, loss: float | None) -> dict:
    """Validation metrics at ``done`` steps; keeps best/ and the patience count."""
    params = materialize(state.trainable, mc)
    vm = evaluate_split(params, val, data.tool_ids, mc, tc.eval_batch_size)
    row = dict(row or {"step": done}, **{f"val_{k}": v for k, v in vm.items()})
    improved = vm["recall@5"] > loop["best_recall5"]
    if jax.process_count() > 1:
      # Every process evaluates; process 0's verdict drives best/patience everywhere, so
      # the processes can never disagree about early stopping (and leave one hanging).
      from jax.experimental import multihost_utils
      improved = bool(multihost_utils.broadcast_one_to_all(np.int32(improved)))
    if improved:
      loop.update(best_recall5=vm["recall@5"], best_step=done, stale_evals=0)
      if pid == 0:
        export_params(params, data, mc, workdir / "best", force=True)
    else:
      loop["stale_evals"] += 1
    log.info("step %d: val recall@5 %.4f comp@5 %.4f (best %.4f at %d)", done, vm["recall@5"],
             vm["comp@5"], loop["best_recall5"], loop["best_step"])
    if bar is not None:
      bar.write(f"step {done}: " + (f"loss {loss:.4f}  " if loss is not None else "") +
                f"val R@5 {vm['recall@5']:.4f}  C@5 {vm['comp@5']:.4f}  "
                f"set F1 {vm['set_f1']:.4f}")
    return row

  if start == 0:
    # The starting point (= the dense retriever) competes for best/ too: if training does not
    # beat it on validation, best/ stays the untrained model.
    mlog.write(validate(0, None, None))
  t0, steps_run, done = time.time(), 0, start
  interrupted = False
  for step in range(start, tc.num_steps):
    if stop_after is not None and steps_run >= stop_after:
      interrupted = True
      break
    params = materialize(state.trainable, mc)
    if provider is not None and step % config.rewards.refresh_every == 0:
      reward_cache = refresh_rewards(provider, params, data, config, step)
    idx = batch_indices(tc.seed, step, tc.batch_size, len(train.ids))
    gold = [train.gold[i] for i in idx]
    padded = np.zeros((len(idx), mc.max_set_size), np.int32)
    for i, g in enumerate(gold):
      padded[i, :len(g)] = g
    nbrs = np.asarray(gold_neighbors(params.tool_embeddings, padded, tc.hard_neighbors))
    forced = [reward_cache.get(int(i), (None, 0.0))[0] for i in idx]
    shortlists = None
    if tc.shortlist_negatives:
      shortlists = np.asarray(_shortlist_fn(params, train.embeddings[idx], k1=mc.k1,
                                            k_pool=mc.k_pool, max_size=mc.max_set_size).tools)
    pools = negatives.sample_pools(gold, local_rows, num_tools=len(data.tool_ids), k_neg=tc.k_neg,
                                   max_size=mc.max_set_size, mix=tc.negative_mix,
                                   neighbors=nbrs, seed=tc.seed, step=step, forced=forced,
                                   shortlists=shortlists,
                                   shortlist_fraction=tc.shortlist_negatives)
    selected = np.zeros(local, np.int32)
    reward = np.zeros(local, np.float32)
    for j, row in enumerate(local_rows):
      e_hat, rho = reward_cache.get(int(idx[row]), (None, 0.0))
      if e_hat is not None:
        selected[j] = 0 if tuple(e_hat) == gold[row] else 1
        reward[j] = rho
    batch = {
        "query": _global(train.embeddings[idx[local_rows]], rows_sharding, tc.batch_size),
        "members": _global(pools.members, rows_sharding, tc.batch_size),
        "mask": _global(pools.mask, rows_sharding, tc.batch_size),
        "selected": _global(selected, rows_sharding, tc.batch_size),
        "reward": _global(reward, rows_sharding, tc.batch_size),
    }
    state, parts = step_fn(state, batch)
    steps_run += 1
    loss = float(parts["loss"])
    if not math.isfinite(loss):
      raise UserError(f"non-finite training loss ({loss}) at step {step + 1}; the last good "
                      f"checkpoint is step {manager.latest_step()} in {workdir / 'checkpoints'}. "
                      f"Lower train.learning_rate or check the inputs")
    done = step + 1
    if bar is not None:
      bar.update(1)
      bar.set_postfix(loss=f"{loss:.4f}")
    row = None
    if done % tc.log_every == 0 or done == tc.num_steps:
      row = {"step": done, **{k: float(v) for k, v in parts.items()},
             "examples_per_s": steps_run * tc.batch_size / (time.time() - t0)}
    if done % tc.eval_every == 0 or done == tc.num_steps:
      row = validate(done, row, loss)
    if row is not None:
      mlog.write(row)
    if done % tc.checkpoint_every == 0 or done == tc.num_steps:
      save(done)
    if loop["stale_evals"] > tc.patience and done < tc.num_steps:
      log.info("early stop at step %d: no better val recall@5 for %d evaluations", done,
               loop["stale_evals"])
      save(done)
      break
  if bar is not None:
    bar.close()
  if interrupted:
    save(done)
    return {"interrupted_at": done}

  if pid == 0:
    export_params(materialize(state.trainable, mc), data, mc, workdir / "final", force=True)
  summary = {"steps": int(manager.latest_step() or 0), "best_step": loop["best_step"],
             "best_val_recall@5": loop["best_recall5"],
             "train_seconds_this_run": round(time.time() - t0, 2)}
  if pid == 0 and mlog.rows:
    plot_curves(mlog.rows, workdir / "curves.png")
  if jax.process_count() > 1:
    # Process 0 wrote best/ and final/; every process reads best/ below.
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices("hyset_train_exports_written")
  if (workdir / "best").exists() and config.data.test_split in data.splits:
    best = modeldir.load_model_dir(workdir / "best")
    tm = evaluate_split(best.params, data.splits[config.data.test_split], data.tool_ids, mc,
                        tc.eval_batch_size)
    summary["test"] = tm
    if pid == 0:
      (workdir / "test_metrics.json").write_text(json.dumps(tm, indent=1) + "\n")
  return summary


def export_params(params: scoring.HysetParams, data: TrainingData, mc: config_lib.ModelConfig,
                  out: pathlib.Path, force: bool = False) -> pathlib.Path:
  """Write θ as a hyset/1 model directory."""
  host = scoring.HysetParams(*(np.asarray(a, np.float32) for a in jax.device_get(params)))
  # Exact symmetry and unit rows for other stacks (the f32 projection leaves ~1e-7 residue).
  host = host._replace(
      tool_embeddings=host.tool_embeddings / np.linalg.norm(host.tool_embeddings, axis=1,
                                                            keepdims=True),
      interactions=0.5 * (host.interactions + np.swapaxes(host.interactions, 1, 2)))
  md = modeldir.ModelDir(host, data.tool_ids, mc.max_set_size, mc.k1, mc.k_pool,
                         data.query_encoder)
  return modeldir.save_model_dir(out, md, force=force)
