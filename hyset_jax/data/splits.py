"""Deterministic splits for data sets that ship without one.

A query's split depends only on its id: ``sha256("<salt>:<query id>")`` read as
a number in [0, 1) picks the split whose cumulative fraction it falls under.
So the split is the same on every run, machine and Python version (unlike
``hash()``), does not depend on file or query order, and adding queries never
moves existing ones between splits. BFCL and the ToolBench examples use
:data:`DEFAULT_FRACTIONS` (80/10/10); :func:`with_validation` carves a
validation split out of ``train`` for data sets that come with train/test only
(ToolLens).

Held out by gold *set* rather than by query: :func:`hold_out` takes whole multi-tool gold sets
out of training (every tool of them still in another training set), for the unseen-set test
splits of the benchmarks and for :func:`with_unseen_validation`, the second validation part
(``data.validation_sets``) that lets model selection see new combinations of known tools.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
from typing import Iterable, Sequence

import numpy as np

from hyset_jax.data.types import Dataset, Query
from hyset_jax.errors import UserError

DEFAULT_FRACTIONS: tuple[tuple[str, float], ...] = (
    ("train", 0.8), ("validation", 0.1), ("test", 0.1))

# The split :func:`with_unseen_validation` writes: queries of gold sets held out of training.
UNSEEN_VALIDATION = "validation_unseen"


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


@dataclasses.dataclass(frozen=True)
class UnseenSplit:
  """The split: train, validation and test queries and the held-out gold sets (sorted tool ids).

  ``validation`` is empty (and ``validation_sets`` too) when validation is carved from train.
  """
  train: tuple[Query, ...]
  test: tuple[Query, ...]
  held_out: tuple[tuple[str, ...], ...]
  validation: tuple[Query, ...] = ()
  validation_sets: tuple[tuple[str, ...], ...] = ()


def hold_out(queries: Sequence[Query], n_sets: int, seed: int, kept: set[str],
             n_validation: int = 0) -> UnseenSplit:
  """Holds out ``n_sets`` (+ ``n_validation``) multi-tool gold sets whose tools stay covered.

  Args:
    queries: the pooled queries.
    n_sets: how many sets to hold out for test.
    seed: the draw order of the candidate sets.
    kept: ids of the queries that stay in train after the validation carve (every query when
      validation is held out instead); a set covers its tools only through such queries.
    n_validation: how many further sets to hold out for validation (0 = validation is carved
      from train when the data is read).

  Returns:
    The split. Candidates are the distinct multi-tool sets, sorted, then permuted by
    ``numpy.random.default_rng(seed)``; a candidate is held out if every one of its tools
    is in at least one other set that is still in training (with a query in ``kept``). The
    first ``n_sets`` held out are the test sets, the next ``n_validation`` the validation sets.
  """
  by_set: dict[tuple[str, ...], list[Query]] = collections.defaultdict(list)
  for q in queries:
    by_set[tuple(sorted(q.gold))].append(q)
  covering = collections.Counter()  # tool -> training sets (with a kept query) that contain it
  for s, qs in by_set.items():
    if any(q.id in kept for q in qs):
      covering.update(s)
  candidates = sorted(s for s in by_set if len(s) >= 2)
  order = np.random.default_rng(seed).permutation(len(candidates))
  held: list[tuple[str, ...]] = []
  for i in order:
    if len(held) == n_sets + n_validation:
      break
    s = candidates[i]
    own = int(any(q.id in kept for q in by_set[s]))  # does s count towards its own tools?
    if all(covering[t] - own >= 1 for t in s):
      held.append(s)
      if own:
        covering.subtract(s)
  if len(held) < n_sets + n_validation:
    raise UserError(f"only {len(held)} of {len(candidates)} multi-tool gold sets can be held out "
                    f"with every tool still in a training set; asked for --sets {n_sets}"
                    + (f" + --validation-sets {n_validation}" if n_validation else ""))
  test_sets, val_sets = set(held[:n_sets]), set(held[n_sets:])
  key = lambda q: tuple(sorted(q.gold))
  test = tuple(q for q in queries if key(q) in test_sets)
  validation = tuple(q for q in queries if key(q) in val_sets)
  train = tuple(q for q in queries if key(q) not in test_sets and key(q) not in val_sets)
  return UnseenSplit(train, test, tuple(sorted(test_sets)), validation, tuple(sorted(val_sets)))


def with_unseen_validation(dataset: Dataset, n_sets: int, seed: int = 0, train: str = "train",
                           validation: str = "validation") -> Dataset:
  """``dataset`` with ``n_sets`` multi-tool gold sets of ``train`` held out: every query of
  those sets in ``train`` and in ``validation`` moves to the split :data:`UNSEEN_VALIDATION`
  (:func:`hold_out`'s seeded draw and coverage rule: each of their tools stays in another
  training set).

  The test split is left as it is. Where its sets also occur in training (ToolLens: all of
  them), its queries of the held-out sets become new combinations for the model — the price
  of measuring new combinations on validation, visible in the official-split metrics.
  """
  if UNSEEN_VALIDATION in dataset.splits:
    raise UserError(f"data set {dataset.name!r} already has a split named "
                    f"{UNSEEN_VALIDATION!r}; data.validation_sets would write it")
  for name in (train, validation):
    if name not in dataset.splits:
      raise UserError(f"data set {dataset.name!r} has no {name!r} split to hold validation "
                      f"sets out of; it has: {', '.join(sorted(dataset.splits))}")
  queries = dataset.splits[train]
  try:
    held = hold_out(queries, 0, seed, {q.id for q in queries}, n_validation=n_sets)
  except UserError as e:
    raise UserError(f"data.validation_sets = {n_sets} on {dataset.name!r}: {e}; lower "
                    f"data.validation_sets or set it to 0") from None
  sets = set(held.validation_sets)
  key = lambda q: tuple(sorted(q.gold))
  new_splits = dict(dataset.splits)
  new_splits[train] = held.train
  new_splits[validation] = tuple(q for q in dataset.splits[validation] if key(q) not in sets)
  new_splits[UNSEEN_VALIDATION] = held.validation + tuple(
      q for q in dataset.splits[validation] if key(q) in sets)
  if not new_splits[validation]:
    raise UserError(f"data.validation_sets = {n_sets} on {dataset.name!r} leaves no query in "
                    f"{validation!r}; lower data.validation_sets")
  new_splits = {name: new_splits[name] for name in canonical_order(new_splits)}
  note = (f"{UNSEEN_VALIDATION}: {len(new_splits[UNSEEN_VALIDATION])} queries of {n_sets} "
          f"multi-tool gold sets held out of {train} and {validation} (seed {seed})")
  return dataclasses.replace(dataset, splits=new_splits, notes=dataset.notes + (note,))


def _check_fractions(fractions: Sequence[tuple[str, float]]) -> None:
  if not fractions or any(f < 0 for _, f in fractions):
    raise UserError(f"split fractions must be non-negative, got {list(fractions)}")
  if abs(sum(f for _, f in fractions) - 1.0) > 1e-9:
    raise UserError(f"split fractions must sum to 1, got {list(fractions)}")
  names = [n for n, _ in fractions]
  if len(set(names)) != len(names):
    raise UserError(f"split names must be distinct, got {names}")
