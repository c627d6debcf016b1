"""Retrieval metrics over rankings and gold tool sets (keys: docs/contracts.md, "Metrics").

Every function takes ``rankings`` (one sequence of tool ids per query, best
first) and ``gold_sets`` (one collection of tool ids per query, the annotated set
E*) and returns a float array of per-query values, shape ``[n_queries]``;
:func:`evaluate` averages them into the ``hyset eval`` metrics dictionary.

Conventions, chosen once for every metric:

- A ranking may be shorter than ``k``; missing positions count as misses.
- A tool repeated in a ranking counts once, at its first position, so a
  retriever cannot raise its recall by repeating a correct tool.
- An empty gold set is an error (every metric would divide by zero or be
  vacuously perfect): :class:`EmptyGoldError`, a :class:`~hyset_jax.errors.UserError`
  and a ``ValueError``. Such no-tool queries do exist (BFCL's ``irrelevant_*``
  splits, for abstention); they are scored by whether the retriever abstains,
  never by these metrics. :func:`evaluate` names the split when told it.
- Relevance is binary: a tool is relevant iff it is in the gold set.

Definitions (``top_k`` = the first ``k`` distinct tools of the ranking,
``G`` = the gold set):

- ``recall@k = |top_k ∩ G| / |G|``.
- ``ndcg@k = DCG@k / IDCG@k`` with ``DCG@k = Σ_{r<k} rel_r / log2(r + 2)`` and
  the ideal DCG taken over ``min(|G|, k)`` relevant positions, so a perfect
  top-``k`` scores 1 even when ``|G| > k``.
- ``comp@k`` exactly as COLT (Qu et al., CIKM 2024) defines COMP@K:
  ``1[G ⊆ top_k]``, i.e. 1 only when the whole gold set is retrieved. When
  ``|G| > k`` it is 0 by construction.
- ``coverage@depth = 1[|top_depth ∩ G| ≥ 1]``: at least one gold tool is in the
  candidate pool. This is ToolScout's "candidate coverage" (its uncovered queries
  are those that "fail to place any gold tool into the candidate pool"), which
  measures whether a downstream reranker has anything correct to pick; the
  stricter all-gold reading is ``comp@depth``.
- For a predicted set ``P`` (variable size, e.g. HYSET's argmax set):
  ``set_precision = |P ∩ G| / |P|`` (0 when ``P`` is empty: an empty answer
  gives the agent nothing), ``set_recall = |P ∩ G| / |G|``, ``set_f1`` their
  harmonic mean (0 when both are 0) and ``set_exact = 1[P = G]``.
"""
from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

from hyset_jax.errors import UserError

# The rank cut-offs reported by ``hyset eval`` (paper §3.1: K ∈ {3, 5}).
REPORT_KS = (3, 5)

# For retrievers that only rank (BM25, dense, fusion), the predicted set scored by
# the set_* metrics is the top-5. The paper's tool-budget rule is that every
# baseline passes at least as many tools to the agent as HYSET does; HYSET's set
# holds at most M = 5 tools, so top-5 never gives a baseline fewer.
RANK_ONLY_SET_SIZE = 5

METRIC_KEYS = (
    "recall@3", "recall@5", "ndcg@3", "ndcg@5", "comp@3", "comp@5",
    "set_precision", "set_recall", "set_f1", "set_exact", "n_queries",
)


class EmptyGoldError(UserError, ValueError):
  """A query with an empty gold set reached a metric.

  A UserError because the split chosen is at fault (a no-tool split such as BFCL's
  ``irrelevant_test``: the console reports it without a traceback), and a ValueError as this
  module's other input errors are.
  """


