"""The set term's weight (not in the paper): γ ≥ 0, chosen on validation after θ, so that
stage 2 scores F'(x, E) = F_align + γ·(F_set + F_cond) — the pair matrices G_m scaled by γ. The
paper's model is γ = 1 (the term absent), which wins ties. The expansion (Eq. 13) keeps M_M as
trained: γ weighs the set term in the score, not which tools are candidates.

Why: θ is trained with F_set and F_align together, but on a library whose test sets are new
combinations of tools the trained pair terms can favour the wrong size. Measured on the
Seal-Tools preset (seed 0): γ = 0 after θ raised the exact set on validation from 5.4 % to
21.6 % with R@5 and COMP@5 unchanged, while ToolLens' validation kept γ = 1 (docs/model.md).

γ refers to no tool row: a library edit leaves it as it is.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from hyset_jax.model.terms.base import Fit, Term
from hyset_jax.model.terms.lexical import SET_CHOICE_METRICS

# The candidates beside γ = 1 (the term absent): off, damped, and doubled. On Seal-Tools'
# validation only γ = 0 moved the criterion (0.6236 → 0.6606); 0.05 … 2 all stayed within
# 0.0013 of γ = 1, because any positive pair score outweighs what a member costs F_align's
# weighted mean: the choice is mostly between the trained set term and none.
WEIGHTS = (0.0, 0.25, 0.5, 2.0)


def with_weight(model, weight: float):
  return dataclasses.replace(model, params=model.params._replace(
      set_weight=np.float32(weight)))


def candidates(model, data, config):
  """``model`` with γ at each of :data:`WEIGHTS`."""
  del data, config
  for weight in WEIGHTS:
    yield f"γ={weight:g}", with_weight(model, weight)


TERM = Term(name="set_weight", acts_on="pairs",
            fit=Fit(switch="set_weight", candidates=candidates, criterion=SET_CHOICE_METRICS))
