"""Training-step throughput on 1 and on 8 fake CPU devices (``hyset_jax.training.train``).

Run as a subprocess (``python -m benchmarks.training``) because the fake devices must be set
before JAX starts: ``--xla_force_host_platform_device_count=8``. The 8 fake devices share the
same CPU cores, so this checks that the sharded step runs and what it costs, not a speed-up.

Prints one JSON object: a row per device count, or ``{"status": "not run: …"}``.
"""
from __future__ import annotations

import json
import os
import sys
import time


def rows(device_counts=(1, 8), *, n_tools: int = 2000, dim: int = 384, batch: int = 256,
         repeats: int = 5, seed: int = 0) -> list[dict]:
  """One timed ``train.make_step_fn`` step per device count (the default config's K_neg, M),
  on random tools and queries; a JSON-able row each. Needs max(device_counts) devices."""
  import jax
  import numpy as np

  from hyset_jax.model import parameters
  from hyset_jax.training import batches, sharding, train
  from hyset_jax import config as config_lib

  cfg = config_lib.Config()
  mc, tc = cfg.model, cfg.train
  rng = np.random.default_rng(seed)
  tools = rng.normal(size=(n_tools, dim)).astype(np.float32)
  k_neg, m = tc.k_neg, mc.max_set_size
  members = rng.integers(0, n_tools, size=(batch, k_neg, m)).astype(np.int32)
  sizes = rng.integers(1, m + 1, size=(batch, k_neg))
  host_batch = {
      "query": rng.normal(size=(batch, dim)).astype(np.float32),
      "members": members,
      "mask": np.arange(m)[None, None, :] < sizes[..., None],
      "selected": np.zeros(batch, np.int32),
      "reward": np.ones(batch, np.float32),
      "shortlist": np.zeros((batch, 0), np.int32),   # the exhaustive-shortlist loss is off
  }
  out = []
  for devices in device_counts:
    mesh = sharding.make_mesh(devices)
    optimizer = train.make_optimizer(tc)
    theta = parameters.init_theta(tools, dim, mc, seed=seed)
    state = train.TrainState(theta, optimizer.init(theta))
    step = train.make_step_fn(mesh, mc, tc, optimizer)
    state = jax.device_put(state, sharding.replicated(mesh))
    b = jax.device_put(batches.Batch(**host_batch), sharding.batch_rows(mesh))
    start = time.perf_counter()
    compiled = step.lower(state, b).compile()
    compile_s = time.perf_counter() - start
    mem = compiled.memory_analysis()
    peak = int(mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
               - mem.alias_size_in_bytes)
    state, metrics = compiled(state, b)
    jax.block_until_ready(metrics)
    times = []
    for _ in range(repeats):
      start = time.perf_counter()
      state, metrics = compiled(state, b)
      jax.block_until_ready(metrics)
      times.append(time.perf_counter() - start)
    t = sorted(times)[len(times) // 2]
    out.append({"devices": devices, "batch": batch, "k_neg": k_neg, "n_tools": n_tools,
                "dim": dim, "examples_per_s": batch / t, "step_s": t, "times_s": times,
                "compile_s": compile_s, "peak_bytes_per_device": peak,
                "loss_finite": bool(np.isfinite(float(metrics["loss"])))})
  return out


def main() -> None:
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_force_host_platform_device_count=8").strip()
  print(json.dumps({"status": "ok", "rows": rows()}))


if __name__ == "__main__":
  sys.exit(main())
