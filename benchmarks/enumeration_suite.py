"""Subset enumeration side by side (main table) and the sweeps over batch, K_pool, M and dim."""
from __future__ import annotations

import gc
import math
import time

from hyset_jax.inference import subsets
from hyset_jax.benchmarking import runners, workload

# The incidence-matmul form bakes C(K,2) × C(K,M) constants into the program; past this size
# (K = 30, M = 5 would need 250 MB) it is not run.
MAX_INCIDENCE_BYTES = 64 << 20


def _incidence_bytes(k_pool: int, max_size: int) -> int:
  return 4 * (math.comb(k_pool, 2) + k_pool) * subsets.count_subsets(k_pool, max_size)


def run_one(impl: str, w: workload.Workload, repeats: int, log, output: str = "scores") -> dict:
  if impl.startswith("jax-matmul") and _incidence_bytes(w.k_pool, w.max_size) > MAX_INCIDENCE_BYTES:
    row = {"impl": impl, **w.settings(), "output": output,
           "status": "not run: incidence matrices over 64 MB"}
  else:
    start = time.perf_counter()
    m = runners.measure(impl, w, repeats=repeats, output=output)
    row = m.to_json()
    row["wall_s"] = time.perf_counter() - start
  row["min_flops_per_query"] = workload.min_flops_per_query(w.k_pool, w.max_size)
  if row["status"] == "ok":
    log(f"  {impl:16s} {output:6s} K={w.k_pool:2d} M={w.max_size} batch={w.batch:5d} dim={w.dim:3d}: "
        f"{row['queries_per_s']:12,.0f} q/s  compile {row['compile_s'] or 0:5.2f} s")
  else:
    log(f"  {impl:16s} {row['status']}")
  gc.collect()
  return row


def main_table(impls, batch: int, naive_batch: int, repeats: int, log,
               output: str = "scores") -> list[dict]:
  """Every implementation at the paper's K_pool = 20, M = 5 (the naive loop on a few queries)."""
  rows = []
  for impl in impls:
    b = naive_batch if impl == "naive" else batch
    rows.append(run_one(impl, workload.make_workload(20, 5, b, 0, seed=0),
                        1 if impl == "naive" else repeats, log, output))
  return rows


def sweep(name: str, values, impls, make, repeats: int, log, limit=None,
          output: str = "scores") -> list[dict]:
  """Run ``impls`` for each value; ``make(value)`` gives the workload; ``limit(impl, value)``
  says whether to skip (to bound the time of slow implementations)."""
  log(f"sweep over {name}")
  rows = []
  for v in values:
    w = make(v)
    for impl in impls:
      if limit is not None and not limit(impl, v):
        continue
      row = run_one(impl, w, repeats, log, output)
      row["sweep"], row["value"] = name, v
      rows.append(row)
    del w
  return rows
