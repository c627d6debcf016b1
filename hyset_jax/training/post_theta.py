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

Last, for a model with the lexical term, :func:`fit_foreign` chooses the β it uses on a library
that lists none of its tools (the manifest's ``foreign``; hyset_jax/io/carry.py).
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
from hyset_jax.training.train_data import tool_encoder, validation_parts

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
  """``model`` without any term that is fitted after θ (nor its foreign-library settings)."""
  for term in terms.REGISTRY.values():
    if term.fit is not None:
      model = term.without(model)
  return dataclasses.replace(model, foreign=None)


def _value(fit, metrics: dict[str, float], plain: dict[str, float]) -> float | None:
  """What the choice maximises for a candidate (None: not admissible): the term's objective,
  else the mean of its criterion metrics."""
  if fit.objective is not None:
    return fit.objective(metrics, plain)
  return float(np.mean([metrics[k] for k in fit.criterion]))


class _Scorer:
  """Validation metrics of a model under the rankings it allows (of those requested): with
  ``data.validation_sets``, the mean over both validation parts (evaluator.mean_metrics)."""

  def __init__(self, data, config, ranking: str | None = None):
    self.parts = validation_parts(data, config.data)
    self.tool_ids, self.mc = data.tool_ids, config.model
    self.batch_size = config.train.eval_batch_size
    # ``ranking``: this one only (fit_foreign's logit), whatever the config's.
    self.fixed = ranking or (None if self.mc.ranking == "auto" else self.mc.ranking)
    self.requested = (self.fixed,) if self.fixed else pipeline.RANKINGS

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
    return self.fixed or evaluator.best_ranking(scores)


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
  model, rows, record = fit_foreign(model, data, config)
  if record is not None:
    table |= rows
    fits.append(record)
  return Selection(model, ranking, table, fits)


def _as_if_foreign(model, data):
  """``model`` carried onto its own library under ids it does not know, as
  :func:`hyset_jax.io.carry.carry_onto` carries it onto a library with none of its tools:
  every row the tool's encoder embedding (data's, by text), then ``carry.foreign``'s changes
  (no query tower, logit) and no lexical term. Rows stay in data's order."""
  from hyset_jax.data.types import ToolLibrary
  from hyset_jax.io import carry
  prefix, known = "foreign:", set(model.tool_ids)
  while any(prefix + t in known for t in data.tool_ids):
    prefix = "_" + prefix
  library = ToolLibrary(tuple(prefix + t for t in data.tool_ids), tuple(data.tool_texts),
                        ({},) * len(data.tool_ids))
  carried, _ = carry.carry(model, library, tool_encoder(data))
  carried, _ = carry.foreign(dataclasses.replace(carried, foreign=None))
  return terms.REGISTRY["lexical"].without(carried)


def fit_foreign(model, data, config):
  """The lexical weight ``model`` uses on a library that lists none of its tools: its own
  validation scored with the model as such a library sees it (:func:`_as_if_foreign`), the
  lexical term's grid against its absence (absence wins ties) under ``logit``, on the same
  criterion as the in-domain β. β chosen beside trained rows undersells BM25 where every row is
  an encoder row (measured: docs/model.md, "A model on a wholly new library").

  Returns (``model`` with ``foreign = {"lexical_weight": β}``, the metrics table with keys
  ``"foreign lexical <candidate> logit"``, the record), or (``model``, {}, None) for a model
  without the lexical term or data without tool texts.
  """
  if model.lexical is None or len(data.tool_texts) != len(data.tool_ids):
    return model, {}, None
  term = terms.REGISTRY["lexical"]
  chosen, _, rows, record = fit_term(term, _as_if_foreign(model, data), data, config,
                                     _Scorer(data, config, ranking="logit"))
  beta = float(chosen.params.lexical_weight or 0.0)
  return (dataclasses.replace(model, foreign={"lexical_weight": beta}),
          {f"foreign {k}": v for k, v in rows.items()}, record | {"library": "foreign"})


def with_record(selection: Selection):
  """The ModelDir to write: the chosen model with its ranking and the selection record."""
  return dataclasses.replace(selection.model, ranking=selection.ranking,
                             fits=tuple(selection.fits))
