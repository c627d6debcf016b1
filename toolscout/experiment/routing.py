"""Stage 5: routing on the mixed stream (every source's test split, one after another).

Modes (:class:`toolscout.keys.Mode`): batch (one decision per source), rolling windows
and per request, each with τ calibrated leave-one-source-out on labelled sources
(:mod:`toolscout.routing_eval`) and with the label-free default τ of ``toolscout fit``
(:func:`toolscout.router.default_thresholds`). Each mode is scored by the coverage and G of
the retriever it picks per query.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from toolscout import fingerprint as fpr
from toolscout import router, routing_eval
from toolscout.experiment.data import Prepared
from toolscout.experiment.detectors import judge_detectors
from toolscout.experiment.evaluation import Evaluation
from toolscout.experiment.outcomes import cat, mean
from toolscout.keys import BATCH_DEFAULT, BATCH_LOSO, Detector, Mode, Reranker, Retriever, Tau


def route_batches(data: Prepared, fp: fpr.Fingerprint, unsafe: Mapping[str, bool],
                  spec: Mapping[str, np.ndarray], agg: Mapping[str, np.ndarray]) -> dict[str, Any]:
  """One decision per source (the source's test split as a batch), τ calibrated LOSO.

  Returns:
    ``{"distance", "tau", "route"}`` per source, and ``"routed"``: per source the per-query
    values (``spec`` or ``agg``, ``float64[n]`` each) of the retriever it is routed to.
  """
  dist = {s: routing_eval.source_distance(fp, data.texts(s, "test"), None) for s in data.names}
  taus = routing_eval.loso_thresholds(dist, unsafe)
  choice = {s: str(router.route(np.array([dist[s]]), taus[s])[0]) for s in data.names}
  routed = {s: spec[s] if choice[s] == router.SPECIALIST else agg[s] for s in data.names}
  return {"distance": dist, "tau": taus, "route": choice, "routed": routed}


def loso_windows(data: Prepared, fp: fpr.Fingerprint, unsafe: Mapping[str, bool],
                 stream: Sequence[str], src: np.ndarray) -> tuple[dict[Mode, np.ndarray], dict]:
  """Rolling-window routes ``str[n]`` per window size with LOSO τ, and window accuracy."""
  texts_by_source = {s: data.texts(s, "test") for s in data.names}
  modes, windows = {}, {}
  for n in data.config.windows:
    dist = {s: routing_eval.source_distance(fp, texts_by_source[s], n) for s in data.names}
    taus = routing_eval.loso_thresholds(dist, unsafe)
    d = routing_eval.stream_window_distances(fp, stream, n)
    modes[Mode(Tau.LOSO, n)] = np.where(d < np.array([taus[s] for s in src]), router.SPECIALIST,
                                        router.AGGREGATE)
    windows[n] = {"source_distance": dist, "tau": taus,
                  **routing_eval.window_classification(fp, texts_by_source, unsafe, taus, n)}
  return modes, windows


def default_modes(data: Prepared, fp: fpr.Fingerprint, batch_distance: Mapping[str, float],
                  stream: Sequence[str], src: np.ndarray
                  ) -> tuple[dict[Mode, np.ndarray], dict[int, float], dict[str, Any]]:
  """Batch and rolling-window routes ``str[n]`` with the label-free τ of ``toolscout fit``.

  Returns:
    the routes per mode, the τ(N) table, and the batch mode's ``{"tau", "route"}`` per source.
  """
  ref_ids = [q.id for q in data.queries[data.reference]["train"]]
  default = router.default_thresholds(ref_ids, data.texts(data.reference, "train"))
  # Batch mode with the label-free τ: the τ tabulated for the batch's size.
  tau = {s: router.threshold_for_window(default, len(data.queries[s]["test"])) for s in data.names}
  route = {s: str(router.route(np.array([batch_distance[s]]), tau[s])[0]) for s in data.names}
  modes = {BATCH_DEFAULT: np.array([route[s] for s in src])}
  for n in data.config.windows:
    d = routing_eval.stream_window_distances(fp, stream, n)
    # As `toolscout route`: the stream's first n - 1 windows are shorter and take their size's τ.
    taus = router.thresholds_for_sizes(default, fpr.window_sizes(len(stream), n))
    modes[Mode(Tau.DEFAULT, n)] = router.route(d, taus)
  return modes, default, {"tau": tau, "route": route}


def score_modes(data: Prepared, modes: Mapping[Mode, np.ndarray], ev: Evaluation,
                src: np.ndarray) -> dict[str, dict[str, Any]]:
  """Coverage, G (MLP reranker) and specialist share of each mode's routes, keyed by mode key."""
  names = data.names
  spec, agg = Retriever.SPECIALIST, Retriever.AGGREGATE
  cov_s, cov_a = cat(ev.coverage[spec], names), cat(ev.coverage[agg], names)
  g_s, g_a = cat(ev.hit1[spec][Reranker.MLP], names), cat(ev.hit1[agg][Reranker.MLP], names)
  matched = src == data.reference
  results = {}
  for mode, choices in modes.items():
    cov = routing_eval.routed_values(choices, cov_s, cov_a)
    g = routing_eval.routed_values(choices, g_s, g_a)
    results[mode.key] = {
        "coverage": mean(cov), "global": mean(g), "matched_coverage": mean(cov[matched]),
        "specialist_share": float(np.mean(choices == router.SPECIALIST)),
        "specialist_share_matched": float(np.mean(choices[matched] == router.SPECIALIST)),
        "per_source_coverage": {s: mean(cov[src == s]) for s in names}}
  return results


def routing(data: Prepared, fp: fpr.Fingerprint, ev: Evaluation, unsafe: Mapping[str, bool],
            ) -> dict[str, Any]:
  """Routed coverage and G on the mixed stream for every mode, plus window accuracy."""
  stream, src = data.stream()
  batch = route_batches(data, fp, unsafe, ev.coverage[Retriever.SPECIALIST],
                        ev.coverage[Retriever.AGGREGATE])
  modes: dict[Mode, np.ndarray] = {BATCH_LOSO: np.array([batch["route"][s] for s in src])}
  window_modes, windows = loso_windows(data, fp, unsafe, stream, src)
  modes.update(window_modes)
  label_free, default, batch_default = default_modes(data, fp, batch["distance"], stream, src)
  modes.update(label_free)
  return {"modes": score_modes(data, modes, ev, src), "windows": windows,
          "batch": {k: v for k, v in batch.items() if k != "routed"},
          "default_thresholds": default, "batch_default": batch_default}


def floor_sweep(data: Prepared, fp: fpr.Fingerprint, ev: Evaluation,
                values: Mapping[str, Mapping[Detector, float]], spec_cov: Mapping[str, float],
                counts: Mapping[str, int]) -> dict[float, Any]:
  """How the unsafe set, detector LOSO scores and batch routing change with the coverage floor."""
  names = data.names
  matched = data.stream()[1] == data.reference
  out = {}
  for floor in data.config.floor_sweep:
    unsafe = {s: bool(spec_cov[s] < floor) for s in names}
    judged = judge_detectors(values, spec_cov, counts, floor)
    batch = route_batches(data, fp, unsafe, ev.coverage[Retriever.SPECIALIST],
                          ev.coverage[Retriever.AGGREGATE])
    routed = cat(batch["routed"], names)
    out[floor] = {"unsafe_sources": [s for s in names if unsafe[s]],
                  "detectors": {k: {"loso_accuracy": v["loso_accuracy"], "loso_f1": v["loso_f1"]}
                                for k, v in judged.items()},
                  "routed_coverage": mean(routed), "routed_matched": mean(routed[matched])}
  return out
