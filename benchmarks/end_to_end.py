"""End-to-end inference latency at the paper's scale (design.md §3, paper Eq. 12-14).

A random library of N = 13,860 tools with d = 768 (unit rows), random symmetric M_2..M_5,
K1 = 15, K_pool = 20, M = 5: stage 1 (ℓ for every tool, top K1), complementarity expansion
(g over every tool), pair matrices, exhaustive stage 2, greedy ranking — ``inference.predict``,
one jitted call. Timed from query embeddings ("encoder excluded") and, when the frozen encoder
is available, from query text ("encoder included": tokenise + encode + predict).
"""
from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from hyset_jax import enumeration, inference
from hyset_jax.scoring import HysetParams

N, D, K1, K_POOL, M = 13_860, 768, 15, 20, 5


def random_params(query_dim: int = D, seed: int = 0) -> HysetParams:
  rng = np.random.default_rng(seed)
  z = rng.normal(size=(N, D)).astype(np.float32)
  z /= np.linalg.norm(z, axis=1, keepdims=True)
  if query_dim == D:
    p = np.eye(D, dtype=np.float32)
  else:  # a length-preserving random map, as model.init_params uses for d_r ≠ d_z
    p = np.linalg.qr(rng.normal(size=(D, query_dim)))[0].T.astype(np.float32)
  m = rng.normal(scale=0.1, size=(M - 1, D, D)).astype(np.float32)
  return HysetParams(*jax.device_put((z, p, (m + m.transpose(0, 2, 1)) / 2)))


def _time(fn, repeats: int) -> list[float]:
  fn()
  out = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    out.append(time.perf_counter() - start)
  return out


def _row(kind: str, batch: int, times: list[float], method: str, **extra) -> dict:
  t = statistics.median(times)
  return {"kind": kind, "batch": batch, "method": method, "time_s": t, "times_s": times,
          "ms_per_query": 1e3 * t / batch, "queries_per_s": batch / t, **extra}


def predict_rows(batches, methods, repeats: int, log) -> list[dict]:
  params = random_params()
  rng = np.random.default_rng(1)
  rows = []
  for method in methods:
    for batch in batches:
      q = rng.normal(size=(batch, D)).astype(np.float32)
      q = jax.device_put(q / np.linalg.norm(q, axis=1, keepdims=True))
      kw = dict(k1=K1, k_pool=K_POOL, max_size=M, method=method)
      start = time.perf_counter()
      compiled = inference.predict.lower(params, q, **kw).compile()
      compile_s = time.perf_counter() - start
      mem = compiled.memory_analysis()
      peak = int(mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
                 - mem.alias_size_in_bytes)
      times = _time(lambda: jax.block_until_ready(compiled(params, q)),
                    repeats if batch > 1 else 4 * repeats)
      row = _row("encoder excluded", batch, times, method, compile_s=compile_s, peak_bytes=peak,
                 peak_source="xla buffer assignment (includes the 42 MB library)")
      log(f"  predict {method:6s} batch={batch:4d}: {row['ms_per_query']:8.3f} ms/query "
          f"({row['queries_per_s']:,.0f} q/s), compile {compile_s:.1f} s, peak {peak / 2**20:.0f} MiB")
      rows.append(row)
  return rows


def encoder_rows(batches, repeats: int, log) -> list[dict] | str:
  """Tokenise + encode + predict, or the reason it cannot run here."""
  try:
    from hyset_jax.encoder import load_encoder
    encoder = load_encoder()
  except Exception as e:  # the encoder is optional for this suite: say why it is missing
    return f"not run: the encoder did not load ({type(e).__name__}: {e})"
  params = random_params(query_dim=encoder.dim)
  words = ("find", "weather", "flights", "convert", "currency", "stock", "price", "translate",
           "email", "calendar", "restaurant", "near", "me", "book", "hotel", "in", "paris")
  rng = np.random.default_rng(2)
  rows = []
  method = enumeration.DEFAULT_METHOD
  for batch in batches:
    texts = [" ".join(rng.choice(words, size=12)) for _ in range(batch)]
    kw = dict(k1=K1, k_pool=K_POOL, max_size=M, method=method)

    def run():
      emb = encoder.encode(texts, batch_size=max(1, batch), progress=False)
      return jax.block_until_ready(inference.predict(params, emb, **kw))

    times = _time(run, repeats)
    enc = _time(lambda: encoder.encode(texts, batch_size=max(1, batch), progress=False), repeats)
    row = _row("encoder included", batch, times, method, encoder=encoder.name,
               encode_ms_per_query=1e3 * statistics.median(enc) / batch)
    log(f"  encode+predict batch={batch:4d}: {row['ms_per_query']:8.3f} ms/query "
        f"(encoder alone {row['encode_ms_per_query']:.3f} ms/query)")
    rows.append(row)
  return rows
