"""``hyset bench enumerate|e2e|compile``: subset-enumeration throughput, end-to-end latency, and
the prediction path's per-device memory and cost compiled for a TPU slice.

  hyset bench enumerate [--k-pool 20] [--max-size 5] [--batch 1024] [--dim 0]
                        [--impl jax] [--output best|scores] [--repeats 5] [--seed 0]
                        [--check] [--json FILE]
  hyset bench e2e [--tools 13860] [--dim 768] [--batch 1] [--k1 15] [--k-pool 20]
                  [--max-size 5] [--method auto] [--ranking greedy] [--repeats 5]
                  [--seed 0] [--json FILE]

``enumerate`` scores every subset (1 ≤ |E| ≤ M) of a K-tool shortlist for a batch of random
queries and reports queries/s, subsets/s, compile time, peak memory and the settings.
``--output best`` (the default) returns the best set per query, as predict does;
``--output scores`` returns every subset's score, f32[batch, n]. ``--dim 0`` times the
enumeration alone from ℓ and G_m; ``--dim D`` also builds them from D-dimensional embeddings.
Implementations: the library default ``jax`` (``--method auto``: the native CPU kernel where it
builds, else the gather form), each form by name (``jax-native``, ``jax-gather``, ``jax-colex``,
``jax-matmul``, ``jax-matmul-bf16``), the NumPy reference and its matmul variant, PyTorch (when
installed) and a naive Python loop. The full side-by-side suite
with sweeps and plots is ``python -m benchmarks.run_all`` in the repository.

JSON (docs/contracts.md): ``queries_per_s``, ``subsets_per_s``, ``time_s`` (median seconds per
batch, so queries_per_s × time_s = batch), ``times_s``, ``compile_s``, ``peak_bytes``,
``impl``, ``method``, ``output``, ``k_pool``, ``max_size``, ``batch``, ``dim``, ``seed``,
``repeats``, ``n_subsets``, ``min_flops_per_query``, ``machine``.

``e2e`` times the prepared inference path (stage 1, neighbour-table expansion, G_m, best-only
stage 2, ranking; encoder excluded) on a random library of ``--tools`` unit vectors of
dimension ``--dim``, and a dense top-K_pool pass over the same library in the same run. JSON:
``ms_per_query``, ``dense_ms_per_query``, ``ratio_to_dense``, ``queries_per_s``, ``times_s``,
``dense_times_s``, ``compile_s``, ``prepare_s`` (P Zᵀ, Z M_m and the neighbour table), the
settings (``num_tools``, ``dim``, ``batch``, ``k1``, ``k_pool``, ``max_size``, ``method``,
``ranking``, ``seed``, ``repeats``) and ``machine``.

``compile --topology tpu:NAME|cpu:N`` compiles the prepared prediction path and stage 2 alone
from abstract shapes for a topology's devices (a TPU slice needs only ``pip install libtpu``,
no TPU) and prints per-device memory and the compiler's FLOPs and bytes
(:mod:`hyset_jax.benchmarking.compile_cost`). JSON: ``rows`` (one per configuration:
``config``, ``part``, ``method``, ``num_tools``, ``dim``, ``batch``, ``data_shards``,
``tool_shards``, ``argument_bytes``, ``output_bytes``, ``temp_bytes``, ``alias_bytes``,
``total_bytes``, ``flops``, ``bytes_accessed``, ``compile_s``, ``error``), ``topology``,
``device_kind``, ``num_devices`` and the settings.
"""
from __future__ import annotations

import argparse
import json

