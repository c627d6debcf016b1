"""Table 1 and Table 2 of the paper on our data: every data set × every method × seeds, with
the significance of HYSET against the best baseline, as Markdown, JSON and a plot.

  python -m benchmarks.paper_tables                 # the full run (see the estimate it prints)
  python -m benchmarks.paper_tables --quick         # ToolLens + BFCL, 1 seed, short training
  python -m benchmarks.paper_tables --datasets seal_tools --methods hyset bm25 --seeds 0
  python -m benchmarks.paper_tables --table 3 [--quick]   # Table 3: benchmarks/paper_table3.py

Each (data set, method, seed) is a cell (benchmarks/paper_cells.py) whose predictions and
metrics are written under ``--out``; a rerun skips the finished cells and redoes a partial one,
so the run can be killed and restarted. After the cells, the tables are built from the
prediction files (benchmarks/paper_report.py): per data set and test split, methods as rows,
R@3/R@5/NDCG@3/NDCG@5/COMP@3/COMP@5/set exact as mean ± std over seeds, and HYSET against each
baseline on the seed-0 predictions (paired bootstrap over queries, 10⁴ resamples, and exact
McNemar: hyset_jax.evaluation.significance); ToolBench's six test sets zero-shot from a ToolLens
model and the UltraTool ↔ Seal-Tools carried models; Table 2's ablations (seed 0). Written to
``--results``/``<tag>.{md,json,png}``; the full run's duration is estimated from this run's
per-cell times and printed.
"""
from __future__ import annotations

import argparse
import logging
import pathlib
import sys
import time

from benchmarks import paper_cells as pc

# --quick: what fits in 15 minutes on the shared 2-core CPU (measured: README, benchmarks/
# README.md): two data sets, one seed, 150 training steps, the baselines that fit in seconds.
QUICK_DATASETS = ["toollens", "bfcl"]
QUICK_METHODS = ["hyset", "hyset-noset", "bm25", "dense", "fusion", "linear-head",
                 "set-classifier", "cardinality", "mmr", "facility-location"]
QUICK_STEPS = 150


def make_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--table", choices=("1", "2", "3"),
                      help="3: Table 3, the generalisation settings (benchmarks/paper_table3.py, "
                           "its own options: --table 3 --help); default: Tables 1 and 2")
  parser.add_argument("--quick", action="store_true",
                      help=f"{' + '.join(QUICK_DATASETS)}, seed 0, {QUICK_STEPS} steps, the "
                           "cheap baselines and one ablation (each still overridable)")
  parser.add_argument("--datasets", nargs="+", metavar="NAME",
                      choices=[*pc.NATIVE, *pc.EVAL_ONLY],
                      help=f"default: all ({', '.join([*pc.NATIVE, *pc.EVAL_ONLY])})")
  parser.add_argument("--methods", nargs="+", metavar="NAME", choices=pc.METHODS,
                      help=f"default: all ({', '.join(pc.METHODS)})")
  parser.add_argument("--seeds", nargs="+", type=int, help="default: 0 1 2 (--quick: 0)")
  parser.add_argument("--set", dest="overrides", action="append", default=[],
                      metavar="KEY=VALUE",
                      help="config override for every preset, e.g. train.num_steps=300")
  parser.add_argument("--no-carried", action="store_true",
                      help="no carried-model cells (ToolLens → ToolBench, UltraTool ↔ "
                           "Seal-Tools)")
  add_output_args(parser, "paper_tables")
  return parser


def add_output_args(parser: argparse.ArgumentParser, stem: str) -> None:
  """The options every paper table shares: where its cells and results go, and the bootstrap."""
  parser.add_argument("--out", help=f"cell folder (default runs/{stem}[_quick])")
  parser.add_argument("--results", default="benchmarks/results",
                      help="existing folder for <tag>.{md,json,png}")
  parser.add_argument("--tag", help=f"names the result files (default {stem}[_quick])")
  parser.add_argument("--resamples", type=int, default=10_000,
                      help="paired-bootstrap resamples (default 10⁴)")
  parser.add_argument("--force", action="store_true", help="replace existing result files")


def with_defaults(args: argparse.Namespace) -> argparse.Namespace:
  """``args`` with what --quick (or its absence) chooses for the options not given."""
  suffix = "_quick" if args.quick else ""
  args.datasets = args.datasets or (QUICK_DATASETS if args.quick
                                    else [*pc.NATIVE, *pc.EVAL_ONLY])
  args.methods = args.methods or (QUICK_METHODS if args.quick else list(pc.METHODS))
  args.seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
  if args.quick and not any(o.startswith("train.num_steps=") for o in args.overrides):
    args.overrides = [f"train.num_steps={QUICK_STEPS}", *args.overrides]
  args.out = pathlib.Path(args.out or f"runs/paper_tables{suffix}")
  args.tag = args.tag or f"paper_tables{suffix}"
  return args


