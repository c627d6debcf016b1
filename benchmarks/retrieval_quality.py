"""Retrieval quality tables for docs/results.md (summarised in the README): baselines, HYSET
over seeds, ablations.

  python -m benchmarks.retrieval_quality --config toollens --seeds 0 1 2 --out benchmarks/results

Every HYSET row is ``hyset train`` (resumable: rerunning skips finished runs) followed by the
best-by-validation model on the test split. Rows:

- BM25 / dense (frozen MiniLM, or the ``--encoder``) / BM25+dense RRF, through ``hyset eval``'s
  retrievers;
- HYSET untrained (= dense);
- HYSET, paper configuration: the config with the paper's choices put back (Eq. 10 with the
  50/30/20 mix, no per-tool loss, no shortlist negatives, no exhaustive-shortlist loss, linear
  P, no conditioned term, greedy ranking, 1,500 steps) — for ``--config toollens`` this is
  ``--config paper``;
- HYSET, preset: the config as shipped;
- ablations on the preset (``--ablation-seeds``; ``--ablations TAG…`` picks some): no query tower,
  no conditioned term, no per-tool loss, no exhaustive-shortlist loss, no F_set, identity M, one
  shared M, 1,500 training steps instead of the preset's, Z fixed at the encoder's embeddings
  (or trained, for a preset that fixes it) — also with 250 steps, with 250 steps and the
  query noise, and with those, no seen-set prior and a 30-tool shortlist (the configuration
  for new combinations) —, Z moved by the per-tool loss only; and two additions, noise on the training query embeddings (``train.query_noise``),
  also with 1,500 steps, and the seen-set prior (``model.set_prior``), alone and with the noise
  and 1,500 steps — each prior run also reported as the same θ without its prior;
- the first preset seed's model, and the first Z-fixed seed's, under every ranking (greedy,
  logit, set-first, set-mean);
- trained baselines on the same frozen embeddings (hyset_jax.retrievers.trained, seeded like
  HYSET): per-tool linear and MLP heads (per-tool softmax loss; set = top 5, and again with a
  validation-chosen probability threshold as the set) and the set classifier over the training
  gold sets (the memorisation baseline), and the paper's set-level baselines over the linear
  head's shortlist (cardinality prediction, MMR, facility location, DeepSets, Set Transformer;
  docs/baselines.md). ``--head-variants`` adds the heads with one-vs-rest
  sigmoid loss, the alternative the softmax loss was chosen over (with --ablation-seeds).

``--baselines-only`` skips every HYSET training row (seconds to minutes instead of an hour);
``--no-preset`` skips the preset row only (ablations measured beside the baselines);
``--data SPEC`` runs the config on another data set, e.g. the unseen-set split of
benchmarks/unseen_split.py; ``--encoder DIR`` embeds queries and tools with another encoder,
e.g. one tuned by ``hyset finetune`` (every row, baselines included, then reads its vectors);
``--tag`` names its outputs and run directories.

Writes ``retrieval_<tag>.json``, ``.md`` and ``.png`` (R@5, COMP@3, COMP@5 of every row) under
--out (``retrieval_<tag>_baselines.*`` with --baselines-only); ``--plot-only`` redraws the plot
of an existing result.
"""
from __future__ import annotations

import argparse
import datetime
import json
import logging
import pathlib
import platform
import subprocess
import sys
import time
from typing import Any, NamedTuple

import numpy as np

from benchmarks import provenance, quality_variants, report

KEYS = ("recall@3", "recall@5", "ndcg@3", "ndcg@5", "comp@3", "comp@5", "set_f1", "set_exact")


# What run_hyset keeps in a workdir it trained start to end: {"wall_s", "steps"}.
WALL_FILE = "benchmark_wall.json"


