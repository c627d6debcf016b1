"""Cost against library size: N = 10³ … 10⁶ tools at d = 256 (K1 = 15, K_pool = 20, M = 5).

For each N, the prepared path (``hyset_jax.benchmarking.end_to_end.measure``) and the dense
top-K_pool pass over the same library, at batch 1 and a batched size. Stage 1 is a dense pass
itself (one [Q, d]×[d, N] product and a top-k), so ``ms_per_query − dense_ms_per_query`` is
what HYSET adds beyond stage 1: the expansion reads K1·W neighbour-table entries, G_m gathers
K rows of Z M_m, and stage 2 is independent of N — it should stay flat.

The neighbour table is built for real up to :data:`BUILD_UP_TO` tools (its N²·d build is timed,
``prepare_s``); above that the rows are random (``table: random``): the query path costs the
same whatever the rows hold, and the build (N²·d = 2.6·10¹⁴ flops at N = 10⁶) would take about
an hour on this CPU.
"""
from __future__ import annotations

import gc

from hyset_jax.benchmarking import end_to_end as e2e

DIM = 256
BUILD_UP_TO = 30_000
SIZES = (1_000, 10_000, 30_000, 100_000, 1_000_000)


def rows(batches=(1, 64), sizes=SIZES, repeats: int = 3, log=print) -> list[dict]:
  out = []
  for n in sizes:
    table = "build" if n <= BUILD_UP_TO else "random"
    prepared = e2e.prepared_library(n, DIM, table=table)
    for batch in batches:
      r = e2e.measure(n, DIM, batch, repeats=repeats, table=table, prepared=prepared)
      r["beyond_stage1_ms_per_query"] = r["ms_per_query"] - r["dense_ms_per_query"]
      out.append(r)
      log(f"  N={n:>9,} batch={batch:3d} ({table} table, prepare {r['prepare_s']:.1f} s): "
          f"{r['ms_per_query']:.3f} ms/query, dense {r['dense_ms_per_query']:.3f}, beyond "
          f"stage 1 {r['beyond_stage1_ms_per_query']:.3f}")
    del prepared
    gc.collect()
  return out
