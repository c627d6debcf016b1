"""``hyset bench enumerate``: subset-enumeration throughput of one implementation.

  hyset bench enumerate [--k-pool 20] [--max-size 5] [--batch 1024] [--dim 0]
                        [--impl jax] [--repeats 5] [--seed 0] [--check] [--json FILE]

Scores every subset (1 ≤ |E| ≤ M) of a K-tool shortlist for a batch of random queries and
reports queries/s, subsets/s, compile time, peak memory and the settings. ``--dim 0`` times the
enumeration alone from ℓ and G_m; ``--dim D`` also builds them from D-dimensional embeddings.
Implementations: the JAX forms (``jax`` is the library default), the NumPy reference and its
matmul variant, PyTorch (when installed) and a naive Python loop. The full side-by-side suite
with sweeps and plots is ``python -m benchmarks.run_all`` in the repository.

JSON (docs/contracts.md): ``queries_per_s``, ``subsets_per_s``, ``time_s`` (median seconds per
batch, so queries_per_s × time_s = batch), ``times_s``, ``compile_s``, ``peak_bytes``,
``impl``, ``method``, ``k_pool``, ``max_size``, ``batch``, ``dim``, ``seed``, ``repeats``,
``n_subsets``, ``min_flops_per_query``, ``machine``.
"""
from __future__ import annotations

import argparse
import json

from hyset_jax.commands import int_at_least
from hyset_jax.errors import UserError

_IMPLS = ("jax", "jax-gather", "jax-colex", "jax-matmul", "jax-matmul-bf16",
          "jax-gather-subset-major", "numpy", "numpy-matmul", "torch", "naive")


_positive = int_at_least(1)
_non_negative = int_at_least(0)


