"""What a batch of queries brings to inference, as one pytree.

Every inference entry point (:mod:`hyset_jax.inference.pipeline`) takes a :class:`QueryInputs` where it
used to take loose arguments: the query embedding and, for the terms that need more per query,
their inputs (a term names them in :attr:`hyset_jax.model.terms.base.Term.inputs`; today the lexical
term's ``lexical_scores``). A bare f32[Q, d_r] array stands for ``QueryInputs(array)``, the
paper's model. Being a NamedTuple of arrays (None for an absent field), it passes through
``jax.jit``, sharding and chunking like the embedding alone did.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np


class QueryInputs(NamedTuple):
  """Per-query inputs.

  Attributes:
    embedding: f32[Q, d_r], the frozen query encoder's r(x).
    lexical_scores: f32[Q, N] b(x, t), the lexical term's input (the query's BM25 scores over
      the tool texts divided by its best; :meth:`hyset_jax.model.lexical.LexicalIndex.scores`), or
      None for a model without the term.
    allowed: bool[Q, N], the tools each query may be answered with (a request's filter and
      its policy, :mod:`hyset_jax.inference.filters`), or None: every tool. A disallowed tool is masked
      in stage 1 and in the expansion, and stage 2 never picks a set holding one, so the
      answer is the exact best set over the allowed tools; output slots left to disallowed
      tools (allow lists shorter than K_pool) read -1. Every query needs ≥ 1 allowed tool.
  """
  embedding: jax.Array
  lexical_scores: jax.Array | None = None
  allowed: jax.Array | None = None

  @property
  def num_queries(self) -> int:
    return int(self.embedding.shape[0])


def of(x) -> QueryInputs:
  """``x`` as QueryInputs: a QueryInputs as it is, an array as the embedding alone."""
  return x if isinstance(x, QueryInputs) else QueryInputs(x)


def check(x: QueryInputs, params) -> QueryInputs:
  """``x`` with the inputs ``params``' terms need, shaped [Q, N]; the inputs of terms the
  model lacks are dropped (so one QueryInputs serves models with and without a term).
  ``allowed``, which no term owns, is kept (as bool) when given. ValueError naming a missing
  or misshapen input, or a query with no allowed tool."""
  from hyset_jax.model import terms
  n, q = int(params.tool_embeddings.shape[0]), x.num_queries
  needed = {name: t.name for t in terms.carried(params) for name in t.inputs}
  out = {"allowed": _check_allowed(x.allowed, q, n)}
  for name in QueryInputs._fields[1:]:
    if name == "allowed":
      continue
    value = getattr(x, name)
    if name not in needed:
      out[name] = None
    elif value is None or tuple(np.shape(value)) != (q, n):
      raise ValueError(f"this model has a {needed[name]} term: it needs {name} f32[{q}, {n}] "
                       f"per query, got {None if value is None else tuple(np.shape(value))}")
    else:
      out[name] = value
  return x._replace(**out)


def _check_allowed(allowed, q: int, n: int):
  """``allowed`` as bool[q, n] (None stays None); ValueError for another shape or a query
  that may use no tool (its best set would be undefined)."""
  if allowed is None:
    return None
  if tuple(np.shape(allowed)) != (q, n):
    raise ValueError(f"allowed must be bool[{q}, {n}] (queries × tools), got "
                     f"{tuple(np.shape(allowed))}")
  if isinstance(allowed, np.ndarray):
    allowed = allowed.astype(bool)
    empty = np.flatnonzero(~allowed.any(axis=1))
    if empty.size:
      raise ValueError(f"query {int(empty[0])} may use no tool (allowed is all False in "
                       f"{empty.size} rows); every query needs at least one allowed tool")
  return allowed
