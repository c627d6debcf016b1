"""``hyset compare``: is B better than A? Two prediction files scored on one split, paired.

    hyset compare A.jsonl B.jsonl --data SPEC --split NAME [--resamples 10000] [--seed N] \\
        [--validation-fraction F] [--out FILE.json [--force]]

A and B are prediction files as ``hyset predict`` writes them (docs/contracts.md,
"Predictions"): one JSON object a line with ``query_id``, ``set`` (the predicted tool set) and
``ranking`` (tool ids, best first); other fields are ignored. Every ``query_id`` must be a query
of the split, at most once per file, and both files must cover the same queries (a subset of
the split is scored, and said so, when both cover only part of it).

Each metric of ``hyset eval`` (R@K, NDCG@K, COMP@K from the ranking; set precision, recall,
F1 and exact match from the set) is computed per query for A and for B; printed: A's value,
B's, the difference B − A with its paired-bootstrap confidence interval (the queries resampled
with replacement, the same resamples for every metric), and for the binary metrics (COMP@K,
set exact match) the exact McNemar p-value with the discordant counts (A right only / B right
only). Values are percentages; ``--out`` writes the same as JSON, as fractions.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from hyset_jax.commands import float_in_open_unit, int_at_least
from hyset_jax.errors import UserError

CONFIDENCE = 0.95


def add_parser(subparsers: Any) -> None:
  p = subparsers.add_parser(
      "compare", help="paired significance of two prediction files on one split "
                      "(bootstrap CIs, exact McNemar)",
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("a", metavar="A.jsonl", help="predictions of system A (hyset predict's lines)")
  p.add_argument("b", metavar="B.jsonl", help="predictions of system B; differences are B − A")
  p.add_argument("--data", required=True, metavar="SPEC",
                 help="data set whose gold sets score both files, e.g. "
                      "beir:../shared/data/toollens")
  p.add_argument("--split", required=True, metavar="NAME", help="split the predictions are for")
  p.add_argument("--validation-fraction", type=float_in_open_unit, default=None, metavar="F",
                 help="--split validation on data without one: the fraction of train carved "
                      "out, as training's data.validation_fraction (default 0.1)")
  p.add_argument("--resamples", type=int_at_least(1), default=10_000, metavar="N",
                 help="paired-bootstrap resamples")
  p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap resamples (default 0)")
  p.add_argument("--out", metavar="FILE", help="also write the comparison as JSON")
  p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
  p.set_defaults(func=run)


def read_predictions(path: str, split_ids: dict[str, int], split: str, spec: str
                     ) -> dict[str, tuple[int, list[str], list[str]]]:
  """query_id -> (line, ranking, set) of a prediction file, each id a query of the split."""
  from hyset_jax.data import files
  files.require_file(path, "prediction file (JSON lines, as hyset predict writes)")
  out: dict[str, tuple[int, list[str], list[str]]] = {}
  seen = files.UniqueIds("prediction")
  for line, obj in files.read_jsonl(path):
    where = f"{path}:{line}"
    query_id = files.get_id(obj, "query_id", where)
    where = f"{path}:{line} (query {query_id!r})"
    if query_id not in split_ids:
      raise UserError(f"{where}: not a query of split {split!r} of {spec}; expected "
                      f"predictions for that split's queries")
    seen.add(query_id, where)
    lists = []
    for key in ("ranking", "set"):
      value = files.get_field(obj, key, list, where)
      if not all(isinstance(t, str) for t in value):
        raise UserError(f"{where}: field {key!r} should be a list of tool ids (strings), "
                        f"found {json.dumps(value)[:80]}")
      lists.append(value)
    out[query_id] = (line, lists[0], lists[1])
  if not out:
    raise UserError(f"{path}: no predictions; expected one {{\"query_id\", \"set\", "
                    f"\"ranking\"}} object a line")
  return out


def _check_same_queries(a: dict[str, tuple], b: dict[str, tuple], path_a: str,
                        path_b: str) -> None:
  for have, lack, have_path, lack_path in ((a, b, path_a, path_b), (b, a, path_b, path_a)):
    missing = [q for q in have if q not in lack]
    if missing:
      examples = ", ".join(f"{q!r} ({have_path}:{have[q][0]})" for q in missing[:3])
      raise UserError(f"{lack_path}: no prediction for {len(missing)} queries that "
                      f"{have_path} has, e.g. {examples}; both files must cover the same "
                      f"queries")


def format_table(result: dict[str, Any]) -> str:
  """The printed report: one row per metric, values in percent."""
  level = round(100 * result["confidence"])
  lines = [f"A: {result['a']}", f"B: {result['b']}",
           f"{result['data']} {result['split']}: {result['n_queries']} queries"
           + (f" of {result['n_split_queries']}"
              if result["n_queries"] != result["n_split_queries"] else "")
           + f"; paired bootstrap, {result['resamples']} resamples, seed {result['seed']}",
           f"{'metric':<14}{'A':>8}{'B':>8}{'B − A':>9}  {f'{level}% CI':<18}"
           f"McNemar p (A only / B only)"]
  for key, row in result["metrics"].items():
    ci = f"[{100 * row['ci_low']:+.2f}, {100 * row['ci_high']:+.2f}]"
    text = (f"{key:<14}{100 * row['a']:>8.2f}{100 * row['b']:>8.2f}"
            f"{100 * row['diff']:>+9.2f}  {ci:<18}")
    if "mcnemar_p" in row:
      text += f"{row['mcnemar_p']:.4g} ({row['a_only']} / {row['b_only']})"
    lines.append(text.rstrip())
  return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
  from hyset_jax import io_utils
  from hyset_jax.evaluation import significance
  from hyset_jax.data import files, splits
  from hyset_jax.data.specs import input_paths, load_dataset

  if args.out is not None:
    io_utils.output_file(args.out, args.force, inputs=(*input_paths(args.data), args.a, args.b))
  for path in (args.a, args.b):  # before the data set, which may take a while to read
    files.require_file(path, "prediction file (JSON lines, as hyset predict writes)")
  dataset = load_dataset(args.data)
  if args.split == "validation":
    # The split training validates on, carved the same way (as hyset eval does).
    dataset = (splits.with_validation(dataset) if args.validation_fraction is None
               else splits.with_validation(dataset, args.validation_fraction))
  queries = dataset.split(args.split)
  if not queries:
    raise UserError(f"split {args.split!r} of {args.data} has no queries to score")
  split_ids = {q.id: i for i, q in enumerate(queries)}
  pred_a = read_predictions(args.a, split_ids, args.split, args.data)
  pred_b = read_predictions(args.b, split_ids, args.split, args.data)
  _check_same_queries(pred_a, pred_b, args.a, args.b)
  scored = [q for q in queries if q.id in pred_a]  # split order
  gold = [q.gold for q in scored]
  per_query = [significance.per_query_metrics([p[q.id][1] for q in scored], gold,
                                              [p[q.id][2] for q in scored])
               for p in (pred_a, pred_b)]
  result = {"a": args.a, "b": args.b, "data": args.data, "split": args.split,
            "n_queries": len(scored), "n_split_queries": len(queries),
            "resamples": args.resamples, "seed": args.seed, "confidence": CONFIDENCE,
            "metrics": significance.compare(*per_query, resamples=args.resamples,
                                            seed=args.seed, confidence=CONFIDENCE)}
  if len(scored) < len(queries):
    print(f"note: both files cover {len(scored)} of the {len(queries)} queries of split "
          f"{args.split!r}; only those are scored", file=sys.stderr)
  print(format_table(result))
  if args.out is not None:
    with io_utils.atomic_write(args.out) as f:
      f.write(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
  return 0
