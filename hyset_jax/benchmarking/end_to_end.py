"""End-to-end latency of the prepared inference path against a dense pass, in one run.

``measure`` builds a random library (N unit tools of dimension d, P = I, random symmetric
M_2..M_M of scale 0.1 — trained-model scale), prepares it (P Zᵀ, Z M_m, the neighbour table),
and times from query embeddings ("encoder excluded"):

- ``pipeline.predict_prepared``: stage 1, expansion, G_m, best-only stage 2, the ranking;
- the dense pass over the same library: ℓ for every tool and its top K_pool — what a plain
  dense retriever does, 2·N·d flops per query — its top-k by the same backend as stage 1's.

Both are jitted, compiled before timing, and timed back to back on the same queries; the
ratio is the number to read on a shared machine. ``breakdown=True`` also times the pipeline's
prefixes — stage 1 (query tower, P Zᵀ, top-K1), + the expansion, + the pair matrices G_m —
interleaved with the other two, so each stage's cost is the difference of two prefixes
measured in the same run (separately compiled programs: XLA may fuse a prefix differently
from the whole, and on a shared machine a difference can come out slightly negative).

``table="random"`` replaces the neighbour table by random rows (same shapes, no ties): the
query path costs the same whatever the rows hold, and building the real table (N²·d flops) is
out of reach at N = 10⁶ on a CPU.
"""
from __future__ import annotations

import statistics
import time
from typing import Literal

import numpy as np


def random_params(num_tools: int, dim: int, max_size: int, seed: int = 0):
  """HysetParams of a random library: unit rows, P = I, symmetric M_m of scale 0.1."""
  import jax

  from hyset_jax.model.scoring import HysetParams
  rng = np.random.default_rng(seed)
  z = rng.standard_normal((num_tools, dim), dtype=np.float32)
  z /= np.linalg.norm(z, axis=1, keepdims=True)
  m = rng.normal(scale=0.1, size=(max_size - 1, dim, dim)).astype(np.float32)
  return jax.device_put(HysetParams(tool_embeddings=z, projection=np.eye(dim, dtype=np.float32),
                                    interactions=(m + m.transpose(0, 2, 1)) / 2))


