"""Abstention (not in the paper): "no tool needed". A logistic classifier on the query embedding r
scores how much a request looks like one that needs no tool, u(r) = r · w + b (log-odds); the
model delivers the empty set when u(r) ≥ τ, and the ranking still comes (a caller may look at
it). Off by default (``model.abstain=true`` turns it on).

Fitted after θ (and after the terms before it in the registry): w and b on the training split
(label 0) against the data set's ``irrelevant_<train split>`` requests (label 1; e.g. BFCL's
irrelevance categories), class-balanced; τ on validation: the τ that abstains on the most of
the ``irrelevant_<validation split>`` requests while the relevant validation queries lose at
most :data:`MAX_RECALL_LOSS` of R@5 (an abstained relevant query counts as retrieving nothing),
against the model without abstention, which wins ties.

Why a classifier rather than a threshold on the best set's score F: measured on BFCL, a
threshold on F abstains on 30 % of the irrelevant validation requests within the 2-point
budget — BFCL's irrelevant requests come with functions close to them, so their best sets score
like relevant ones (benchmarks/results/abstention_bfcl.md has both curves).

w, b and τ refer to no tool row: a library edit leaves them as they are.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from hyset_jax.errors import UserError
from hyset_jax.model.scoring import Abstention
from hyset_jax.model.terms.base import Fit, Term

# The most R@5 (absolute, on the relevant validation queries) abstention may cost.
MAX_RECALL_LOSS = 0.02
# Candidate thresholds: these quantiles of u over the irrelevant validation requests (τ at the
# q-quantile abstains on about 1 − q of them).
QUANTILES = np.linspace(0.0, 1.0, 41)[:-1]
# The metric the choice maximises: the share of the irrelevant validation requests abstained.
IRRELEVANT_ABSTAINED = "irrelevant_abstained"
# The classifier's inverse regularisation (scikit-learn's C).
C = 1.0


def irrelevant_split(config, split: str | None = None) -> str:
  """The split of requests that need no tool beside ``split`` (default: validation)."""
  return f"irrelevant_{split or config.data.val_split}"


def _irrelevant(data, config, split: str | None = None):
  name = irrelevant_split(config, split)
  if name not in data.splits or not len(data.splits[name].texts):
    have = ", ".join(sorted(data.splits))
    raise UserError(f"model.abstain=true learns from requests that need no tool, split "
                    f"{name!r}, which this data set does not have (it has: {have}); the bfcl "
                    f"reader has them (BFCL's irrelevance categories)")
  return data.splits[name]


def fit_classifier(relevant: np.ndarray, irrelevant: np.ndarray, seed: int = 0):
  """(w f32[d_r], b f32[]): class-balanced logistic regression of "needs no tool" on query
  embeddings, ``relevant`` f32[A, d_r] (label 0) against ``irrelevant`` f32[B, d_r] (1)."""
  from sklearn.linear_model import LogisticRegression
  x = np.concatenate([relevant, irrelevant]).astype(np.float64)
  y = np.concatenate([np.zeros(len(relevant)), np.ones(len(irrelevant))])
  lr = LogisticRegression(C=C, class_weight="balanced", max_iter=2000, random_state=seed)
  lr.fit(x, y)
  return lr.coef_[0].astype(np.float32), np.float32(lr.intercept_[0])


def no_tool_scores(abstention: Abstention, embeddings: np.ndarray) -> np.ndarray:
  """u(r) f32[Q] for query embeddings f32[Q, d_r] (float32, as the prediction computes it)."""
  return (np.asarray(embeddings, np.float32) @ np.asarray(abstention.w, np.float32)
          + np.float32(abstention.b))


def with_threshold(model, abstention: Abstention, tau: float):
  return dataclasses.replace(model, params=model.params._replace(
      abstain=abstention._replace(threshold=np.float32(tau))))


def candidates(model, data, config):
  """``model`` with the classifier fitted on the training splits and τ at each of
  :data:`QUANTILES` of u over the irrelevant validation requests."""
  train = data.splits[config.data.train_split].embeddings
  irr_train = _irrelevant(data, config, config.data.train_split).embeddings
  w, b = fit_classifier(train, irr_train, config.train.seed)
  fitted = Abstention(w, b, np.float32(np.inf))
  u = no_tool_scores(fitted, _irrelevant(data, config).embeddings)
  for tau in np.unique(np.quantile(u, QUANTILES).astype(np.float32)):
    yield f"τ={tau:.6g}", with_threshold(model, fitted, float(tau))


def measure(model, data, config) -> dict[str, float]:
  """The share of the irrelevant validation requests ``model`` answers with no tool."""
  from hyset_jax.inference import pipeline
  qs, mc = _irrelevant(data, config), config.model
  pred = pipeline.predict_batched(model.params, model.query_inputs(qs.embeddings, qs.texts),
                                  k1=mc.k1, k_pool=mc.k_pool, max_size=mc.max_set_size,
                                  batch_size=config.train.eval_batch_size)
  return {IRRELEVANT_ABSTAINED: float(np.mean(np.asarray(pred.set_size) == 0))}


def objective(metrics: dict, plain: dict) -> float | None:
  """The irrelevant requests' abstention rate; None (not admissible) when the relevant
  queries lose more than :data:`MAX_RECALL_LOSS` of R@5 against ``plain`` (no abstention)."""
  if plain["recall@5"] - metrics["recall@5"] > MAX_RECALL_LOSS + 1e-9:
    return None
  return metrics[IRRELEVANT_ABSTAINED]


TERM = Term(name="abstain", acts_on="answer", container=Abstention, fit=Fit(
    switch="abstain", candidates=candidates, criterion=("recall@5", IRRELEVANT_ABSTAINED),
    measure=measure, objective=objective))
