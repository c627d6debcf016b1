"""The retrieval metrics of θ's two-stage inference on one query split."""
from __future__ import annotations

import jax
import numpy as np

from hyset_jax.evaluation import metrics
from hyset_jax.inference import pipeline
from hyset_jax.model import lexical as lexical_lib, set_prior, terms
from hyset_jax.model.query_inputs import QueryInputs
from hyset_jax.model.scoring import HysetParams, SetPrior
from hyset_jax.training.train_data import QuerySet


# What "auto" ranking maximises on validation: the mean of the rank metrics (the set metrics do
# not depend on the ranking).
RANK_METRICS = ("recall@3", "recall@5", "ndcg@3", "ndcg@5", "comp@3", "comp@5")
# The seen-set prior changes the delivered set, not only the ranking, so its choice also weighs
# the set metrics (on an unseen-set split, rank metrics alone chose a prior that cost 6 points
# of set F1: docs/results.md).
PRIOR_METRICS = RANK_METRICS + ("set_f1", "set_exact")
# The seen-set prior's grid, chosen on validation with the ranking (λ = 0, no prior, competes).
PRIOR_WEIGHTS = (0.5, 1.0, 2.0, 4.0, 8.0)
PRIOR_FLOORS = (1e-3, 1e-2, 1e-1)