def check_gold_sets(gold_sets: Sequence[Collection[str]], split: str | None = None,
                    query_ids: Sequence[str] | None = None) -> None:
  """Raises :class:`EmptyGoldError` naming ``split`` (and the first query's id when
  ``query_ids`` is given) if any gold set is empty.

  >>> try:
  ...   check_gold_sets([{"a"}, set()], split="irrelevant_test", query_ids=["q1", "q2"])
  ... except EmptyGoldError as e:
  ...   print(str(e).split(";")[0])
  split 'irrelevant_test': 1 of 2 queries have an empty gold set (no-tool requests, e.g. query 'q2')
  """
  empty = [i for i, gold in enumerate(gold_sets) if not gold]
  if not empty:
    return
  named = query_ids is not None and len(query_ids) == len(gold_sets)
  first = f"query {query_ids[empty[0]]!r}" if named else f"query {empty[0]}"
  where = f"split {split!r}: " if split is not None else ""
  raise EmptyGoldError(
      f"{where}{len(empty)} of {len(gold_sets)} queries have an empty gold set (no-tool "
      f"requests, e.g. {first}); retrieval metrics are undefined for them: score abstention "
      f"on such a split (BFCL's irrelevant_*), not retrieval")


def _check_inputs(rankings: Sequence[Sequence[str]],
                  gold_sets: Sequence[Collection[str]]) -> None:
  if len(rankings) != len(gold_sets):
    raise ValueError(
        f"got {len(rankings)} rankings but {len(gold_sets)} gold sets; need one of each per query")
  check_gold_sets(gold_sets)


def _check_k(k: int, name: str = "k") -> None:
  if k < 1:
    raise ValueError(f"{name} must be >= 1, got {k}")


def hit_matrix(rankings: Sequence[Sequence[str]],
               gold_sets: Sequence[Collection[str]],
               k: int) -> np.ndarray:
  """Binary relevance of the first ``k`` ranking positions.

  Args:
    rankings: ``n`` rankings of tool ids, best first; any length.
    gold_sets: ``n`` non-empty gold sets of tool ids.
    k: the cut-off.

  Returns:
    ``bool[n, k]``: ``[q, r]`` is True iff position ``r`` of ranking ``q`` holds a
    gold tool not already seen at an earlier position. Positions past the end of
    a short ranking are False.

  >>> hit_matrix([["a", "x", "a", "b"]], [{"a", "b"}], 5).astype(int).tolist()
  [[1, 0, 0, 1, 0]]
  """
  _check_inputs(rankings, gold_sets)
  _check_k(k)
  hits = np.zeros((len(rankings), k), dtype=bool)
  for q, (ranking, gold) in enumerate(zip(rankings, gold_sets)):
    gold = set(gold)
    seen = set()
    for r, tool in enumerate(ranking[:k]):
      if tool in gold and tool not in seen:
        hits[q, r] = True
      seen.add(tool)
  return hits


def _gold_sizes(gold_sets: Sequence[Collection[str]]) -> np.ndarray:
  return np.array([len(set(g)) for g in gold_sets], dtype=np.float64)


def recall_at_k(rankings: Sequence[Sequence[str]],
                gold_sets: Sequence[Collection[str]],
                k: int) -> np.ndarray:
  """Recall@k per query: the fraction of the gold set in the top ``k``.

  Args:
    rankings: ``n`` rankings of tool ids, best first.
    gold_sets: ``n`` non-empty gold sets.
    k: the cut-off.

  Returns:
    ``float64[n]`` in [0, 1].

  >>> recall_at_k([["a", "x", "b"], ["x", "y"]], [{"a", "b", "c"}, {"y"}], 2).tolist()
  [0.3333333333333333, 1.0]
  """
  hits = hit_matrix(rankings, gold_sets, k)
  return hits.sum(axis=1) / _gold_sizes(gold_sets)


