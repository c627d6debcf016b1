"""The report's per-source and mixed-stream tables and its headline summary, from the stages'
per-query outcomes."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from toolscout import proxies
from toolscout.experiment.data import Prepared
from toolscout.experiment.evaluation import Evaluation
from toolscout.experiment.outcomes import cat, mean, p1_covered
from toolscout.keys import BATCH_DEFAULT, BATCH_LOSO, CONTROLS, DENSE, Reranker, Retriever

# Goal: routed ≥ this × aggregate coverage on the mixed stream, while keeping the
# specialist's edge on matched traffic (routed matched ≥ aggregate matched).
GOAL_RATIO = 0.95


def per_source(data: Prepared, ev: Evaluation, unsafe: Mapping[str, bool],
               values: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
  """Coverage, P@1 among covered, G, unsafe label and detector values of each source."""
  out = {}
  for s in data.names:
    out[s] = {
        "n_train": len(data.queries[s]["train"]), "n_test": len(data.queries[s]["test"]),
        "coverage": {k: mean(ev.coverage[k][s]) for k in DENSE + CONTROLS},
        "p1_covered": {k: {kind: p1_covered(ev.hit1[k][kind][s], ev.coverage[k][s])
                           for kind in Reranker} for k in DENSE},
        "global": {k: {kind: mean(ev.hit1[k][kind][s]) for kind in Reranker} for k in DENSE},
        "unsafe": unsafe[s], "detectors": values[s],
        "mean_words": proxies.mean_length(data.texts(s, "test")),
        "multistep_rate": proxies.multistep_rate([len(g) for g in data.gold[s]["test"]]),
    }
  return out


def mixed(data: Prepared, ev: Evaluation) -> dict[str, Any]:
  """The same over the mixed stream (every source's test split pooled)."""
  names = data.names
  cov = {k: cat(ev.coverage[k], names) for k in DENSE + CONTROLS}
  hit = {k: {kind: cat(ev.hit1[k][kind], names) for kind in Reranker} for k in DENSE}
  return {"n": int(sum(data.counts().values())),
          "coverage": {k: mean(v) for k, v in cov.items()},
          "global": {k: {kind: mean(hit[k][kind]) for kind in Reranker} for k in DENSE},
          "p1_covered": {k: {kind: p1_covered(hit[k][kind], cov[k]) for kind in Reranker}
                         for k in DENSE}}


def _ratio(x: float, y: float) -> float:
  return x / y if y else float("nan")


def summary(data: Prepared, ev: Evaluation, spec_cov: Mapping[str, float],
            unsafe: Mapping[str, bool], per_source_table: Mapping[str, Any],
            mixed_table: Mapping[str, Any], modes: Mapping[str, Any]) -> dict[str, Any]:
  """The headline numbers: collapse, mixed-stream coverage, routed batch modes, the goal."""
  names, ref = data.names, data.reference
  mismatched = [s for s in names if s != ref]
  spec, agg = Retriever.SPECIALIST, Retriever.AGGREGATE
  loso, default = modes[BATCH_LOSO.key], modes[BATCH_DEFAULT.key]
  agg_mixed = mixed_table["coverage"][agg]
  out = {
      "reference": ref,
      "specialist_matched": spec_cov[ref],
      "aggregate_matched": per_source_table[ref]["coverage"][agg],
      "specialist_mismatched": mean(cat(ev.coverage[spec], mismatched)),
      "aggregate_mismatched": mean(cat(ev.coverage[agg], mismatched)),
      "unsafe_sources": [s for s in names if unsafe[s]],
      "mixed_specialist": mixed_table["coverage"][spec],
      "mixed_aggregate": agg_mixed,
      "mixed_routed_batch": loso["coverage"],
      "routed_over_aggregate": _ratio(loso["coverage"], agg_mixed),
      "routed_matched": loso["matched_coverage"],
      "mixed_routed_default": default["coverage"],
      "routed_default_over_aggregate": _ratio(default["coverage"], agg_mixed),
      "routed_default_matched": default["matched_coverage"],
  }
  out["goal_met"] = bool(out["routed_over_aggregate"] >= GOAL_RATIO
                         and out["routed_matched"] >= out["aggregate_matched"])
  out["goal_met_default"] = bool(out["routed_default_over_aggregate"] >= GOAL_RATIO
                                 and out["routed_default_matched"] >= out["aggregate_matched"])
  return out
