"""``make demo``: the main job on the embedded default data set (BFCL from ``bfcl-eval``).

1. Untrained HYSET (= the frozen MiniLM dense retriever) on the BFCL test split.
2. ``hyset train --config bfcl`` for a few minutes (resumes if ``runs/demo`` already holds it).
3. The trained model on the same split, and a few queries with their predicted tool sets.

Run: ``python -m hyset_jax.demo [--workdir runs/demo] [--set key=value ...]``.
"""
from __future__ import annotations

import argparse
import logging
import sys

KEYS = ("recall@3", "recall@5", "comp@3", "comp@5", "set_f1", "set_exact")


def _table(rows: dict[str, dict]) -> str:
  head = f"{'model':<28}" + "".join(f"{k:>11}" for k in KEYS)
  lines = [head, "-" * len(head)]
  for name, m in rows.items():
    lines.append(f"{name:<28}" + "".join(f"{100 * m[k]:>10.2f}%" for k in KEYS))
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir", default="runs/demo")
  parser.add_argument("--config", default="bfcl")
  parser.add_argument("--set", dest="overrides", action="append", default=[])
  args = parser.parse_args(argv)

  from hyset_jax.errors import UserError
  try:
    return _run(args)
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2


def _run(args) -> int:
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
  for noisy in ("absl", "orbax", "jax"):
    logging.getLogger(noisy).setLevel(logging.WARNING)
  from hyset_jax import config as config_lib
  from hyset_jax.inference import pipeline
  from hyset_jax.io import modeldir
  from hyset_jax.model import parameters
  from hyset_jax.training import train
  from hyset_jax.evaluation.evaluator import evaluate_split
  from hyset_jax.training.train_data import prepare_data

  config = config_lib.resolve(args.config, args.overrides)
  print(f"== data {config.data.spec}: encoding tools and queries with the frozen encoder "
        f"(cached after the first run)")
  data = prepare_data(config)
  test = data.splits[config.data.test_split]
  untrained = parameters.init_params(data.tool_embeddings, test.embeddings.shape[1],
                                config.model.max_set_size)
  before = evaluate_split(untrained, test, data.tool_ids, config.model, 256)

  print(f"== training ({config.train.num_steps} steps max) in {args.workdir}")
  summary = train.train_and_evaluate(config, args.workdir, data=data)
  best = modeldir.load_model_dir(f"{args.workdir}/best")
  after = evaluate_split(best.params, test, data.tool_ids, config.model, 256,
                         ranking=best.ranking,  # the ranking training chose on validation
                         lexical=best.lexical)

  print(f"\n== {config.data.spec} test split, {before['n_queries']} queries")
  trained = f"HYSET (step {summary['best_step']}, {best.default_ranking})"
  print(_table({"untrained (= dense)": before, trained: after}))
  pred = pipeline.predict_batched(best.params,
                                   best.query_inputs(test.embeddings[:5], test.texts[:5]),
                                   k1=best.k1, k_pool=best.k_pool, max_size=best.max_set_size)
  print("\n== a few test queries")
  for q in range(min(5, len(test.ids))):
    text = " ".join(test.texts[q].split())[:110]
    got = [data.tool_ids[t] for t in pred.set_tools[q] if t >= 0]
    gold = [data.tool_ids[t] for t in test.gold[q]]
    print(f"- {text}\n  predicted set: {got}\n  gold set:      {gold}")
  print(f"\ncurves: {args.workdir}/curves.png   model: {args.workdir}/best   "
        f"metrics: {args.workdir}/metrics.jsonl")
  return 0


if __name__ == "__main__":
  sys.exit(main())
