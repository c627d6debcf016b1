"""Exhaustive scoring of every subset E ⊆ S, 1 ≤ |E| ≤ M, of a K-tool shortlist (paper Eq. 14).

Subsets are listed once per (K, M) in a static :class:`SubsetTable`: by size ascending, and within
a size in *colex* order (ordered by the largest element, then the next largest, …). Colex order has
the property the fast path relies on: the k-subsets whose largest element is c are exactly
{p ∪ {c}} for the first C(c, k−1) (k−1)-subsets p. So each level of the enumeration is built from
contiguous slices of the previous one plus a broadcast add — no gathers (design.md §3).

Implementations of the same function, measured against each other in ``benchmarks/``:

- :func:`score_subsets_gather` — gathers each subset's members from the tables; the default.
- :func:`score_subsets_colex` — the level recurrence above.

Both take the per-query shortlist quantities ℓ (f32[Q, K]) and the pair matrices
G_m = Z_S M_m Z_Sᵀ (f32[Q, M−1, K, K]) and return :class:`SubsetScores`.

Tie-breaking: :func:`best_sets` takes the first maximum in table order, i.e. the smallest set
wins an exact tie between sizes; within a size, ties resolve by the colex order of the positions
each implementation reports (shortlist order for the gather form, ascending-ℓ order for the
colex form). Exact ties between distinct sets need exactly equal floating-point scores.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hyset_jax.errors import UserError

Method = Literal["colex", "gather"]


def count_subsets(k_pool: int, max_size: int) -> int:
  """Σ_{m=1}^{M} C(K, m).

  >>> count_subsets(20, 5)
  21699
  """
  return sum(math.comb(k_pool, m) for m in range(1, max_size + 1))


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


def _colex(k_pool: int, size: int) -> list[tuple[int, ...]]:
  """k-subsets of range(K) in colex order, built by the same recurrence the fast path uses."""
  level = [(c,) for c in range(k_pool)]
  for k in range(2, size + 1):
    level = [p + (c,) for c in range(k - 1, k_pool) for p in level[:math.comb(c, k - 1)]]
  return level


@functools.lru_cache(maxsize=32)
def subset_table(k_pool: int, max_size: int) -> SubsetTable:
  """The static table for (K, M), built once and cached.

  >>> t = subset_table(4, 2)
  >>> t.members[t.offsets[1]:, :2].tolist()  # the 2-subsets in colex order
  [[0, 1], [0, 2], [1, 2], [0, 3], [1, 3], [2, 3]]
  """
  validate_sizes(k_pool, max_size)
  rows = [s for m in range(1, max_size + 1) for s in _colex(k_pool, m)]
  members = np.zeros((len(rows), max_size), np.int32)
  mask = np.zeros((len(rows), max_size), bool)
  for i, s in enumerate(rows):
    members[i, :len(s)] = s
    mask[i, :len(s)] = True
  sizes = mask.sum(1).astype(np.int32)
  offsets = tuple(int(np.searchsorted(sizes, m)) for m in range(1, max_size + 1)) + (len(rows),)
  for a in (members, mask, sizes):
    a.setflags(write=False)
  return SubsetTable(k_pool, max_size, members, mask, sizes, offsets)


class SubsetScores(NamedTuple):
  """F for every subset of each query's shortlist.

  Attributes:
    scores: f32[Q, n], in table order.
    positions: int32[Q, K]; subset i of query q is the shortlist positions
      ``positions[q, table.members[i, :table.sizes[i]]]``.
  """
  scores: jax.Array
  positions: jax.Array


def _check_inputs(logits: jax.Array, pairs: jax.Array, table: SubsetTable) -> None:
  q, k = logits.shape
  if k != table.k_pool or pairs.shape != (q, table.max_size - 1, k, k):
    raise ValueError(
        f"expected logits [Q, {table.k_pool}] and pairs [Q, {table.max_size - 1}, "
        f"{table.k_pool}, {table.k_pool}], got {logits.shape} and {pairs.shape}")


def score_subsets_gather(logits: jax.Array, pairs: jax.Array, table: SubsetTable) -> SubsetScores:
  """Score every subset by gathering its members' ℓ and pair scores.

  Args:
    logits: f32[Q, K] ℓ of the shortlist tools.
    pairs: f32[Q, M−1, K, K] pair matrices G_m (see :func:`scoring.pair_matrices`).
    table: the subset table for (K, M).

  Returns:
    SubsetScores with identity positions.
  """
  _check_inputs(logits, pairs, table)
  from hyset_jax.scoring import align_scores  # local: avoid a cycle in docs tooling
  q, k = logits.shape
  blocks = []
  for m in range(1, table.max_size + 1):
    lo, hi = table.offsets[m - 1], table.offsets[m]
    idx = table.members[lo:hi, :m]                                   # [n_m, m]
    f = align_scores(logits[:, idx], jnp.ones(idx.shape, bool))      # [Q, n_m]
    if m >= 2:
      a, b = np.triu_indices(m, 1)
      flat = idx[:, a] * k + idx[:, b]                                # [n_m, C(m,2)]
      f = f + jnp.sum(pairs[:, m - 2].reshape(q, k * k)[:, flat], axis=-1)
    blocks.append(f)
  positions = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), (q, k))
  return SubsetScores(jnp.concatenate(blocks, axis=1), positions)


def score_subsets_colex(logits: jax.Array, pairs: jax.Array, table: SubsetTable) -> SubsetScores:
  """Score every subset with the colex level recurrence: slices and broadcast adds only.

  The shortlist is first reordered by ascending ℓ, so the largest position of a set is also
  its largest logit. Adding c to p then rescales p's softmax sums by exp(ℓ_max(p) − ℓ_c) ≤ 1:
  the recurrence is exact for any logit range (no overflow, and what underflows is negligible).

  F_set of the m-subsets under G_m is built bottom-up from the pair sums PS and row sums
  R[p, :] = Σ_{i∈p} G_m[i, :] of the smaller subsets: PS(p ∪ c) = PS(p) + R[p, c] and
  R(p ∪ c) = R(p) + G_m[c]. The chains of all cardinalities still needed at a level run
  together on a stacked axis, so the program has one slice-and-add per (level, c) block.

  Args and returns as :func:`score_subsets_gather`; positions give the reordering.
  """
  _check_inputs(logits, pairs, table)
  q, k = logits.shape
  big_m = table.max_size
  order = jnp.argsort(logits, axis=1, stable=True).astype(jnp.int32)  # ascending ℓ
  ell = jnp.take_along_axis(logits, order, axis=1)
  g = jnp.take_along_axis(pairs, order[:, None, :, None], axis=2)
  g = jnp.take_along_axis(g, order[:, None, None, :], axis=3)         # [Q, M-1, K, K]

  # Level 1. align: (Σw, Σwℓ, ℓ_max) per set, w relative to the set's own ℓ_max.
  align = jnp.stack([jnp.ones_like(ell), ell, ell], axis=1)           # [Q, 3, n]
  pair_sum = jnp.zeros((q, big_m - 1, k), logits.dtype)                # [Q, chains, n]
  rows = g                                                             # [Q, chains, n, K]
  blocks = [ell]
  for size in range(2, big_m + 1):
    live = big_m - size + 1                  # chains for cardinalities m ≥ size
    pair_sum, rows, g_live = pair_sum[:, -live:], rows[:, -live:], g[:, -live:]
    new_align, new_sum, new_rows = [], [], []
    for c in range(size - 1, k):
      n = math.comb(c, size - 1)             # the (size−1)-subsets of {0..c−1}
      l_c = ell[:, c:c + 1]
      scale = jnp.exp(align[:, 2, :n] - l_c)
      new_align.append(jnp.stack([1.0 + align[:, 0, :n] * scale,
                                  l_c + align[:, 1, :n] * scale,
                                  jnp.broadcast_to(l_c, scale.shape)], axis=1))
      new_sum.append(pair_sum[:, :, :n] + rows[:, :, :n, c])
      if size < big_m:
        new_rows.append(rows[:, :, :n, :] + g_live[:, :, c:c + 1, :])
    align = jnp.concatenate(new_align, axis=2)
    pair_sum = jnp.concatenate(new_sum, axis=2)
    rows = jnp.concatenate(new_rows, axis=2) if new_rows else None
    # Chain 0 is cardinality `size`: its pair sums are F_set of this level.
    blocks.append(pair_sum[:, 0] + align[:, 1] / align[:, 0])
  return SubsetScores(jnp.concatenate(blocks, axis=1), order)


SCORERS = {"colex": score_subsets_colex, "gather": score_subsets_gather}


def score_subsets(logits: jax.Array, pairs: jax.Array, table: SubsetTable,
                  method: Method = "gather") -> SubsetScores:
  """Dispatch to one implementation by name (``gather`` or ``colex``)."""
  try:
    return SCORERS[method](logits, pairs, table)
  except KeyError:
    raise UserError(f"unknown enumeration method {method!r}; choose one of {sorted(SCORERS)}")


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
