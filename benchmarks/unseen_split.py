"""The unseen-set split: test queries whose gold *set* never occurs in training.

  python -m benchmarks.unseen_split --data beir:../shared/data/toollens --seed 0 \
      --out runs/unseen_toollens_s0

ToolLens is scene-based: every official test set also occurs in training, so memorising
sets scores well there. This split asks what a retriever does for a new combination of
known tools. From all queries of the data set (every split pooled), it holds out
``--sets`` multi-tool gold sets (|E*| ≥ 2), drawn in a seeded random order and kept only
if each of their tools still occurs in some training set once every held-out set is
gone. Every query whose gold set is held out goes to test; all other queries go to
train.

Validation is held out the same way (``--validation-sets V``, default 20): the next V sets of
the same draw, under the same coverage rule, go to ``qrels/validation.tsv``, so that early
stopping and the choice of the ranking see new combinations too, as the test does. A
validation split carved from train (``--validation-sets 0``) holds sets that training also
sees; measured on ToolLens, a model selected on it is the one that memorised the training
sets best (docs/results.md, unseen-split tables). With a carve, the tool coverage is checked
after it.

Writes a BEIR folder (corpus.jsonl, queries.jsonl, qrels/train.tsv, [qrels/validation.tsv,]
qrels/test.tsv) that every method reads as ``beir:DIR``, plus ``split.json`` recording the
source, seed, held-out sets and counts. Deterministic given the data and the seed; an existing
DIR is kept unless ``--force``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
from collections.abc import Mapping, Sequence

from hyset_jax.config import DataConfig
from hyset_jax.data.splits import hold_out
from hyset_jax.data.types import Dataset, Query
from hyset_jax.errors import UserError

DEFAULT_SETS = 40
DEFAULT_VALIDATION_SETS = 20


def pooled_queries(dataset: Dataset) -> list[Query]:
  """Every query of every split once, in split order; a repeated id must repeat its gold set.
  Requests that need no tool (empty gold, e.g. BFCL's irrelevance splits) hold no tool set."""
  seen: dict[str, Query] = {}
  for split, queries in dataset.splits.items():
    for q in queries:
      if not q.gold:
        continue
      first = seen.setdefault(q.id, q)
      if first.gold != q.gold:
        raise UserError(f"{dataset.name}: query {q.id!r} appears in several splits with different "
                        f"gold sets ({first.gold} and {q.gold} in {split!r}); cannot pool them")
  return list(seen.values())


def train_after_carve(queries: Sequence[Query], dataset: Dataset, fraction: float) -> set[str]:
  """Ids of ``queries`` that stay in train when validation is carved (splits.with_validation)."""
  from hyset_jax.data.splits import with_validation
  carved = with_validation(dataclasses.replace(dataset, splits={"train": tuple(queries)}),
                           fraction)
  return {q.id for q in carved.splits["train"]}


def write_beir(out: pathlib.Path, dataset: Dataset,
               splits: Mapping[str, Sequence[Query]]) -> None:
  """corpus.jsonl (``dataset.tools``), queries.jsonl and qrels/<name>.tsv under ``out``
  (beir.py's layout), one qrels file per non-empty split of ``splits``; an empty validation
  split is left out, so that training carves one from train when the data is read."""
  with open(out / "corpus.jsonl", "w", encoding="utf-8") as f:
    for tool_id, text, meta in zip(dataset.tools.ids, dataset.tools.texts, dataset.tools.metadata):
      # The reader's tool text is title + " " + text, stripped: an empty title keeps it.
      f.write(json.dumps({"_id": tool_id, "title": "", "text": text, "metadata": meta},
                         ensure_ascii=False) + "\n")
  with open(out / "queries.jsonl", "w", encoding="utf-8") as f:
    for q in (q for qs in splits.values() for q in qs):
      meta = {"source": q.source} if q.source else {}
      f.write(json.dumps({"_id": q.id, "text": q.text, "metadata": meta}, ensure_ascii=False)
              + "\n")
  (out / "qrels").mkdir()
  for name, qs in splits.items():
    if not qs:
      continue
    with open(out / "qrels" / f"{name}.tsv", "w", encoding="utf-8") as f:
      f.write("query-id\tcorpus-id\tscore\n")
      for q in qs:
        for tool in q.gold:
          f.write(f"{q.id}\t{tool}\t1\n")


def check_written(out: pathlib.Path, fraction: float) -> dict[str, int]:
  """Reads the folder back as ``beir:`` and checks the split's promises; returns the counts.

  Train here is what a method trains on: the qrels' train minus the validation carve (when the
  folder has no validation qrels). Held-out validation sets must be unseen in train too, and
  disjoint from the test sets.
  """
  from hyset_jax.data.specs import load_dataset
  from hyset_jax.data.splits import with_validation
  data = with_validation(load_dataset(f"beir:{out}"), fraction)
  train, test = data.split("train"), data.split("test")
  train_sets = {q.gold for q in train}
  train_tools = {t for q in train for t in q.gold}
  # Held-out validation (its own qrels) must be unseen too; a carved one is not held out.
  val = list(data.split("validation")) if (out / "qrels" / "validation.tsv").exists() else []
  held = list(test) + val
  seen_sets = [q.id for q in held if q.gold in train_sets]
  unseen_tools = sorted({t for q in held for t in q.gold} - train_tools)
  shared = {q.gold for q in test} & {q.gold for q in val}
  if seen_sets or unseen_tools or shared:
    raise RuntimeError(f"unseen split {out} is broken: {len(seen_sets)} held-out queries have a "
                       f"training gold set (e.g. {seen_sets[:3]}), {len(unseen_tools)} held-out "
                       f"tools are in no training query (e.g. {unseen_tools[:3]}), "
                       f"{len(shared)} sets are in both validation and test")
  return {"train": len(train), "validation": len(data.split("validation")), "test": len(test),
          "test_sets": len({q.gold for q in test}), "train_sets": len(train_sets)}


def run(args: argparse.Namespace) -> int:
  from hyset_jax import io_utils
  from hyset_jax.data.specs import load_dataset
  if args.sets < 1:
    raise UserError(f"--sets must be >= 1, got {args.sets}")
  if args.validation_sets < 0:
    raise UserError(f"--validation-sets must be >= 0, got {args.validation_sets}")
  if not 0 < args.validation_fraction < 1:
    raise UserError(f"--validation-fraction must be in (0, 1), got {args.validation_fraction}")
  out = pathlib.Path(args.out)
  if out.exists() and not out.is_dir():
    raise UserError(f"--out {out} is a file; this script writes a BEIR directory")
  io_utils.check_target(out, args.force)  # before reading anything
  dataset = load_dataset(args.data)
  queries = pooled_queries(dataset)
  if args.validation_sets:
    kept = {q.id for q in queries}  # no carve: every query not held out trains
  else:
    kept = train_after_carve(queries, dataset, args.validation_fraction)
  split = hold_out(queries, args.sets, args.seed, kept, args.validation_sets)
  with io_utils.atomic_dir(out, args.force) as tmp:
    write_beir(tmp, dataset, {"train": split.train, "validation": split.validation,
                              "test": split.test})
    counts = check_written(tmp, args.validation_fraction)
    n_multi = len({tuple(q.gold) for q in queries if len(q.gold) >= 2})
    manifest = {
        "source": args.data, "seed": args.seed, "sets_requested": args.sets,
        "validation_sets_requested": args.validation_sets,
        "validation_fraction": args.validation_fraction if not args.validation_sets else None,
        "pooled_queries": len(queries), "multi_tool_sets": n_multi,
        "held_out_sets": len(split.held_out), "held_out_queries": len(split.test),
        "after_carve": counts,
        "checks": "no held-out gold set occurs in train; every held-out tool occurs in train; "
                  "validation and test sets are disjoint",
        "held_out": [list(s) for s in split.held_out],
        "validation_held_out": [list(s) for s in split.validation_sets],
    }
    (tmp / "split.json").write_text(json.dumps(manifest, indent=1) + "\n")
  print(f"{args.data}: pooled {len(queries)} queries, {n_multi} distinct multi-tool gold sets; "
        f"held out {len(split.held_out)} sets = {len(split.test)} test queries (seed {args.seed})")
  how = (f"held out: {len(split.validation_sets)} sets" if args.validation_sets
         else f"carved, fraction {args.validation_fraction}")
  print(f"train {counts['train']} queries ({counts['train_sets']} distinct sets) + validation "
        f"{counts['validation']} ({how}); test {counts['test']} over {counts['test_sets']} sets")
  print("checked: no held-out gold set occurs in train; every held-out tool occurs in train")
  print(f"wrote {out} (read it as beir:{out})")
  return 0


def main(argv: list[str] | None = None) -> int:
  from hyset_jax import cli
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--data", required=True, metavar="SPEC", help="source data set (data spec)")
  parser.add_argument("--seed", type=int, default=0, help="draw order of the held-out sets")
  parser.add_argument("--sets", type=int, default=DEFAULT_SETS,
                      help=f"how many multi-tool gold sets to hold out (default {DEFAULT_SETS})")
  parser.add_argument("--validation-sets", type=int, default=DEFAULT_VALIDATION_SETS,
                      help="further multi-tool gold sets held out the same way for validation "
                           f"(default {DEFAULT_VALIDATION_SETS}); 0 = validation is carved from "
                           "train, so its sets are seen in training")
  parser.add_argument("--validation-fraction", type=float,
                      default=DataConfig.validation_fraction,
                      help="with --validation-sets 0: the validation carve training will apply "
                           "(for the coverage check)")
  parser.add_argument("--out", required=True, metavar="DIR", help="BEIR directory to write")
  parser.add_argument("--force", action="store_true", help="replace an existing --out")
  parser.set_defaults(func=run)
  return cli.run(parser, argv)


if __name__ == "__main__":
  sys.exit(main())
