"""The model terms, one module each, picked by name (the way big_vision picks models).

Each module declares a :class:`~hyset_jax.model.terms.base.Term`; its tensors are in the model schema
(:mod:`hyset_jax.io.model_format`). Consumers loop over :data:`REGISTRY` (model directories,
``hyset tools add|remove``, the rankings a model allows) instead of naming terms one by one.
Adding a term is one new module, one line below, its tensors in ``model_schema.json`` and its
tests (``tests/test_terms.py`` fails for a term that misses a consumer).
"""
from __future__ import annotations

from hyset_jax.io import model_format
from hyset_jax.errors import UserError
from hyset_jax.model.terms import (abstain, conditioned, lexical, prior, row_blend, set_weight,
                                   tower)
from hyset_jax.model.terms.base import Term

REGISTRY: dict[str, Term] = {t.name: t for t in (
    tower.TERM,
    conditioned.TERM,
    row_blend.TERM,
    prior.TERM,
    lexical.TERM,
    set_weight.TERM,
    abstain.TERM,
)}


def _check_registry() -> None:
  """The registry and the schema name the same terms, in the same order, and every term that
  refers to tool rows says how it follows them (a developer error otherwise)."""
  if tuple(REGISTRY) != model_format.TERMS:
    raise RuntimeError(f"hyset_jax.model.terms registers {tuple(REGISTRY)} but the model schema "
                       f"declares {model_format.TERMS}")
  for term in REGISTRY.values():
    if term.refers_to_rows and term.reindex is None:
      raise RuntimeError(f"term {term.name!r} refers to tool rows but has no reindex")


_check_registry()


def carried(params) -> tuple[Term, ...]:
  """The terms ``params`` (a HysetParams) carries, in registry order."""
  return tuple(t for t in REGISTRY.values() if t.value(params) is not None)


def names(params) -> tuple[str, ...]:
  return tuple(t.name for t in carried(params))


def allowed_rankings(params) -> tuple[str, ...]:
  """The rankings a model with ``params`` supports (e.g. the prior rules out greedy)."""
  return model_format.allowed_rankings(names(params))


def check_ranking(params, ranking: str) -> None:
  """UserError when ``ranking`` is one a term of ``params`` rules out."""
  allowed = allowed_rankings(params)
  if ranking not in allowed:
    culprits = [t.name for t in carried(params) if ranking in t.rankings_excluded]
    raise UserError(f"the {ranking} ranking is not supported by a model with the "
                    f"{', '.join(culprits) or 'given'} term; use {', '.join(allowed)}")
