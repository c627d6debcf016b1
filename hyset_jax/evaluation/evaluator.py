"""The retrieval metrics of θ's two-stage inference on one query split."""
from __future__ import annotations

import jax
import numpy as np

from hyset_jax.evaluation import metrics
from hyset_jax.inference import pipeline
from hyset_jax.model import lexical as lexical_lib, terms
from hyset_jax.model.query_inputs import QueryInputs
from hyset_jax.model.scoring import HysetParams
from hyset_jax.training.train_data import QuerySet


# What "auto" ranking maximises on validation: the mean of the rank metrics (the set metrics do
# not depend on the ranking).
RANK_METRICS = ("recall@3", "recall@5", "ndcg@3", "ndcg@5", "comp@3", "comp@5")


def evaluate_split(params: HysetParams, qs: QuerySet, tool_ids: tuple[str, ...], mc,
                   batch_size: int, ranking: str | None = None,
                   lexical: lexical_lib.LexicalIndex | None = None) -> dict[str, float]:
  """Recall/NDCG/COMP@K and the set metrics (:func:`metrics.evaluate`) of ``params`` on ``qs``.

  ``mc`` (a ModelConfig) gives K1, K_pool and M; ``ranking`` a ranking method (None: the
  inference default); ``lexical`` the tool texts' BM25 index, needed when ``params`` has the
  lexical term (it scores ``qs.texts``).
  """
  ranking = ranking or pipeline.DEFAULT_RANKING
  return evaluate_rankings(params, qs, tool_ids, mc, batch_size, (ranking,),
                           lexical=lexical)[ranking]


def evaluate_rankings(params: HysetParams, qs: QuerySet, tool_ids: tuple[str, ...], mc,
                      batch_size: int, rankings: tuple[str, ...] = pipeline.RANKINGS,
                      lexical: lexical_lib.LexicalIndex | None = None,
                      lexical_scores: np.ndarray | None = None,
                      neighbor_table: bool | None = None
                      ) -> dict[str, dict[str, float]]:
  """:func:`evaluate_split` for each of ``rankings``, from one stage-2 pass (``lexical_scores``:
  ``qs``'s lexical scores already computed, instead of ``lexical``; ``neighbor_table``: as
  :func:`pipeline.predict_batched`)."""
  if lexical_scores is None:
    lexical_scores = lexical_lib.query_scores(params.lexical_weight, lexical, qs.texts)
  preds = pipeline.predict_batched(jax.device_get(params),
                                    QueryInputs(qs.embeddings, lexical_scores), k1=mc.k1,
                                    k_pool=mc.k_pool, max_size=mc.max_set_size,
                                    batch_size=batch_size, rankings=tuple(rankings),
                                    neighbor_table=neighbor_table)
  abstains = params.abstain is not None
  return {r: prediction_metrics(p, qs, tool_ids, abstains) for r, p in zip(rankings, preds)}


def evaluate_parts(params: HysetParams, parts: dict[str, QuerySet], tool_ids: tuple[str, ...],
                   mc, batch_size: int, rankings: tuple[str, ...] = pipeline.RANKINGS,
                   lexical: lexical_lib.LexicalIndex | None = None,
                   neighbor_table: bool | None = None) -> dict[str, dict[str, float]]:
  """:func:`evaluate_rankings` on each validation part (split name -> queries,
  train_data.validation_parts), combined per ranking by :func:`mean_metrics`."""
  per_part = {name: evaluate_rankings(params, qs, tool_ids, mc, batch_size, rankings,
                                      lexical=lexical, neighbor_table=neighbor_table)
              for name, qs in parts.items()}
  return {r: mean_metrics({name: m[r] for name, m in per_part.items()}) for r in rankings}


def mean_metrics(parts: dict[str, dict[str, float]]) -> dict[str, float]:
  """What model selection maximises over validation parts (split name -> metrics): each
  metric's mean over the parts — each part weighs the same, however many queries it has —
  and ``n_queries`` summed; with several parts, each part's own values too, as
  ``"<split>/<metric>"``. One part: its metrics unchanged.

  >>> mean_metrics({"a": {"recall@5": 0.9, "n_queries": 10}, "b": {"recall@5": 0.5,
  ...               "n_queries": 4}})["recall@5"]
  0.7
  """
  if len(parts) == 1:
    return dict(next(iter(parts.values())))
  keys = [k for k in next(iter(parts.values())) if all(k in m for m in parts.values())]
  out = {k: float(sum(m[k] for m in parts.values())) if k == "n_queries"
         else float(np.mean([m[k] for m in parts.values()])) for k in keys}
  for name, m in parts.items():
    out |= {f"{name}/{k}": v for k, v in m.items()}
  return out


def prediction_metrics(pred: pipeline.Prediction, qs: QuerySet, tool_ids: tuple[str, ...],
                       abstains: bool = False) -> dict[str, float]:
  """The metrics of ``pred``; a query answered with no set (abstention: "no tool needed")
  counts as retrieving nothing, its ranking included — the agent was told to use no tool."""
  ids = np.asarray(tool_ids, dtype=object)
  empty = np.asarray(pred.set_size) == 0
  rankings = [[] if e else ids[r[r >= 0]].tolist()  # -1: a slot a filter emptied
              for r, e in zip(pred.ranking, empty)]
  sets = [ids[t[:n]].tolist() for t, n in zip(pred.set_tools, pred.set_size)]
  gold = [[tool_ids[t] for t in g] for g in qs.gold]
  out = metrics.evaluate(rankings, gold, sets)
  return out | {"abstained": float(np.mean(empty))} if abstains else out


def choose_ranking(params: HysetParams, qs: QuerySet, tool_ids: tuple[str, ...], mc,
                   batch_size: int, lexical: lexical_lib.LexicalIndex | None = None
                   ) -> tuple[str, dict[str, dict[str, float]]]:
  """The ranking method with the best mean of :data:`RANK_METRICS` on ``qs`` (ties: the first
  of ``pipeline.RANKINGS``, the paper's greedy), and every method's metrics."""
  names = terms.allowed_rankings(params)  # a term may rule some out (the prior: greedy)
  scores = evaluate_rankings(params, qs, tool_ids, mc, batch_size, names, lexical=lexical)
  return best_ranking(scores), scores


def best_ranking(scores: dict[str, dict[str, float]]) -> str:
  """Of ``scores`` (ranking -> metrics, in :data:`pipeline.RANKINGS` order), the ranking with
  the best mean of :data:`RANK_METRICS` (ties: the earlier, so the paper's greedy first)."""
  names = tuple(scores)
  return max(names, key=lambda r: (np.mean([scores[r][k] for k in RANK_METRICS]),
                                   -names.index(r)))
