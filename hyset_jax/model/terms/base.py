"""What a model term is: one declaration, read by every consumer that loops over the terms.

A term is an optional part of the model beside the paper's core θ = (Z, P, M_2..M_M). Its
tensors (names, shapes, dtypes) are declared in the model schema (``model_schema.json``, read by
:mod:`hyset_jax.io.model_format`); the rest is declared here, in the term's own module:

- ``acts_on``: where it enters the score — ``rows`` (Z itself, as every consumer reads it),
  ``query`` (the query side q(r) in front of P),
  ``logits`` (a per-tool addition to ℓ), ``pairs`` (an addition to, or a weight on, the pair
  matrices G_m of stage 2), ``set`` (a bonus on F for some sets) or ``answer`` (whether the
  best set is delivered at all);
- ``inputs``: the per-query inputs it needs besides the query embedding (e.g. lexical scores);
- ``reindex``: how it follows tool rows when the library changes (``hyset tools add|remove``,
  a model carried onto another library); required for a term whose tensors or file refer to
  tool rows (the schema marks them), so a forgotten case cannot leave a term on wrong rows;
- the rankings it rules out (in the schema, where the NumPy reference reads them too);
- ``fit``: how it is chosen on validation after θ is trained, rather than trained with it (its
  candidate grid and what the choice maximises; :mod:`hyset_jax.training.post_theta` runs every
  fit in registry order).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from hyset_jax.io import model_format

ACTS_ON = ("rows", "query", "logits", "pairs", "set", "answer")


@dataclasses.dataclass(frozen=True)
class Fit:
  """How a term is chosen on validation after θ (:mod:`hyset_jax.training.post_theta`).

  Attributes:
    switch: the :class:`hyset_jax.config.ModelConfig` field that turns the fit on.
    candidates: ``(model, data, config) -> iterable of (label, model)``: ``model`` (a ModelDir
      without the term) with each candidate value of it; ``data`` the training data (its
      splits), ``config`` the run's config.
    criterion: the metrics the choice reads (recorded with it).
    objective: ``(metrics, plain) -> float or None``: what the choice maximises for a
      candidate's validation metrics, ``plain`` those of the model without the term (None: the
      candidate is not admissible). Default: the mean of ``criterion``.
    measure: ``(model, data, config) -> dict``: metrics beyond the validation split's that the
      objective reads (e.g. on another split), added to each candidate's.
  """
  switch: str
  candidates: Callable[..., Iterable[tuple[str, Any]]]
  criterion: tuple[str, ...]
  objective: Callable[[dict, dict], float | None] | None = None
  measure: Callable[..., dict] | None = None


@dataclasses.dataclass(frozen=True)
class Term:
  """A model term (see the module docstring).

  Attributes:
    name: the schema's name, also what a manifest lists.
    acts_on: one of :data:`ACTS_ON`.
    container: the NamedTuple holding its tensors in schema order, or None for a term of one
      scalar tensor (held as f32[]).
    inputs: per-query inputs the term needs (fields of
      :class:`hyset_jax.model.query_inputs.QueryInputs`).
    reindex: ``(model, rows, added_texts) -> model``: ``model`` already on the new library
      (tool ids and Z), this term's value still on the old rows; ``rows`` int[N_old] maps each
      old row to its new row (-1: removed); ``added_texts`` the texts of the rows that are new.
    fit: how it is chosen after θ (on validation) rather than trained with it; None: trained
      with θ (or set by hand).
    remove: ``model -> model`` without the term; default: its HysetParams field cleared.
  """
  name: str
  acts_on: str
  container: type | None = None
  inputs: tuple[str, ...] = ()
  reindex: Callable[..., Any] | None = None
  fit: Fit | None = None
  remove: Callable[[Any], Any] | None = None

  def __post_init__(self):
    if self.acts_on not in ACTS_ON:
      raise ValueError(f"term {self.name!r}: acts_on {self.acts_on!r} is not one of {ACTS_ON}")

  @property
  def schema(self) -> dict:
    return model_format.SCHEMA["terms"][self.name]

  @property
  def field(self) -> str:
    """The :class:`hyset_jax.model.scoring.HysetParams` field that holds the term (None: absent)."""
    return model_format.term_field(self.name)

  @property
  def tensor_names(self) -> list[str]:
    return model_format.term_tensors(self.name)

  @property
  def refers_to_rows(self) -> bool:
    """Whether its tensors or its file are indexed by, or hold, tool rows."""
    return ("file_rows" in self.schema
            or any(s.get("rows") or "N" in s["shape"] for s in self.schema["tensors"]))

  @property
  def rankings_excluded(self) -> tuple[str, ...]:
    return tuple(self.schema.get("rankings_excluded", ()))

  def value(self, params):
    return getattr(params, self.field)

  def without(self, model):
    """``model`` (a ModelDir) without this term."""
    if self.remove is not None:
      return self.remove(model)
    return dataclasses.replace(model, params=model.params._replace(**{self.field: None}))

  def pack(self, value) -> dict[str, np.ndarray]:
    """The term's named tensors (f32, or int32 for tool rows), as files store them."""
    parts = tuple(value) if self.container is not None else (value,)
    out = {}
    for spec, a in zip(self.schema["tensors"], parts):
      dtype = np.int32 if spec["dtype"] == "int" else np.float32
      out[spec["name"]] = np.asarray(a, dtype, order="C")  # not ascontiguousarray: 0-d stays
    return out

  def unpack(self, parts) -> Any:
    """The term's value from :class:`hyset_jax.io.model_format.Model`'s field."""
    if self.container is None:
      return np.asarray(parts, np.float32)
    cast = [np.asarray(a, np.int32 if s["dtype"] == "int" else np.float32)
            for s, a in zip(self.schema["tensors"], parts)]
    return self.container(*cast)
