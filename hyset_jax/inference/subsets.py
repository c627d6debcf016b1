"""The static subset tables of stage 2 and their arithmetic (paper Eq. 14).

Every subset E ⊆ S, 1 ≤ |E| ≤ M, of a K-tool shortlist is listed once per (K, M) in a
:class:`SubsetTable`: by size ascending, and within a size in *colex* order (ordered by the
largest element, then the next largest, …). The colex rank of {s_1 < … < s_k} is Σ_j C(s_j, j),
so the row of any subset, and of the subsets it is built from, is known when the table is built
(docs/speed.md). Also here: the incidence matrices of the table, the results every
implementation of :mod:`hyset_jax.inference.enumeration` returns (:class:`SubsetScores`,
:class:`BestSets`) and the reductions between them. The JAX forms, the native kernel and the
Pallas kernel all build on this module, and it imports none of them.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hyset_jax.errors import UserError


def count_subsets(k_pool: int, max_size: int) -> int:
  """Σ_{m=1}^{M} C(K, m).

  >>> count_subsets(20, 5)
  21699
  """
  return sum(math.comb(k_pool, m) for m in range(1, max_size + 1))


def subsets_containing(k_pool: int, max_size: int) -> int:
  """How many subsets of sizes 1..M of K tools contain a given tool: Σ_m C(K − 1, m − 1).

  >>> subsets_containing(20, 3)
  191
  """
  return sum(math.comb(k_pool - 1, m - 1) for m in range(1, max_size + 1))


@dataclasses.dataclass(frozen=True, eq=False)
class SubsetTable:
  """All subsets of {0..K-1} of size 1..M, sizes ascending, colex within a size.

  Attributes:
    k_pool: K.
    max_size: M.
    members: int32[n, M] positions of each subset's members, ascending, padded with 0.
    mask: bool[n, M], True for real members.
    sizes: int32[n].
    offsets: start row of each size block; ``offsets[m - 1]`` is the first subset of size m,
      ``offsets[M]`` = n.
  """
  k_pool: int
  max_size: int
  members: np.ndarray
  mask: np.ndarray
  sizes: np.ndarray
  offsets: tuple[int, ...]

  def __len__(self) -> int:
    return int(self.sizes.shape[0])


def validate_sizes(k_pool: int, max_size: int, *, k1: int | None = None,
                   num_tools: int | None = None) -> None:
  """Raise a UserError unless 2 ≤ M ≤ K_pool, 1 ≤ K1 < K_pool and K_pool ≤ N."""
  if not (isinstance(k_pool, int) and isinstance(max_size, int)):
    raise UserError(f"k_pool and max_size must be integers, got {k_pool!r}, {max_size!r}")
  if not 2 <= max_size <= k_pool:
    raise UserError(f"max set size M must satisfy 2 ≤ M ≤ k_pool ({k_pool}), got {max_size}")
  if k1 is not None and not 1 <= k1 < k_pool:
    raise UserError(f"k1 must satisfy 1 ≤ k1 < k_pool ({k_pool}), got {k1}")
  if num_tools is not None and num_tools < k_pool:
    raise UserError(f"the tool library has {num_tools} tools, fewer than k_pool = {k_pool}; "
                    f"lower --k-pool (and --k1) or use a larger library")


def _colex(k_pool: int, size: int) -> np.ndarray:
  """int32[C(K, size), size]: the size-subsets of range(K) in colex order, members ascending.

  Built by the recurrence of the module docstring: the subsets whose largest element is c are
  the first C(c, size − 1) smaller subsets, each with c appended.
  """
  level = np.arange(k_pool, dtype=np.int32)[:, None]
  for k in range(2, size + 1):
    level = np.concatenate([
        np.concatenate([level[:math.comb(c, k - 1)],
                        np.full((math.comb(c, k - 1), 1), c, np.int32)], axis=1)
        for c in range(k - 1, k_pool)])
  return level


def colex_rank(members: np.ndarray) -> np.ndarray:
  """Row of each subset within its size block: Σ_j C(s_j, j + 1) for ascending members s.

  >>> colex_rank(np.array([[0, 1], [0, 2], [1, 2], [0, 3]])).tolist()
  [0, 1, 2, 3]
  """
  k = members.shape[-1]
  binom = np.array([[math.comb(s, j + 1) for j in range(k)]
                    for s in range(int(members.max(initial=0)) + 1)], np.int64)
  return binom[members, np.arange(k)].sum(-1)


@functools.lru_cache(maxsize=32)
def subset_table(k_pool: int, max_size: int) -> SubsetTable:
  """The static table for (K, M), built once and cached.

  >>> t = subset_table(4, 2)
  >>> t.members[t.offsets[1]:, :2].tolist()  # the 2-subsets in colex order
  [[0, 1], [0, 2], [1, 2], [0, 3], [1, 3], [2, 3]]
  """
  validate_sizes(k_pool, max_size)
  blocks = [_colex(k_pool, m) for m in range(1, max_size + 1)]
  n = sum(len(b) for b in blocks)
  members = np.zeros((n, max_size), np.int32)
  mask = np.zeros((n, max_size), bool)
  offsets = [0]
  for m, block in enumerate(blocks, start=1):
    lo = offsets[-1]
    members[lo:lo + len(block), :m] = block
    mask[lo:lo + len(block), :m] = True
    offsets.append(lo + len(block))
  sizes = mask.sum(1).astype(np.int32)
  for a in (members, mask, sizes):
    a.setflags(write=False)
  return SubsetTable(k_pool, max_size, members, mask, sizes, tuple(offsets))


class SubsetScores(NamedTuple):
  """F for every subset of each query's shortlist.

  Attributes:
    scores: f32[Q, n], in table order.
    positions: int32[Q, K]; subset i of query q is the shortlist positions
      ``positions[q, table.members[i, :table.sizes[i]]]``.
  """
  scores: jax.Array
  positions: jax.Array


def check_inputs(logits: jax.Array, pairs: jax.Array, table: SubsetTable) -> None:
  """ValueError unless logits is [Q, K] and pairs [Q, M−1, K, K] for ``table``'s (K, M)."""
  q, k = logits.shape
  if k != table.k_pool or pairs.shape != (q, table.max_size - 1, k, k):
    raise ValueError(
        f"expected logits [Q, {table.k_pool}] and pairs [Q, {table.max_size - 1}, "
        f"{table.k_pool}, {table.k_pool}], got {logits.shape} and {pairs.shape}")


