"""The gather and colex forms of stage 2 on query-last tables: one chunk of queries scored
subset-major, f32[n, Q] (the arithmetic behind :func:`enumeration.score_subsets_gather`,
:func:`enumeration.score_subsets_colex` and their best-set reduction).

How XLA:CPU treats these programs decides their speed more than the arithmetic does, so the
structure below is deliberate (measurements in benchmarks/README.md):

- Scores are computed with queries on the minor axis ([rows, Q]): every static-index gather
  then moves a contiguous run of queries and vectorises; along the minor axis it would be
  scalar loads (~10x slower).
- XLA fuses each block of subsets into one loop that reads the per-query tables. The loop
  vectorises only if the tables are physically query-last, which layout assignment guarantees
  only for the output of an op XLA will not fuse into its consumers: a gather (expensive, and
  its consumers reuse elements). So the tables are built by gathers whose output already has
  queries last; a transpose there would be fused in as a strided read.
- A transpose of the scoring loops' output would be fused into them too (computing in
  transposed order, ~10x slower), so everything here stays subset-major; the [Q, n] API output
  is a separate copy made per chunk in :mod:`hyset_jax.inference.enumeration`.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hyset_jax.inference.subsets import SubsetTable, colex_rank, subset_table


class Tables(NamedTuple):
  """Per-query tables, queries on the minor axis.

  order: int32[Q, K] ascending-ℓ order (the reported positions).
  ell: f32[K, Q] ℓ in that order.
  expo: f32[K·K, Q]; row a·K + c holds exp(ℓ_a − ℓ_c), ≤ 1 for a ≤ c.
  pairs: f32[M−1, K·K, Q]; row a·K + c of block m − 2 holds G_m[order a, order c].
  """
  order: jax.Array
  ell: jax.Array
  expo: jax.Array
  pairs: jax.Array


def sorted_tables(logits: jax.Array, pairs: jax.Array) -> Tables:
  """The :class:`Tables` of f32[Q, K] logits and f32[Q, M−1, K, K] pair matrices."""
  q, k = logits.shape
  order = jnp.argsort(logits, axis=1, stable=True).astype(jnp.int32)
  queries = jnp.arange(q)
  order_t = order.T                                                      # [K, Q]
  ell = logits[queries[None, :], order_t]                                # [K, Q]
  flat = (order_t[:, None, :] * k + order_t[None, :, :]).reshape(k * k, q)
  sizes = jnp.arange(pairs.shape[1])[:, None, None]
  g = pairs.reshape(q, -1, k * k)[queries[None, None, :], sizes, flat[None]]  # [M−1, K·K, Q]
  expo = jnp.exp(jnp.minimum(ell[:, None, :] - ell[None, :, :], 0.0))   # [K, K, Q]
  return Tables(order, ell, expo.reshape(k * k, q), g)


# Rows per scoring loop: each piece is one fusion writing its rows into the subset-major buffer.
_PIECE_ROWS = 2048


def _row_pieces(sizes: list[int]) -> list[list[tuple[int, int]]]:
  """Row ranges splitting blocks of the given sizes into pieces of at most _PIECE_ROWS."""
  counts = [max(1, -(-n // _PIECE_ROWS)) for n in sizes]
  return [[(n * i // c, n * (i + 1) // c) for i in range(c)] for n, c in zip(sizes, counts)]


def subset_major(t: Tables, table: SubsetTable, method: str, rows: int | None = None,
                 fill: float = 0.0) -> jax.Array:
  """f32[rows, Q]: the gather or colex scores written into one subset-major buffer, rows
  beyond the table's (``rows`` ≥ n, default n) holding ``fill``."""
  pieces = (_colex_query_last(t, table) if method == "colex" else _gather_query_last(t, table))
  # In-place updates of one buffer: each piece is computed straight into it, where a
  # concatenation would copy every score once more.
  out = jnp.full((rows or len(table), t.ell.shape[1]), fill, t.ell.dtype)
  row = 0
  for piece in pieces:
    out = jax.lax.dynamic_update_slice(out, piece, (row, 0))
    row += piece.shape[0]
  return out


# ---------------------------------------------------------------------------------------------
# Colex level recurrence.


