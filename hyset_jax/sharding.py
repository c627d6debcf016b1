"""Devices, processes and global arrays: the mesh, ``jax.distributed`` setup, which batch rows
a process supplies, and the few cross-process collectives the loop needs.

Like big_vision's ``sharding.py`` and MaxText's ``utils/sharding.py``: the training loop names
axes (``data``) and shardings, and this module turns them into devices. ``jax.pmap`` is not
used; the train step is one ``jax.jit`` over a named ``Mesh``.
"""
from __future__ import annotations

import os

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from hyset_jax.errors import UserError

DATA_AXIS = "data"


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
  return jax.sharding.Mesh(np.asarray(devices), (DATA_AXIS,))


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
