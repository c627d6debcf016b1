"""Reciprocal-rank fusion (RRF) of several retrievers, by default BM25 + dense."""
from __future__ import annotations

from collections.abc import Sequence

from hyset_jax.retrievers.base import Retrieval, Retriever, check_depth

# k = 60 is the constant of Cormack, Clarke & Büttcher (SIGIR 2009), the usual
# default: large enough that the first few ranks of each list weigh alike.
RRF_K = 60


def reciprocal_rank_fusion(rankings: Sequence[Sequence[str]], k: int = RRF_K) -> list[str]:
  """Fuses several rankings of one query: ``score(t) = Σ_lists 1 / (k + rank(t))``.

  ``rank`` is 1-based; a tool missing from a list gets nothing from it. Ties are
  broken by first appearance when reading the lists one after another (the
  first list's order, then new tools of the second list, ...), so the result is
  deterministic and the first list acts as the tie-breaker.

  Args:
    rankings: the lists to fuse, each best first.
    k: the RRF constant.

  Returns:
    Every tool in any list, best fused score first.

  >>> # a: 1/61 + 1/62, b: 1/62 + 1/61 (tie with a, a came first), c: 1/63.
  >>> reciprocal_rank_fusion([["a", "b", "c"], ["b", "a"]])
  ['a', 'b', 'c']
  >>> # c: 1/63 + 1/61 = 0.032266 edges out b: 2/62 = 0.032258.
  >>> reciprocal_rank_fusion([["a", "b", "c"], ["c", "b"]])
  ['c', 'b', 'a']
  """
  if k < 0:
    raise ValueError(f"RRF constant k must be >= 0, got {k}")
  scores: dict[str, float] = {}  # insertion order = first appearance
  for ranking in rankings:
    seen = set()
    for rank, tool in enumerate(ranking, start=1):
      if tool in seen:  # a repeated id counts once, at its best rank
        continue
      seen.add(tool)
      scores[tool] = scores.get(tool, 0.0) + 1.0 / (k + rank)
  # sorted() is stable, so equal scores keep first-appearance order.
  return sorted(scores, key=lambda t: -scores[t])


class FusionRetriever:
  """RRF over retrievers (the BM25 + dense fusion control of the ToolScout paper).

  Each base retriever ranks to ``pool_depth`` (at least ``depth``); the fused
  list is cut to ``depth``. A tool outside a retriever's pool gets 0 from it, as
  in the usual RRF over top-k lists; with a pool of 100 on a few-thousand-tool
  library that changes nothing in the top 5.

  Args:
    retrievers: the base retrievers; the first breaks ties (pass BM25 first).
    k: the RRF constant (60).
    pool_depth: how deep each base ranking is read.
  """

  def __init__(self, retrievers: Sequence[Retriever], *, k: int = RRF_K, pool_depth: int = 100):
    if not retrievers:
      raise ValueError("fusion needs at least one retriever")
    check_depth(pool_depth)
    self.retrievers = tuple(retrievers)
    self.k = k
    self.pool_depth = pool_depth

  def retrieve(self, queries: Sequence[str], depth: int) -> Retrieval:
    check_depth(depth)
    pool = max(depth, self.pool_depth)
    per_retriever = [r.retrieve(queries, pool).rankings for r in self.retrievers]
    fused = [reciprocal_rank_fusion([lists[q] for lists in per_retriever], self.k)[:depth]
             for q in range(len(queries))]
    return Retrieval(rankings=fused)
