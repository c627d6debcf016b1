"""Deterministic splits for data sets that ship without one.

A query's split depends only on its id: ``sha256("<salt>:<query id>")`` read as
a number in [0, 1) picks the split whose cumulative fraction it falls under.
So the split is the same on every run, machine and Python version (unlike
``hash()``), does not depend on file or query order, and adding queries never
moves existing ones between splits. BFCL and the ToolBench examples use
:data:`DEFAULT_FRACTIONS` (80/10/10); :func:`with_validation` carves a
validation split out of ``train`` for data sets that come with train/test only
(ToolLens).
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Iterable, Sequence

from hyset_jax.data.types import Dataset, Query
from hyset_jax.errors import UserError

DEFAULT_FRACTIONS: tuple[tuple[str, float], ...] = (
    ("train", 0.8), ("validation", 0.1), ("test", 0.1))


_CANONICAL_ORDER = ("train", "validation", "test")


def canonical_order(names):
  """Split names with train, validation, test first, then the rest sorted.

  >>> canonical_order(["test", "dev", "train"])
  ['train', 'test', 'dev']
  """
  names = list(names)
  known = [n for n in _CANONICAL_ORDER if n in names]
  return known + sorted(n for n in names if n not in _CANONICAL_ORDER)


def unit_hash(query_id: str, salt: str) -> float:
  """A stable number in [0, 1) for ``query_id``.

  >>> round(unit_hash("simple_python_0", "split"), 6)
  0.244666
  """
  digest = hashlib.sha256(f"{salt}:{query_id}".encode("utf-8")).digest()
  return int.from_bytes(digest[:8], "big") / 2.0**64


def assign(query_id: str, fractions: Sequence[tuple[str, float]] = DEFAULT_FRACTIONS,
           salt: str = "split") -> str:
  """The split name for ``query_id`` under ``fractions`` (which must sum to 1)."""
  u = unit_hash(query_id, salt)
  total = 0.0
  for name, fraction in fractions:
    total += fraction
    if u < total:
      return name
  return fractions[-1][0]  # u is within rounding of 1.0


def hash_split(queries: Iterable[Query],
               fractions: Sequence[tuple[str, float]] = DEFAULT_FRACTIONS,
               salt: str = "split") -> dict[str, tuple[Query, ...]]:
  """Splits ``queries`` by id hash; every named split is present, order is kept."""
  _check_fractions(fractions)
  out: dict[str, list[Query]] = {name: [] for name, _ in fractions}
  for query in queries:
    out[assign(query.id, fractions, salt)].append(query)
  return {name: tuple(qs) for name, qs in out.items()}


def with_validation(dataset: Dataset, fraction: float = 0.1) -> Dataset:
  """``dataset`` with a ``validation`` split carved out of ``train`` by id hash.

  Returns ``dataset`` unchanged if it already has a validation split. A
  separate salt keeps this independent of :func:`hash_split`'s boundaries.
  """
  if "validation" in dataset.splits:
    return dataset
  if "train" not in dataset.splits:
    raise UserError(f"data set {dataset.name!r} has no train split to carve a validation "
                    f"split from; it has: {', '.join(sorted(dataset.splits))}")
  if not 0.0 < fraction < 1.0:
    raise UserError(f"validation fraction must be in (0, 1), got {fraction}")
  fractions = (("validation", fraction), ("train", 1.0 - fraction))
  carved = hash_split(dataset.splits["train"], fractions, salt="validation")
  new_splits = dict(dataset.splits)
  new_splits["train"] = carved["train"]
  new_splits["validation"] = carved["validation"]
  new_splits = {name: new_splits[name] for name in canonical_order(new_splits)}
  note = (f"validation: {len(carved['validation'])} queries carved from train "
          f"(sha256 of the query id, fraction {fraction})")
  return dataclasses.replace(dataset, splits=new_splits, notes=dataset.notes + (note,))


def _check_fractions(fractions: Sequence[tuple[str, float]]) -> None:
  if not fractions or any(f < 0 for _, f in fractions):
    raise UserError(f"split fractions must be non-negative, got {list(fractions)}")
  if abs(sum(f for _, f in fractions) - 1.0) > 1e-9:
    raise UserError(f"split fractions must sum to 1, got {list(fractions)}")
  names = [n for n, _ in fractions]
  if len(set(names)) != len(names):
    raise UserError(f"split names must be distinct, got {names}")
