"""Devices, processes and global arrays: the mesh, ``jax.distributed`` setup, which batch rows
a process supplies, θ's named shardings, the top-k over tool shards, and the few cross-process
collectives the loop needs.

Like big_vision's ``sharding.py`` and MaxText's ``utils/sharding.py``: the training loop names
axes and shardings, and this module turns them into devices. The mesh is 2-D, (``data``,
``tools``): batch rows split on ``data``; Z (f32[N, d_z]), its optimiser state and every per-tool
product split on ``tools``; P, M_m and the query tower replicated. Arrays name their axes
logically (``tool``, ``batch``, …) and :data:`LOGICAL_RULES` maps them to mesh axes, as MaxText's
``logical_axis_rules`` does, so changing what is sharded is a one-line change here. ``jax.pmap``
is not used; the train step is one ``jax.jit`` over the named ``Mesh`` (GSPMD partitions it).
"""
from __future__ import annotations

import math
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from hyset_jax.errors import UserError

DATA_AXIS = "data"
TOOLS_AXIS = "tools"
MESH_AXES = (DATA_AXIS, TOOLS_AXIS)

# Logical axis -> mesh axis; a logical axis not named here is replicated.
LOGICAL_RULES = {"batch": DATA_AXIS, "tool": TOOLS_AXIS}
# The logical axes of θ's trained leaves (model.init_theta's keys). The optimiser state mirrors
# θ's dict (Adam's mu and nu hold a "z" leaf too), so a leaf is named by the last dict key on its
# path. Leaves not named here (P, M_m, the tower, step counters) are replicated.
PARAM_AXES = {"z": ("tool", "embed")}


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


def mesh_shape(data: int, tools: int, num_devices: int) -> tuple[int, int]:
  """(data, tools) with a -1 resolved to the rest of ``num_devices``; UserError if it does not
  tile them (``mesh.data`` × ``mesh.tools`` must equal the device count)."""
  if tools == -1:
    tools = num_devices // data if data > 0 and num_devices % data == 0 else 0
  if data == -1:
    data = num_devices // tools if tools > 0 and num_devices % tools == 0 else 0
  if data < 1 or tools < 1 or data * tools != num_devices:
    raise UserError(f"mesh.data × mesh.tools must equal the {num_devices} devices of this job "
                    f"(-1 = the rest), got mesh.data={data or '?'} mesh.tools={tools or '?'}")
  return data, tools


def make_mesh(num_devices: int | None = None, data: int = -1, tools: int = 1,
              devices=None) -> jax.sharding.Mesh:
  """The (``data``, ``tools``) mesh over the first ``num_devices`` of ``devices`` (default: every
  device of every process). Axes are ``Auto``: GSPMD propagates the shardings we name.

  ``jax.make_mesh`` orders the devices for the hardware's topology (TPU rings); on CPU and GPU it
  keeps ``jax.devices()`` order, so each process's devices are adjacent along ``data``.
  """
  devices = list(jax.devices() if devices is None else devices)
  if num_devices is not None:
    devices = devices[:num_devices]
  shape = mesh_shape(data, tools, len(devices))
  return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * 2, devices=devices)


def axis_size(mesh, axis: str) -> int:
  """The size of mesh axis ``axis`` (1 when the mesh has no such axis or there is no mesh)."""
  return 1 if mesh is None or mesh.empty else dict(mesh.shape).get(axis, 1)


def tools_shards(num_tools: int) -> int:
  """How many ``tools`` shards the context mesh splits N tools into: its ``tools`` axis size,
  or 1 when there is none or N does not divide evenly (then the tools are not split)."""
  t = axis_size(jax.sharding.get_abstract_mesh(), TOOLS_AXIS)
  return 1 if num_tools % t else t


def logical_spec(axes) -> PartitionSpec:
  """A PartitionSpec for an array whose axes are named ``axes`` (LOGICAL_RULES)."""
  return PartitionSpec(*(LOGICAL_RULES.get(a) for a in axes))


def _leaf_name(path) -> str | None:
  names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
  return names[-1] if names else None


def state_shardings(tree, mesh: jax.sharding.Mesh):
  """NamedShardings for a pytree holding θ's trained leaves (θ, its optimiser state, a train
  state; arrays or ShapeDtypeStructs): PARAM_AXES by leaf name, everything else replicated."""
  def one(path, leaf):
    axes = PARAM_AXES.get(_leaf_name(path))
    if axes is None or len(getattr(leaf, "shape", ())) != len(axes):
      return NamedSharding(mesh, PartitionSpec())
    return NamedSharding(mesh, logical_spec(axes))
  return jax.tree_util.tree_map_with_path(one, tree)


