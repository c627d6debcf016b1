"""Abstention ("no tool needed") on a data set with requests that need no tool, e.g. BFCL:

  hyset train --config bfcl --set model.abstain=true --workdir runs/bfcl-abstain
  python -m benchmarks.abstention --model runs/bfcl-abstain/best --config bfcl --tag bfcl \
      [--out benchmarks/results] [--force]

The model's abstention (hyset_jax/model/terms/abstain.py: a no-tool classifier u(r) = r·w + b
fitted on ``irrelevant_train`` against ``train``, its threshold τ chosen on validation: the most
``irrelevant_validation`` requests abstained with at most 2 points of R@5 lost on the relevant
validation queries) is swept over τ on the test splits the choice never saw: for each τ
(quantiles of u over the ``irrelevant_test`` requests) the share of ``irrelevant_test`` requests
answered with the empty set, against R@5, COMP@5 and exact-set of the relevant ``test`` queries,
where an abstained relevant query counts as retrieving nothing (the agent is told to use no
tool). Beside it, the label-free alternative the term does not use: a threshold on the best
set's score F (abstain when F < τ). Abstention changes nothing but which sets are emptied, so
each point is computed from one prediction pass; at the chosen τ the model's own prediction path
is run too and must give the same numbers.

Writes ``abstention_<tag>.json``, ``.md`` and ``.png`` (irrelevant requests abstained against R@5
lost, for both signals, the chosen τ marked) under --out (an existing folder; existing files
need ``--force``).
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np

from benchmarks import provenance

QUANTILES = np.linspace(0.0, 1.0, 41)
RELEVANT = ("recall@5", "comp@5", "set_exact")
SIGNALS = ("classifier", "best_set_score")


class _Inputs:
  """One prediction pass over the relevant and irrelevant test queries, without abstention."""

  def __init__(self, model, data, config, candidates: dict | None = None):
    from hyset_jax.errors import UserError
    from hyset_jax.inference import pipeline
    from hyset_jax.model.terms.abstain import irrelevant_split, no_tool_scores
    mc, self.data, self.config, self.model = config.model, data, config, model
    self.plain = model.params._replace(abstain=None)
    self.rel_qs = data.splits[config.data.test_split]
    irr_qs = data.splits[irrelevant_split(config, config.data.test_split)]
    row = {t: i for i, t in enumerate(model.tool_ids)}

    def allowed(qs):
      """bool[Q, N]: each request's own candidates; rows without any: no tool to offer."""
      mask = np.zeros((len(qs.ids), len(row)), bool)
      for i, qid in enumerate(qs.ids):
        if qid not in candidates:
          raise UserError(f"query {qid!r}: no candidate list in the BFCL data")
        mask[i, [row[n] for n in candidates[qid] if n in row]] = True
      return mask

    def predict(qs, mask=None):
      x = model.query_inputs(qs.embeddings, qs.texts)
      if mask is not None:
        x = x._replace(allowed=mask)
      return pipeline.predict_batched(self.plain, x, k1=mc.k1, k_pool=mc.k_pool,
                                      max_size=mc.max_set_size,
                                      batch_size=config.train.eval_batch_size,
                                      ranking=model.default_ranking)
    offered = np.ones(len(irr_qs.ids), bool)  # irrelevant requests offered some function
    if candidates is None:
      self.rel, irr = predict(self.rel_qs), predict(irr_qs)
    else:
      rel_mask, irr_mask = allowed(self.rel_qs), allowed(irr_qs)
      empty = [q for q, m in zip(self.rel_qs.ids, rel_mask) if not m.any()]
      if empty:
        raise UserError(f"relevant query {empty[0]!r}: none of its candidate functions is in "
                        f"the model's library")
      # A request offered no function has no set to answer with: it abstains at every τ.
      offered = irr_mask.any(axis=1)
      irr_mask[~offered] = True  # (predicted over everything only to keep the shapes)
      self.rel, irr = predict(self.rel_qs, rel_mask), predict(irr_qs, irr_mask)
    ab = model.params.abstain
    def irrelevant(scores):
      return np.where(offered, scores, np.inf)
    self.signal = {  # per signal: (relevant, irrelevant) "abstain" scores, higher = abstain
        "classifier": (no_tool_scores(ab, self.rel_qs.embeddings),
                       irrelevant(no_tool_scores(ab, irr_qs.embeddings)))
                      if ab is not None else None,
        "best_set_score": (-np.asarray(self.rel.set_score),
                           irrelevant(-np.asarray(irr.set_score)))}
    self.unoffered = int((~offered).sum())

  def point(self, signal: str, tau: float | None) -> dict:
    """The numbers when the queries whose ``signal`` is ≥ ``tau`` abstain (None: none do)."""
    from hyset_jax.evaluation.evaluator import prediction_metrics
    rel_s, irr_s = self.signal[signal]
    rel_none = np.zeros(len(rel_s), bool) if tau is None else rel_s >= tau
    irr_none = np.zeros(len(irr_s), bool) if tau is None else irr_s >= tau
    pred = self.rel._replace(set_size=np.where(rel_none, 0, np.asarray(self.rel.set_size)))
    m = prediction_metrics(pred, self.rel_qs, self.data.tool_ids, abstains=True)
    return {"tau": tau, "irrelevant_abstained": float(irr_none.mean()),
            "relevant_abstained": float(rel_none.mean()), **{k: m[k] for k in RELEVANT}}