def run_hyset(config_name: str, variant: str, overrides: list[str], seed: int,
              runs: pathlib.Path, tag: str) -> dict:
  from hyset_jax import config as config_lib, io_utils
  from hyset_jax.training import checkpoints
  from hyset_jax.training.train import train_and_evaluate
  workdir = runs / f"{tag}_{variant}_s{seed}"
  config = config_lib.resolve(config_name, overrides + [f"train.seed={seed}"])
  # A workdir with a checkpoint is resumed or reused; one killed before its first checkpoint
  # trains from step 0 again, so its time is whole.
  fresh = not checkpoints.saved_steps(workdir)
  t0 = time.time()
  summary = train_and_evaluate(config, workdir, progress=False)
  # A wall time only for a run trained start to end here, kept in the workdir (WALL_FILE) so
  # that a rerun of the finished run (the fits after θ chosen again) reports the training's
  # measured time rather than none; a run resumed part-way says nothing.
  wall = workdir / WALL_FILE
  if fresh:
    summary["wall_s"] = round(time.time() - t0, 1)
    with io_utils.atomic_write(wall) as f:
      json.dump({"wall_s": summary["wall_s"], "steps": summary.get("steps")}, f)
  else:
    try:  # a missing or damaged record is no measurement
      saved = dict(json.loads(wall.read_text()))
    except (OSError, ValueError, TypeError):
      saved = {}
    summary["wall_s"] = saved.get("wall_s") if saved.get("steps") == summary.get("steps") else None
  summary["workdir"] = str(workdir)
  return summary


def ranking_rows(model_dir: pathlib.Path, data, test, mc) -> dict[str, dict]:
  """The preset model under every ranking it supports (greedy not with a seen-set prior); the
  set Ê is the same under all of them."""
  from hyset_jax.io import modeldir
  from hyset_jax.model import terms
  from hyset_jax.evaluation.evaluator import evaluate_rankings
  md = modeldir.load_model_dir(model_dir)
  mc = model_sizes(mc, md)
  chosen = md.default_ranking
  names = terms.allowed_rankings(md.params)
  return {f"ranking {r}" + (" (chosen on validation)" if r == chosen else ""): m
          for r, m in evaluate_rankings(md.params, test, data.tool_ids, mc, 256, names,
                                        lexical=md.lexical).items()}


def without_prior(model_dir: pathlib.Path, data, config) -> dict:
  """Test metrics of a model directory's θ with its seen-set prior removed, ranked by the
  method validation chooses for that model."""
  from hyset_jax.io import modeldir
  from hyset_jax.evaluation.evaluator import choose_ranking, evaluate_split
  md = modeldir.load_model_dir(model_dir)
  params, mc = md.params._replace(prior=None), model_sizes(config.model, md)
  ranking, _ = choose_ranking(params, data.splits[config.data.val_split], data.tool_ids,
                              mc, 256, md.lexical)
  return evaluate_split(params, data.splits[config.data.test_split], data.tool_ids,
                        mc, 256, ranking=ranking, lexical=md.lexical)


def without_lexical(model_dir: pathlib.Path, data, config) -> dict | None:
  """Test metrics of a model directory's θ (and prior) with its lexical term removed, ranked
  by the method validation chooses for that model; None when it has no lexical term."""
  from hyset_jax.io import modeldir
  from hyset_jax.evaluation.evaluator import choose_ranking, evaluate_split
  md = modeldir.load_model_dir(model_dir)
  if md.lexical is None:
    return None
  params, mc = md.params._replace(lexical_weight=None), model_sizes(config.model, md)
  ranking, _ = choose_ranking(params, data.splits[config.data.val_split], data.tool_ids,
                              mc, 256)
  return evaluate_split(params, data.splits[config.data.test_split], data.tool_ids,
                        mc, 256, ranking=ranking)


def model_sizes(mc, md):
  """``mc`` with the K1, K_pool and M a model directory was trained with (an ablation may
  change them: zfixed250noise30)."""
  import dataclasses
  return dataclasses.replace(mc, k1=md.k1, k_pool=md.k_pool, max_set_size=md.max_set_size)


def baselines(config, data, test) -> dict[str, dict]:
  from hyset_jax.evaluation import metrics
  from hyset_jax.data.specs import load_dataset
  from hyset_jax.encoder import load_encoder
  from hyset_jax.model.parameters import init_params
  from hyset_jax.retrievers import BM25Retriever, DenseRetriever, FusionRetriever
  from hyset_jax.evaluation.evaluator import evaluate_split
  tools = load_dataset(config.data.spec).tools
  encoder = load_encoder(config.model.encoder or None)
  gold = [[data.tool_ids[t] for t in g] for g in test.gold]
  out = {}
  bm25, dense = BM25Retriever(tools), DenseRetriever(tools, encoder)
  dense_name = "dense (frozen MiniLM)" if not config.model.encoder else "dense (--encoder)"
  for name, r in (("BM25", bm25), (dense_name, dense),
                  ("BM25+dense RRF", FusionRetriever([bm25, dense]))):
    got = r.retrieve(list(test.texts), depth=20)
    out[name] = metrics.evaluate(got.rankings, gold, got.sets)
  untrained = init_params(data.tool_embeddings, test.embeddings.shape[1],
                          config.model.max_set_size)
  out["HYSET untrained (= dense)"] = evaluate_split(untrained, test, data.tool_ids,
                                                    config.model, 256)
  return out