def check_tool_rows(num_tools: int, mesh: jax.sharding.Mesh) -> None:
  """Z's rows must split evenly over ``tools`` (JAX shards only evenly divisible axes)."""
  t = axis_size(mesh, TOOLS_AXIS)
  if num_tools % t:
    fits = [d for d in range(t, 0, -1) if num_tools % d == 0 and mesh.size % d == 0]
    raise UserError(f"the library's {num_tools} tools do not split evenly over mesh.tools={t}; "
                    f"use a mesh.tools that divides {num_tools} (e.g. {fits[0]})")


def per_device_bytes(tree, shardings=None) -> int:
  """Bytes one device holds of ``tree`` (arrays or ShapeDtypeStructs with shardings)."""
  leaves = jax.tree.leaves(tree)
  shards = jax.tree.leaves(shardings) if shardings is not None else \
      [getattr(x, "sharding", None) for x in leaves]
  total = 0
  for x, s in zip(leaves, shards):
    shape = s.shard_shape(x.shape) if s is not None else x.shape
    total += math.prod(shape) * np.dtype(x.dtype).itemsize
  return total


def top_k(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
  """``jax.lax.top_k`` over the last (tool) axis, per ``tools`` shard then merged.

  Under a context mesh (``jax.set_mesh``) with a ``tools`` axis of size T > 1 and N % T == 0,
  each shard takes the top min(k, N/T) of its own N/T tools, the T candidate lists are gathered
  (T·k values, not N) and a last top-k picks the winners. Candidates are gathered in shard order
  and ``lax.top_k`` prefers the earlier position on ties, so values *and* indices (ties to the
  lower tool row) equal ``jax.lax.top_k(x, k)`` exactly. Without such a mesh it is
  ``jax.lax.top_k``. Leading axes are computed on every shard (they are small: queries, gold
  members).

  Args:
    x: f[..., N].
    k: ≤ N.

  Returns:
    (values f[..., k], indices int32[..., k]), replicated.
  """
  mesh = jax.sharding.get_abstract_mesh()
  n = x.shape[-1]
  t = tools_shards(n)
  if t == 1:
    return jax.lax.top_k(x, k)
  local = n // t
  spec = PartitionSpec(*([None] * (x.ndim - 1)), TOOLS_AXIS)

  def per_shard(xs):
    v, i = jax.lax.top_k(xs, min(k, local))
    i = i + jax.lax.axis_index(TOOLS_AXIS) * local
    v = jax.lax.all_gather(v, TOOLS_AXIS, axis=x.ndim - 1, tiled=True)   # [..., T·k]
    i = jax.lax.all_gather(i, TOOLS_AXIS, axis=x.ndim - 1, tiled=True)
    best_v, j = jax.lax.top_k(v, k)
    return best_v, jnp.take_along_axis(i, j, axis=-1).astype(jnp.int32)

  return jax.shard_map(per_shard, mesh=mesh, in_specs=spec,
                       out_specs=(PartitionSpec(), PartitionSpec()), check_vma=False)(x)


def replicated(mesh: jax.sharding.Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def batch_rows(mesh: jax.sharding.Mesh) -> NamedSharding:
  """Leading (batch) axis split over ``data``."""
  return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def process_rows(sharding: NamedSharding, global_rows: int) -> list[int]:
  """The global batch rows this process supplies: the union of its devices' shards, which
  for a 1-D ``data`` mesh over ``jax.devices()`` is one contiguous block per process."""
  rows = sorted({i for idx in sharding.addressable_devices_indices_map((global_rows,)).values()
                 for i in range(global_rows)[idx[0]]})
  if rows != list(range(rows[0], rows[0] + len(rows))):
    raise UserError(f"this process's devices hold non-contiguous batch rows {rows[:8]}…; "
                    f"use a mesh whose process-local devices are adjacent")
  return rows


def global_batch(local: dict[str, np.ndarray], sharding: NamedSharding,
                 global_rows: int) -> dict[str, jax.Array]:
  """Each process's rows of a batch (a dict of host arrays) as global arrays under ``sharding``."""
  return {k: jax.make_array_from_process_local_data(sharding, v, (global_rows,) + v.shape[1:])
          for k, v in local.items()}


def to_host(tree):
  """``tree``'s arrays as NumPy on every process, gathering shards other processes hold (a Z
  sharded over ``tools`` across hosts). A collective when it gathers: call it on every process."""
  def one(x):
    if isinstance(x, jax.Array) and not (x.is_fully_addressable or x.is_fully_replicated):
      from jax.experimental import multihost_utils
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)
  return jax.tree.map(one, tree)


def from_first_process(x):
  """``x`` as process 0 has it, on every process (identity for a single process).

  θ is replicated, so every process must start from the same Z: encoders on different hosts
  may differ in the last bits.
  """
  if jax.process_count() == 1:
    return x
  from jax.experimental import multihost_utils
  return multihost_utils.broadcast_one_to_all(x)


def first_process_decides(verdict: bool) -> bool:
  """Process 0's verdict on every process, so processes never disagree (and leave one hanging)."""
  return bool(from_first_process(np.int32(verdict)))


def barrier(name: str) -> None:
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)