@dataclasses.dataclass(frozen=True, eq=False)
class _ColexLevel:
  """Static indices for the k-subsets E = p ∪ {c}, c = max E, b = max p, p' = p \\ {b}.

  parent: row of p among the (k−1)-subsets.
  sibling: row of p' ∪ {c} among the (k−1)-subsets (k ≥ 3).
  pair: b·K + c, the row of (b, c) in the K×K tables.
  last: c.
  """
  parent: np.ndarray
  sibling: np.ndarray | None
  pair: np.ndarray
  last: np.ndarray

  def rows(self, lo: int, hi: int) -> "_ColexLevel":
    return _ColexLevel(self.parent[lo:hi], None if self.sibling is None else self.sibling[lo:hi],
                       self.pair[lo:hi], self.last[lo:hi])


@functools.lru_cache(maxsize=32)
def _colex_levels(k_pool: int, max_size: int) -> tuple[_ColexLevel, ...]:
  table = subset_table(k_pool, max_size)
  levels = []
  for k in range(2, max_size + 1):
    mem = table.members[table.offsets[k - 1]:table.offsets[k], :k]
    c, b = mem[:, -1], mem[:, -2]
    sibling = None
    if k >= 3:
      sibling = colex_rank(np.concatenate([mem[:, :-2], c[:, None]], axis=1)).astype(np.int32)
    levels.append(_ColexLevel(colex_rank(mem[:, :-1]).astype(np.int32), sibling,
                              (b * k_pool + c).astype(np.int32), c.astype(np.int32)))
  return tuple(levels)


class _Level(NamedTuple):
  """Per-subset state of one level, f32[rows, Q] each: softmax sums relative to the largest
  logit, and for every cardinality m still needed the pair sum P_m and new-member term D_m."""
  s0: jax.Array
  s1: jax.Array
  pair_sums: dict
  new_terms: dict


def _colex_step(t: Tables, prev: _Level, lv: _ColexLevel, k: int, big_m: int) -> _Level:
  """Level k from level k − 1 (see :func:`_colex_query_last`)."""
  e = t.expo[lv.pair]
  s0 = 1.0 + e * prev.s0[lv.parent]
  s1 = t.ell[lv.last] + e * prev.s1[lv.parent]
  pair_sums, new_terms = {}, {}
  for m in range(k, big_m + 1):
    g = t.pairs[m - 2][lv.pair]
    if k == 2:
      new_terms[m] = pair_sums[m] = g
    else:
      new_terms[m] = prev.new_terms[m][lv.sibling] + g
      pair_sums[m] = prev.pair_sums[m][lv.parent] + new_terms[m]
  return _Level(s0, s1, pair_sums, new_terms)


def _colex_query_last(t: Tables, table: SubsetTable) -> list[jax.Array]:
  """The recurrence on query-last tables; returns row pieces of f32[n, Q] in table order.

  Per subset E = p ∪ {c} of size k, with e = exp(ℓ_b − ℓ_c), b = max p:
    S0(E) = 1 + e·S0(p),  S1(E) = ℓ_c + e·S1(p)          (softmax sums relative to ℓ_c)
    D_m(E) = Σ_{i∈p} G_m[i, c] = D_m(p' ∪ {c}) + G_m[b, c]
    P_m(E) = Σ_{pairs ⊆ E} G_m = P_m(p) + D_m(E)          (for every m ≥ k still needed)
    F(E) = P_k(E) + S1(E) / S0(E).
  """
  big_m = table.max_size
  levels = _colex_levels(table.k_pool, big_m)
  sizes = [table.offsets[m] - table.offsets[m - 1] for m in range(1, big_m + 1)]
  pieces = []
  prev = _Level(jnp.ones_like(t.ell), t.ell, {}, {})
  for k, ranges in enumerate(_row_pieces(sizes), start=1):
    if k == 1:
      pieces += [t.ell[lo:hi] for lo, hi in ranges]
      continue
    lv = levels[k - 2]
    for lo, hi in ranges:
      out = _colex_step(t, prev, lv.rows(lo, hi), k, k)
      pieces.append(out.pair_sums[k] + out.s1 / out.s0)
    if k < big_m:
      prev = _colex_step(t, prev, lv, k, big_m)
  return pieces


