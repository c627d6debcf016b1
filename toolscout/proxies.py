"""Source-level detectors of specialist collapse, and how well they track it (paper §5.2, A.3).

Every detector (:class:`toolscout.keys.Detector`) maps a source (its queries, optionally
its gold tools) to one number that grows with its difference from the reference source:

- ``tfidf``: query-side d_tfidf (:mod:`toolscout.fingerprint`), source centroid vs reference.
- ``tfidf_tool``: the same over the gold tool texts of each source's queries
  (one text per gold tool per query), with TF-IDF fitted on the reference's.
- ``semantic``: 1 − cos of sentence-embedding centroids (the frozen encoder).
- ``length_gap``: |mean words per query − reference's|.
- ``multistep_gap``: |share of queries with more than one gold tool − reference's|.

They are judged by the Pearson correlation with the specialist's coverage per
source (plain and weighted by query count; a good detector is strongly
negative) and by leave-one-source-out accuracy/F1 of a threshold rule for the
unsafe sources (:func:`toolscout.router.leave_one_source_out`).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def mean_length(texts: Sequence[str]) -> float:
  """Mean whitespace-separated words per text.

  >>> mean_length(["a b", "c d e f"])
  3.0
  """
  return float(np.mean([len(t.split()) for t in texts])) if texts else 0.0


def multistep_rate(gold_sizes: Sequence[int]) -> float:
  """Share of queries needing more than one tool.

  >>> multistep_rate([1, 2, 3, 1])
  0.5
  """
  return float(np.mean(np.asarray(gold_sizes) > 1)) if len(gold_sizes) else 0.0


def weighted_pearson(x: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> float:
  """Pearson r of ``x`` and ``y`` under weights ``w``; NaN when either is constant.

  >>> round(weighted_pearson(np.array([1., 2., 3.]), np.array([2., 4., 7.])), 4)
  0.9934
  >>> weighted_pearson(np.array([1., 2., 3.]), np.array([1., 1., 1.]))
  nan
  """
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  w = np.ones_like(x) if w is None else np.asarray(w, np.float64)
  w = w / w.sum()
  dx, dy = x - w @ x, y - w @ y
  sx, sy = np.sqrt(w @ dx**2), np.sqrt(w @ dy**2)
  if sx < 1e-15 or sy < 1e-15:
    return float("nan")
  return float((w @ (dx * dy)) / (sx * sy))
