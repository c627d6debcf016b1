"""What is chosen after θ: every term with a fit (:class:`hyset_jax.model.terms.base.Fit`), in
registry order, by one selection loop on validation, then the ranking.

Each fitted term starts from the model so far without it: its candidates (the term's own grid)
compete with its absence, which wins ties, on the mean of the term's criterion metrics; with
``model.ranking = auto`` each candidate is scored under every ranking it allows and the ranking
is chosen with it, else ``model.ranking`` is used throughout. A rerun strips every fitted term
first, so switching one off (or on) on a finished run rechooses everything after θ.

The result records every candidate: the validation metrics of each ``"<term> <candidate>
<ranking>"`` (metrics.jsonl) and, per term, each candidate's criterion score and the one chosen
(the model's ``manifest.json``, key ``fits``).
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, NamedTuple

import numpy as np

from hyset_jax.evaluation import evaluator
from hyset_jax.inference import pipeline
from hyset_jax.model import terms
from hyset_jax.training.train_data import validation_parts

log = logging.getLogger(__name__)


class Selection(NamedTuple):
  """What the loop chose.

  Attributes:
    model: the ModelDir with the chosen terms.
    ranking: the chosen ranking method.
    table: ``"<term> <candidate> <ranking>"`` (``"<term> none <ranking>"`` for the model
      without the term; ``"<ranking>"`` when no term is fitted) -> its validation metrics.
    fits: per fitted term ``{"term", "criterion", "scores": {"<candidate> <ranking>": mean of
      the criterion}, "chosen": candidate or "none", "ranking"}``.
  """
  model: Any
  ranking: str
  table: dict[str, dict[str, float]]
  fits: list[dict]


def strip(model):
  """``model`` without any term that is fitted after θ."""
  for term in terms.REGISTRY.values():
    if term.fit is not None:
      model = term.without(model)
  return model


def _value(fit, metrics: dict[str, float], plain: dict[str, float]) -> float | None:
  """What the choice maximises for a candidate (None: not admissible): the term's objective,
  else the mean of its criterion metrics."""
  if fit.objective is not None:
    return fit.objective(metrics, plain)
  return float(np.mean([metrics[k] for k in fit.criterion]))


class _Scorer:
  """Validation metrics of a model under the rankings it allows (of those requested): with
  ``data.validation_sets``, the mean over both validation parts (evaluator.mean_metrics)."""

  def __init__(self, data, config):
    self.parts = validation_parts(data, config.data)
    self.tool_ids, self.mc = data.tool_ids, config.model
    self.batch_size = config.train.eval_batch_size
    self.requested = pipeline.RANKINGS if self.mc.ranking == "auto" else (self.mc.ranking,)

  def __call__(self, model) -> dict[str, dict[str, float]]:
    allowed = terms.allowed_rankings(model.params)
    rankings = tuple(r for r in self.requested if r in allowed)
    # neighbor_table: the candidates share Z and M_M, so one table (built for the first,
    # neighbors.load_or_build keeps it) serves them all, however large the library.
    return evaluator.evaluate_parts(model.params, self.parts, self.tool_ids, self.mc,
                                    self.batch_size, rankings, lexical=model.lexical,
                                    neighbor_table=True)

  def ranked(self, scores: dict[str, dict[str, float]]) -> str:
    """The ranking without a new term: the best mean of the rank metrics (ties: the paper's
    greedy, the first of ``pipeline.RANKINGS``), or the configured one."""
    return self.mc.ranking if self.mc.ranking != "auto" else evaluator.best_ranking(scores)


def fit_term(term: terms.Term, model, data, config, scorer: _Scorer | None = None,
             plain: dict[str, dict[str, float]] | None = None):
  """One term's choice: ``model`` (without the term) against it with each candidate
  (``plain``: ``model``'s validation metrics, when already known).

  Returns (the model, the ranking, the metrics table, the term's record).
  """
  fit, t0 = term.fit, time.time()
  scorer = scorer or _Scorer(data, config)
  plain = plain if plain is not None else scorer(model)
  ranking = scorer.ranked(plain)
  extra = fit.measure(model, data, config) if fit.measure else {}
  none = {r: m | extra for r, m in plain.items()}
  table = {f"{term.name} none {r}": m for r, m in none.items()}
  base = none[ranking]
  scores = {f"none {r}": _value(fit, m, base) for r, m in none.items()}
  best, chosen = scores[f"none {ranking}"], None
  for label, candidate in fit.candidates(model, data, config):
    extra = fit.measure(candidate, data, config) if fit.measure else {}
    for r, m in scorer(candidate).items():
      table[f"{term.name} {label} {r}"] = m = m | extra
      value = scores[f"{label} {r}"] = _value(fit, m, base)
      if value is not None and value > best:
        best, chosen, ranking, model_chosen = value, label, r, candidate
  log.info("%s term: %s, ranking %r chosen on validation (%.0fs)", term.name,
           chosen or "none", ranking, time.time() - t0)
  record = {"term": term.name, "criterion": list(fit.criterion), "scores": scores,
            "chosen": chosen or "none", "ranking": ranking}
  return (model_chosen if chosen else model), ranking, table, record


def select(model, data, config) -> Selection:
  """Every enabled fit of ``config.model`` in registry order on ``model`` (a ModelDir, its
  post-θ terms stripped first), then the ranking; see the module docstring."""
  model, mc = strip(model), config.model
  fitted = [t for t in terms.REGISTRY.values()
            if t.fit is not None and getattr(mc, t.fit.switch)]
  if not fitted and mc.ranking != "auto":
    return Selection(model, mc.ranking, {}, [])
  scorer = _Scorer(data, config)
  plain = scorer(model)
  ranking, fits = scorer.ranked(plain), []
  table = {} if fitted else dict(plain)  # the ranking choice alone: keyed by the ranking
  for term in fitted:
    before = model
    model, ranking, rows, record = fit_term(term, model, data, config, scorer, plain)
    table |= rows
    fits.append(record)
    plain = plain if model is before else None  # the next term's baseline: the model so far
  return Selection(model, ranking, table, fits)


def with_record(selection: Selection):
  """The ModelDir to write: the chosen model with its ranking and the selection record."""
  return dataclasses.replace(selection.model, ranking=selection.ranking,
                             fits=tuple(selection.fits))
