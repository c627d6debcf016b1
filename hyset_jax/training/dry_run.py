"""What one training step costs each device, known before training: ``hyset train --dry-run``.

The train step is lowered from shapes alone and compiled ahead of time for the configured mesh
(hyset_jax.training.step_cost, as MaxText's ``train_compile.py`` does): the train state and the
batch are ``jax.ShapeDtypeStruct``s carrying the shardings a real run uses. The report gives the
per-device parameter, optimiser-state, batch and temporary bytes and the FLOPs of one step.

The shapes come from the data set's tool count and the encoder's width (its config.json); no
text is encoded and no embedding is read. A real start (hyset_jax.training.train) compiles the
same way, logs the same numbers and writes them as ``metrics.jsonl``'s header record (step -1).
This module imports train; train never imports it.

Compiling for other hardware than this machine's: the mesh is built over whatever devices JAX
has, so ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` (or ``--devices N`` on the CLI)
compiles for N CPU devices; a TPU slice's topology (``--topology tpu:v5e:4x4``) compiles on any
machine through ``jax.experimental.topologies`` once the TPU runtime (``pip install libtpu``)
is installed (docs/sharding.md says what was tried).
"""
from __future__ import annotations

import json
import math

import jax

from hyset_jax import config as config_lib
from hyset_jax.errors import UserError
from hyset_jax.training import sharding, train
from hyset_jax.training.step_cost import GIB, StepReport, abstract_batch, compile_step


def check_fits(report: StepReport, budget_gb: float) -> None:
  """UserError (exit 2) naming what does not fit ``budget_gb`` GiB per device (0: no check)."""
  if not budget_gb or report.total <= budget_gb * GIB:
    return
  parts = {"parameters": report.parameters, "optimiser state": report.optimizer_state,
           "batch": report.batch, "temporaries": report.temporaries,
           "outputs": report.outputs - report.aliased}
  named = ", ".join(f"{k} {v / GIB:.3f}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]))
  t = report.mesh[sharding.TOOLS_AXIS]
  sharded = report.parameters + report.optimizer_state  # Z dominates both; it scales as 1/T
  devices = math.prod(report.mesh.values())
  hint = ""
  for t2 in range(t + 1, devices + 1):
    if devices % t2 or report.num_tools % t2:
      continue
    if report.total - sharded * (1 - t / t2) <= budget_gb * GIB:
      hint = (f"; with mesh.tools={t2} parameters + optimiser state would be about "
              f"{sharded * t / t2 / GIB:.3f} GiB (check with another --dry-run)")
      break
  else:
    hint = "; no mesh.tools on these devices brings it under — use more devices or a smaller batch"
  raise UserError(f"the train step needs {report.total / GIB:.3f} GiB per device on mesh "
                  f"data={report.mesh[sharding.DATA_AXIS]} x tools={t}, more than "
                  f"mesh.memory_per_device_gb={budget_gb:g} ({named} GiB){hint}")


def topology_devices(spec: str) -> list:
  """The devices of a TPU topology to compile for, from ``tpu:NAME`` (e.g. ``tpu:v5e:4x4``,
  ``tpu:v4:2x2x2``); no TPU is needed, only its runtime (``pip install libtpu``)."""
  platform, _, name = spec.partition(":")
  if platform != "tpu" or not name:
    raise UserError(f"--topology {spec!r}: expected tpu:NAME, e.g. tpu:v5e:4x4 or tpu:v4:2x2x2 "
                    f"(for N CPU devices use --devices N)")
  import os
  # No metadata server to ask off a TPU VM: without this libtpu waits minutes for it.
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
  from jax.experimental import topologies
  try:
    return list(topologies.get_topology_desc(platform="tpu", topology_name=name).devices)
  except RuntimeError as e:
    if "not installed" in str(e):
      raise UserError(f"--topology {spec}: JAX's TPU support is not installed here; "
                      f"`pip install libtpu` (compile-only works on a machine without a TPU)"
                      ) from None
    raise UserError(f"--topology {spec}: {str(e).splitlines()[0]}; expected a name like "
                    f"v5e:4x4 or v4:2x2x2") from None


def encoder_dim(model_dir: str) -> int:
  """The sentence encoder's output width from its files (hidden size × pooling modes), without
  loading its weights."""
  from hyset_jax.encoder import sentence
  path = sentence.resolve_model_dir(model_dir or None)
  pipeline = sentence.read_pipeline(path)
  config_file = pipeline.transformer_dir / "config.json"
  try:
    hidden = json.loads(config_file.read_text())["hidden_size"]
  except (OSError, ValueError, KeyError) as e:
    raise UserError(f"{config_file}: cannot read the encoder's hidden_size ({e})") from None
  return int(hidden) * len(pipeline.pooling)


def library_shape(config: config_lib.Config) -> tuple[int, int, int]:
  """(N, d_z, d_r) for ``config``: the data set's tool count and the frozen encoder's width."""
  from hyset_jax.data.specs import load_dataset
  n = len(load_dataset(config.data.spec, max_set_size=config.model.max_set_size).tools)
  d = encoder_dim(config.model.encoder)
  return n, d, d


def dry_run(config: config_lib.Config, *, num_tools: int | None = None,
            tool_dim: int | None = None, query_dim: int | None = None,
            devices=None) -> StepReport:
  """Compile ``config``'s train step for its mesh and return the report; nothing is trained or
  written. Sizes default to :func:`library_shape`; UserError if the mesh does not tile the
  devices or Z's rows do not split over ``tools`` (:func:`check_fits` checks the budget)."""
  config_lib.validate(config)
  sharding.maybe_initialize_distributed()  # a multi-host slice compiles for all of its chips
  if num_tools is None or tool_dim is None or query_dim is None:
    n, dz, dr = library_shape(config)
    num_tools, tool_dim, query_dim = num_tools or n, tool_dim or dz, query_dim or dr
  mesh = train.training_mesh(config, devices=devices)
  sharding.check_tool_rows(num_tools, mesh)
  optimizer = train.make_optimizer(config.train)
  state = train.abstract_state(num_tools, tool_dim, query_dim, config.model, config.train,
                               optimizer, mesh)
  step_fn = train.make_step_fn(mesh, config.model, config.train, optimizer,
                               jax.tree.map(lambda x: x.sharding, state))
  batch = abstract_batch(config.train, config.model, query_dim, mesh)
  return compile_step(step_fn, state, batch, mesh)[1]
