"""The routing rule and its threshold τ (paper §3, §5.3, A.3).

Rule: send traffic to the specialist when d < τ, else to the aggregate retriever.

Two ways to choose τ:

- :func:`calibrate_threshold` (labelled sources, the paper's way). A source is
  *unsafe* when the specialist's coverage on it is below a floor (paper: 30%).
  Given one distance per source, τ is the cut that classifies "unsafe iff
  d ≥ τ" most accurately. Candidate cuts are the midpoints between consecutive
  distinct distances plus one cut below all and one above all. Ties in accuracy
  go to the smallest τ: it sends more traffic to the aggregate, whose coverage
  never collapses, so a tie costs at most the specialist's edge, never coverage.
  :func:`leave_one_source_out` scores this procedure honestly: each source is
  classified by a τ calibrated on the other sources only.
- :func:`default_thresholds` (no labels, what ``toolscout fit`` does without
  ``--threshold``). The fingerprint is fitted on 80% of the reference queries;
  the held-out 20% are scored in non-overlapping windows of each size in
  :data:`DEFAULT_WINDOWS`, and τ(N) is the 95th percentile of those held-out
  distances. So about 5% of matched windows are (harmlessly) sent to the
  aggregate, and anything farther from the reference than 95% of fresh matched
  traffic is treated as a different source. Distances shrink as windows grow
  (a centroid of many requests is closer to any centroid), hence one τ per window
  size; a window size between tabulated ones uses the next larger tabulated
  size, whose τ is smaller, i.e. the more conservative one. A decision scored on fewer
  requests than asked for (the first N − 1 of a rolling window of N, the last chunk of a
  stream) takes the τ of the size it saw (:func:`thresholds_for_sizes`).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from hyset_jax.data.splits import unit_hash
from toolscout import fingerprint as fpr

SPECIALIST = "specialist"
AGGREGATE = "aggregate"

# Paper §5.2: a transfer source is "clearly unsafe" below 30% specialist coverage.
DEFAULT_COVERAGE_FLOOR = 0.30
# Held-out share of the reference queries and the quantile τ takes from them.
HOLDOUT_FRACTION = 0.2
HOLDOUT_QUANTILE = 0.95
# Window sizes τ is tabulated for when it is derived from held-out reference windows.
DEFAULT_WINDOWS = (1, 2, 5, 10, 20, 50, 100, 200)
# Fewest reference queries to fit on: the 20% hold-out must hold a few windows.
MIN_REFERENCE = 20


def route(distances: np.ndarray, threshold: float | np.ndarray) -> np.ndarray:
  """``"specialist"`` where d < τ else ``"aggregate"``, ``str[n]``; τ is one value or one per
  decision (``float64[n]``, :func:`thresholds_for_sizes`).

  >>> route(np.array([0.1, 0.5, 0.9]), 0.5).tolist()
  ['specialist', 'aggregate', 'aggregate']
  """
  return np.where(np.asarray(distances) < threshold, SPECIALIST, AGGREGATE)


def unsafe_labels(coverages: np.ndarray, floor: float = DEFAULT_COVERAGE_FLOOR) -> np.ndarray:
  """Which sources the specialist is unsafe on: coverage below ``floor``, ``bool[s]``.

  >>> unsafe_labels(np.array([0.9, 0.29, 0.3])).tolist()
  [False, True, False]
  """
  return np.asarray(coverages) < floor


def candidate_thresholds(distances: np.ndarray) -> np.ndarray:
  """Midpoints between consecutive distinct distances, plus one cut below and above all.

  >>> candidate_thresholds(np.array([0.2, 0.6, 0.2])).tolist()
  [-0.8, 0.4, 1.6]
  """
  values = np.unique(np.asarray(distances, np.float64))
  if values.size == 0:
    raise ValueError("no distances to calibrate on")
  mids = (values[:-1] + values[1:]) / 2
  return np.concatenate([[values[0] - 1.0], mids, [values[-1] + 1.0]])


def calibrate_threshold(distances: np.ndarray, unsafe: np.ndarray,
                        weights: np.ndarray | None = None) -> float:
  """The τ that best separates unsafe sources (d ≥ τ) from safe ones (d < τ).

  Args:
    distances: ``float[s]``, one distance per source.
    unsafe: ``bool[s]``, the label of each source.
    weights: optional ``float[s]`` (e.g. query counts) for a weighted accuracy.

  Returns:
    The accuracy-maximising candidate cut; ties go to the smallest τ.

  >>> # Safe at 0.1, 0.3; unsafe at 0.5, 0.7, but also a safe source at 0.6.
  >>> calibrate_threshold(np.array([0.1, 0.3, 0.5, 0.6, 0.7]),
  ...                     np.array([False, False, True, False, True]))
  0.4
  """
  distances = np.asarray(distances, np.float64)
  unsafe = np.asarray(unsafe, bool)
  w = np.ones_like(distances) if weights is None else np.asarray(weights, np.float64)
  cuts = candidate_thresholds(distances)
  predicted_unsafe = distances[None, :] >= cuts[:, None]  # [cuts, s]
  accuracy = ((predicted_unsafe == unsafe[None, :]) * w[None, :]).sum(axis=1)
  best = np.flatnonzero(accuracy >= accuracy.max() - 1e-12)
  return float(cuts[best[0]])  # cuts ascend, so the first best is the smallest


@dataclasses.dataclass(frozen=True)
class LosoResult:
  """Leave-one-source-out scores of a threshold detector.

  Attributes:
    predicted_unsafe: ``bool[s]``, each source classified by a τ fitted without it.
    thresholds: ``float[s]``, that τ.
    accuracy: fraction of sources classified right.
    f1: F1 of the unsafe class (0 when it is never predicted nor present).
  """
  predicted_unsafe: np.ndarray
  thresholds: np.ndarray
  accuracy: float
  f1: float


def leave_one_source_out(distances: np.ndarray, unsafe: np.ndarray,
                         weights: np.ndarray | None = None) -> LosoResult:
  """Scores :func:`calibrate_threshold` with each source held out in turn.

  >>> r = leave_one_source_out(np.array([0.1, 0.2, 0.8, 0.9]),
  ...                          np.array([False, False, True, True]))
  >>> r.accuracy, r.f1, r.thresholds.tolist()
  (1.0, 1.0, [0.5, 0.45, 0.55, 0.5])
  """
  distances = np.asarray(distances, np.float64)
  unsafe = np.asarray(unsafe, bool)
  n = len(distances)
  if n < 2:
    raise ValueError("leave-one-source-out needs at least two sources")
  taus = np.zeros(n)
  for i in range(n):
    keep = np.arange(n) != i
    taus[i] = calibrate_threshold(distances[keep], unsafe[keep],
                                  None if weights is None else np.asarray(weights)[keep])
  predicted = distances >= taus
  return LosoResult(predicted, taus, float((predicted == unsafe).mean()),
                    binary_f1(unsafe, predicted))


def binary_f1(truth: np.ndarray, predicted: np.ndarray) -> float:
  """F1 of the positive class; 1.0 when there is none and none is predicted.

  >>> binary_f1(np.array([True, True, False]), np.array([True, False, False]))
  0.6666666666666666
  """
  truth, predicted = np.asarray(truth, bool), np.asarray(predicted, bool)
  tp = float((truth & predicted).sum())
  denom = float(truth.sum() + predicted.sum())
  return 1.0 if denom == 0 else 2 * tp / denom


# --- τ without labels: held-out reference windows ------------------------------


def holdout_split(ids: Sequence[str], fraction: float = HOLDOUT_FRACTION) -> np.ndarray:
  """``bool[n]``: True for the held-out share, the ids with the smallest hashes.

  Exactly ``ceil(fraction · n)`` ids are held out (at least one), chosen by a
  hash of the id, so the split does not depend on file order.
  """
  n = len(ids)
  k = max(1, math.ceil(fraction * n))
  order = np.argsort([unit_hash(str(i), "toolscout-holdout") for i in ids], kind="stable")
  mask = np.zeros(n, bool)
  mask[order[:k]] = True
  return mask


def default_thresholds(ids: Sequence[str], texts: Sequence[str],
                       windows: Sequence[int] = DEFAULT_WINDOWS,
                       quantile: float = HOLDOUT_QUANTILE) -> dict[int, float]:
  """τ(N) per window size N from held-out reference windows (module docstring).

  Args:
    ids, texts: the reference queries.
    windows: window sizes to tabulate; sizes with fewer than one full
      held-out window are left out (size 1 always fits).
    quantile: which quantile of the held-out distances τ takes.

  Returns:
    ``{N: τ(N)}`` in ascending N.
  """
  held = holdout_split(ids)
  texts = list(texts)
  fp = fpr.fit_fingerprint([t for t, h in zip(texts, held) if not h])
  held_texts = [t for t, h in zip(texts, held) if h]
  out: dict[int, float] = {}
  for size in sorted(set(windows)):
    if size > len(held_texts):
      break
    n_chunks = len(held_texts) // size  # full chunks only: a partial one is a smaller window
    d = fpr.chunk_distances(fp, held_texts[:n_chunks * size], size)[::size]
    out[size] = float(np.quantile(d, quantile))
  return out


def threshold_for_window(thresholds: Mapping[int, float], window: int) -> float:
  """τ for a window size: the tabulated size itself, else the next larger one, else the largest.

  >>> threshold_for_window({1: 0.9, 10: 0.6, 50: 0.4}, 20)
  0.4
  >>> threshold_for_window({1: 0.9, 10: 0.6}, 500)
  0.6
  """
  if not thresholds:
    raise ValueError("no thresholds tabulated")
  sizes = sorted(int(s) for s in thresholds)
  for size in sizes:
    if size >= window:
      return float(thresholds[size])
  return float(thresholds[sizes[-1]])


def thresholds_for_sizes(thresholds: Mapping[int, float], sizes: np.ndarray) -> np.ndarray:
  """τ of each decision from the size of the window it was scored on, ``float64[n]``.

  A rolling window's first N − 1 decisions (and a stream's last, shorter chunk) see fewer
  than N requests; their distances are those of a smaller window, so they take that size's
  τ (:func:`threshold_for_window`), not τ(N).

  >>> thresholds_for_sizes({1: 0.9, 2: 0.7, 5: 0.5}, np.array([1, 2, 3, 3])).tolist()
  [0.9, 0.7, 0.5, 0.5]
  """
  table = {int(k): threshold_for_window(thresholds, int(k)) for k in np.unique(sizes)}
  return np.array([table[int(k)] for k in sizes], np.float64)