# ---------------------------------------------------------------------------------------------
# Direct gathers.


@functools.lru_cache(maxsize=32)
def _gather_indices(k_pool: int, max_size: int) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
  """Per size m ≥ 2: the K×K-table rows of each subset's pairs (a·K + b, a < b) and of its
  members against its largest element (i·K + c, i < c)."""
  table = subset_table(k_pool, max_size)
  out = []
  for m in range(2, max_size + 1):
    mem = table.members[table.offsets[m - 1]:table.offsets[m], :m].astype(np.int32)
    a, b = np.triu_indices(m, 1)
    out.append((mem[:, a] * k_pool + mem[:, b], mem[:, :-1] * k_pool + mem[:, -1:]))
  return tuple(out)


def _gather_query_last(t: Tables, table: SubsetTable) -> list[jax.Array]:
  """Direct gathers on query-last tables; returns row pieces of f32[n, Q] in table order."""
  k = table.k_pool
  weighted = t.expo * jnp.repeat(t.ell, k, axis=0)                       # e_ic ℓ_i at i·K + c
  sizes = [table.offsets[m] - table.offsets[m - 1] for m in range(1, table.max_size + 1)]
  ranges = _row_pieces(sizes)
  pieces = [t.ell[lo:hi] for lo, hi in ranges[0]]
  for m, (pair_rows, member_rows) in enumerate(_gather_indices(k, table.max_size), start=2):
    for lo, hi in ranges[m - 1]:
      pr, mr = pair_rows[lo:hi], member_rows[lo:hi]
      # Separate gathers summed elementwise fuse into one loop; a [rows, C(m,2), Q] gather
      # followed by a reduction would be written to memory first.
      f_set = sum(t.pairs[m - 2][pr[:, j]] for j in range(pr.shape[1]))
      num = t.ell[mr[:, 0] % k] + sum(weighted[mr[:, j]] for j in range(m - 1))
      den = 1.0 + sum(t.expo[mr[:, j]] for j in range(m - 1))
      pieces.append(f_set + num / den)
  return pieces


# ---------------------------------------------------------------------------------------------
# Best set only.

# Rows per reduction block of enumeration.best_subset (see best_rows).
_BEST_BLOCK = 128


def best_rows(logits: jax.Array, pairs: jax.Array, table: SubsetTable,
              method: str) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(best score f32[Q], its first table row int32[Q], positions int32[Q, K]) for one chunk.

  XLA:CPU vectorises a plain max over the major axis of a materialised array, but not an
  argmax (a variadic reduce), nor a reduce fused with the scoring gathers (~10-50x slower,
  measured), and a second full pass for the first row of the max (a select and an integer
  min) cost as much as half the scoring. So the chunk's scores are written subset-major into
  a buffer padded with −inf to whole blocks of _BEST_BLOCK rows (no copy: the scoring loops
  write into it), reduced by a plain max per block (f32[n / 128, Q]), and only the first
  block holding each query's maximum is searched for its first row (a [128, Q] gather).
  Measured (K_pool = 20, M = 5, chunk of 64, 2-core EPYC, one run): scoring alone 2.0 ms,
  this 2.4 ms, a max + first-row pass 2.3-2.7 ms more than scoring, the former unpadded
  block reduction with a minor-axis gather 3.9 ms.
  """
  t = sorted_tables(logits, pairs)
  n, q = len(table), logits.shape[0]
  nb = -(-n // _BEST_BLOCK)
  blocks = subset_major(t, table, method, nb * _BEST_BLOCK, -jnp.inf)
  blocks = blocks.reshape(nb, _BEST_BLOCK, q)
  block_max = jnp.max(blocks, axis=1)                                    # [nb, Q]
  block = jnp.argmax(block_max, axis=0)                                  # first block with it
  inside = jnp.take_along_axis(blocks, block[None, None, :], axis=0)[0]  # [block, Q]
  row = block * _BEST_BLOCK + jnp.argmax(inside, axis=0)
  # NaN scores could point past the table; clamp so the row still indexes it.
  return jnp.max(block_max, axis=0), jnp.minimum(row, n - 1).astype(jnp.int32), t.order
