"""The shortlist a training step draws its shortlist negatives from, against library size.

  python -m benchmarks.train_shortlist                       # N = 10³, 10⁴, 10⁵
  python -m benchmarks.train_shortlist --sizes 10000 --repeats 5 --tag quick

Every step of a preset with shortlist negatives (``train.shortlist_negatives``) or the
exhaustive loss runs stage 1 and the complementarity expansion (Eq. 13) for its whole batch
under the current θ. Measured here, on one batch of B = 256 queries that share their stage-1
tools as a training batch's do (drawn around 40 centres), d = 384, K1 = 15, K_pool = 20, M = 3:

- ``scan``: :func:`hyset_jax.inference.pipeline.shortlist`, jitted — the expansion scans every
  tool against every (query, S0 tool) slot, 2·B·K1·N·d flops (what training ran before
  2026-12-05);
- ``distinct``: :func:`hyset_jax.inference.pipeline.shortlist_distinct` — the scan reads each
  distinct S0 tool of the batch once (what training runs now); the same tools (checked);
- ``threshold``: the expansion's selection alone (:func:`pipeline._select_expansion`) with the
  threshold's top-k from the backend (:func:`pipeline.top_indices`: on a CPU the native kernel,
  what training and the prepared path run) against XLA's top_k (what the exports trace; on a CPU
  XLA fuses it into the comparisons that read the threshold and sorts every row in full).

Times are medians of ``--repeats`` calls after a warm-up; what to read is each ratio, measured
in the same run. Writes ``benchmarks/results/train_shortlist_<tag>.{json,md}``.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import numpy as np

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "results"
SIZES = (1_000, 10_000, 100_000)
B, D, K1, K_POOL, M, CENTRES = 256, 384, 15, 20, 3, 40


def _median_s(fn, repeats: int) -> float:
  import jax
  jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return float(np.median(times))


def row(n: int, repeats: int, seed: int = 0) -> dict:
  import functools
  import jax
  import jax.numpy as jnp
  from hyset_jax.inference import pipeline
  from hyset_jax.model.scoring import HysetParams
  rng = np.random.default_rng(seed)
  z = rng.normal(size=(n, D)).astype(np.float32) / np.sqrt(D)
  u = rng.normal(size=(M - 1, D, 8))
  params = HysetParams(jnp.asarray(z), jnp.eye(D, dtype=jnp.float32),
                       jnp.asarray(np.einsum("mdr,mer->mde", u, u) * 0.05, jnp.float32))
  centres = rng.normal(size=(CENTRES, D))
  q = jnp.asarray(centres[rng.integers(CENTRES, size=B)] + 0.3 * rng.normal(size=(B, D)),
                  jnp.float32)
  scan = jax.jit(pipeline.shortlist, static_argnames=("k1", "k_pool", "max_size"))
  kw = dict(k1=K1, k_pool=K_POOL, max_size=M)
  want = np.asarray(scan(params, q, **kw).tools)
  got = np.asarray(pipeline.shortlist_distinct(params, q, **kw).tools)
  if not np.array_equal(want, got):
    raise AssertionError(f"N = {n}: shortlist_distinct differs from shortlist")
  g = jnp.asarray(rng.normal(size=(B, n)), jnp.float32)
  logits = jnp.asarray(rng.normal(size=(B, n)), jnp.float32)
  s0 = jnp.asarray(want[:, :K1])
  select = functools.partial(pipeline._select_expansion, n_ext=K_POOL - K1, allowed=None)
  kept = jax.jit(functools.partial(select, top=pipeline.top_indices))
  fused = jax.jit(select)
  if not np.array_equal(kept(g, logits, s0), fused(g, logits, s0)):
    raise AssertionError(f"N = {n}: the selection differs between the two top-k")
  out = {"tools": n, "distinct_s0_tools": int(len(np.unique(want[:, :K1]))),
         "scan_s": _median_s(lambda: scan(params, q, **kw).tools, repeats),
         "distinct_s": _median_s(lambda: pipeline.shortlist_distinct(params, q, **kw).tools,
                                 repeats),
         "selection_xla_top_k_s": _median_s(lambda: fused(g, logits, s0), repeats),
         "selection_backend_top_k_s": _median_s(lambda: kept(g, logits, s0), repeats)}
  out["distinct_speedup"] = out["scan_s"] / out["distinct_s"]
  out["selection_speedup"] = out["selection_xla_top_k_s"] / out["selection_backend_top_k_s"]
  return out


def markdown(doc: dict) -> str:
  prov = doc["provenance"]
  lines = ["# The training batch's shortlist", "",
           f"`{prov['command']}` — {prov['date']}, {prov['machine']}; B = {B}, d = {D}, "
           f"K1 = {K1}, K_pool = {K_POOL}, M = {M}; medians of repeated calls; the ratios are "
           "what to read.", "",
           "| N | distinct S0 tools of 3,840 slots | scan s | distinct s | speed-up | "
           "selection, XLA top-k s | backend top-k s | speed-up |",
           "|---|---|---|---|---|---|---|---|"]
  for r in doc["rows"]:
    lines.append(f"| {r['tools']:,} | {r['distinct_s0_tools']:,} | {r['scan_s']:.4f} | "
                 f"{r['distinct_s']:.4f} | {r['distinct_speedup']:.1f}× | "
                 f"{r['selection_xla_top_k_s']:.4f} | {r['selection_backend_top_k_s']:.4f} | "
                 f"{r['selection_speedup']:.1f}× |")
  return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
  from hyset_jax import cli, io_utils
  from hyset_jax.errors import UserError
  from benchmarks import provenance
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--tag", default="cpu")
  p.add_argument("--results", default=str(RESULTS), help="existing folder for the result files")
  p.add_argument("--force", action="store_true", help="replace existing result files")

  def run(args) -> int:
    if args.repeats < 1 or any(n < K_POOL + 1 for n in args.sizes):
      raise UserError(f"--repeats must be ≥ 1 and every size > K_pool = {K_POOL}")
    stem = pathlib.Path(args.results) / f"train_shortlist_{args.tag}"
    outs = [stem.with_suffix(".json"), stem.with_suffix(".md")]
    for path in outs:
      io_utils.output_file(path, args.force, flag="--results/--tag")
    rows = []
    for n in args.sizes:
      rows.append(row(n, args.repeats))
      r = rows[-1]
      print(f"N = {n:,}: scan {r['scan_s']:.3f} s, distinct {r['distinct_s']:.3f} s "
            f"({r['distinct_speedup']:.1f}×); selection {r['selection_speedup']:.1f}× faster "
            "with the backend's top-k", flush=True)
    doc = provenance.with_provenance({"rows": rows})
    with io_utils.atomic_write(outs[0]) as f:
      f.write(json.dumps(doc, indent=1) + "\n")
    with io_utils.atomic_write(outs[1]) as f:
      f.write(markdown(doc))
    print(f"wrote {outs[0]} and {outs[1]}")
    return 0

  p.set_defaults(func=run)
  return cli.run(p, argv)


if __name__ == "__main__":
  sys.exit(main())