@functools.lru_cache(maxsize=32)
def incidence(k_pool: int, max_size: int) -> tuple[tuple[np.ndarray, np.ndarray | None], ...]:
  """Per size m: A_m f32[K, C(K,m)] member incidence, and for m ≥ 2 A_pairs,m
  f32[C(K,2), C(K,m)] pair incidence (pairs in np.triu_indices(K, 1) order)."""
  table = subset_table(k_pool, max_size)
  pair_index = np.full((k_pool, k_pool), -1, np.int64)
  iu = np.triu_indices(k_pool, 1)
  pair_index[iu] = np.arange(len(iu[0]))
  out = []
  for m in range(1, max_size + 1):
    mem = table.members[table.offsets[m - 1]:table.offsets[m], :m]
    n_m = len(mem)
    a = np.zeros((k_pool, n_m), np.float32)
    a[mem, np.arange(n_m)[:, None]] = 1.0
    ap = None
    if m >= 2:
      i, j = np.triu_indices(m, 1)
      ap = np.zeros((len(iu[0]), n_m), np.float32)
      ap[pair_index[mem[:, i], mem[:, j]], np.arange(n_m)[:, None]] = 1.0
    out.append((a, ap))
  return tuple(out)


class BestSets(NamedTuple):
  """The top-k sets per query. positions: int32[Q, k, M] shortlist positions (padding 0);
  mask: bool[Q, k, M]; scores: f32[Q, k]."""
  positions: jax.Array
  mask: jax.Array
  scores: jax.Array


def best_sets(subset_scores: SubsetScores, table: SubsetTable, k: int = 1) -> BestSets:
  """The k highest-scoring subsets per query, best first (first in table order on ties)."""
  scores, idx = jax.lax.top_k(subset_scores.scores, k)                # [Q, k]
  members = jnp.asarray(table.members)[idx]                           # [Q, k, M]
  mask = jnp.asarray(table.mask)[idx]
  positions = jnp.take_along_axis(subset_scores.positions[:, None, :], members, axis=2)
  return BestSets(jnp.where(mask, positions, 0), mask, scores)


def reorder_to_shortlist(scores: np.ndarray, positions: np.ndarray,
                         table: SubsetTable) -> np.ndarray:
  """Scores indexed by table row in shortlist order (NumPy, f32[Q, n]), from scores indexed in
  ``positions`` order (the ascending-ℓ reordering the gather and colex forms report)."""
  out = np.empty_like(scores)
  for q in range(scores.shape[0]):
    members = np.where(table.mask, positions[q][table.members], -1)
    members = np.sort(np.where(table.mask, members, np.iinfo(np.int32).max), axis=1)
    rows = np.empty(len(table), np.int64)
    for m in range(1, table.max_size + 1):
      lo, hi = table.offsets[m - 1], table.offsets[m]
      rows[lo:hi] = lo + colex_rank(members[lo:hi, :m])
    out[q, rows] = scores[q]
  return out