def evaluate_split(params: HysetParams, qs: QuerySet, tool_ids: tuple[str, ...], mc,
                   batch_size: int, ranking: str | None = None,
                   lexical: lexical_lib.LexicalIndex | None = None) -> dict[str, float]:
  """Recall/NDCG/COMP@K and the set metrics (hyset_jax.evaluation.metrics.evaluate) of ``params`` on ``qs``.

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
                      lexical_scores: np.ndarray | None = None
                      ) -> dict[str, dict[str, float]]:
  """:func:`evaluate_split` for each of ``rankings``, from one stage-2 pass (``lexical_scores``:
  ``qs``'s lexical scores already computed, instead of ``lexical``)."""
  if lexical_scores is None:
    lexical_scores = lexical_lib.query_scores(params.lexical_weight, lexical, qs.texts)
  preds = pipeline.predict_batched(jax.device_get(params),
                                    QueryInputs(qs.embeddings, lexical_scores), k1=mc.k1,
                                    k_pool=mc.k_pool, max_size=mc.max_set_size,
                                    batch_size=batch_size, rankings=tuple(rankings))
  return {r: _metrics(p, qs, tool_ids) for r, p in zip(rankings, preds)}


def _metrics(pred: pipeline.Prediction, qs: QuerySet,
             tool_ids: tuple[str, ...]) -> dict[str, float]:
  ids = np.asarray(tool_ids, dtype=object)
  rankings = [ids[r[r >= 0]].tolist() for r in pred.ranking]  # -1: a slot a filter emptied
  sets = [ids[t[:n]].tolist() for t, n in zip(pred.set_tools, pred.set_size)]
  gold = [[tool_ids[t] for t in g] for g in qs.gold]
  return metrics.evaluate(rankings, gold, sets)


def choose_ranking(params: HysetParams, qs: QuerySet, tool_ids: tuple[str, ...], mc,
                   batch_size: int, lexical: lexical_lib.LexicalIndex | None = None
                   ) -> tuple[str, dict[str, dict[str, float]]]:
  """The ranking method with the best mean of :data:`RANK_METRICS` on ``qs`` (ties: the first
  of ``pipeline.RANKINGS``, the paper's greedy), and every method's metrics."""
  names = terms.allowed_rankings(params)  # a term may rule some out (the prior: greedy)
  scores = evaluate_rankings(params, qs, tool_ids, mc, batch_size, names, lexical=lexical)
  best = max(names, key=lambda r: (np.mean([scores[r][k] for k in RANK_METRICS]),
                                   -names.index(r)))
  return best, scores


def _mean_prior(scores: dict[str, float]) -> float:
  return float(np.mean([scores[k] for k in PRIOR_METRICS]))


def choose_prior(params: HysetParams, prior: SetPrior, qs: QuerySet, tool_ids: tuple[str, ...],
                 mc, batch_size: int, lexical: lexical_lib.LexicalIndex | None = None
                 ) -> tuple[SetPrior | None, str, dict[str, dict]]:
  """The seen-set prior's λ and τ, by the best mean of :data:`PRIOR_METRICS` on ``qs`` over
  :data:`PRIOR_WEIGHTS` × :data:`PRIOR_FLOORS`, against the model without it (which wins ties;
  its ranking is the one :func:`choose_ranking` picks); with ``mc.ranking = "auto"`` the
  ranking is chosen with them (the prior's candidates: every ranking but greedy), else
  ``mc.ranking`` is used throughout.

  Returns:
    (the prior with the chosen λ and τ, or None when no prior beats its absence; the ranking;
     every candidate's metrics keyed ``"none <ranking>"`` or ``"λ=… τ=… <ranking>"``).
  """
  if mc.ranking == "auto":
    ranking, plain = choose_ranking(params, qs, tool_ids, mc, batch_size, lexical)
    candidates = tuple(r for r in pipeline.RANKINGS if r != "greedy")
  else:
    ranking, candidates = mc.ranking, (mc.ranking,)
    plain = evaluate_rankings(params, qs, tool_ids, mc, batch_size, candidates, lexical=lexical)
  table = {f"none {r}": m for r, m in plain.items()}
  chosen, best = None, _mean_prior(plain[ranking])
  for weight in PRIOR_WEIGHTS:
    for tau in PRIOR_FLOORS:
      candidate = set_prior.with_weight(prior, weight, tau)
      scores = evaluate_rankings(params._replace(prior=candidate), qs, tool_ids, mc, batch_size,
                                 candidates, lexical=lexical)
      for r, m in scores.items():
        table[f"λ={weight:g} τ={tau:g} {r}"] = m
        if _mean_prior(m) > best:
          chosen, ranking, best = candidate, r, _mean_prior(m)
  return chosen, ranking, table


def choose_lexical(params: HysetParams, index: lexical_lib.LexicalIndex, qs: QuerySet,
                   tool_ids: tuple[str, ...], mc, batch_size: int
                   ) -> tuple[float | None, str, dict[str, dict]]:
  """The lexical term's β, by the best mean of :data:`PRIOR_METRICS` on ``qs`` (the term moves
  the shortlist and the delivered set, not only the ranking) over
  :data:`hyset_jax.model.lexical.WEIGHTS`, against the model without it (which wins ties); with
  ``mc.ranking = "auto"`` the ranking is chosen with it, else ``mc.ranking`` is used.

  Returns:
    (β, or None when no β > 0 beats its absence; the ranking; every candidate's metrics keyed
     ``"none <ranking>"`` or ``"β=… <ranking>"``).
  """
  candidates = tuple(r for r in (pipeline.RANKINGS if mc.ranking == "auto" else (mc.ranking,))
                     if r in terms.allowed_rankings(params))
  plain_params = params._replace(lexical_weight=None)
  table = {f"none {r}": m for r, m in evaluate_rankings(plain_params, qs, tool_ids, mc,
                                                        batch_size, candidates).items()}
  # Without the term the ranking is chosen as choose_ranking does (rank metrics, paper first).
  ranking = max(candidates, key=lambda r: (np.mean([table[f"none {r}"][k] for k in RANK_METRICS]),
                                           -candidates.index(r)))
  chosen, best = None, _mean_prior(table[f"none {ranking}"])
  scores = index.scores(qs.texts)
  for weight in lexical_lib.WEIGHTS:
    candidate = params._replace(lexical_weight=np.float32(weight))
    for r, m in evaluate_rankings(candidate, qs, tool_ids, mc, batch_size, candidates,
                                  lexical_scores=scores).items():
      table[f"β={weight:g} {r}"] = m
      if _mean_prior(m) > best:
        chosen, ranking, best = weight, r, _mean_prior(m)
  return chosen, ranking, table