def sweep(model, data, config, candidates: dict | None = None) -> dict:
  """Each signal's points, the point without abstention and the model's own (chosen) one;
  with ``candidates`` (query id -> its candidate function names), each request is answered
  over its own candidates only."""
  from hyset_jax.evaluation.evaluator import evaluate_split
  x = _Inputs(model, data, config, candidates)
  base = x.point("best_set_score", None)
  curves = {}
  for signal in SIGNALS:
    if x.signal[signal] is None:
      continue
    irr = x.signal[signal][1]
    taus = np.unique(np.quantile(irr[np.isfinite(irr)], QUANTILES).astype(np.float32))
    curves[signal] = [x.point(signal, float(t)) for t in taus]
  chosen = None
  if model.params.abstain is not None:
    chosen = x.point("classifier", float(model.params.abstain.threshold))
  if chosen is not None and candidates is None:  # (the prediction path has no candidates)
    real = evaluate_split(model.params, x.rel_qs, data.tool_ids, config.model,
                          config.train.eval_batch_size, ranking=model.default_ranking,
                          lexical=model.lexical)
    for k in RELEVANT:  # the model's own path agrees with the one-pass computation
      if abs(real[k] - chosen[k]) > 1e-9:
        raise RuntimeError(f"{k}: {real[k]} on the prediction path, {chosen[k]} here")
  for p in [q for c in curves.values() for q in c] + ([chosen] if chosen else []):
    p["recall@5_lost"] = base["recall@5"] - p["recall@5"]
    p["comp@5_lost"] = base["comp@5"] - p["comp@5"]
  from sklearn.metrics import roc_auc_score
  auc = {}  # how well each signal separates the two kinds of request, whatever the budget
  for signal, pair in x.signal.items():
    if pair is not None:
      rel_s, irr_s = pair
      auc[signal] = float(roc_auc_score(np.r_[np.zeros(len(rel_s)), np.ones(len(irr_s))],
                                        np.nan_to_num(np.r_[rel_s, irr_s], posinf=1e30)))
  best = {}
  for signal, pts in curves.items():
    within = [p for p in pts if p["recall@5_lost"] <= 0.02 + 1e-9]
    best[signal] = max(within, key=lambda p: p["irrelevant_abstained"]) if within else None
  return {"without": base, "chosen": chosen, "best_within_2_points_on_test": best,
          "roc_auc": auc, "curves": curves}


def plot(result: dict, title: str, path: pathlib.Path) -> None:
  from hyset_jax.training.curves import save_png
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(7, 4.5))
  labels = {"classifier": "no-tool classifier u(r) ≥ τ (the term)",
            "best_set_score": "best set's score F < τ (label-free)"}
  for signal, pts in result["curves"].items():
    ax.plot([100 * p["recall@5_lost"] for p in pts],
            [100 * p["irrelevant_abstained"] for p in pts], "o-", ms=3, label=labels[signal])
  if result["chosen"]:
    c = result["chosen"]
    ax.plot([100 * c["recall@5_lost"]], [100 * c["irrelevant_abstained"]], "r*", ms=14,
            label=f"τ chosen on validation ({c['tau']:.3g})")
  ax.axvline(2, color="grey", ls=":", label="2 points of R@5")
  ax.axhline(90, color="grey", ls="--", label="90% abstained")
  ax.set_xlabel("R@5 lost on the relevant test queries (points)")
  ax.set_ylabel("irrelevant test requests abstained (%)")
  ax.set_xlim(left=-1)
  ax.legend(fontsize=8)
  ax.set_title(title, fontsize=10)
  fig.tight_layout()
  save_png(fig, path)
  plt.close(fig)


def _row(name: str, p: dict | None) -> str:
  if p is None:
    return f"| {name} | — | — | — | — | — | — |"
  tau = "—" if p["tau"] is None else f"{p['tau']:.4g}"
  return (f"| {name} | {tau} | {100 * p['irrelevant_abstained']:.1f} | "
          f"{100 * p['relevant_abstained']:.1f} | {100 * p['recall@5']:.2f} | "
          f"{100 * p['comp@5']:.2f} | {100 * p['set_exact']:.2f} |")


