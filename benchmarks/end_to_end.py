"""End-to-end inference latency at the paper's scale (paper Eq. 12-14).

A random library of N = 13,860 tools with d = 768 (unit rows), random symmetric M_2..M_5,
K1 = 15, K_pool = 20, M = 5 (:mod:`hyset_jax.benchmarking.end_to_end`):

- ``prepared``: ``pipeline.predict_prepared`` — what ``hyset predict`` runs: stage 1 as one
  product with P Zᵀ, the neighbour-table expansion, G_m from the precomputed Z M_m, best-only
  stage 2, ranking; next to a dense top-K_pool pass over the same library, timed interleaved;
- ``reference``: ``pipeline.predict`` from θ (full expansion scan, G_m per query), the path
  the issue measured, for the speed-up in the same run;
- encoder included, when the frozen encoder is available: tokenise + encode + predict.
"""
from __future__ import annotations

import statistics
import time

import jax
import numpy as np

from hyset_jax.inference import pipeline
from hyset_jax.benchmarking import end_to_end as e2e

N, D, K1, K_POOL, M = 13_860, 768, 15, 20, 5


def _time(fn, repeats: int) -> list[float]:
  fn()
  out = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    out.append(time.perf_counter() - start)
  return out


def prepared_rows(batches, methods, repeats: int, log, prepared=None) -> list[dict]:
  """Prepared path vs the dense pass, for each (method, batch), on one library."""
  prepared = prepared or e2e.prepared_library(N, D, k_pool=K_POOL, max_size=M)
  log(f"  prepared the library (P Zᵀ, Z M_m, neighbour table) in {prepared[1]:.1f} s")
  rows = []
  for method in methods:
    for batch in batches:
      r = e2e.measure(N, D, batch, k1=K1, k_pool=K_POOL, max_size=M, method=method,
                      repeats=repeats if batch > 1 else 4 * repeats, prepared=prepared)
      r["kind"] = "prepared (hyset predict)"
      log(f"  prepared {r['method']:6s} batch={batch:4d}: {r['ms_per_query']:8.3f} ms/query, dense "
          f"{r['dense_ms_per_query']:.3f} ms/query, ratio {r['ratio_to_dense']:.2f}")
      rows.append(r)
  return rows


def reference_rows(batches, repeats: int, log) -> list[dict]:
  """``pipeline.predict`` from θ: the full expansion scan and per-query G_m."""
  params = e2e.random_params(N, D, M)
  rng = np.random.default_rng(1)
  rows = []
  for batch in batches:
    q = rng.normal(size=(batch, D)).astype(np.float32)
    q = jax.device_put(q / np.linalg.norm(q, axis=1, keepdims=True))
    kw = dict(k1=K1, k_pool=K_POOL, max_size=M)
    compiled = pipeline.predict.lower(params, q, **kw).compile()
    times = _time(lambda: jax.block_until_ready(compiled(params, q)), repeats)
    t = statistics.median(times)
    rows.append({"kind": "reference (predict from θ)", "batch": batch, "times_s": times,
                 "ms_per_query": 1e3 * t / batch, "queries_per_s": batch / t})
    log(f"  reference batch={batch:4d}: {rows[-1]['ms_per_query']:8.3f} ms/query")
  return rows


def encoder_rows(batches, repeats: int, log) -> list[dict] | str:
  """Tokenise + encode + predict (prepared path), or the reason it cannot run here."""
  try:
    from hyset_jax.encoder import load_encoder
    encoder = load_encoder()
  except Exception as e:  # the encoder is optional for this suite: say why it is missing
    return f"not run: the encoder did not load ({type(e).__name__}: {e})"
  prep, _ = e2e.prepared_library(N, encoder.dim, k_pool=K_POOL, max_size=M)
  words = ("find", "weather", "flights", "convert", "currency", "stock", "price", "translate",
           "email", "calendar", "restaurant", "near", "me", "book", "hotel", "in", "paris")
  rng = np.random.default_rng(2)
  rows = []
  for batch in batches:
    texts = [" ".join(rng.choice(words, size=12)) for _ in range(batch)]
    kw = dict(k1=K1, k_pool=K_POOL, max_size=M)

    def run():
      emb = encoder.encode(texts, batch_size=max(1, batch), progress=False)
      return jax.block_until_ready(pipeline.predict_prepared(prep, emb, **kw))

    times = _time(run, repeats)
    enc = _time(lambda: encoder.encode(texts, batch_size=max(1, batch), progress=False), repeats)
    t = statistics.median(times)
    row = {"kind": "encoder included", "batch": batch, "encoder": encoder.name,
           "times_s": times, "ms_per_query": 1e3 * t / batch, "queries_per_s": batch / t,
           "encode_ms_per_query": 1e3 * statistics.median(enc) / batch}
    log(f"  encode+predict batch={batch:4d}: {row['ms_per_query']:8.3f} ms/query "
        f"(encoder alone {row['encode_ms_per_query']:.3f} ms/query)")
    rows.append(row)
  return rows
