"""Exhaustive scoring of every subset E ⊆ S, 1 ≤ |E| ≤ M, of a K-tool shortlist (paper Eq. 14).

Subsets are listed once per (K, M) in a static :class:`SubsetTable`: by size ascending, and within
a size in *colex* order (ordered by the largest element, then the next largest, …). The colex
rank of {s_1 < … < s_k} is Σ_j C(s_j, j), so the row of any subset, and of the subsets it is
built from, is known when the table is built (docs/speed.md).

Six implementations of the same function, measured against each other in ``benchmarks/``
(their names: :data:`hyset_jax.choices.ENUMERATION_METHODS`):

- :func:`score_subsets_gather` — the default: gathers each subset's members and pairs from
  per-query tables and sums them, C(m, 2) + 2m − 2 terms per m-subset.
- :func:`score_subsets_colex` — the level recurrence: a k-subset E = p ∪ {c} (c its largest
  element) is scored from its parent p and one sibling, a few operations per subset.
- :func:`score_subsets_matmul` — the incidence-matmul form: F_align = (A·(wℓ)) / (A·w) and
  F_set = A_pairs,m · g_m, one matmul per size and quantity (f32, or bf16 operands).
- :func:`score_subsets_native` — a native CPU kernel called through the XLA FFI
  (:mod:`hyset_jax.inference.native`): a depth-first walk over the subsets with queries on the vector
  lanes and its state in L1, spread over XLA's thread pool. CPU backend only; not
  differentiable.
- :func:`score_subsets_pallas` — a Pallas kernel for GPU/TPU (:mod:`hyset_jax.inference.pallas_stage2`;
  interpret mode on a CPU): the gather form's arithmetic walked on chip, the best set kept
  there. Not differentiable.

``method="auto"`` (the default of :func:`best_subset` and :func:`score_subsets`) is resolved
by :func:`resolve_method` when the program is traced: the native kernel where it can run, the
Pallas kernel on GPU/TPU, the gather form elsewhere.

All take the per-query shortlist quantities ℓ (f32[Q, K]) and the pair matrices
G_m = Z_S M_m Z_Sᵀ (f32[Q, M−1, K, K]) and return :class:`SubsetScores`; each is jitted (the
table is a static argument) and compiles in about a second at K = 20, M = 5.

Why gather is the JAX form "auto" falls back to (K_pool = 20, M = 5, XLA:CPU,
benchmarks/results/speed.md): it is exact for any logit range, fastest at batches ≤ 64 and
≥ 1024, needs no O(C(K,2)·C(K,M)) constants (so it runs at K = 30), and on XLA:CPU the colex
recurrence loses its operation-count advantage (XLA recomputes or spills the shared levels,
which is what the native kernel avoids). On GPU/TPU re-measure with ``hyset bench
enumerate``: the matmul forms suit tensor cores and MXUs.

Numerics: the gather and colex forms reorder the shortlist by ascending ℓ (``positions``
records the order), so a subset's largest position also holds its largest logit c, and its
softmax sums are kept relative to ℓ_c: every weight is exp(ℓ_i − ℓ_c) ≤ 1 and the largest is
exactly 1. Exact for any logit range. The matmul form shifts by the query's largest shortlist
logit instead (one shift per query is what makes it a matmul); it is exact while every set's
largest logit is within ~80 of it (f32 exp underflows below −87), which holds for cosine-scale
logits; a set entirely below that range gets its largest member's logit as F_align.

Two outputs (:data:`hyset_jax.choices.STAGE2_OUTPUTS`): ``scores`` (:func:`score_subsets`,
every subset's F as f32[Q, n]) and ``best`` (:func:`best_subset`, the argmax per query, what
predict runs). ``best`` never writes [Q, n]: queries are scored in chunks of
:data:`BEST_CHUNK`, each chunk's scores stay subset-major (f32[n, chunk], ~5.5 MB, cache-sized) and
are reduced by block maxima and a search of one block (see :func:`_best_rows_query_last` for
why this form on XLA:CPU).

Tie-breaking: :func:`best_sets` and :func:`best_subset` take the first maximum in table order, i.e. the smallest set
wins an exact tie between sizes; within a size, ties resolve by the colex order of the positions
each implementation reports (ascending-ℓ order for gather, colex, native and pallas, shortlist
order for matmul). Exact ties between distinct sets need exactly equal floating-point scores.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hyset_jax import choices
from hyset_jax.errors import UserError

Method = choices.MethodChoice
DEFAULT_METHOD: Method = choices.DEFAULT_METHOD


def resolve_method(method: Method, k_pool: int | None = None, max_size: int | None = None,
                   all_scores: bool = False) -> choices.EnumerationMethod:
  """The implementation ``method`` names: ``"auto"`` is ``"native"`` where the native kernel
  can run (CPU backend, kernel built, and the shortlist of ``k_pool`` tools and sets of up to
  ``max_size`` within its limits, when given), ``"pallas"`` on GPU/TPU (within its limits) and
  :data:`choices.PORTABLE_METHOD` elsewhere;
  an explicit ``"native"`` that cannot run is a UserError saying why."""
  choices.check("enumeration method", method, choices.METHOD_CHOICES)
  from hyset_jax.inference import native
  if method == "auto":
    fits = k_pool is None or native.fits(k_pool, max_size or 2, all_scores)
    if fits and native.available():
      return "native"
    from hyset_jax.inference import pallas_stage2
    if (pallas_stage2.platform() != "interpret"
        and (k_pool is None or pallas_stage2.fits(k_pool, max_size or 2))):
      return "pallas"
    return choices.PORTABLE_METHOD
  if method == "native":
    native.require()
  return method


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


def _check_inputs(logits: jax.Array, pairs: jax.Array, table: SubsetTable) -> None:
  q, k = logits.shape
  if k != table.k_pool or pairs.shape != (q, table.max_size - 1, k, k):
    raise ValueError(
        f"expected logits [Q, {table.k_pool}] and pairs [Q, {table.max_size - 1}, "
        f"{table.k_pool}, {table.k_pool}], got {logits.shape} and {pairs.shape}")


# ---------------------------------------------------------------------------------------------
# Query-last tables and output assembly, shared by the gather and colex forms.
#
# How XLA:CPU treats these programs decides their speed more than the arithmetic does, so the
# structure below is deliberate (measurements in benchmarks/README.md):
# - Scores are computed with queries on the minor axis ([rows, Q]): every static-index gather
#   then moves a contiguous run of queries and vectorises; along the minor axis it would be
#   scalar loads (~10x slower).
# - XLA fuses each block of subsets into one loop that reads the per-query tables. The loop
#   vectorises only if the tables are physically query-last, which layout assignment
#   guarantees only for the output of an op XLA will not fuse into its consumers: a gather
#   (expensive, and its consumers reuse elements). So the tables are built by gathers whose
#   output already has queries last; a transpose there would be fused in as a strided read.
# - The API returns [Q, n]. A transpose of the scoring loops' output would be fused into them
#   too (computing in transposed order, ~10x slower). So each query chunk's scores are written
#   subset-major into one buffer (in-place updates) and transposed as a separate copy while
#   the chunk is in cache (:func:`_scores_query_major`).


class _Tables(NamedTuple):
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


def _sorted_tables(logits: jax.Array, pairs: jax.Array) -> _Tables:
  q, k = logits.shape
  order = jnp.argsort(logits, axis=1, stable=True).astype(jnp.int32)
  queries = jnp.arange(q)
  order_t = order.T                                                      # [K, Q]
  ell = logits[queries[None, :], order_t]                                # [K, Q]
  flat = (order_t[:, None, :] * k + order_t[None, :, :]).reshape(k * k, q)
  sizes = jnp.arange(pairs.shape[1])[:, None, None]
  g = pairs.reshape(q, -1, k * k)[queries[None, None, :], sizes, flat[None]]  # [M−1, K·K, Q]
  expo = jnp.exp(jnp.minimum(ell[:, None, :] - ell[None, :, :], 0.0))   # [K, K, Q]
  return _Tables(order, ell, expo.reshape(k * k, q), g)


# Rows per scoring loop: each piece is one fusion writing its rows into the subset-major buffer.
_PIECE_ROWS = 2048


def _row_pieces(sizes: list[int]) -> list[list[tuple[int, int]]]:
  """Row ranges splitting blocks of the given sizes into pieces of at most _PIECE_ROWS."""
  counts = [max(1, -(-n // _PIECE_ROWS)) for n in sizes]
  return [[(n * i // c, n * (i + 1) // c) for i in range(c)] for n, c in zip(sizes, counts)]


# Queries per chunk of the ``scores`` output: each chunk is scored subset-major (f32[n, 16],
# 1.4 MB at K_pool = 20, M = 5) and transposed while it is in cache. Measured (2-core EPYC,
# batch 1024, same run): 137 ms per batch against 316 ms for one transpose of the whole
# f32[n, 1024] (89 MB, out of cache); chunks of 32 / 64 / 128 took 146 / 157 / 205 ms.
SCORES_CHUNK = 16


def map_query_chunks(fn, chunk: int, *arrays: jax.Array):
  """``fn(*arrays)`` over query chunks of ``chunk`` rows (``lax.map``; a remainder is one
  smaller chunk), the outputs concatenated along queries.

  For work whose working set must stay in cache: every array and every output of ``fn`` has
  queries on its leading axis. A symbolic batch (jax.export's "q") cannot be split at trace
  time: it is one chunk.
  """
  q = arrays[0].shape[0]
  full = q // chunk if isinstance(q, int) and q > chunk else 0
  if not full:
    return fn(*arrays)
  n = full * chunk
  out = jax.lax.map(lambda a: fn(*a), tuple(x[:n].reshape(full, chunk, *x.shape[1:])
                                            for x in arrays))
  parts = [jax.tree.map(lambda x: x.reshape(n, *x.shape[2:]), out)]
  if q > n:
    parts.append(fn(*(x[n:] for x in arrays)))
  return jax.tree.map(lambda *x: jnp.concatenate(x), *parts)


def _scores_query_major(logits: jax.Array, pairs: jax.Array, table: SubsetTable,
                        method: str) -> SubsetScores:
  """The gather or colex scores as f32[Q, n], transposed chunk by chunk (:data:`SCORES_CHUNK`).

  A transpose fused into the scoring loops would compute in transposed order (~10x slower),
  so each chunk's scores are first written subset-major (one buffer) and then transposed as
  a separate copy.
  """
  def one(lg, pr):
    t = _sorted_tables(lg, pr)
    return _subset_major(t, table, method).T, t.order
  return SubsetScores(*map_query_chunks(one, SCORES_CHUNK, logits, pairs))


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


def _colex_step(t: _Tables, prev: _Level, lv: _ColexLevel, k: int, big_m: int) -> _Level:
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


def _colex_query_last(t: _Tables, table: SubsetTable) -> list[jax.Array]:
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


@functools.partial(jax.jit, static_argnums=2)
def score_subsets_colex(logits: jax.Array, pairs: jax.Array, table: SubsetTable) -> SubsetScores:
  """Score every subset with the colex level recurrence (a few operations per subset).

  Args:
    logits: f32[Q, K] ℓ of the shortlist tools.
    pairs: f32[Q, M−1, K, K] pair matrices G_m (see :func:`scoring.pair_matrices`).
    table: the subset table for (K, M).

  Returns:
    SubsetScores; positions give the ascending-ℓ reordering.
  """
  _check_inputs(logits, pairs, table)
  return _scores_query_major(logits, pairs, table, "colex")


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


def _gather_query_last(t: _Tables, table: SubsetTable) -> list[jax.Array]:
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


@functools.partial(jax.jit, static_argnums=2)
def score_subsets_gather(logits: jax.Array, pairs: jax.Array, table: SubsetTable) -> SubsetScores:
  """Score every subset by gathering its members' softmax terms and its pair scores.

  F(E) = Σ_{a<b ∈ E} G_m[a, b] + (ℓ_c + Σ_{i∈E, i≠c} e_ic ℓ_i) / (1 + Σ_{i≠c} e_ic), with c the
  member of largest ℓ and e_ic = exp(ℓ_i − ℓ_c) ≤ 1.

  Args and returns as :func:`score_subsets_colex`.
  """
  _check_inputs(logits, pairs, table)
  return _scores_query_major(logits, pairs, table, "gather")


# ---------------------------------------------------------------------------------------------
# Incidence matmuls.


@functools.lru_cache(maxsize=32)
def _incidence(k_pool: int, max_size: int) -> tuple[tuple[np.ndarray, np.ndarray | None], ...]:
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


@functools.partial(jax.jit, static_argnums=(2, 3))
def score_subsets_matmul(logits: jax.Array, pairs: jax.Array, table: SubsetTable,
                         operand_dtype=jnp.float32) -> SubsetScores:
  """Score every subset with incidence matmuls (docs/speed.md), queries as matmul rows.

  F_align = (wℓ · A_m) / (w · A_m) with w = exp(ℓ − max ℓ) per query, F_set = g_m · A_pairs,m
  with g_m the upper triangle of G_m. The output is query-major as the matmuls write it.

  Args:
    logits, pairs, table: as :func:`score_subsets_colex`.
    operand_dtype: dtype of the matmul operands (the 0/1 incidence matrices are exact in any
      float type); results are f32 (bf16 on XLA:CPU, which lacks the mixed dot). bf16
      operands round w, wℓ and g_m to 8 significant bits.

  Returns:
    SubsetScores with identity positions.
  """
  _check_inputs(logits, pairs, table)
  q, k = logits.shape
  # XLA:CPU has no bf16 × bf16 → f32 dot; there the product is rounded to bf16 as well.
  acc = (jnp.float32 if operand_dtype == jnp.float32 or jax.default_backend() != "cpu"
         else operand_dtype)
  dot = functools.partial(jnp.dot, preferred_element_type=acc)
  top = jnp.max(logits, axis=1, keepdims=True)
  w = jnp.exp(logits - top)
  iu = np.triu_indices(k, 1)
  lhs_align = jnp.concatenate([w, w * logits], axis=0).astype(operand_dtype)   # [2Q, K]
  blocks = []
  for m, (a, ap) in enumerate(_incidence(k, table.max_size), start=1):
    if m == 1:
      blocks.append(logits)
      continue
    sums = dot(lhs_align, jnp.asarray(a, operand_dtype)).astype(jnp.float32)   # [2Q, n_m]
    den, num = sums[:q], sums[q:]
    g = pairs[:, m - 2][:, iu[0], iu[1]].astype(operand_dtype)                 # [Q, C(K,2)]
    f_set = dot(g, jnp.asarray(ap, operand_dtype)).astype(jnp.float32)
    # A set far below the query's top logit underflows to 0/0; its F_align is then its
    # largest member's logit (the limit of the softmax average).
    fallback = logits[:, table.members[table.offsets[m - 1]:table.offsets[m], m - 1]]
    blocks.append(f_set + jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), fallback))
  positions = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), (q, k))
  return SubsetScores(jnp.concatenate(blocks, axis=1), positions)


def score_subsets_matmul_bf16(logits: jax.Array, pairs: jax.Array,
                              table: SubsetTable) -> SubsetScores:
  """:func:`score_subsets_matmul` with bf16 operands and f32 accumulation (approximate:
  scores within ~1e-2 relative; for MXUs and tensor cores)."""
  return score_subsets_matmul(logits, pairs, table, operand_dtype=jnp.bfloat16)


@functools.partial(jax.jit, static_argnums=(2, 3))
def score_subsets_subset_major(logits: jax.Array, pairs: jax.Array, table: SubsetTable,
                               method: Literal["colex", "gather"] = "gather"
                               ) -> tuple[jax.Array, jax.Array]:
  """The gather or colex scores before the final transpose: (f32[n, Q], positions int32[Q, K]).

  The same numbers as ``score_subsets(...).scores.T``. On XLA:CPU the transpose to [Q, n]
  costs more than scoring (benchmarks/README.md), so a consumer that can read subset-major
  scores (a reduction over subsets, say) should use this.
  """
  _check_inputs(logits, pairs, table)
  t = _sorted_tables(logits, pairs)
  return _subset_major(t, table, method), t.order


def _subset_major(t: _Tables, table: SubsetTable, method: str, rows: int | None = None,
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


@functools.partial(jax.jit, static_argnums=2)
def score_subsets_native(logits: jax.Array, pairs: jax.Array, table: SubsetTable) -> SubsetScores:
  """Score every subset with the native CPU kernel (:mod:`hyset_jax.inference.native`): the colex
  recurrence, 16 queries per vector, over XLA's thread pool.

  Args and returns as :func:`score_subsets_colex` (positions give the ascending-ℓ reordering).
  """
  from hyset_jax.inference import native
  _check_inputs(logits, pairs, table)
  return SubsetScores(*native.subset_scores(logits, pairs, len(table)))


def score_subsets_pallas(logits: jax.Array, pairs: jax.Array, table: SubsetTable
                         ) -> SubsetScores:
  """Score every subset with the Pallas kernel (:mod:`hyset_jax.inference.pallas_stage2`; GPU/TPU,
  interpret mode on a CPU). Args and returns as :func:`score_subsets_colex`."""
  from hyset_jax.inference import pallas_stage2
  return pallas_stage2.score_subsets(logits, pairs, table)


SCORERS = {
    "gather": score_subsets_gather,
    "colex": score_subsets_colex,
    "matmul": score_subsets_matmul,
    "matmul_bf16": score_subsets_matmul_bf16,
    "native": score_subsets_native,
    "pallas": score_subsets_pallas,
}


# Keyed by the names in hyset_jax.choices (the one list of method names).
assert tuple(SCORERS) == choices.ENUMERATION_METHODS, "SCORERS and choices disagree"


def score_subsets(logits: jax.Array, pairs: jax.Array, table: SubsetTable,
                  method: Method = DEFAULT_METHOD) -> SubsetScores:
  """Dispatch to one implementation by name (see :data:`SCORERS`; ``"auto"``:
  :func:`resolve_method`)."""
  return SCORERS[resolve_method(method, table.k_pool, table.max_size, True)](logits, pairs, table)


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


# ---------------------------------------------------------------------------------------------
# Best set only.

# Queries per chunk of best_subset: the chunk's subset-major scores (f32[n, 64], 5.5 MB at
# K_pool = 20, M = 5) and tables stay in cache. Measured (2-core EPYC, batch 1024): chunks of
# 64 run ~3x faster than 32 or 128 and ~8x faster than one unchunked call.
BEST_CHUNK = 64
# Rows per reduction block of best_subset (see _best_rows_query_last).
_BEST_BLOCK = 128


def _best_rows_query_last(logits: jax.Array, pairs: jax.Array, table: SubsetTable,
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
  t = _sorted_tables(logits, pairs)
  n, q = len(table), logits.shape[0]
  nb = -(-n // _BEST_BLOCK)
  blocks = _subset_major(t, table, method, nb * _BEST_BLOCK, -jnp.inf)
  blocks = blocks.reshape(nb, _BEST_BLOCK, q)
  block_max = jnp.max(blocks, axis=1)                                    # [nb, Q]
  block = jnp.argmax(block_max, axis=0)                                  # first block with it
  inside = jnp.take_along_axis(blocks, block[None, None, :], axis=0)[0]  # [block, Q]
  row = block * _BEST_BLOCK + jnp.argmax(inside, axis=0)
  # NaN scores could point past the table; clamp so the row still indexes it.
  return jnp.max(block_max, axis=0), jnp.minimum(row, n - 1).astype(jnp.int32), t.order


@functools.partial(jax.jit, static_argnums=(2, 3))
def best_subset(logits: jax.Array, pairs: jax.Array, table: SubsetTable,
                method: Method = DEFAULT_METHOD) -> BestSets:
  """The best subset per query, ``best_sets(score_subsets(...), table, 1)`` without [Q, n].

  Same sets, scores and ties (the first maximum in table order of the reported positions).
  The native kernel keeps a running best per query while it scores; the gather and colex forms
  score queries in chunks of :data:`BEST_CHUNK` (``lax.map``; a remainder is scored as one
  smaller chunk) and reduce each chunk's subset-major scores; the matmul forms reduce their
  [Q, n] scores (their GEMMs write them anyway).

  Args:
    logits: f32[Q, K]; pairs: f32[Q, M−1, K, K]; table: as :func:`score_subsets_colex`.
    method: the enumeration implementation (``"auto"``: :func:`resolve_method`).

  Returns:
    BestSets with k = 1.
  """
  method = resolve_method(method, table.k_pool, table.max_size)
  _check_inputs(logits, pairs, table)
  if method == "native":
    from hyset_jax.inference import native
    best, rows, order = native.best_rows(logits, pairs)
  elif method == "pallas":
    from hyset_jax.inference import pallas_stage2
    best, rows, order = pallas_stage2.best_rows(logits, pairs, table)
  elif method in ("gather", "colex"):
    best, rows, order = map_query_chunks(
        lambda lg, pr: _best_rows_query_last(lg, pr, table, method), BEST_CHUNK, logits, pairs)
  else:
    return best_sets(SCORERS[method](logits, pairs, table), table, k=1)
  members = jnp.asarray(table.members)[rows]                             # [Q, M]
  mask = jnp.asarray(table.mask)[rows]
  positions = jnp.take_along_axis(order, members, axis=1)
  return BestSets(jnp.where(mask, positions, 0)[:, None], mask[:, None], best[:, None])


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
