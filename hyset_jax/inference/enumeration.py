"""Exhaustive scoring of every subset E ⊆ S, 1 ≤ |E| ≤ M, of a K-tool shortlist (paper Eq. 14).

Subsets are listed once per (K, M) in a static table, by size and within a size in colex order
(:class:`hyset_jax.inference.subsets.SubsetTable`, which also holds the results' types).

Six implementations of the same function, measured against each other in ``benchmarks/``
(their names: :data:`hyset_jax.choices.ENUMERATION_METHODS`):

- :func:`score_subsets_gather` — the default: gathers each subset's members and pairs from
  per-query tables and sums them, C(m, 2) + 2m − 2 terms per m-subset.
- :func:`score_subsets_colex` — the level recurrence: a k-subset E = p ∪ {c} (c its largest
  element) is scored from its parent p and one sibling, a few operations per subset.
- :func:`score_subsets_matmul` — the incidence-matmul form: F_align = (A·(wℓ)) / (A·w) and
  F_set = A_pairs,m · g_m, one matmul per size and quantity (f32, or bf16 operands).
- :func:`score_subsets_native` — a native CPU kernel called through the XLA FFI
  (:mod:`hyset_jax.inference.native`): a depth-first walk over the subsets with queries on the
  vector lanes and its state in L1, spread over XLA's thread pool. CPU backend only; not
  differentiable.
- :func:`score_subsets_pallas` — a Pallas kernel for GPU/TPU
  (:mod:`hyset_jax.inference.pallas_stage2`; interpret mode on a CPU): the gather form's
  arithmetic walked on chip, the best set kept there. Not differentiable.

The gather and colex forms' arithmetic lives in :mod:`hyset_jax.inference.gather_colex`; this
module chunks their queries, lays out their outputs, and dispatches between the six.

``method="auto"`` (the default of :func:`best_subset` and :func:`score_subsets`) is resolved
by :func:`resolve_method` when the program is traced: the native kernel where it can run, the
Pallas kernel on GPU/TPU, the gather form elsewhere.

All take the per-query shortlist quantities ℓ (f32[Q, K]) and the pair matrices
G_m = Z_S M_m Z_Sᵀ (f32[Q, M−1, K, K]) and return :class:`subsets.SubsetScores`; each is jitted (the
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
:data:`BEST_CHUNK`, each chunk's scores stay subset-major (f32[n, chunk], ~5.5 MB,
cache-sized) and are reduced by block maxima and a search of one block (see
:func:`gather_colex.best_rows` for why this form on XLA:CPU).

Tie-breaking: :func:`subsets.best_sets` and :func:`best_subset` take the first maximum in table
order, i.e. the smallest set wins an exact tie between sizes; within a size, ties resolve by
the colex order of the positions each implementation reports (ascending-ℓ order for gather,
colex, native and pallas, shortlist order for matmul). Exact ties between distinct sets need
exactly equal floating-point scores.
"""
from __future__ import annotations

import functools
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from hyset_jax import choices
from hyset_jax.inference import gather_colex
from hyset_jax.inference.subsets import (BestSets, SubsetScores, SubsetTable, best_sets,
                                         check_inputs, incidence)

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


# ---------------------------------------------------------------------------------------------
# The gather and colex forms (their arithmetic: hyset_jax.inference.gather_colex).
#
# The API returns [Q, n]. A transpose of the scoring loops' output would be fused into them
# (computing in transposed order, ~10x slower), so each query chunk's scores are written
# subset-major into one buffer (in-place updates) and transposed as a separate copy while the
# chunk is in cache (:func:`_scores_query_major`).

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
    t = gather_colex.sorted_tables(lg, pr)
    return gather_colex.subset_major(t, table, method).T, t.order
  return SubsetScores(*map_query_chunks(one, SCORES_CHUNK, logits, pairs))


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
  check_inputs(logits, pairs, table)
  return _scores_query_major(logits, pairs, table, "colex")


@functools.partial(jax.jit, static_argnums=2)
def score_subsets_gather(logits: jax.Array, pairs: jax.Array, table: SubsetTable) -> SubsetScores:
  """Score every subset by gathering its members' softmax terms and its pair scores.

  F(E) = Σ_{a<b ∈ E} G_m[a, b] + (ℓ_c + Σ_{i∈E, i≠c} e_ic ℓ_i) / (1 + Σ_{i≠c} e_ic), with c the
  member of largest ℓ and e_ic = exp(ℓ_i − ℓ_c) ≤ 1.

  Args and returns as :func:`score_subsets_colex`.
  """
  check_inputs(logits, pairs, table)
  return _scores_query_major(logits, pairs, table, "gather")


# ---------------------------------------------------------------------------------------------
# Incidence matmuls.


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
  check_inputs(logits, pairs, table)
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
  for m, (a, ap) in enumerate(incidence(k, table.max_size), start=1):
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
  check_inputs(logits, pairs, table)
  t = gather_colex.sorted_tables(logits, pairs)
  return gather_colex.subset_major(t, table, method), t.order


@functools.partial(jax.jit, static_argnums=2)
def score_subsets_native(logits: jax.Array, pairs: jax.Array, table: SubsetTable) -> SubsetScores:
  """Score every subset with the native CPU kernel (:mod:`hyset_jax.inference.native`): the colex
  recurrence, 16 queries per vector, over XLA's thread pool.

  Args and returns as :func:`score_subsets_colex` (positions give the ascending-ℓ reordering).
  """
  from hyset_jax.inference import native
  check_inputs(logits, pairs, table)
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


# ---------------------------------------------------------------------------------------------
# Best set only.

# Queries per chunk of best_subset: the chunk's subset-major scores (f32[n, 64], 5.5 MB at
# K_pool = 20, M = 5) and tables stay in cache. Measured (2-core EPYC, batch 1024): chunks of
# 64 run ~3x faster than 32 or 128 and ~8x faster than one unchunked call.
BEST_CHUNK = 64


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
  check_inputs(logits, pairs, table)
  if method == "native":
    from hyset_jax.inference import native
    best, rows, order = native.best_rows(logits, pairs)
  elif method == "pallas":
    from hyset_jax.inference import pallas_stage2
    best, rows, order = pallas_stage2.best_rows(logits, pairs, table)
  elif method in ("gather", "colex"):
    best, rows, order = map_query_chunks(
        lambda lg, pr: gather_colex.best_rows(lg, pr, table, method), BEST_CHUNK, logits, pairs)
  else:
    return best_sets(SCORERS[method](logits, pairs, table), table, k=1)
  members = jnp.asarray(table.members)[rows]                             # [Q, M]
  mask = jnp.asarray(table.mask)[rows]
  positions = jnp.take_along_axis(order, members, axis=1)
  return BestSets(jnp.where(mask, positions, 0)[:, None], mask[:, None], best[:, None])
