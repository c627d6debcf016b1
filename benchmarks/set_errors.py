"""Where a trained HYSET model's predicted set differs from the set classifier's, query by query:

  python -m benchmarks.set_errors --model runs/results/toollens_tuned_e3_preset_s0/best \
      --tag toollens_tuned_e3 [--config toollens] [--out benchmarks/results] [--force]

Both read the query encoder the model directory names. The set classifier (the memorisation
baseline: a softmax over the training gold sets, hyset_jax.retrievers.set_classifier) is fitted
with seed 0 on the config's training split. On the test split this counts the queries each gets
exactly right, both, neither, and sorts the queries HYSET gets wrong while the classifier is
right by the kind of mistake: the wrong size or the right size, a predicted set that is or is
not a training gold set, and whether the gold set was inside HYSET's shortlist at all (a
shortlist miss cannot be fixed by the set score).

Writes ``set_errors_<tag>.json`` and ``.md`` under --out (an existing folder; existing files
need ``--force``).
"""
from __future__ import annotations

import argparse
import collections
import datetime
import pathlib
import sys

from benchmarks import provenance


def mistake(pred: frozenset, gold: frozenset, shortlist: set, seen: set) -> str:
  """One label for a wrong prediction.

  >>> mistake(frozenset({1}), frozenset({1, 2}), {1, 2, 3}, {frozenset({1})})
  'wrong size (a subset of the gold set), a training set, gold in the shortlist'
  """
  if len(pred) != len(gold):
    kind = "wrong size" + (" (a subset of the gold set)" if pred < gold else
                           " (a superset of the gold set)" if pred > gold else "")
  else:
    kind = "right size"
  return ", ".join((kind, "a training set" if pred in seen else "not a training set",
                    "gold in the shortlist" if gold <= shortlist else "gold not in the shortlist"))


def run(args: argparse.Namespace) -> int:
  from hyset_jax import config as config_lib, io_utils
  from hyset_jax.encoder import load_encoder
  from hyset_jax.errors import UserError
  from hyset_jax.io.modeldir import load_model_dir
  from hyset_jax.retrievers import fit_baseline
  from hyset_jax.retrievers.hyset import HysetRetriever
  from hyset_jax.training.train_data import load_config_dataset
  out_json, out_md = (io_utils.output_file(pathlib.Path(args.out) / f"set_errors_{args.tag}.{e}",
                                           args.force, inputs=[args.model])
                      for e in ("json", "md"))
  model = load_model_dir(args.model)
  if model.query_encoder is None:
    raise UserError(f"{args.model}: the model directory names no query encoder")
  config = config_lib.resolve(args.config)
  c = config.data
  dataset = load_config_dataset(c, model.max_set_size)
  train, val, test = (dataset.split(s) for s in (c.train_split, c.val_split, c.test_split))
  encoder = load_encoder(model.query_encoder)
  texts = [q.text for q in test]
  hyset = HysetRetriever(model.params, model.tool_ids, encoder, k1=model.k1, k_pool=model.k_pool, lexical=model.lexical,
                         max_size=model.max_set_size, ranking=model.default_ranking)
  got = hyset.retrieve(texts, depth=model.k_pool)
  classifier = fit_baseline("set-classifier", dataset.tools, encoder, train, seed=0,
                            validation=val, set_rule="top5")
  other = classifier.retrieve(texts, depth=5)
  seen = {frozenset(q.gold) for q in train}
  counts = collections.Counter()
  kinds: collections.Counter = collections.Counter()
  for i, q in enumerate(test):
    gold = frozenset(q.gold)
    h, s = frozenset(got.sets[i]) == gold, frozenset(other.sets[i]) == gold
    counts["both right" if h and s else "HYSET only" if h else "set classifier only" if s
           else "both wrong"] += 1
    if s and not h:
      kinds[mistake(frozenset(got.sets[i]), gold, set(got.rankings[i]), seen)] += 1
  n = len(test)
  command = "python -m benchmarks.set_errors " + " ".join(args.argv)
  meta = {"command": command, "date": datetime.date.today().isoformat(), "spec": c.spec,
          "model": str(pathlib.Path(args.model).resolve()), "query_encoder": model.query_encoder,
          "test_queries": n, "test_gold_sets_seen_in_training":
          sum(frozenset(q.gold) in seen for q in test)}
  provenance.write_json(out_json, {"meta": meta, "exact": dict(counts),
                                  "hyset_wrong_classifier_right": dict(kinds)}, command)
  lines = [f"{c.spec} test split ({n} queries), model {meta['model']}, query encoder "
           f"{model.query_encoder}; `{command}`, {meta['date']}.", "",
           "| exact set | queries | % |", "|---|---:|---:|"]
  lines += [f"| {k} | {v} | {100 * v / n:.2f} |" for k, v in
            sorted(counts.items(), key=lambda kv: -kv[1])]
  lines += ["", "| HYSET wrong, set classifier right: HYSET's set | queries |", "|---|---:|"]
  lines += [f"| {k} | {v} |" for k, v in kinds.most_common()]
  out_md.write_text("\n".join(lines) + "\n")
  print("\n".join(lines))
  return 0


def main(argv: list[str] | None = None) -> int:
  from hyset_jax import cli
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", required=True, metavar="DIR", help="a HYSET model directory")
  parser.add_argument("--tag", required=True, help="names the outputs")
  parser.add_argument("--config", default="toollens",
                      help="the preset whose data and splits to use (default: toollens)")
  parser.add_argument("--out", default="benchmarks/results", metavar="DIR",
                      help="existing folder for set_errors_<tag>.json and .md")
  parser.add_argument("--force", action="store_true", help="replace existing result files")
  parser.set_defaults(func=run, argv=list(sys.argv[1:] if argv is None else argv))
  return cli.run(parser, argv)


if __name__ == "__main__":
  sys.exit(main())
