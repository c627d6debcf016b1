"""The seen-set prior (not in the paper; :mod:`hyset_jax.model.set_prior`): a bonus on F for the
training gold sets, fitted after θ. Its sets are tool rows, so it follows the library: each set
keeps its tools when rows move; a set that lost a tool can no longer be predicted and is
dropped (its classifier row too: p is a softmax over the sets that remain), and no prior is
left when none remains.
"""
from __future__ import annotations

import dataclasses

import numpy as np

import logging
import time

from hyset_jax.model.scoring import SetPrior
from hyset_jax.model.terms.base import Fit, Term
from hyset_jax.model.terms.lexical import SET_CHOICE_METRICS

log = logging.getLogger(__name__)

# The grid chosen on validation (with the ranking; λ = 0, no prior, competes): λ × τ.
WEIGHTS = (0.5, 1.0, 2.0, 4.0, 8.0)
FLOORS = (1e-3, 1e-2, 1e-1)


def moved(prior: SetPrior | None, rows: np.ndarray) -> SetPrior | None:
  """``prior`` with its members' rows moved by ``rows`` (old row → new row, -1: removed)."""
  if prior is None:
    return None
  members = np.asarray(prior.members)
  moved_rows = np.where(members >= 0, rows[np.maximum(members, 0)], -1)
  keep = ~np.any((members >= 0) & (moved_rows < 0), axis=1)
  if not keep.any():
    return None
  # Rows change order only by removal, which keeps the survivors' order: still ascending.
  return prior._replace(members=moved_rows[keep].astype(np.int32), w=np.asarray(prior.w)[keep],
                        b=np.asarray(prior.b)[keep])


def reindex(model, rows: np.ndarray, added_texts=None):
  del added_texts  # the prior needs no text
  return dataclasses.replace(model, params=model.params._replace(
      prior=moved(model.params.prior, rows)))


def candidates(model, data, config):
  """``model`` with the prior fitted on the training queries' gold sets, at each λ × τ of
  :data:`WEIGHTS` × :data:`FLOORS`."""
  from hyset_jax.model import set_prior
  train_qs, t0 = data.splits[config.data.train_split], time.time()
  prior = set_prior.fit(train_qs.embeddings, train_qs.gold, config.model.max_set_size,
                        config.train.seed)
  log.info("seen-set prior: %d training sets, fitted in %.0fs", len(prior.b), time.time() - t0)
  for weight in WEIGHTS:
    for tau in FLOORS:
      yield f"λ={weight:g} τ={tau:g}", dataclasses.replace(model, params=model.params._replace(
          prior=set_prior.with_weight(prior, weight, tau)))


TERM = Term(name="prior", acts_on="set", container=SetPrior, reindex=reindex,
            fit=Fit(switch="set_prior", candidates=candidates, criterion=SET_CHOICE_METRICS))