# (row label, method, HeadConfig overrides); heads also get a ", thresholded set" row.
TRAINED = (("per-tool linear head", "linear-head", {}),
           ("per-tool MLP head", "mlp-head", {}),
           ("set classifier (training gold sets)", "set-classifier", {}),
           # The paper's set-level baselines (§3.3), over the linear head's shortlist; each
           # predicts its own set (docs/baselines.md).
           ("cardinality prediction (top-m̂ of ℓ)", "cardinality", {}),
           ("maximal marginal relevance", "mmr", {}),
           ("facility location", "facility-location", {}),
           ("DeepSets set scorer", "deepsets", {}),
           ("Set Transformer set scorer", "set-transformer", {}))
HEAD_VARIANTS = (("per-tool linear head, sigmoid loss", "linear-head", {"loss": "sigmoid"}),
                 ("per-tool MLP head, sigmoid loss", "mlp-head", {"loss": "sigmoid"}))


def trained_baselines(config, data, test, subsets: dict[str, list[int]], seeds: list[int],
                      mlp_seeds: list[int], variant_seeds: list[int],
                      with_lexical: bool = False) -> tuple[dict, dict]:
  """Fits each trained baseline once per seed on the train split and scores every subset.

  The MLP head (the slowest fit) runs with ``mlp_seeds``, the head variants (sigmoid loss)
  with ``variant_seeds`` (empty: not at all); ``with_lexical`` adds the linear head with the
  lexical term (a row beside any HYSET row that has it).

  Returns ({subset: {row: [metrics per seed]}}, {row: [fit seconds per seed]}). The heads'
  threshold is chosen on the validation split (the one HYSET early-stops on).
  """
  from hyset_jax.evaluation import metrics
  from hyset_jax.encoder import load_encoder
  from hyset_jax.model.lexical import LexicalIndex
  from hyset_jax.retrievers import fit_baseline
  from hyset_jax.retrievers.heads import LexicalHeadRetriever
  from hyset_jax.training.train_data import load_config_dataset
  c = config.data
  dataset = load_config_dataset(c, config.model.max_set_size)
  lexical = LexicalIndex(dataset.tools.texts) if with_lexical else None
  train, validation = dataset.split(c.train_split), dataset.split(c.val_split)
  encoder = load_encoder(config.model.encoder or None)
  gold = [[data.tool_ids[t] for t in g] for g in test.gold]
  rows: dict[str, dict[str, list[dict]]] = {name: {} for name in subsets}
  costs: dict[str, list[float]] = {}
  runs = [(row, mlp_seeds if row[1] == "mlp-head" else seeds) for row in TRAINED]
  runs += [(row, variant_seeds) for row in HEAD_VARIANTS]
  for (label, method, overrides), row_seeds in runs:
    head = method in ("linear-head", "mlp-head")
    for seed in row_seeds:
      t0 = time.time()
      r = fit_baseline(method, dataset.tools, encoder, train, seed=seed, validation=validation,
                       set_rule="threshold" if head else "top5", **overrides)
      costs.setdefault(label, []).append(round(time.time() - t0, 1))
      got = r.retrieve(list(test.texts), depth=20)
      for name, keep in subsets.items():
        ranks, golds = [got.rankings[i] for i in keep], [gold[i] for i in keep]
        sets = None if got.sets is None else [got.sets[i] for i in keep]
        out = rows[name]
        # A head's own rows score the top 5 as its set, like the rank-only retrievers.
        out.setdefault(label, []).append(metrics.evaluate(ranks, golds, None if head else sets))
        if head:
          out.setdefault(f"{label}, thresholded set", []).append(
              metrics.evaluate(ranks, golds, sets))
      logging.info("%s seed %d: fit %.0fs, test comp@5 %.4f", label, seed, costs[label][-1],
                   rows["all"][label][-1]["comp@5"])
      if method == "linear-head" and lexical and not overrides:
        # The same head with HYSET's lexical term (β on validation): the words' own gain.
        fused = LexicalHeadRetriever.fit(r, lexical, validation)
        got = fused.retrieve(list(test.texts), depth=20)
        name_l = f"{label} + lexical term"
        for name, keep in subsets.items():
          rows[name].setdefault(name_l, []).append(metrics.evaluate(
              [got.rankings[i] for i in keep], [gold[i] for i in keep]))
        logging.info("%s seed %d: β = %g, test comp@5 %.4f", name_l, seed, fused.weight,
                     rows["all"][name_l][-1]["comp@5"])
  return rows, costs