def run(args: argparse.Namespace) -> int:
  from hyset_jax import config as config_lib, io_utils
  from hyset_jax.errors import UserError
  from hyset_jax.io.modeldir import load_model_dir
  from hyset_jax.training.train_data import prepare_data
  out_json, out_md, out_png = (
      io_utils.output_file(pathlib.Path(args.out) / f"abstention_{args.tag}.{e}", args.force,
                           inputs=[args.model]) for e in ("json", "md", "png"))
  model = load_model_dir(args.model)
  config = config_lib.resolve(args.config)
  data = prepare_data(config)
  from hyset_jax.model.terms.abstain import irrelevant_split
  name = irrelevant_split(config, config.data.test_split)
  if name not in data.splits:
    raise UserError(f"{config.data.spec}: no split {name!r} of requests that need no tool "
                    f"(the bfcl reader has them)")
  if model.tool_ids != data.tool_ids:
    raise UserError(f"{args.model}: its tools are not {config.data.spec}'s library")
  if model.params.abstain is None:
    raise UserError(f"{args.model}: this model does not abstain (its terms: "
                    f"{', '.join(model.terms) or 'none'}); train with --set model.abstain=true")
  candidates = None
  if args.within_candidates:
    spec = config.data.spec
    if spec != "bfcl" and not spec.startswith("bfcl:"):
      raise UserError(f"--within-candidates: {args.config}'s data {spec!r} is not BFCL (only "
                      f"BFCL poses each request with its own candidate functions)")
    from hyset_jax.data import bfcl
    candidates = bfcl.candidate_functions(spec[len("bfcl:"):] or None)
  result = sweep(model, data, config, candidates)
  command = provenance.command()
  doc = {"model": str(pathlib.Path(args.model).resolve()), "spec": config.data.spec,
         "within_candidates": candidates is not None,
         "test_queries": len(data.splits[config.data.test_split].texts),
         "irrelevant_test_requests": len(data.splits[name].texts),
         "ranking": model.default_ranking, **result}
  provenance.write_json(out_json, doc)
  lines = [f"{config.data.spec}: {doc['test_queries']} relevant test queries, "
           f"{doc['irrelevant_test_requests']} irrelevant test requests; model {doc['model']} "
           f"(ranking {model.default_ranking}); `{command}`. An abstained relevant query counts "
           f"as retrieving nothing." + (
               " Each request is answered over its own candidate functions only (BFCL's "
               "setting: the allow list of each request is the functions BFCL offers with it), "
               "not over the union library." if candidates is not None else ""), "",
           "| point | τ | irrelevant abstained % | relevant abstained % | R@5 | COMP@5 | "
           "exact |", "|---|---:|---:|---:|---:|---:|---:|",
           _row("no abstention", result["without"]),
           _row("classifier, τ chosen on validation", result["chosen"]),
           _row("classifier, best τ on test within 2 points of R@5 (oracle)",
                result["best_within_2_points_on_test"].get("classifier")),
           _row("best set's score F, best τ on test within 2 points (oracle)",
                result["best_within_2_points_on_test"].get("best_set_score"))]
  lines += ["", "ROC AUC on test (irrelevant against relevant requests): " + ", ".join(
      f"{k} {v:.3f}" for k, v in result["roc_auc"].items())]
  out_md.write_text("\n".join(lines) + "\n")
  plot(result, f"abstention: {config.data.spec}, test splits"
       + (", each request over its own candidates" if candidates is not None else ""), out_png)
  print("\n".join(lines))
  return 0


def main(argv: list[str] | None = None) -> int:
  from hyset_jax import cli
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", required=True, metavar="DIR",
                      help="a model directory (best/ of a run with model.abstain=true)")
  parser.add_argument("--tag", required=True, help="names the outputs")
  parser.add_argument("--config", default="bfcl",
                      help="the preset whose data set (with irrelevant_* splits) to measure on")
  parser.add_argument("--out", default="benchmarks/results", metavar="DIR",
                      help="existing folder for abstention_<tag>.json, .md and .png")
  parser.add_argument("--within-candidates", action="store_true",
                      help="answer each BFCL request over its own candidate functions (an "
                           "allow list per request, as BFCL poses them) instead of the union "
                           "library")
  parser.add_argument("--force", action="store_true", help="replace existing result files")
  parser.set_defaults(func=run)
  return cli.run(parser, argv)


if __name__ == "__main__":
  sys.exit(main())
