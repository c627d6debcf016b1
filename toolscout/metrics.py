"""ToolScout's metrics on top of :mod:`hyset_jax.evaluation.metrics` (paper §4).

- Candidate coverage at depth 20: :func:`hyset_jax.evaluation.metrics.coverage_at_depth`
  (any gold tool in the pool; reused, not redefined).
- P@1 among covered queries: the first tool after reranking the pool is gold,
  averaged over the queries whose pool holds a gold tool at all (uncovered
  queries are no test of a reranker: it has nothing correct to pick).
- Global proxy G = C · P@1|cov: uncovered queries count as failed top-1.
"""
from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

from hyset_jax.evaluation.metrics import coverage_at_depth

DEPTH = 20  # the paper's candidate depth


def coverage(rankings: Sequence[Sequence[str]], gold_sets: Sequence[Collection[str]],
             depth: int = DEPTH) -> np.ndarray:
  """Per-query candidate coverage, ``float64[n]`` of 0/1 (see the module docstring)."""
  return coverage_at_depth(rankings, gold_sets, depth)


def precision_at_1_covered(top1: Sequence[str], gold_sets: Sequence[Collection[str]],
                           covered: np.ndarray) -> float:
  """P@1 over covered queries; NaN when no query is covered.

  Args:
    top1: the reranked first tool of each of ``n`` queries.
    gold_sets: ``n`` gold sets.
    covered: ``bool[n]`` (or 0/1) coverage of each query's pool.

  >>> precision_at_1_covered(["a", "x", "y"], [{"a"}, {"b"}, {"c"}], np.array([1, 1, 0]))
  0.5
  """
  covered = np.asarray(covered, bool)
  if len(top1) != len(gold_sets) or len(top1) != len(covered):
    raise ValueError("top1, gold_sets and covered must have one entry per query")
  if not covered.any():
    return float("nan")
  hits = np.array([t in g for t, g in zip(top1, gold_sets)], bool)
  return float(hits[covered].mean())


def global_proxy(coverage_rate: float, p_at_1_covered: float) -> float:
  """G = C · P@1|cov; 0 when nothing is covered (P@1 undefined, every query failed).

  >>> global_proxy(0.8, 0.5)
  0.4
  >>> global_proxy(0.0, float("nan"))
  0.0
  """
  if coverage_rate == 0:
    return 0.0
  return float(coverage_rate * p_at_1_covered)