def ndcg_at_k(rankings: Sequence[Sequence[str]],
              gold_sets: Sequence[Collection[str]],
              k: int) -> np.ndarray:
  """NDCG@k per query with binary relevance.

  The ideal DCG places ``min(|G|, k)`` relevant tools at the top, so the value
  is 1 exactly when the first ``min(|G|, k)`` positions are all gold.

  Args:
    rankings: ``n`` rankings of tool ids, best first.
    gold_sets: ``n`` non-empty gold sets.
    k: the cut-off.

  Returns:
    ``float64[n]`` in [0, 1].

  >>> # One gold tool, found at rank 2 of 3: DCG = 1/log2(3), IDCG = 1.
  >>> round(float(ndcg_at_k([["x", "a", "y"]], [{"a"}], 3)[0]), 6)
  0.63093
  >>> ndcg_at_k([["a", "b", "c"]], [{"a", "b", "c", "d"}], 3).tolist()
  [1.0]
  """
  hits = hit_matrix(rankings, gold_sets, k)
  discounts = 1.0 / np.log2(np.arange(k) + 2.0)  # [k]
  dcg = hits @ discounts  # [n]
  n_ideal = np.minimum(_gold_sizes(gold_sets), k).astype(int)  # [n], each >= 1
  ideal = np.concatenate([[0.0], np.cumsum(discounts)])[n_ideal]  # [n]
  return dcg / ideal


def comp_at_k(rankings: Sequence[Sequence[str]],
              gold_sets: Sequence[Collection[str]],
              k: int) -> np.ndarray:
  """COMP@k per query (COLT): 1 when the whole gold set is in the top ``k``.

  Args:
    rankings: ``n`` rankings of tool ids, best first.
    gold_sets: ``n`` non-empty gold sets.
    k: the cut-off.

  Returns:
    ``float64[n]`` of 0s and 1s.

  >>> comp_at_k([["a", "b", "x"], ["a", "x", "y"]], [{"a", "b"}, {"a", "b"}], 3).tolist()
  [1.0, 0.0]
  """
  hits = hit_matrix(rankings, gold_sets, k)
  return (hits.sum(axis=1) == _gold_sizes(gold_sets)).astype(np.float64)


def coverage_at_depth(rankings: Sequence[Sequence[str]],
                      gold_sets: Sequence[Collection[str]],
                      depth: int) -> np.ndarray:
  """Candidate coverage per query (ToolScout): any gold tool in the top ``depth``.

  Args:
    rankings: ``n`` rankings of tool ids, best first.
    gold_sets: ``n`` non-empty gold sets.
    depth: the candidate-pool depth (ToolScout reports depth 20).

  Returns:
    ``float64[n]`` of 0s and 1s.

  >>> coverage_at_depth([["x", "b"], ["x", "y"]], [{"a", "b"}, {"a"}], 2).tolist()
  [1.0, 0.0]
  """
  _check_k(depth, "depth")
  hits = hit_matrix(rankings, gold_sets, depth)
  return hits.any(axis=1).astype(np.float64)