from hyset_jax import choices
from hyset_jax.benchmarking.runners import IMPLS
from hyset_jax.commands import int_at_least
from hyset_jax.errors import UserError

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
  e.add_argument("--impl", choices=IMPLS, default="jax",
                 help="implementation (default: jax, the library's default method)")
  e.add_argument("--output", choices=choices.STAGE2_OUTPUTS, default=choices.DEFAULT_STAGE2_OUTPUT,
                 help="best: the best set per query (default, what predict runs); scores: "
                      "every subset's score")
  e.add_argument("--repeats", type=_positive, default=5, help="timed samples (default 5)")
  e.add_argument("--seed", type=int, default=0,
                 help="seed of the random queries and tool embeddings (default 0)")
  e.add_argument("--check", action="store_true",
                 help="also compare the scores of the first 8 queries with the NumPy reference")
  e.add_argument("--json", metavar="FILE", help="write the result as JSON")
  e.add_argument("--force", action="store_true", help="overwrite the --json FILE if it exists")
  e.set_defaults(func=run_enumerate)

  t = sub.add_parser("e2e", help="end-to-end latency from query embeddings vs a dense pass",
                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  t.add_argument("--tools", type=int_at_least(2), default=13_860,
                 help="library size N (default 13860, the paper's)")
  t.add_argument("--dim", type=_positive, default=768, help="embedding dimension (default 768)")
  t.add_argument("--batch", type=_positive, default=1, help="queries per call (default 1)")
  t.add_argument("--k1", type=_positive, default=15, help="stage-1 size K1 (default 15)")
  t.add_argument("--k-pool", type=_positive, default=20, help="shortlist size (default 20)")
  t.add_argument("--max-size", type=_positive, default=5, help="largest set size M (default 5)")
  t.add_argument("--method", choices=choices.METHOD_CHOICES, default=choices.DEFAULT_METHOD,
                 help="subset-enumeration implementation of stage 2 (default auto: the native "
                      "CPU kernel where it can run, else gather)")
  t.add_argument("--ranking", choices=choices.RANKINGS, default=choices.DEFAULT_RANKING,
                 help="how the shortlist is ranked")
  t.add_argument("--precision", choices=choices.PRECISIONS, default=choices.DEFAULT_PRECISION,
                 help="dtype of the prepared products P Zᵀ and Z M_m (default f32; bf16: f32 "
                      "accumulation, for accelerators)")
  t.add_argument("--repeats", type=_positive, default=5, help="timed samples (default 5)")
  t.add_argument("--seed", type=int, default=0,
                 help="seed of the random library and queries (default 0)")
  t.add_argument("--breakdown", action="store_true",
                 help="also time stage 1, the expansion, the pair matrices and stage 2 apart "
                      "(stages_ms_per_query in the JSON)")
  t.add_argument("--json", metavar="FILE", help="write the result as JSON")
  t.add_argument("--force", action="store_true", help="overwrite the --json FILE if it exists")
  t.set_defaults(func=run_e2e)

  c = sub.add_parser("compile", help="per-device memory and FLOPs of prediction, compiled for "
                                     "a TPU slice (or N CPU devices) without running it",
                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  c.add_argument("--topology", required=True,
                 help="tpu:NAME (e.g. tpu:v5e:2x4, tpu:v5p:2x2x1; needs `pip install libtpu`) "
                      "or cpu:N (N host CPU devices)")
  c.add_argument("--num-tools", type=int_at_least(2), default=13_860,
                 help="library size N of the replicated rows (default 13860, the paper's)")
  c.add_argument("--dim", type=_positive, default=768, help="embedding dimension (default 768)")
  c.add_argument("--batches", type=_int_list, default=[1, 64, 1024, 16384],
                 help="comma-separated batch sizes (default 1,64,1024,16384)")
  c.add_argument("--k1", type=_positive, default=15, help="stage-1 size K1 (default 15)")
  c.add_argument("--k-pool", type=_positive, default=20, help="shortlist size (default 20)")
  c.add_argument("--max-size", type=int_at_least(2), default=5,
                 help="largest set size M (default 5)")
  c.add_argument("--methods", type=_method_list, default=["gather", "pallas"],
                 help="comma-separated stage-2 methods (default gather,pallas)")
  c.add_argument("--precision", choices=choices.PRECISIONS, default=choices.DEFAULT_PRECISION,
                 help="dtype of the prepared products P Zᵀ and Z M_m (default f32)")
  c.add_argument("--sharded-tools", type=_non_negative, default=1_000_000,
                 help="N of the row with Z split over a tools axis of every device "
                      "(default 1000000; 0: no such row)")
  c.add_argument("--sharded-batch", type=_positive, default=1024,
                 help="batch of the tools-sharded row (default 1024)")
  c.add_argument("--json", metavar="FILE", help="write the rows as JSON")
  c.add_argument("--force", action="store_true", help="overwrite the --json FILE if it exists")
  c.set_defaults(func=run_compile)


def _int_list(text: str) -> list[int]:
  try:
    values = [int(v) for v in text.split(",") if v.strip()]
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
  if not values or min(values) < 1:
    raise argparse.ArgumentTypeError(f"expected comma-separated integers ≥ 1, got {text!r}")
  return values


def _method_list(text: str) -> list[str]:
  from hyset_jax.benchmarking.compile_cost import METHODS
  values = [v.strip() for v in text.split(",") if v.strip()]
  bad = [v for v in values if v not in METHODS]
  if not values or bad:
    raise argparse.ArgumentTypeError(f"expected comma-separated methods from {', '.join(METHODS)}"
                                     f", got {text!r}")
  return values


def run_compile(args: argparse.Namespace) -> int:
  import sys

  from hyset_jax import io_utils
  from hyset_jax.inference import subsets
  from hyset_jax.benchmarking import compile_cost

  if args.json:
    io_utils.output_file(args.json, args.force, flag="--json")
  subsets.validate_sizes(args.k_pool, args.max_size, k1=args.k1, num_tools=args.num_tools)
  if args.sharded_tools:
    subsets.validate_sizes(args.k_pool, args.max_size, k1=args.k1, num_tools=args.sharded_tools)
  devices = compile_cost.devices_for(args.topology)
  if args.sharded_tools % len(devices):
    raise UserError(f"--sharded-tools {args.sharded_tools} does not split evenly over the "
                    f"{len(devices)} devices of {args.topology}; use a multiple of {len(devices)}")
  kind = devices[0].device_kind
  print(f"{args.topology}: {len(devices)} device(s) ({kind})", flush=True)
  rows = compile_cost.compile_rows(
      devices, num_tools=args.num_tools, dim=args.dim, batches=args.batches, k1=args.k1,
      k_pool=args.k_pool, max_size=args.max_size, methods=args.methods,
      sharded_tools=args.sharded_tools, sharded_batch=args.sharded_batch,
      kernel_platform="tpu" if args.topology.startswith("tpu:") else None,
      precision=args.precision,
      progress=lambda r: print(f"  {r.config} {r.part} {r.method} N={r.num_tools} "
                               f"batch={r.batch}: " + (f"failed ({r.error[:200]})" if r.error
                                                       else f"compiled in {r.compile_s:.1f} s"),
                               file=sys.stderr, flush=True))
  print("\n".join(compile_cost.table_lines(rows)))
  out = {"topology": args.topology, "device_kind": kind, "num_devices": len(devices),
         "k1": args.k1, "k_pool": args.k_pool, "max_size": args.max_size,
         "precision": args.precision,
         "jax_version": __import__("jax").__version__,
         "rows": [dict(vars(r)) for r in rows]}
  if args.json:
    _write_provenance_json(args.json, out)
  return 0


def _write_provenance_json(path: str, out: dict) -> None:
  """With ``benchmarks/provenance.py``'s command, commit and date where the repository is
  importable (a checkout); else the command line and date alone."""
  import datetime
  import sys
  try:
    from benchmarks import provenance
  except ImportError:
    out = {"command": " ".join(["hyset", *sys.argv[1:]]),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           **out}
    _write_json(path, out)
    return
  provenance.write_json(path, out, indent=2)


def _write_json(path: str | None, out: dict) -> None:
  if path:
    from hyset_jax import io_utils
    with io_utils.atomic_write(path) as f:
      json.dump(out, f, indent=2)
      f.write("\n")


def run_e2e(args: argparse.Namespace) -> int:
  from hyset_jax import io_utils
  from hyset_jax.inference import subsets
  from hyset_jax.benchmarking import end_to_end, hardware

  if args.json:
    io_utils.output_file(args.json, args.force, flag="--json")
  subsets.validate_sizes(args.k_pool, args.max_size, k1=args.k1, num_tools=args.tools)
  if args.tools * args.dim * 4 * (args.max_size + 1) > 16 << 30:
    raise UserError(f"--tools {args.tools} × --dim {args.dim} needs over 16 GiB for the "
                    "prepared library; lower one of them")
  out = end_to_end.measure(args.tools, args.dim, args.batch, k1=args.k1, k_pool=args.k_pool,
                           max_size=args.max_size, method=args.method, ranking=args.ranking,
                           repeats=args.repeats, seed=args.seed, breakdown=args.breakdown,
                           precision=args.precision)
  out["machine"] = hardware.describe()
  print(f"e2e N={args.tools} d={args.dim} batch={args.batch}: {out['ms_per_query']:.3f} ms/query "
        f"({out['queries_per_s']:,.0f} q/s); dense top-{args.k_pool} pass "
        f"{out['dense_ms_per_query']:.3f} ms/query; ratio {out['ratio_to_dense']:.2f}; "
        f"prepare {out['prepare_s']:.1f} s, compile {out['compile_s']:.1f} s")
  if args.breakdown:
    print("  ms/query by stage: " + ", ".join(
        f"{k} {v:.3f}" for k, v in out["stages_ms_per_query"].items()))
  _write_json(args.json, out)
  return 0


def run_enumerate(args: argparse.Namespace) -> int:
  from hyset_jax import io_utils
  from hyset_jax.inference import subsets
  from hyset_jax.benchmarking import hardware, runners, workload

  if args.json:
    io_utils.output_file(args.json, args.force, flag="--json")
  subsets.validate_sizes(args.k_pool, args.max_size)
  n = subsets.count_subsets(args.k_pool, args.max_size)
  check_memory(args.k_pool, args.max_size, args.batch, n)
  if args.impl == "naive":
    estimate_naive(args.batch, n, args.repeats)
  w = workload.make_workload(args.k_pool, args.max_size, args.batch, args.dim, args.seed)
  m = runners.measure(args.impl, w, repeats=args.repeats, output=args.output)
  out = m.to_json()
  out["min_flops_per_query"] = workload.min_flops_per_query(args.k_pool, args.max_size)
  out["machine"] = hardware.describe()
  if args.check and m.ok:
    out["max_abs_diff_vs_numpy"] = _check(args.impl, w, args.output)
  if m.ok:
    peak = f"{m.peak_bytes / 2**20:.1f} MiB ({m.peak_source})" if m.peak_bytes else "n/a"
    compile_s = f"{m.compile_s:.2f} s" if m.compile_s is not None else "n/a"
    print(f"{args.impl} ({m.method}, {args.output}): K={args.k_pool} M={args.max_size} "
          f"batch={args.batch} "
          f"dim={args.dim}: {m.queries_per_s:,.0f} queries/s, {m.subsets_per_s:,.0f} subsets/s "
          f"(median of {len(m.times_s)}: {m.time_s * 1e3:.2f} ms/batch), compile {compile_s}, "
          f"peak {peak}")
    if "max_abs_diff_vs_numpy" in out:
      print(f"max |score − NumPy reference| over 8 queries: {out['max_abs_diff_vs_numpy']:.2e}")
  else:
    print(f"{args.impl}: {m.status}")
  _write_json(args.json, out)
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


def _check(impl: str, w, output: str = "scores") -> float:
  """Max |score − NumPy| over the first 8 queries, mapping reordered positions back; for
  ``output="best"``, of the best score (and the best set must be NumPy's argmax)."""
  import dataclasses

  import numpy as np

  from hyset_jax.inference import enumeration, subsets
  from hyset_jax.benchmarking import references, runners

  small = dataclasses.replace(
      w, batch=min(8, w.batch), logits=w.logits[:8], pairs=w.pairs[:8],
      query=None if w.query is None else w.query[:8], tools=None if w.tools is None else w.tools[:8])
  want = references.numpy_gather(small)
  table = subsets.subset_table(w.k_pool, w.max_size)
  if output == "best":
    return _check_best(impl, small, want, table)
  if impl in runners.JAX_METHODS:
    import jax.numpy as jnp
    method = runners.JAX_METHODS[impl] or enumeration.DEFAULT_METHOD
    logits, pairs = (jnp.asarray(a) for a in references.numpy_inputs(small))
    if method == "gather/subset-major":
      scores, positions = enumeration.score_subsets_subset_major(logits, pairs, table, "gather")
      scores = scores.T
    else:
      scores, positions = enumeration.score_subsets(logits, pairs, table, method)
    got = subsets.reorder_to_shortlist(np.asarray(scores), np.asarray(positions), table)
  elif impl == "torch":
    got = references.torch_gather(small).cpu().numpy()
  else:
    got = runners.prepare(impl, small, measure_peak=False).call()
  return float(np.max(np.abs(np.asarray(got) - want)))


def _check_best(impl: str, small, want, table) -> float:
  """Max |best score − NumPy's best| over the workload; UserError if a best set differs."""
  import numpy as np

  from hyset_jax.inference import enumeration
  from hyset_jax.benchmarking import references, runners
  best_want = want.max(axis=1)
  if impl in runners.JAX_METHODS:
    import jax.numpy as jnp
    method = runners.JAX_METHODS[impl] or enumeration.DEFAULT_METHOD
    if method == "gather/subset-major":
      raise UserError("--impl jax-gather-subset-major has no --output best; use --output scores")
    logits, pairs = (jnp.asarray(a) for a in references.numpy_inputs(small))
    best = enumeration.best_subset(logits, pairs, table, method)
    got = np.asarray(best.scores[:, 0])
    for q in range(len(got)):
      members = tuple(sorted(np.asarray(best.positions[q, 0])[np.asarray(best.mask[q, 0])]))
      row = int(np.argmax(want[q]))
      if members != tuple(table.members[row, :table.sizes[row]]):
        raise UserError(f"check failed: query {q}: best set {members} is not NumPy's "
                        f"{tuple(table.members[row, :table.sizes[row]])}")
  else:
    rows = runners.prepare(impl, small, measure_peak=False, output="best").call()
    rows = rows.cpu().numpy() if hasattr(rows, "cpu") else np.asarray(rows)
    got = want[np.arange(len(rows)), rows]
  return float(np.max(np.abs(got - best_want)))
