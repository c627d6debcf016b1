"""What one training step costs each device, read from its ahead-of-time compilation.

The train step is compiled for the configured mesh before it runs
(``jax.jit(step).lower(state, batch).compile()``, as MaxText's ``train_compile.py`` does), from
arrays or from ``jax.ShapeDtypeStruct``s carrying the shardings a real run uses
(hyset_jax.training.sharding: Z and its optimiser state on ``tools``, batch rows on ``data``).
The compiled executable's ``memory_analysis()`` gives the per-device argument, output and
temporary bytes and ``cost_analysis()`` the FLOPs of one step; parameters, optimiser state and
the batch are split out of the argument bytes from their shard shapes.

Shared by a real start (hyset_jax.training.train: it logs the report, writes it as
``metrics.jsonl``'s header record and runs the executable compiled here) and by ``hyset train
--dry-run`` (hyset_jax.training.dry_run, from shapes alone). It imports neither.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from hyset_jax import config as config_lib
from hyset_jax.model import scoring
from hyset_jax.training import batches, sharding

GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class StepReport:
  """One train step's per-device cost on a mesh (bytes are per device).

  ``parameters`` + ``optimizer_state`` + ``batch`` = ``arguments`` (what the step is given);
  ``temporaries`` is XLA's scratch; the state is donated, so its outputs alias its inputs and
  ``total`` = arguments + outputs − aliased + temporaries + generated code.
  """
  mesh: dict[str, int]
  platform: str
  device_kind: str
  num_tools: int
  tool_dim: int
  query_dim: int
  batch_size: int
  parameters: int
  optimizer_state: int
  batch: int
  arguments: int
  outputs: int
  aliased: int
  temporaries: int
  generated_code: int
  flops_per_device: float
  # True when the step scores its pools in set_scores' "keyed" order: XLA's cost analysis
  # counts the body of its data-dependent loop once, so flops_per_device is a lower bound.
  flops_lower_bound: bool = False

  @property
  def total(self) -> int:
    return self.arguments + self.outputs - self.aliased + self.temporaries + self.generated_code

  def to_json(self) -> dict:
    return dict(dataclasses.asdict(self), total=self.total)

  def lines(self) -> list[str]:
    d, t = self.mesh[sharding.DATA_AXIS], self.mesh[sharding.TOOLS_AXIS]
    gib = lambda b: f"{b / GIB:9.3f} GiB" if b >= GIB else f"{b / 2 ** 20:9.3f} MiB"  # noqa: E731
    return [
        f"mesh: data={d} x tools={t} = {d * t} {self.platform} device(s) ({self.device_kind})",
        f"library: N={self.num_tools} tools, d_z={self.tool_dim}, d_r={self.query_dim}; "
        f"global batch {self.batch_size}",
        "per-device memory:",
        f"  parameters       {gib(self.parameters)}",
        f"  optimiser state  {gib(self.optimizer_state)}",
        f"  batch            {gib(self.batch)}",
        f"  temporaries      {gib(self.temporaries)}",
        f"  outputs (new)    {gib(self.outputs - self.aliased)}",
        f"  total            {gib(self.total)}",
        f"FLOPs per step: {self.flops_per_device:.4g} per device, "
        f"{self.flops_per_device * d * t:.4g} for the mesh"
        + (" (a lower bound: the pools' Z M_m products run in a loop whose body XLA counts once)"
           if self.flops_lower_bound else ""),
    ]


def abstract_batch(tc: config_lib.TrainConfig, mc: config_lib.ModelConfig, query_dim: int,
                   mesh: jax.sharding.Mesh) -> batches.Batch:
  """The global batch as ShapeDtypeStructs, rows on ``data`` (the shapes of batches.Batch)."""
  rows = sharding.batch_rows(mesh)
  b, c, m = tc.batch_size, tc.k_neg, mc.max_set_size
  spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=rows)  # noqa: E731
  listed = mc.k_pool if tc.exhaustive_loss_weight else 0
  return batches.Batch(spec((b, query_dim), jnp.float32), spec((b, c, m), jnp.int32),
                       spec((b, c, m), jnp.bool_), spec((b,), jnp.int32), spec((b,), jnp.float32),
                       spec((b, listed), jnp.int32))


def compile_step(step_fn, state, batch, mesh: jax.sharding.Mesh) -> tuple[object, StepReport]:
  """``step_fn`` (a jitted train step) compiled for ``state`` and ``batch`` (arrays or
  ShapeDtypeStructs with shardings), and its per-device report. The compiled step is what a
  real run then calls, so the step is compiled once."""
  compiled = step_fn.lower(state, batch).compile()
  mem = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  device = mesh.devices.flat[0]
  z = state.theta["z"]
  report = StepReport(
      mesh={k: int(v) for k, v in mesh.shape.items()}, platform=device.platform,
      device_kind=device.device_kind, num_tools=int(z.shape[0]), tool_dim=int(z.shape[1]),
      query_dim=int(batch.query.shape[1]), batch_size=int(batch.query.shape[0]),
      parameters=sharding.per_device_bytes(state.theta),
      optimizer_state=sharding.per_device_bytes(state.opt_state),
      batch=sharding.per_device_bytes(batch),
      arguments=int(mem.argument_size_in_bytes), outputs=int(mem.output_size_in_bytes),
      aliased=int(mem.alias_size_in_bytes), temporaries=int(mem.temp_size_in_bytes),
      generated_code=int(mem.generated_code_size_in_bytes),
      flops_per_device=float((cost or {}).get("flops", float("nan"))),
      flops_lower_bound=not scoring.gram_is_cheaper(int(batch.members.shape[2]) - 1,
                                                    int(z.shape[0]), int(z.shape[1]),
                                                    tuple(batch.members.shape)))
  return compiled, report
