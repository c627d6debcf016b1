"""Evaluating the router on labelled sources: LOSO thresholds, routed coverage, windows.

A source's distance at window size N is the median d_tfidf of its requests
scored in consecutive chunks of N (N = ``None``: the whole source as one batch).
τ is calibrated per window size on those source-level distances, because
distances shrink as windows grow. Every source is routed with the τ calibrated
*without* it (leave one source out), so the routed numbers never use the
evaluated source's own label.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from toolscout import fingerprint as fpr
from toolscout import router


def source_distance(fp: fpr.Fingerprint, texts: Sequence[str], window: int | None) -> float:
  """Median chunk distance of a source at window size ``window`` (None: one batch)."""
  if window is None:
    return fpr.batch_distance(fp, texts)
  d = fpr.chunk_distances(fp, texts, window)
  return float(np.median(d[::window]))


def loso_thresholds(distances: Mapping[str, float], unsafe: Mapping[str, bool]) -> dict[str, float]:
  """τ per source, calibrated on all the other sources."""
  names = list(distances)
  result = router.leave_one_source_out(np.array([distances[s] for s in names]),
                                       np.array([unsafe[s] for s in names]))
  return dict(zip(names, result.thresholds.tolist()))


def stream_window_distances(fp: fpr.Fingerprint, stream: Sequence[str], window: int) -> np.ndarray:
  """Rolling-window distances over the mixed stream, ``float64[n]``."""
  return fpr.window_distances(fp, stream, window)


def routed_values(choices: np.ndarray, specialist: np.ndarray, aggregate: np.ndarray) -> np.ndarray:
  """Per-query value of the routed system: the specialist's where chosen, else the aggregate's.

  >>> routed_values(np.array(["specialist", "aggregate"]), np.array([1., 1.]), np.array([0., 0.]))
  array([1., 0.])
  """
  return np.where(np.asarray(choices) == router.SPECIALIST, specialist, aggregate)


def window_classification(fp: fpr.Fingerprint, texts_by_source: Mapping[str, Sequence[str]],
                          unsafe: Mapping[str, bool], taus: Mapping[str, float],
                          window: int) -> dict[str, float]:
  """Accuracy/F1 of classifying non-overlapping windows of each source as unsafe.

  Each window of source s (chunks of ``window`` requests; a source shorter than
  the window is one chunk) is called unsafe when its distance is ≥ τ_{-s}; the
  truth is s's label.
  """
  truth, predicted = [], []
  for name, texts in texts_by_source.items():
    d = fpr.chunk_distances(fp, texts, window)[::window]
    predicted.extend((d >= taus[name]).tolist())
    truth.extend([unsafe[name]] * len(d))
  truth_a, pred_a = np.array(truth, bool), np.array(predicted, bool)
  return {"n_windows": int(len(truth_a)), "accuracy": float((truth_a == pred_a).mean()),
          "f1": router.binary_f1(truth_a, pred_a)}