def subset(test, keep: list[int]):
  import dataclasses
  return dataclasses.replace(test, ids=tuple(test.ids[i] for i in keep),
                             texts=tuple(test.texts[i] for i in keep),
                             embeddings=test.embeddings[keep],
                             gold=tuple(test.gold[i] for i in keep))


def multi_tool_hyset_rows(config, data, sub, runs: pathlib.Path, args) -> dict:
  """The trained HYSET runs again, on the multi-tool test queries only."""
  from hyset_jax.io import modeldir
  from hyset_jax.evaluation.evaluator import evaluate_split
  rows: dict[str, list[dict]] = {}
  for label, tag in (("HYSET, paper configuration", "paper"), ("HYSET, preset", "preset")):
    for seed in args.seeds:
      run = runs / f"{args.tag}_{tag}_s{seed}"
      if not (run / "best").exists():
        continue                     # a row run with fewer seeds (--paper-seeds)
      best = modeldir.load_model_dir(run / "best")
      mc = model_sizes(config.model, best)
      rows.setdefault(label, []).append(evaluate_split(best.params, sub, data.tool_ids,
                                                       mc, 256, ranking=best.ranking,
                                                       lexical=best.lexical))
      if best.lexical is not None:
        plain = best.params._replace(lexical_weight=None)
        rows.setdefault(f"{label}: the same θ without the lexical term", []).append(
            evaluate_split(plain, sub, data.tool_ids, mc, 256, ranking=best.ranking))
  return rows


def fmt(values: list[float]) -> str:
  a = 100 * np.asarray(values)
  return f"{a.mean():.2f} ± {a.std(ddof=1):.2f}" if len(a) > 1 else f"{a[0]:.2f}"


def table(rows: dict[str, list[dict]]) -> list[str]:
  lines = ["| method | runs | " + " | ".join(KEYS) + " |", "|---|---|" + "---|" * len(KEYS)]
  for name, ms in rows.items():
    lines.append(f"| {name} | {len(ms)} | " + " | ".join(fmt([m[k] for m in ms]) for k in KEYS)
                 + " |")
  return lines


def main(argv: list[str] | None = None) -> int:
  from hyset_jax import cli
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", default="toollens")
  parser.add_argument("--data", metavar="SPEC",
                      help="data set to run the config on instead of its own (data.spec)")
  parser.add_argument("--encoder", metavar="DIR",
                      help="the query encoder of every row (HYSET and the baselines): a "
                           "sentence-transformers directory, e.g. hyset finetune's OUT/encoder "
                           "(default: the config's model.encoder)")
  parser.add_argument("--tag", help="names the outputs and run directories (default: --config)")
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--paper-seeds", type=int, nargs="*",
                      help="seeds of the paper-configuration row (default: --seeds)")
  parser.add_argument("--ablation-seeds", type=int, nargs="+", default=[0])
  parser.add_argument("--ablations", nargs="*", metavar="TAG",
                      help="only these ablation rows (tags: notower nocond notool noenum noset "
                           "identity shared ztrain zfixed zfixed250 zfixed250noise zfixed250noise30 "
                           "zfixed250noise30lex zsep nolex lexical "
                           "steps1500 noise "
                           "noise1500 "
                           "prior prior1500; none given: no ablations; default: all)")
  parser.add_argument("--no-preset", action="store_true",
                      help="no preset row (ablations and baselines only; --seeds still seeds "
                           "the baselines)")
  parser.add_argument("--runs", default="runs/results")
  parser.add_argument("--multi-tool", action="store_true",
                      help="also a table on the test queries with ≥ 2 gold tools")
  parser.add_argument("--baselines-only", action="store_true",
                      help="only the untrained and trained baselines; no HYSET training")
  parser.add_argument("--mlp-seeds", type=int, nargs="*",
                      help="seeds of the MLP head, the slowest fit (default: --seeds; "
                           "none given: no MLP rows)")
  parser.add_argument("--head-variants", action="store_true",
                      help="also the per-tool heads with one-vs-rest sigmoid loss "
                           "(--ablation-seeds)")
  parser.add_argument("--out", default="benchmarks/results",
                      help="existing folder for retrieval_<tag>[_baselines].{json,md}")
  parser.add_argument("--force", action="store_true",
                      help="replace existing result files of the same name")
  parser.add_argument("--plot-only", action="store_true",
                      help="only (re)draw retrieval_<tag>[_baselines].png from its existing "
                           ".json under --out")
  # The command recorded in the results is the one given here, also when called from Python.
  parser.set_defaults(func=run, argv=list(sys.argv[1:] if argv is None else argv))
  return cli.run(parser, argv)


