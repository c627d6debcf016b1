"""What the prediction path costs per device on hardware we do not have: ``hyset bench compile``.

The whole prepared prediction path (:func:`hyset_jax.inference.pipeline.predict_prepared`:
stage 1, the expansion, the pair matrices, stage 2, the ranking) and stage 2 alone
(:func:`hyset_jax.inference.enumeration.best_subset`) are lowered from
``jax.ShapeDtypeStruct``s carrying shardings and compiled ahead of time for a topology's
devices, as ``hyset train --dry-run`` does for the train step (no array of size N is ever
allocated). Each row reports the compiler's per-device memory analysis (arguments, outputs,
temporaries) and cost analysis (FLOPs, bytes accessed): inputs to a roofline, not a
measurement of speed.

Configurations:

- replicated: the model on every device, the batch split over all of them (``data`` axis)
  where it divides evenly, else replicated; one row per (method, batch, part).
- tools-sharded: Z, P Zᵀ, Z M_m and the neighbour table split by tool over a ``tools`` axis
  of every device (as training shards Z, :mod:`hyset_jax.training.sharding`), the batch
  replicated; one row per method (``part`` e2e only: stage 2 does not read the library).

``--topology tpu:NAME`` needs the TPU runtime (``pip install libtpu``; not a dependency of
hyset-jax); ``cpu:N`` compiles for N host CPU devices (``XLA_FLAGS=
--xla_force_host_platform_device_count=N``), which is what the tests run.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import time

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from hyset_jax.errors import UserError

PARTS = ("e2e", "stage2")
METHODS = ("gather", "pallas")


@dataclasses.dataclass
class Row:
  """One compiled configuration; ``error`` (first line of the compiler's message) when it
  failed to lower or compile, and then no numbers."""
  config: str
  part: str
  method: str
  num_tools: int
  dim: int
  batch: int
  data_shards: int
  tool_shards: int
  argument_bytes: int = 0
  output_bytes: int = 0
  temp_bytes: int = 0
  alias_bytes: int = 0
  total_bytes: int = 0
  flops: float = 0.0
  bytes_accessed: float = 0.0
  compile_s: float = 0.0
  error: str | None = None

  @property
  def queries_per_device(self) -> int:
    return self.batch // self.data_shards


def devices_for(spec: str) -> list:
  """The devices of ``tpu:NAME`` (a TPU topology, through libtpu) or ``cpu:N`` (the first N
  host CPU devices); UserError naming what is wrong otherwise."""
  platform, _, name = spec.partition(":")
  if platform == "cpu":
    try:
      n = int(name)
    except ValueError:
      n = 0
    if n < 1:
      raise UserError(f"--topology {spec!r}: expected cpu:N with N ≥ 1, e.g. cpu:8")
    have = jax.devices("cpu")
    if len(have) < n:
      raise UserError(f"--topology {spec}: this process has {len(have)} CPU device(s); start it "
                      f"with XLA_FLAGS=--xla_force_host_platform_device_count={n}")
    return list(have[:n])
  if platform != "tpu" or not name:
    raise UserError(f"--topology {spec!r}: expected tpu:NAME (e.g. tpu:v5e:2x4, tpu:v5p:2x2x1) "
                    f"or cpu:N (N host CPU devices)")
  from hyset_jax.training import dry_run
  return dry_run.topology_devices(spec)


@contextlib.contextmanager
def _kernel_platform(where: str | None):
  """The Pallas kernel picks Mosaic/Triton/interpret from the *default* backend when traced;
  compiling for a TPU topology from a CPU host must trace its Mosaic form, so the choice is
  pinned to ``where`` while lowering (None: left alone)."""
  if where is None:
    yield
    return
  from unittest import mock

  from hyset_jax.inference import pallas_stage2
  with mock.patch.object(pallas_stage2, "platform", lambda backend=None: where):
    yield


def _sds(shape, dtype, sharding) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=sharding)


def abstract_prepared(num_tools: int, dim: int, k_pool: int, max_size: int, mesh,
                      tools_sharded: bool, precision: str = "f32"):
  """A PreparedModel of ShapeDtypeStructs (the paper's model: no tower, prior or filters),
  Z-sized leaves split by tool over ``tools`` when ``tools_sharded``; P Zᵀ and Z M_m in the
  dtype of ``precision`` (:func:`hyset_jax.inference.pipeline.prepare`)."""
  from hyset_jax.inference import neighbors, pipeline
  from hyset_jax.model.scoring import HysetParams
  from hyset_jax.training import sharding
  rep = NamedSharding(mesh, PartitionSpec())
  by_tool = NamedSharding(mesh, PartitionSpec(sharding.TOOLS_AXIS)) if tools_sharded else rep
  f32, width = jnp.float32, neighbors.width_for(k_pool, num_tools)
  params = HysetParams(tool_embeddings=_sds((num_tools, dim), f32, by_tool),
                       projection=_sds((dim, dim), f32, rep),
                       interactions=_sds((max_size - 1, dim, dim), f32, rep))
  table = neighbors.NeighborTable(ids=_sds((num_tools, width), jnp.int32, by_tool),
                                  scores=_sds((num_tools, width), f32, by_tool))
  products = pipeline.PRECISION_DTYPES[precision]
  return pipeline.PreparedModel(params, _sds((num_tools, dim), products, by_tool),
                                _sds((num_tools, max_size - 1, dim), products, by_tool), table)


def _analyse(row: Row, lowered_fn) -> Row:
  t0 = time.perf_counter()
  try:
    compiled = lowered_fn().compile()
  except Exception as e:  # noqa: BLE001 — any lowering/compiler failure is a result here
    msg = " ".join(str(e).split())
    row.error = f"{type(e).__name__}: {msg[:400]}"
    return row
  row.compile_s = round(time.perf_counter() - t0, 2)
  mem = compiled.memory_analysis()
  row.argument_bytes = int(mem.argument_size_in_bytes)
  row.output_bytes = int(mem.output_size_in_bytes)
  row.temp_bytes = int(mem.temp_size_in_bytes)
  row.alias_bytes = int(mem.alias_size_in_bytes)
  row.total_bytes = row.argument_bytes + row.output_bytes + row.temp_bytes - row.alias_bytes
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):  # older JAX: one dict per computation
    cost = cost[0] if cost else {}
  row.flops = float(cost.get("flops", 0.0))
  row.bytes_accessed = float(cost.get("bytes accessed", 0.0))
  return row


def compile_rows(devices: list, *, num_tools: int, dim: int, batches: list[int], k1: int,
                 k_pool: int, max_size: int, methods: list[str], sharded_tools: int,
                 sharded_batch: int, kernel_platform: str | None = None,
                 progress=None, precision: str = "f32") -> list[Row]:
  """Compile every configuration (module docstring) for ``devices``; one Row each
  (``precision``: the prepared products' dtype, :func:`abstract_prepared`)."""
  from hyset_jax.inference import enumeration, pipeline, subsets
  from hyset_jax.training import sharding
  n_dev = len(devices)
  table = subsets.subset_table(k_pool, max_size)
  rows: list[Row] = []

  def e2e(mesh, prep, x_sharding, batch):
    x = _sds((batch, dim), jnp.float32, x_sharding)
    return lambda: pipeline.predict_prepared.lower(prep, x, k1=k1, k_pool=k_pool,
                                                   max_size=max_size, method=method)

  for method in methods:
    for batch in batches:
      data = n_dev if batch >= n_dev and batch % n_dev == 0 else 1
      mesh = sharding.make_mesh(devices=devices, data=data, tools=n_dev // data)
      x_sh = NamedSharding(mesh, PartitionSpec(sharding.DATA_AXIS if data > 1 else None))
      prep = abstract_prepared(num_tools, dim, k_pool, max_size, mesh, tools_sharded=False,
                               precision=precision)
      for part in PARTS:
        row = Row("replicated", part, method, num_tools, dim, batch, data, 1)
        if part == "e2e":
          fn = e2e(mesh, prep, x_sh, batch)
        else:
          logits = _sds((batch, k_pool), jnp.float32, x_sh)
          pairs = _sds((batch, max_size - 1, k_pool, k_pool), jnp.float32, x_sh)
          fn = (lambda lg=logits, pr=pairs, m=method:
                enumeration.best_subset.lower(lg, pr, table, m))
        with _kernel_platform(kernel_platform):
          rows.append(_analyse(row, fn))
        if progress:
          progress(rows[-1])
    if sharded_tools:
      mesh = sharding.make_mesh(devices=devices, data=1, tools=n_dev)
      sharding.check_tool_rows(sharded_tools, mesh)
      prep = abstract_prepared(sharded_tools, dim, k_pool, max_size, mesh, tools_sharded=True,
                               precision=precision)
      row = Row("tools-sharded", "e2e", method, sharded_tools, dim, sharded_batch, 1, n_dev)
      with _kernel_platform(kernel_platform), jax.set_mesh(mesh):
        rows.append(_analyse(row, e2e(mesh, prep, NamedSharding(mesh, PartitionSpec()),
                                      sharded_batch)))
      if progress:
        progress(rows[-1])
  return rows


# Vendor peaks per chip, used by roofline(): (f32 FLOP/s, bf16 FLOP/s, HBM bytes/s). Sources in
# docs/speed.md ("TPU and GPU: compiled, not yet measured").
PEAKS = {
    "tpu-v5e": (197e12, 197e12, 819e9),   # MXU bf16; f32 matmul runs as bf16 passes (below)
    "tpu-v5p": (459e12, 459e12, 2765e9),
    "h100-sxm": (67e12, 989e12, 3.35e12),
    "h200": (67e12, 989e12, 4.8e12),
}


def roofline(row: Row, peak_flops: float, peak_bw: float) -> tuple[float, str]:
  """(predicted queries/s per device, the bound that holds: "compute" or "memory") from the
  compiler's per-device FLOPs and bytes: Q_dev / max(flops / peak, bytes / bandwidth)."""
  t_c, t_m = row.flops / peak_flops, row.bytes_accessed / peak_bw
  t = max(t_c, t_m)
  return (row.queries_per_device / t if t > 0 else math.inf), ("compute" if t_c >= t_m
                                                                else "memory")


def table_lines(rows: list[Row]) -> list[str]:
  """A Markdown table of ``rows`` (MiB per device; FLOPs and bytes per device per call)."""
  mib = 2.0 ** 20
  out = ["| config | part | method | N | batch | data×tools | args MiB | out MiB | temp MiB | "
         "total MiB | GFLOP | GB accessed | compile s |",
         "|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
  for r in rows:
    head = (f"| {r.config} | {r.part} | {r.method} | {r.num_tools:,} | {r.batch:,} | "
            f"{r.data_shards}×{r.tool_shards} |")
    if r.error:
      out.append(f"{head} failed: {r.error[:160]} |||||||")
      continue
    out.append(f"{head} {r.argument_bytes / mib:,.1f} | {r.output_bytes / mib:,.2f} | "
               f"{r.temp_bytes / mib:,.1f} | {r.total_bytes / mib:,.1f} | "
               f"{r.flops / 1e9:,.3f} | {r.bytes_accessed / 1e9:,.3f} | {r.compile_s:.1f} |")
  return out
