"""The set classifier: the memorisation baseline over the training gold sets.

Its classes are the distinct gold sets of the training split; a softmax head on the
frozen query embedding (:func:`hyset_jax.retrievers.heads.fit_head`, one target per
query: its set's class) gives p(set | query). It can only ever answer a set seen in
training, so it is strong where test sets repeat training sets (ToolLens is
scene-based: every official test set occurs in training) and blind to new
combinations (benchmarks/unseen_split.py builds such a test).

- predicted set: the argmax class's tools;
- ranking: those tools first, then the rest by their marginal probability
  ``Σ_s p(s) · 1[t ∈ s]``; within the best set, members are ordered by the same marginal.
  Tools in no training set have marginal 0 and follow in library order.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hyset_jax.data.types import Query, ToolLibrary
from hyset_jax.retrievers.base import Retrieval, check_depth, top_k_ids
from hyset_jax.retrievers.dense import embed
from hyset_jax.retrievers.heads import HeadConfig, fit_head, gold_rows, head_logits, probabilities

# A linear softmax over sets, from zero weights (its classes are sets, not tools). 6,000 Adam
# steps (twice the per-tool heads' budget): on ToolLens' validation split COMP@3 89.9 against
# 89.5 with a 3x larger step; its test COMP@3, 89.9, is what scikit-learn's converged
# LogisticRegression(C=10) reaches on the same training queries (docs/baselines.md).
DEFAULT_CONFIG = HeadConfig(hidden=0, loss="softmax", steps=6000)


def distinct_sets(rows: Sequence[Sequence[int]]) -> tuple[list[tuple[int, ...]], list[int]]:
  """The distinct sets in first-seen order, and each row's class index.

  >>> distinct_sets([[2, 1], [3], [1, 2]])
  ([(1, 2), (3,)], [0, 1, 0])
  """
  classes: dict[tuple[int, ...], int] = {}
  labels = [classes.setdefault(tuple(sorted(r)), len(classes)) for r in rows]
  return list(classes), labels


def set_ranking_scores(set_probs: np.ndarray, membership: np.ndarray) -> tuple[np.ndarray,
                                                                                np.ndarray]:
  """Tool scores that put the argmax set first, then the rest by marginal probability.

  Args:
    set_probs: f32[n, S] p(set | query).
    membership: f32[S, N] 1 where tool t is in set s.

  Returns:
    (f32[n, N] scores, int[n] argmax class). The marginal is ≤ 1, so adding 2 to the best
    set's members puts them first and keeps their marginal order among themselves.

  >>> s, best = set_ranking_scores(np.array([[0.6, 0.4]]), np.array([[1., 0, 0], [0, 1, 1]]))
  >>> s.round(2).tolist(), best.tolist()
  ([[2.6, 0.4, 0.4]], [0])
  """
  best = np.argmax(set_probs, axis=1)  # first of equal maxima: lowest class index
  marginal = set_probs @ membership  # [n, N]
  return marginal + 2.0 * membership[best], best


class SetClassifierRetriever:
  """Predicts one of the training gold sets; ranks its members first. Build with :meth:`fit`."""

  def __init__(self, params: dict[str, np.ndarray], sets: Sequence[tuple[int, ...]],
               tool_ids: Sequence[str], encoder: Any):
    self.params = params
    self.sets = tuple(sets)
    self.tool_ids = tuple(tool_ids)
    self.encoder = encoder
    self.membership = np.zeros((len(self.sets), len(self.tool_ids)), np.float32)  # [S, N]
    for s, members in enumerate(self.sets):
      self.membership[s, list(members)] = 1.0

  @classmethod
  def fit(cls, tools: ToolLibrary, encoder: Any, train: Sequence[Query],
          config: HeadConfig = DEFAULT_CONFIG) -> SetClassifierRetriever:
    """Trains the softmax over ``train``'s distinct gold sets (``config.loss`` must be softmax)."""
    if config.loss != "softmax":
      raise ValueError("the set classifier is a softmax over sets; got loss "
                       f"{config.loss!r}")
    sets, labels = distinct_sets(gold_rows(train, tools.index(), "training"))
    x = embed(encoder, [q.text for q in train])
    params = fit_head(x, [[c] for c in labels], len(sets), config)
    return cls(params, sets, tools.ids, encoder)

  def set_probabilities(self, queries: Sequence[str]) -> np.ndarray:
    """f32[n_queries, n_sets] p(set | query)."""
    logits = np.asarray(head_logits(self.params, embed(self.encoder, queries)))
    return probabilities(logits, "softmax")

  def retrieve(self, queries: Sequence[str], depth: int) -> Retrieval:
    check_depth(depth)
    scores, best = set_ranking_scores(self.set_probabilities(queries), self.membership)
    # Members of the best set in ranking order, so the set reads like the ranking's head.
    rankings = top_k_ids(scores, self.tool_ids, max(depth, max(map(len, self.sets))))
    sets = [r[:len(self.sets[b])] for r, b in zip(rankings, best)]
    return Retrieval(rankings=[r[:depth] for r in rankings], sets=sets)