class _Setup(NamedTuple):
  """What every part of a :func:`run` reads: the resolved config, its prepared data and test
  split, the ``--data``/``--encoder`` overrides every HYSET row adds, the test subsets scored
  ("all", and "multi" with --multi-tool), the multi-tool test rows and the runs folder."""
  config: Any
  data: Any
  test: Any
  data_override: list[str]
  subsets: dict[str, list[int]]
  multi: list[int]
  runs: pathlib.Path


def run(args: argparse.Namespace) -> int:
  from hyset_jax import io_utils
  args.tag = args.tag or args.config
  stem = f"retrieval_{args.tag}" + ("_baselines" if args.baselines_only else "")
  if args.plot_only:
    return plot_only(args, stem)
  # Every output checked before an hour of training (an existing result needs --force).
  out_json, out_md, out_png = (
      io_utils.output_file(pathlib.Path(args.out) / f"{stem}.{ext}", args.force)
      for ext in ("json", "md", "png"))
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
  for noisy in ("absl", "orbax", "jax"):
    logging.getLogger(noisy).setLevel(logging.WARNING)

  setup = _prepare(args)
  test, subsets = setup.test, setup.subsets
  rows = {name: {k: [v] for k, v in baselines(setup.config, setup.data,
                                             subset(test, keep)).items()}
          for name, keep in subsets.items()}
  costs, chosen = _hyset_rows(args, setup, rows["all"])
  if "multi" in subsets and not args.baselines_only:
    rows["multi"].update(multi_tool_hyset_rows(setup.config, setup.data,
                                               subset(test, setup.multi), setup.runs, args))
  trained, fit_costs = trained_baselines(setup.config, setup.data, test, subsets, args.seeds,
                                         args.seeds if args.mlp_seeds is None
                                         else args.mlp_seeds,
                                         args.ablation_seeds if args.head_variants else [],
                                         with_lexical=True)
  for name in subsets:
    rows[name].update(trained[name])

  meta = {"command": "python -m benchmarks.retrieval_quality " + " ".join(args.argv),
          "date": datetime.date.today().isoformat(), "machine": platform.processor() or
          platform.machine(), "cpus": subprocess.run(["nproc"], capture_output=True,
                                                     text=True).stdout.strip(),
          "spec": setup.config.data.spec, "query_encoder": setup.data.query_encoder,
          "test_queries": len(test.ids),
          "multi_tool_test_queries": len(setup.multi),
          "train_wall_s": costs, "fit_wall_s": fit_costs, "rankings": chosen}
  provenance.write_json(
      out_json, {"meta": meta, "rows": rows["all"], "multi_tool_rows": rows.get("multi", {})},
      meta["command"])
  lines = _markdown(args, setup, rows, meta)
  out_md.write_text("\n".join(lines) + "\n")
  report.plot_quality(rows["all"], out_png,
                      f"{setup.config.data.spec} test ({len(test.ids)} queries)")
  print("\n".join(lines))
  print(f"wrote {out_json}, {out_md} and {out_png}")
  return 0


def _prepare(args: argparse.Namespace) -> _Setup:
  """Resolves the config (with ``--data``/``--encoder``), prepares its data and picks the
  test subsets. Returns the run's :class:`_Setup`."""
  from hyset_jax import config as config_lib
  from hyset_jax.training.train_data import prepare_data
  data_override = ([f"data.spec={args.data}"] if args.data else []) + (
      [f"model.encoder={args.encoder}"] if args.encoder else [])
  config = config_lib.resolve(args.config, data_override)
  data = prepare_data(config)
  test = data.splits[config.data.test_split]
  multi = [i for i, g in enumerate(test.gold) if len(g) >= 2]
  subsets = {"all": list(range(len(test.ids)))}
  if args.multi_tool and multi:
    subsets["multi"] = multi
  return _Setup(config, data, test, data_override, subsets, multi, pathlib.Path(args.runs))