def random_table(num_tools: int, width: int, seed: int = 0):
  """A neighbour table of random rows for timing only: per row W distinct tools other than
  the row's own (strictly increasing offsets below N), descending scores — so, like a real
  table, a row holds no duplicates and no boundary tie sends a batch to the full scan."""
  import jax

  from hyset_jax.inference.neighbors import NeighborTable
  rng = np.random.default_rng(seed)
  steps = rng.integers(1, max(2, num_tools // width), (num_tools, width))
  ids = ((np.arange(num_tools)[:, None] + np.cumsum(steps, axis=1)) % num_tools).astype(np.int32)
  scores = -np.sort(-rng.random((num_tools, width), dtype=np.float32), axis=1) - 1.0
  return NeighborTable(*jax.device_put((ids, scores)))


def _time(fn, repeats: int, min_sample_s: float = 0.05) -> list[float]:
  """Per-call seconds: ``repeats`` samples, each as many calls as last ≥ min_sample_s."""
  fn()
  start = time.perf_counter()
  fn()
  calls = max(1, int(np.ceil(min_sample_s / max(time.perf_counter() - start, 1e-6))))
  out = []
  for _ in range(repeats):
    start = time.perf_counter()
    for _ in range(calls):
      fn()
    out.append((time.perf_counter() - start) / calls)
  return out


def prepared_library(num_tools: int, dim: int, *, k_pool: int = 20, max_size: int = 5,
                     seed: int = 0, table: Literal["build", "random"] = "build",
                     precision: str = "f32"):
  """(PreparedModel of a random library, seconds :func:`pipeline.prepare` took);
  ``precision``: the products' dtype (:func:`pipeline.prepare`)."""
  import jax

  from hyset_jax.inference import pipeline, neighbors
  params = random_params(num_tools, dim, max_size, seed)
  start = time.perf_counter()
  prep = pipeline.prepare(params, max_size=max_size, k_pool=k_pool,
                           neighbor_table=table == "build", precision=precision)
  jax.block_until_ready(prep)
  prepare_s = time.perf_counter() - start
  if table == "random":
    prep = prep._replace(neighbors=random_table(
        num_tools, neighbors.width_for(k_pool, num_tools), seed))
  return prep, prepare_s


def measure(num_tools: int = 13_860, dim: int = 768, batch: int = 1, *, k1: int = 15,
            k_pool: int = 20, max_size: int = 5, method: str | None = None,
            ranking: str | None = None, repeats: int = 5, seed: int = 0,
            table: Literal["build", "random"] = "build", prepared=None, log=None,
            breakdown: bool = False, precision: str = "f32") -> dict:
  """Time predict_prepared and the dense pass (see the module docstring); a JSON-able dict.
  ``prepared``: (PreparedModel, prepare_s) of :func:`prepared_library`, to reuse one library.
  ``breakdown``: also time the prefixes; adds ``stages_ms_per_query`` (stage1, expansion,
  pair_matrices, stage2 — the last is the rest: enumeration and ranking). ``precision``: the
  prepared products' dtype (:func:`pipeline.prepare`); the dense pass multiplies in it too."""
  import jax

  from hyset_jax import choices
  from hyset_jax.inference import enumeration, pipeline, subsets
  # Record the implementation that runs ("auto" names none).
  method = enumeration.resolve_method(method or choices.DEFAULT_METHOD, k_pool, max_size)
  ranking = ranking or pipeline.DEFAULT_RANKING
  subsets.validate_sizes(k_pool, max_size, k1=k1, num_tools=num_tools)
  log = log or (lambda msg: None)
  prep, prepare_s = prepared or prepared_library(num_tools, dim, k_pool=k_pool,
                                                 max_size=max_size, seed=seed, table=table,
                                                 precision=precision)
  log(f"prepared N={num_tools} d={dim} in {prepare_s:.1f} s (table: {table})")
  rng = np.random.default_rng(seed + 1)
  q = rng.standard_normal((batch, dim), dtype=np.float32)
  q = jax.device_put(q / np.linalg.norm(q, axis=1, keepdims=True))
  kw = dict(k1=k1, k_pool=k_pool, max_size=max_size, method=method, ranking=ranking)
  start = time.perf_counter()
  compiled = pipeline.predict_prepared.lower(prep, q, **kw).compile()
  compile_s = time.perf_counter() - start
  # The dense pass is stage 1 with K_pool for K1 (the same product, layout and top-k), so the
  # ratio compares the two pipelines, not two implementations of a dense pass.
  dense = jax.jit(lambda p, x: pipeline.stage1_prepared(p, x, k_pool, method)[1]
                  ).lower(prep, q).compile()
  prefixes = _prefixes(prep, q, k1, k_pool, method) if breakdown else {}
  # Interleave them all so a change in machine load hits each alike.
  t_hyset, t_dense, t_prefix = [], [], {name: [] for name in prefixes}
  for _ in range(repeats):
    t_hyset += _time(lambda: jax.block_until_ready(compiled(prep, q)), 1)
    t_dense += _time(lambda: jax.block_until_ready(dense(prep, q)), 1)
    for name, fn in prefixes.items():
      t_prefix[name] += _time(lambda fn=fn: jax.block_until_ready(fn(prep, q)), 1)
  ms = 1e3 * statistics.median(t_hyset) / batch
  dense_ms = 1e3 * statistics.median(t_dense) / batch
  extra = {}
  if breakdown:
    cum = {name: 1e3 * statistics.median(t) / batch for name, t in t_prefix.items()}
    extra["stages_ms_per_query"] = {
        "stage1": cum["stage1"], "expansion": cum["shortlist"] - cum["stage1"],
        "pair_matrices": cum["pairs"] - cum["shortlist"], "stage2": ms - cum["pairs"]}
  return {**extra, "kind": "encoder excluded", "num_tools": num_tools, "dim": dim,
          "batch": batch, "k1": k1, "k_pool": k_pool, "max_size": max_size, "method": method,
          "ranking": ranking, "seed": seed, "repeats": repeats, "table": table,
          "precision": prep.precision,
          "ms_per_query": ms, "dense_ms_per_query": dense_ms, "ratio_to_dense": ms / dense_ms,
          "queries_per_s": 1e3 / ms, "times_s": t_hyset, "dense_times_s": t_dense,
          "compile_s": compile_s, "prepare_s": prepare_s}


def _prefixes(prep, q, k1: int, k_pool: int, method: str) -> dict:
  """Compiled prefixes of predict_prepared: stage 1, + expansion (the shortlist), + G_m."""
  import jax

  from hyset_jax.inference import pipeline

  def stage1(p, x):
    return pipeline.stage1_prepared(p, x, k1, method)[1]   # ℓ stays inside, as in the whole

  def shortlist(p, x):
    return pipeline.shortlist_prepared(p, x, k1, k_pool, method)

  def pairs(p, x):
    return pipeline.pair_matrices_prepared(p, x, shortlist(p, x).tools, method)
  return {name: jax.jit(fn).lower(prep, q).compile()
          for name, fn in (("stage1", stage1), ("shortlist", shortlist), ("pairs", pairs))}