def add_parser(subparsers) -> None:
  p = subparsers.add_parser("bench", help="benchmark subset enumeration",
                            description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = p.add_subparsers(dest="bench_command", required=True, metavar="WHAT")
  e = sub.add_parser("enumerate", help="score every subset of a shortlist for random queries",
                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  e.add_argument("--k-pool", type=_positive, default=20, help="shortlist size K (default 20)")
  e.add_argument("--max-size", type=_positive, default=5, help="largest set size M (default 5)")
  e.add_argument("--batch", type=_positive, default=1024, help="queries per call (default 1024)")
  e.add_argument("--dim", type=_non_negative, default=0,
                 help="embedding dimension; 0 (default) times the enumeration alone")
  e.add_argument("--impl", choices=_IMPLS, default="jax",
                 help="implementation (default: jax, the library's default method)")
  e.add_argument("--repeats", type=_positive, default=5, help="timed samples (default 5)")
  e.add_argument("--seed", type=int, default=0,
                 help="seed of the random queries and tool embeddings (default 0)")
  e.add_argument("--check", action="store_true",
                 help="also compare the scores of the first 8 queries with the NumPy reference")
  e.add_argument("--json", metavar="FILE", help="write the result as JSON")
  e.add_argument("--force", action="store_true", help="overwrite the --json FILE if it exists")
  e.set_defaults(func=run_enumerate)


def run_enumerate(args: argparse.Namespace) -> int:
  import numpy as np

  from hyset_jax import enumeration
  from hyset_jax.benchmarking import hardware, references, runners, workload

  from hyset_jax import io_utils

  if args.json:
    io_utils.output_file(args.json, args.force, flag="--json")
  enumeration.validate_sizes(args.k_pool, args.max_size)
  n = enumeration.count_subsets(args.k_pool, args.max_size)
  check_memory(args.k_pool, args.max_size, args.batch, n)
  if args.impl == "naive":
    estimate_naive(args.batch, n, args.repeats)
  w = workload.make_workload(args.k_pool, args.max_size, args.batch, args.dim, args.seed)
  m = runners.measure(args.impl, w, repeats=args.repeats)
  out = m.to_json()
  out["min_flops_per_query"] = workload.min_flops_per_query(args.k_pool, args.max_size)
  out["machine"] = hardware.describe()
  if args.check and m.ok:
    out["max_abs_diff_vs_numpy"] = _check(args.impl, w)
  if m.ok:
    peak = f"{m.peak_bytes / 2**20:.1f} MiB ({m.peak_source})" if m.peak_bytes else "n/a"
    compile_s = f"{m.compile_s:.2f} s" if m.compile_s is not None else "n/a"
    print(f"{args.impl} ({m.method}): K={args.k_pool} M={args.max_size} batch={args.batch} "
          f"dim={args.dim}: {m.queries_per_s:,.0f} queries/s, {m.subsets_per_s:,.0f} subsets/s "
          f"(median of {len(m.times_s)}: {m.time_s * 1e3:.2f} ms/batch), compile {compile_s}, "
          f"peak {peak}")
    if "max_abs_diff_vs_numpy" in out:
      print(f"max |score − NumPy reference| over 8 queries: {out['max_abs_diff_vs_numpy']:.2e}")
  else:
    print(f"{args.impl}: {m.status}")
  if args.json:
    with io_utils.atomic_write(args.json) as f:
      json.dump(out, f, indent=2)
      f.write("\n")
  return 0


# What one run may plan to allocate; above it the run is refused before allocating anything.
MEMORY_BUDGET_BYTES = 8 << 30
# The naive loop's speed, measured on the project's 2-core CPU (2026-12-01: 92k subsets/s at
# K=20, M=5, batch 2); used only for the up-front time estimate.
NAIVE_SUBSETS_PER_S = 1e5
NAIVE_LIMIT_S = 600.0


def memory_budget() -> int:
  """:data:`MEMORY_BUDGET_BYTES`, or half the machine's memory if that is less."""
  import os
  try:
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError, AttributeError):
    return MEMORY_BUDGET_BYTES
  return min(MEMORY_BUDGET_BYTES, physical // 2)


def memory_estimate(k_pool: int, max_size: int, batch: int, n: int) -> tuple[int, int]:
  """(subset-table bytes, score bytes) one run needs at least.

  The table holds int32 members and bool masks [n, M], built from int32 colex blocks that are
  concatenated level by level (about two more int32 [n, M] copies at the peak); the scores are
  f32[Q, n], twice (the [n, Q] pieces and their transpose). A lower bound, not a measurement:
  K=40, M=8 at --batch 1 (10 GiB by this count) was killed for memory on a 24 GiB machine.
  """
  table = n * (max_size * (3 * 4 + 1) + 8)
  scores = 2 * batch * n * 4
  return table, scores


def check_memory(k_pool: int, max_size: int, batch: int, n: int) -> None:
  """UserError unless the run fits :func:`memory_budget` (checked before allocating)."""
  table, scores = memory_estimate(k_pool, max_size, batch, n)
  if table + scores > memory_budget():
    raise UserError(
        f"K={k_pool}, M={max_size} has {n:,} subsets: the subset table needs "
        f"{table / 2**30:.1f} GiB and the scores of --batch {batch} {scores / 2**30:.1f} GiB, "
        f"over this command's {memory_budget() / 2**30:.1f} GiB budget; lower --k-pool, "
        f"--max-size or --batch")


def estimate_naive(batch: int, n: int, repeats: int) -> None:
  """Print how long the naive loop will take; refuse a run of more than NAIVE_LIMIT_S."""
  import sys
  calls = repeats + 2  # warm-up, a first timed call, then the samples (runners.measure)
  seconds = batch * n * calls / NAIVE_SUBSETS_PER_S
  if seconds > NAIVE_LIMIT_S:
    raise UserError(
        f"--impl naive is a pure-Python loop (~{NAIVE_SUBSETS_PER_S:,.0f} subsets/s on a 2-core "
        f"CPU): {calls} calls of --batch {batch} × {n:,} subsets would take about "
        f"{seconds / 60:.0f} minutes; use --batch 2 (or lower --repeats)")
  print(f"naive: about {seconds:.0f} s ({calls} calls of {batch} queries × {n:,} subsets, "
        f"~{NAIVE_SUBSETS_PER_S:,.0f} subsets/s)", file=sys.stderr, flush=True)


def _check(impl: str, w) -> float:
  """Max |score − NumPy| over the first 8 queries, mapping reordered positions back."""
  import dataclasses

  import numpy as np

  from hyset_jax import enumeration
  from hyset_jax.benchmarking import references, runners

  small = dataclasses.replace(
      w, batch=min(8, w.batch), logits=w.logits[:8], pairs=w.pairs[:8],
      query=None if w.query is None else w.query[:8], tools=None if w.tools is None else w.tools[:8])
  want = references.numpy_gather(small)
  if impl in runners.JAX_METHODS:
    import jax.numpy as jnp
    method = runners.JAX_METHODS[impl] or enumeration.DEFAULT_METHOD
    logits, pairs = (jnp.asarray(a) for a in references.numpy_inputs(small))
    table = enumeration.subset_table(w.k_pool, w.max_size)
    if method == "gather/subset-major":
      scores, positions = enumeration.score_subsets_subset_major(logits, pairs, table, "gather")
      scores = scores.T
    else:
      scores, positions = enumeration.score_subsets(logits, pairs, table, method)
    got = reorder_to_shortlist(np.asarray(scores), np.asarray(positions), table)
  elif impl == "torch":
    got = references.torch_gather(small).cpu().numpy()
  else:
    got = runners.prepare(impl, small, measure_peak=False).call()
  return float(np.max(np.abs(np.asarray(got) - want)))


def reorder_to_shortlist(scores, positions, table):
  """Scores indexed by table row in shortlist order, from scores indexed in ``positions``
  order (the reordering the gather and colex forms report)."""
  import numpy as np

  from hyset_jax import enumeration

  out = np.empty_like(scores)
  for q in range(scores.shape[0]):
    members = np.where(table.mask, positions[q][table.members], -1)
    members = np.sort(np.where(table.mask, members, np.iinfo(np.int32).max), axis=1)
    rows = np.empty(len(table), np.int64)
    for m in range(1, table.max_size + 1):
      lo, hi = table.offsets[m - 1], table.offsets[m]
      rows[lo:hi] = lo + enumeration.colex_rank(members[lo:hi, :m])
    out[q, rows] = scores[q]
  return out