def _hyset_rows(args: argparse.Namespace, setup: _Setup, rows: dict[str, list[dict]]
                ) -> tuple[dict[str, list[float]], dict[str, list[str]]]:
  """Trains (or reuses) every HYSET run asked for and adds its test rows to ``rows``: the
  run's own, the same θ without its prior or lexical term where it has one, and the first
  preset and Z-fixed seed under every ranking.

  Returns ({row: training seconds of each run trained start to end here},
  {row: the ranking each run recorded}).
  """
  from hyset_jax import config as config_lib
  config, data = setup.config, setup.data
  costs: dict[str, list[float]] = {}
  chosen: dict[str, list[str]] = {}   # the ranking each run recorded, per row
  hyset = quality_variants.variants(args, config.model.train_tool_embeddings)
  for label, tag, overrides, seeds in [] if args.baselines_only else hyset:
    for seed in seeds:
      summary = run_hyset(args.config, tag, setup.data_override + overrides, seed, setup.runs,
                          args.tag)
      rows.setdefault(label, []).append(summary["test"])
      chosen.setdefault(label, []).append(summary["ranking"])
      if summary["wall_s"] is not None:
        costs.setdefault(label, []).append(summary["wall_s"])
      best = pathlib.Path(summary["workdir"]) / "best"
      if config_lib.resolve(args.config, setup.data_override + overrides).model.set_prior:
        # The same θ without its prior (the ranking chosen for that): the prior's own effect.
        rows.setdefault(f"{label}: the same θ without the prior", []).append(
            without_prior(best, data, config))
      if config_lib.resolve(args.config, setup.data_override + overrides).model.lexical:
        # The same θ without its lexical term (the ranking chosen for that): the term's effect.
        plain = without_lexical(best, data, config)
        if plain is not None:
          rows.setdefault(f"{label}: the same θ without the lexical term", []).append(plain)
      if tag in ("preset", "zfixed") and seed == seeds[0]:
        for name, m in ranking_rows(best, data, setup.test, config.model).items():
          rows[f"{'Z fixed' if tag == 'zfixed' else tag} seed {seed}, {name}"] = [m]
  return costs, chosen


def _markdown(args: argparse.Namespace, setup: _Setup, rows: dict[str, dict[str, list[dict]]],
              meta: dict) -> list[str]:
  """The lines of ``retrieval_<tag>.md``: the tables, the rankings and the costs."""
  test, costs, chosen = setup.test, meta["train_wall_s"], meta["rankings"]
  lines = [f"{setup.config.data.spec} test split ({len(test.ids)} queries), query encoder "
           f"{setup.data.query_encoder} (frozen while θ trains); "
           f"mean ± std over seeds {args.seeds} where several; "
           f"`{meta['command']}`, {meta['date']}, {meta['cpus']} CPUs.", ""] + table(rows["all"])
  if "multi" in rows:
    lines += ["", f"Multi-tool test queries only (|E*| ≥ 2: {len(setup.multi)} queries):", ""]
    lines += table(rows["multi"])
  lines.append("")
  if chosen:
    lines.append("Ranking of each run (chosen on validation unless the config names one), by "
                 "seed: " + "; ".join(f"{k}: {', '.join(v)}" for k, v in chosen.items()))
  if not costs and not args.baselines_only:
    lines.append("Training wall time: no HYSET run was trained start to end in this invocation "
                 f"(all reused from {setup.runs}/).")
  if costs:
    lines.append("Training wall time per run trained start to end in this invocation (s, this "
                 "CPU, to early stop or the step budget): " +
                 ", ".join(f"{k}: {np.mean(v):.0f}" for k, v in costs.items()))
  lines.append("Trained-baseline fit time per seed (s, this CPU, embeddings cached): " +
               ", ".join(f"{k}: {np.mean(v):.0f}" for k, v in meta["fit_wall_s"].items()))
  return lines


def plot_only(args: argparse.Namespace, stem: str) -> int:
  """``--plot-only``: the plot of an existing ``<stem>.json`` (no data read, nothing trained)."""
  from hyset_jax import io_utils
  from hyset_jax.data import files
  from hyset_jax.errors import UserError
  src = files.require_file(pathlib.Path(args.out) / f"{stem}.json", "retrieval_quality result")
  result = files.read_json(src)
  if not isinstance(result, dict) or not isinstance(result.get("rows"), dict):
    raise UserError(f"{src}: expected a retrieval_quality result with a \"rows\" object")
  out_png = io_utils.output_file(pathlib.Path(args.out) / f"{stem}.png", args.force)
  meta = result.get("meta", {})
  report.plot_quality(result["rows"], out_png,
                      f"{meta.get('spec', stem)} test ({meta.get('test_queries', '?')} queries)")
  print(f"wrote {out_png}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
