"""The one retriever interface, its result type, and score-to-ranking helper.

Every method ``hyset eval`` compares (BM25, dense, fusion, HYSET) implements
:class:`Retriever`, so the metrics see exactly the same inputs for each.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np


@dataclasses.dataclass(frozen=True)
class Retrieval:
  """What a retriever returns for a batch of queries.

  Attributes:
    rankings: one list of tool ids per query, best first, distinct ids, at most
      ``depth`` long (shorter only when the library is smaller than ``depth`` or
      the method ranks a fixed shortlist, as HYSET does).
    sets: one predicted tool set per query for set-level retrievers (HYSET's
      argmax set), or None for methods that only rank.
  """
  rankings: list[list[str]]
  sets: list[list[str]] | None = None


@runtime_checkable
class Retriever(Protocol):
  """Anything that maps query texts to tool rankings (and maybe tool sets)."""

  def retrieve(self, queries: Sequence[str], depth: int) -> Retrieval:
    """Ranks the library for each query.

    Args:
      queries: ``n`` query texts.
      depth: how many tools to return per query (>= 1).

    Returns:
      A :class:`Retrieval` with ``n`` rankings.
    """
    ...


def check_depth(depth: int) -> None:
  if depth < 1:
    raise ValueError(f"depth must be >= 1, got {depth}")


def top_k_ids(scores: np.ndarray, tool_ids: Sequence[str], depth: int) -> list[list[str]]:
  """Rankings of tool ids from a dense score matrix, with deterministic ties.

  Ties are broken by library row order (lower row first): a stable sort of the
  negated scores keeps equal scores in their original order, so the same input
  always gives the same ranking whatever the platform's partial-sort does.

  Args:
    scores: ``float[n_queries, n_tools]``, higher is better.
    tool_ids: ``n_tools`` ids in row order.
    depth: how many ids to keep per query.

  Returns:
    ``n_queries`` lists of ``min(depth, n_tools)`` tool ids, best first.

  >>> top_k_ids(np.array([[0.1, 0.5, 0.5, 0.2]]), ["a", "b", "c", "d"], 3)
  [['b', 'c', 'd']]
  """
  check_depth(depth)
  scores = np.asarray(scores)
  if scores.ndim != 2 or scores.shape[1] != len(tool_ids):
    raise ValueError(
        f"scores must be [n_queries, {len(tool_ids)}], got shape {scores.shape}")
  order = np.argsort(-scores, axis=1, kind="stable")[:, :depth]
  ids = np.asarray(tool_ids, dtype=object)
  return [ids[row].tolist() for row in order]
