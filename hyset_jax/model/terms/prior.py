"""The seen-set prior (not in the paper; :mod:`hyset_jax.model.set_prior`): a bonus on F for the
training gold sets, fitted after θ. Its sets are tool rows, so it follows the library: each set
keeps its tools when rows move; a set that lost a tool can no longer be predicted and is
dropped (its classifier row too: p is a softmax over the sets that remain), and no prior is
left when none remains.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from hyset_jax.model.scoring import SetPrior
from hyset_jax.model.terms.base import Term


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


TERM = Term(name="prior", acts_on="set", container=SetPrior, reindex=reindex,
            fitted_after_theta=True)
