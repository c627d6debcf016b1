"""Per-query outcome arrays (0/1 coverage, 0/1 reranked top-1) reduced to report numbers."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def mean(x: np.ndarray) -> float:
  """Mean of ``float64[n]``; NaN (``null`` in the report) for no queries.

  >>> mean(np.array([1.0, 0.0])), mean(np.array([]))
  (0.5, nan)
  """
  return float(np.mean(x)) if len(x) else float("nan")


def p1_covered(hit: np.ndarray, cov: np.ndarray) -> float:
  """P@1 among covered queries from 0/1 ``hit`` and ``cov`` (``float64[n]`` each); NaN if none.

  >>> p1_covered(np.array([1., 0., 0.]), np.array([1., 1., 0.]))
  0.5
  """
  return float(hit[cov > 0].mean()) if (cov > 0).any() else float("nan")


def cat(per_source: Mapping[str, np.ndarray], names: Sequence[str]) -> np.ndarray:
  """The per-source arrays of ``names`` end to end, in the mixed stream's order."""
  return np.concatenate([per_source[s] for s in names])
