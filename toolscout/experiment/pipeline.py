"""Every stage in order, and the report dict they make (:func:`run`)."""
from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import sys
import time
from typing import Any

from toolscout import fingerprint as fpr
from toolscout import reranker as rr
from toolscout.config import ExperimentConfig
from toolscout.experiment import detectors, repair, routing, summary
from toolscout.experiment.data import prepare
from toolscout.experiment.evaluation import evaluate_retrievers
from toolscout.experiment.latency import latency
from toolscout.experiment.lexical import lexical_scores
from toolscout.experiment.outcomes import mean
from toolscout.experiment.skill_cards import skill_cards
from toolscout.experiment.training import train_retrievers
from toolscout.keys import DENSE, Reranker, Retriever

FORMAT = "toolscout-report/2"


def environment(config: ExperimentConfig) -> dict[str, Any]:
  """Date, command, machine and library versions, for the report's header."""
  import jax
  import sklearn
  return {"date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
          "command": " ".join(["toolscout"] + sys.argv[1:]) if sys.argv and
          sys.argv[0].endswith("toolscout") else "toolscout experiment --config " + config.name,
          "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
          "cpus": os.cpu_count(), "platform": platform.platform(),
          "python": platform.python_version(), "jax": jax.__version__,
          "jax_backend": jax.default_backend(), "sklearn": sklearn.__version__}


def run(config: ExperimentConfig) -> dict[str, Any]:
  """Runs every stage and returns the report dict (see :mod:`toolscout.report`).

  BLAS runs single-threaded here: the matrices are small, and on a machine
  whose cores are busy, multi-threaded OpenBLAS spins (measured: logistic
  regression 70× slower with 2 threads on 2 shared cores than with 1).
  """
  import threadpoolctl
  with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):
    return _run(config)


class _Laps:
  """Seconds per stage, for the report's ``timing``."""

  def __init__(self):
    self.start = self.last = time.perf_counter()
    self.timing: dict[str, float] = {}

  def __call__(self, name: str) -> None:
    now = time.perf_counter()
    self.timing[name] = round(now - self.last, 2)
    self.last = now

  def total(self) -> dict[str, float]:
    return {**self.timing, "total_s": round(time.perf_counter() - self.start, 2)}


def _run(config: ExperimentConfig) -> dict[str, Any]:
  config.validate()
  lap = _Laps()
  data = prepare(config)
  lap("prepare_s")
  names, counts = data.names, data.counts()
  projections, training = train_retrievers(data, data.tool_emb)
  lap("train_s")
  lexical = lexical_scores(data, data.suite.tools)
  ev = evaluate_retrievers(data, data.tool_emb, data.suite.tools.texts, projections, lexical)
  lap("evaluate_s")

  spec_cov = {s: mean(ev.coverage[Retriever.SPECIALIST][s]) for s in names}
  unsafe = {s: bool(spec_cov[s] < config.coverage_floor) for s in names}
  fp = fpr.fit_fingerprint(data.texts(data.reference, "train"))
  values = detectors.detector_values(data, fp)
  judged = detectors.judge_detectors(values, spec_cov, counts, config.coverage_floor)
  query_tool_r = detectors.query_tool_correlation(values, counts)
  source_clf = detectors.source_classifier(data)
  lap("detectors_s")

  floors = routing.floor_sweep(data, fp, ev, values, spec_cov, counts)
  routes = routing.routing(data, fp, ev, unsafe)
  lat = latency(data)
  lap("routing_s")

  repaired = repair.repair(data, projections[Retriever.SPECIALIST], ev, spec_cov, lexical.test)
  paired = repair.paired_transfer(data, projections)
  lap("repair_s")
  cards = (skill_cards(data, fp, values, counts, routes["batch_default"]["route"])
           if config.skill_cards else None)
  lap("skill_cards_s")

  per_source = summary.per_source(data, ev, unsafe, values)
  mixed = summary.mixed(data, ev)
  return {
      "format": FORMAT,
      "config": dataclasses.asdict(config), "environment": environment(config),
      "timing": lap.total(),
      "suite": {"n_tools": len(data.suite.tools), "notes": list(data.suite.notes),
                "sources": {s: {"n_train": len(data.queries[s]["train"]), "n_test": counts[s]}
                            for s in names}},
      "summary": summary.summary(data, ev, spec_cov, unsafe, per_source, mixed, routes["modes"]),
      "training": training, "per_source": per_source, "mixed": mixed,
      "detectors": judged, "query_tool_weighted_r": query_tool_r, "source_classifier": source_clf,
      "routing": routes, "floor_sweep": floors, "latency": lat,
      "reranker_coefficient_mass": {k: rr.coefficient_mass(ev.rerankers[k][Reranker.LINEAR])
                                    for k in DENSE},
      "repair": repaired, "paired_transfer": paired, "skill_cards": cards,
  }