def _set_overlap(predicted_sets: Sequence[Collection[str]],
                 gold_sets: Sequence[Collection[str]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(|P ∩ G|, |P|, |G|) per query, each ``float64[n]``, on distinct ids."""
  if len(predicted_sets) != len(gold_sets):
    raise ValueError(
        f"got {len(predicted_sets)} predicted sets but {len(gold_sets)} gold sets")
  _check_inputs(predicted_sets, gold_sets)
  inter = np.array([len(set(p) & set(g)) for p, g in zip(predicted_sets, gold_sets)],
                   dtype=np.float64)
  n_pred = np.array([len(set(p)) for p in predicted_sets], dtype=np.float64)
  return inter, n_pred, _gold_sizes(gold_sets)


def set_precision(predicted_sets: Sequence[Collection[str]],
                  gold_sets: Sequence[Collection[str]]) -> np.ndarray:
  """|P ∩ G| / |P| per query; 0 for an empty prediction.

  >>> set_precision([["a", "x"], []], [{"a"}, {"a"}]).tolist()
  [0.5, 0.0]
  """
  inter, n_pred, _ = _set_overlap(predicted_sets, gold_sets)
  return np.divide(inter, n_pred, out=np.zeros_like(inter), where=n_pred > 0)


def set_recall(predicted_sets: Sequence[Collection[str]],
               gold_sets: Sequence[Collection[str]]) -> np.ndarray:
  """|P ∩ G| / |G| per query.

  >>> set_recall([["a", "x"]], [{"a", "b", "c", "d"}]).tolist()
  [0.25]
  """
  inter, _, n_gold = _set_overlap(predicted_sets, gold_sets)
  return inter / n_gold


def set_f1(predicted_sets: Sequence[Collection[str]],
           gold_sets: Sequence[Collection[str]]) -> np.ndarray:
  """Harmonic mean of set precision and recall per query; 0 when both are 0.

  Equivalently ``2 |P ∩ G| / (|P| + |G|)``.

  >>> set_f1([["a", "x"], ["y"]], [{"a", "b", "c", "d"}, {"a"}]).tolist()
  [0.3333333333333333, 0.0]
  """
  inter, n_pred, n_gold = _set_overlap(predicted_sets, gold_sets)
  return 2.0 * inter / (n_pred + n_gold)


def set_exact(predicted_sets: Sequence[Collection[str]],
              gold_sets: Sequence[Collection[str]]) -> np.ndarray:
  """1 when the predicted set equals the gold set (order and repeats ignored).

  >>> set_exact([["b", "a"], ["a"]], [{"a", "b"}, {"a", "b"}]).tolist()
  [1.0, 0.0]
  """
  _set_overlap(predicted_sets, gold_sets)  # validates
  return np.array([set(p) == set(g) for p, g in zip(predicted_sets, gold_sets)],
                  dtype=np.float64)


def evaluate(rankings: Sequence[Sequence[str]],
             gold_sets: Sequence[Collection[str]],
             predicted_sets: Sequence[Collection[str]] | None = None, *,
             split: str | None = None,
             query_ids: Sequence[str] | None = None) -> dict[str, float | int]:
  """The ``hyset eval`` metrics: means over queries, keyed as in docs/contracts.md.

  Args:
    rankings: ``n`` rankings of tool ids, best first (at least 5 long to be fair).
    gold_sets: ``n`` non-empty gold sets.
    predicted_sets: ``n`` predicted sets from a set-level retriever (HYSET). When
      None (rank-only retrievers), the predicted set is the top
      :data:`RANK_ONLY_SET_SIZE` (= 5) of each ranking, matching the paper's
      rule that baselines pass at least as many tools as HYSET.
    split, query_ids: the split's name and the queries' ids, only to name them in the
      :class:`EmptyGoldError` an empty gold set raises.

  Returns:
    ``{"recall@3", "recall@5", "ndcg@3", "ndcg@5", "comp@3", "comp@5",
    "set_precision", "set_recall", "set_f1", "set_exact"}`` as floats in [0, 1]
    and ``"n_queries"`` as an int.

  >>> m = evaluate([["a", "b", "x", "y", "z"]], [{"a", "b"}])
  >>> m["recall@3"], m["comp@3"], m["set_precision"], m["set_recall"]
  (1.0, 1.0, 0.4, 1.0)
  """
  check_gold_sets(gold_sets, split, query_ids)  # before _check_inputs: name the split
  _check_inputs(rankings, gold_sets)
  if not rankings:
    raise ValueError("no queries to evaluate")
  if predicted_sets is None:
    predicted_sets = [list(dict.fromkeys(r))[:RANK_ONLY_SET_SIZE] for r in rankings]
  out: dict[str, float | int] = {}
  for k in REPORT_KS:
    out[f"recall@{k}"] = float(recall_at_k(rankings, gold_sets, k).mean())
  for k in REPORT_KS:
    out[f"ndcg@{k}"] = float(ndcg_at_k(rankings, gold_sets, k).mean())
  for k in REPORT_KS:
    out[f"comp@{k}"] = float(comp_at_k(rankings, gold_sets, k).mean())
  out["set_precision"] = float(set_precision(predicted_sets, gold_sets).mean())
  out["set_recall"] = float(set_recall(predicted_sets, gold_sets).mean())
  out["set_f1"] = float(set_f1(predicted_sets, gold_sets).mean())
  out["set_exact"] = float(set_exact(predicted_sets, gold_sets).mean())
  out["n_queries"] = len(rankings)
  assert tuple(out) == METRIC_KEYS
  return out