def _clock(seconds: float) -> str:
  s = int(round(seconds))
  return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def run_cells(plan: list, is_finished, run, log=print) -> dict[str, float]:
  """Runs every cell of ``plan`` (objects with a ``name``) that ``is_finished(cell)`` says is not
  done, in order, through ``run(cell)`` (its result: ``{"splits": {split: metrics}}``), with a
  progress line per cell (i/n, elapsed, ETA from the mean time of the cells run so far);
  returns {cell name: seconds} of the cells run now (skipped ones are not in it). Tables 1-2
  and Table 3 (benchmarks/paper_table3.py) both go through it."""
  t0, ran = time.time(), {}
  todo = [c for c in plan if not is_finished(c)]
  log(f"{len(plan)} cells, {len(plan) - len(todo)} finished before, {len(todo)} to run")
  for i, cell in enumerate(plan, 1):
    if cell not in todo:
      log(f"[{i}/{len(plan)}] {cell.name}: finished before, skipped")
      continue
    t = time.time()
    result = run(cell)
    ran[cell.name] = time.time() - t
    left = len(todo) - len(ran)
    eta = sum(ran.values()) / len(ran) * left
    comp = ", ".join(f"{s} COMP@5 {100 * m['comp@5']:.2f}"
                     for s, m in result["splits"].items())
    log(f"[{i}/{len(plan)}] {cell.name}: {ran[cell.name]:.0f}s ({comp}); elapsed "
        f"{_clock(time.time() - t0)}, ETA {_clock(eta)} for {left} cells")
  return ran


def run_plan(plan: list[pc.Cell], out: pathlib.Path, overrides: list[str],
             log=print) -> dict[str, float]:
  """:func:`run_cells` over Tables 1-2's cells under ``out``."""
  log(f"cells under {out}")
  return run_cells(plan, lambda c: pc.finished(out, c, pc.cell_spec(c, overrides)),
                   lambda c: pc.run_cell(c, out, overrides), log)


def main(argv: list[str] | None = None) -> int:
  from hyset_jax import allocator, cli
  if argv is None:
    allocator.reexec()   # its trainings run as `hyset train` does (huge pages where served)
  argv = list(sys.argv[1:] if argv is None else argv)
  # --table 3 is benchmarks/paper_table3.py (its own options); 1 or 2 (or none) is this one.
  table = argparse.ArgumentParser(add_help=False)
  table.add_argument("--table", choices=("1", "2", "3"))
  known, rest = table.parse_known_args(argv)
  if known.table == "3":
    from benchmarks import paper_table3
    return paper_table3.main(rest)
  argv = rest
  parser = make_parser()
  # The command recorded in the results is the one given here, also when called from Python.
  parser.set_defaults(func=run, argv=argv)
  return cli.run(parser, argv)


def run(args: argparse.Namespace) -> int:
  from benchmarks import paper_report
  from hyset_jax.errors import UserError
  from hyset_jax import config as config_lib, io_utils
  args = with_defaults(args)
  if args.resamples < 1:
    raise UserError(f"--resamples must be at least 1, got {args.resamples}")
  for name in {pc.NATIVE[d][0] for d in args.datasets if d in pc.NATIVE}:
    config_lib.resolve(name, args.overrides)          # a bad --set fails before any cell
  outputs = paper_report.check_outputs(pathlib.Path(args.results), args.tag, args.force)
  io_utils.ensure_writable_dir(args.out, "--out folder")
  logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
  plan = pc.build_plan(args.datasets, args.methods, args.seeds, not args.no_carried)
  if not plan:
    raise_none(args)
  t0 = time.time()
  ran = run_plan(plan, args.out, args.overrides)
  report = paper_report.build(plan, args, ran, time.time() - t0)
  paper_report.write(report, outputs, args)
  print("\n".join(report["markdown"]))
  print("wrote " + ", ".join(str(p) for p in outputs.values()))
  return 0


def raise_none(args: argparse.Namespace) -> None:
  from hyset_jax.errors import UserError
  raise UserError(f"no cell to run: --datasets {' '.join(args.datasets)} with --methods "
                  f"{' '.join(args.methods)} selects nothing (ToolBench has no training split: "
                  "it needs toollens and hyset, or bm25/dense/fusion beside them)")


if __name__ == "__main__":
  sys.exit(main())
