"""What the machine can do, measured in the same run as the implementations.

- :func:`matmul_peak_gflops`: the best of a few large f32 matmuls (XLA) — the arithmetic
  peak this run can reach; the arithmetic bound of an implementation is its minimal work per
  query divided by this.
- :func:`write_floor_s`: the time to write an f32 array as large as the scores — the floor
  for any implementation that materialises every score (memory bandwidth, not arithmetic).
- :func:`describe`: CPU model, core count, JAX backend and devices, load average, how memory
  is paged (:mod:`hyset_jax.allocator`).
"""
from __future__ import annotations

import os
import platform
import time

import numpy as np

from hyset_jax import allocator


def _best_time(fn, repeats: int) -> float:
  fn()
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - start)
  return best


def matmul_peak_gflops(n: int = 2048, repeats: int = 5) -> float:
  """GFLOP/s of an n×n×n f32 matmul under XLA (best of ``repeats``)."""
  import jax
  import jax.numpy as jnp

  a = jax.device_put(np.random.default_rng(0).normal(size=(n, n)).astype(np.float32))
  f = jax.jit(lambda x: x @ x)
  t = _best_time(lambda: f(a).block_until_ready(), repeats)
  return 2 * n ** 3 / t / 1e9


def write_floor_s(rows: int, cols: int, repeats: int = 5) -> float:
  """Seconds to write an f32[rows, cols] array once (best of ``repeats``)."""
  import jax
  import jax.numpy as jnp

  f = jax.jit(lambda s: jnp.full((rows, cols), s, jnp.float32))
  s = jax.device_put(np.float32(1.5))
  return _best_time(lambda: f(s).block_until_ready(), repeats)


def _cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def describe() -> dict:
  import jax

  devices = jax.devices()
  info = {"cpu": _cpu_model(), "nproc": os.cpu_count(), "backend": jax.default_backend(),
          "devices": f"{len(devices)} × {devices[0].device_kind}", "jax": jax.__version__,
          "numpy": np.__version__, "python": platform.python_version(),
          "allocator": allocator.describe()}
  try:
    info["load_avg_1m"] = round(os.getloadavg()[0], 2)
  except OSError:
    pass
  return info
