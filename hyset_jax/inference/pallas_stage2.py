"""Stage 2 (paper Eq. 14) as a Pallas kernel for GPU and TPU: every subset E ⊆ S, 1 ≤ |E| ≤ M,
of each query's K-tool shortlist scored on chip, the best set per query or every score.

Two entry points, the two stage-2 outputs of :mod:`hyset_jax.inference.enumeration`:

- :func:`best_rows` — the best subset per query. A running best (score and table row) is kept
  in registers while the subsets are walked; only f32[Q] and int32[Q] leave the chip, never
  the f32[Q, n] score matrix (n = 21,699 at K = 20, M = 5).
- :func:`score_subsets` — every subset's F, f32[Q, n] in table order.

Same answers as the gather form (:func:`enumeration.score_subsets_gather`), ties included:
the shortlist is reordered by ascending ℓ with the same stable sort, and each subset's F is
computed with the gather form's operations in its order — f_set as a left fold over the
pairs (a, b), a < b, in ``np.triu_indices`` order; num = ℓ_c + Σ_j e_jc·ℓ_j and
den = 1 + Σ_j e_jc over the members j below the largest c, each sum folded from the smallest
member; F = f_set + num / den — so on XLA:CPU (interpret mode) the scores are bit for bit the
gather form's, and the best set is the first maximum in table order (the smallest set wins an
exact tie between sizes; within a size the first in colex order of the ascending-ℓ positions).
A NaN score wins, the first one in table order, as ``jnp.argmax``. On a GPU, the compiler may
contract a multiply and an add into one FMA (ptxas does by default), so scores may differ from
XLA's by an ulp and a near-tie within an ulp may resolve differently; exact ties built from
equal inputs (equal logits, zero pair scores) stay ties.

Design (why these blocks):

- Layout: queries on the lanes. Each table row is one tile of a query block, f32[S, 128] with
  S·128 queries (S = 8 on TPU: one full (8, 128) vreg per row; S = 1 on GPU: 128 queries per
  program, one per thread of 4 warps). A subset's terms are rows of per-query tables indexed by
  scalars (dynamic indices on the leading, untiled axis only, which Mosaic and Triton both
  lower), so scoring a subset is a few whole-vector loads and adds for S·128 queries at once;
  no gather with vector indices, no matmul.
- Tables (built once per batch outside the kernel, ~6 KB per query at K = 20, M = 5): ℓ in
  ascending order f32[K, …]; e_ac = exp(min(ℓ_a − ℓ_c, 0)) and e_ac·ℓ_a for a < c, and
  G_m permuted to that order for a < c, f32[T, …] and f32[M − 1, T, …], T = K(K − 1)/2 rows (the
  upper triangle only: half the on-chip memory of the gather form's K·K tables). On TPU the
  query block's tables are 4.6 MB at K = 20, M = 5, S = 8; double-buffered they fit the
  default 16 MiB of scoped VMEM (S is halved for larger shortlists, and the VMEM limit raised
  to what the blocks need).
- Best set: one program per query block walks every subset in table order — sizes ascending,
  colex within a size — as nested loops from the largest member down (the loop order *is*
  colex order), so each member's rows are loaded once in its own loop, outside the loops below
  it; the innermost loop loads M + 1 rows per subset. A strict > keeps the first maximum; the
  table row is a scalar counter. Grid: query blocks only ("parallel": the TPU's cores or the
  GPU's SMs split them).
- Every score: the output block is R subset rows × the query block (R = 512 on a device:
  2 MB on TPU), so the grid is (query blocks, row chunks), each chunk within one size; a
  chunk starts from its first subset (a small int32 table, scalar-prefetched into SMEM on
  TPU) and steps to the next in colex order with scalar arithmetic. The kernel writes
  subset-major tiles; one XLA transpose outside makes the API's [Q, n] (the gather form
  transposes too). The tables' block index does not change along the chunk axis, so they
  are copied into VMEM once per query block.
- Platform: chosen when the program is traced (:func:`platform`): Mosaic on TPU, Triton on
  GPU, and Pallas interpret mode on the CPU backend (the kernel body run as XLA ops: how the
  tests check it; the native kernel, not this, is what ``auto`` runs on a CPU).

- Several devices: Mosaic kernels cannot be partitioned automatically, so when the inputs
  are traced over a mesh of more than one device (a context mesh, or the mesh their
  ``NamedSharding`` names) the call is wrapped in a ``jax.shard_map`` over the query axis
  (:func:`_per_device`): each device runs the kernel on its block of queries, split over the
  mesh axes whose sizes divide the batch (``data``, then ``tools``: stage 2 reads no
  per-tool array), or on the whole batch, replicated, where none divides. One device: the
  call as it is. Queries are independent, so the answers do not depend on the split.

Not differentiable (like the native kernel); training's enumeration uses the gather form.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.sharding import PartitionSpec

from hyset_jax.inference import subsets

LANES = 128
# Subset rows per output block of the every-score kernel on a device (f32[R, S, 128]).
SCORES_ROWS = 512
# In interpret mode each grid step copies its blocks: larger chunks, fewer steps.
SCORES_ROWS_INTERPRET = 2048
# Scoped VMEM the TPU blocks may take, double-buffered, before S is halved.
VMEM_BUDGET_BYTES = 24 << 20
PLATFORMS = ("interpret", "tpu", "gpu")


def platform(backend: str | None = None) -> str:
  """Where the kernel runs for a JAX backend (default: the default backend): ``"tpu"``
  (Mosaic), ``"gpu"`` (Triton, CUDA or ROCm) or ``"interpret"`` (CPU and anything else)."""
  backend = backend or jax.default_backend()
  if backend == "tpu":
    return "tpu"
  if backend in ("gpu", "cuda", "rocm"):
    return "gpu"
  return "interpret"


def fits(k: int, max_size: int) -> bool:
  """Whether the kernel takes a shortlist of K tools and sets of up to M: int32 rows, and one
  query tile of the tables within the VMEM budget."""
  return (subsets.count_subsets(k, max_size) < 2 ** 31
          and 2 * _table_bytes(k, max_size, 1) <= VMEM_BUDGET_BYTES)


def _table_bytes(k: int, max_size: int, sublanes: int) -> int:
  """Bytes of one query block's tables: ℓ, e and e·ℓ, and G_m (f32, S·128 queries)."""
  t = k * (k - 1) // 2
  return 4 * sublanes * LANES * (k + 2 * t + (max_size - 1) * t)


def _sublanes(q: int, k: int, max_size: int, where: str, out_rows: int = 0) -> int:
  """S, the query block's sublanes (S·128 queries per program); see the module docstring."""
  if where == "gpu":
    return 1
  s = 8
  if where == "interpret":
    # As many as the batch needs: interpret mode pays per op, not per element.
    s = min(8, 1 << max(0, math.ceil(math.log2(max(1, -(-q // LANES))))))
  while s > 1 and 2 * (_table_bytes(k, max_size, s) + 4 * out_rows * s * LANES) \
      > VMEM_BUDGET_BYTES:
    s //= 2
  return s


def _compiler_params(where: str, semantics: tuple[str, ...], vmem_bytes: int):
  if where == "tpu":
    from jax.experimental.pallas import tpu as pltpu
    return pltpu.CompilerParams(dimension_semantics=semantics,
                                vmem_limit_bytes=max(32 << 20, vmem_bytes + (8 << 20)))
  if where == "gpu":
    from jax.experimental.pallas import triton as pltriton
    return pltriton.CompilerParams(num_warps=4, num_stages=1)
  return None


# ---------------------------------------------------------------------------------------------
# Several devices: one kernel call per device, over its queries.


def mesh_of(*arrays: jax.Array):
  """The mesh the arrays are traced over: the context mesh (``jax.set_mesh``) when there is
  one, else the mesh their shardings name (inputs placed with a ``NamedSharding`` carry it
  through every op computed from them); None for one device or none."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    for x in arrays:
      sharding = getattr(jax.typeof(x), "sharding", None)
      mesh = getattr(sharding, "mesh", None)
      if mesh is not None and not mesh.empty:
        break
  return None if mesh is None or mesh.empty or mesh.size == 1 else mesh


def batch_axes(mesh, q: int) -> tuple[str, ...]:
  """The mesh axes the queries are split over: the longest run of the mesh's axes of size > 1,
  in mesh order (``data`` before ``tools``), whose product divides Q. Stage 2 reads no
  per-tool array, so a ``tools`` axis splits the queries too; () leaves them replicated."""
  axes, n = [], 1
  for name, size in mesh.shape.items():
    if size == 1:
      continue
    if q % (n * size):
      break
    axes.append(name)
    n *= size
  return tuple(axes)


def _per_device(fn, logits: jax.Array, pairs: jax.Array):
  """``fn(logits, pairs)`` (outputs with queries leading), once per device on a mesh of
  several devices.

  Mosaic kernels cannot be partitioned automatically, so on a mesh the call is wrapped in a
  ``jax.shard_map``: each device runs the kernel on its block of queries (split over
  :func:`batch_axes`), or on all of them where Q does not divide (every device the same, the
  output replicated). One device, or no mesh: ``fn`` as it is. Queries are independent, so the
  answers are the same bits as one call over the whole batch.
  """
  mesh = mesh_of(logits, pairs)
  if mesh is None:
    return fn(logits, pairs)
  spec = PartitionSpec(batch_axes(mesh, logits.shape[0]) or None)
  return jax.shard_map(fn, mesh=mesh, in_specs=(spec, spec), out_specs=spec,
                       check_vma=False)(logits, pairs)


# ---------------------------------------------------------------------------------------------
# Tables.


@functools.lru_cache(maxsize=32)
def _triangle(k: int) -> tuple[np.ndarray, np.ndarray]:
  """(a, c) of the pairs a < c in row order: row(a, c) = c(c − 1)/2 + a (colex)."""
  c = np.concatenate([np.full(i, i, np.int32) for i in range(k)])
  a = np.concatenate([np.arange(i, dtype=np.int32) for i in range(k)])
  return a, c


def _tables(logits: jax.Array, pairs: jax.Array, q_pad: int):
  """Query-last tables in ascending-ℓ order, queries padded to ``q_pad`` (a multiple of 128).

  Returns:
    order int32[Q, K] (the stable ascending-ℓ order, as the gather form reports it),
    ell f32[K, Q'/128, 128], expo and wtd f32[T, Q'/128, 128] (e_ac and e_ac·ℓ_a, row
    c(c − 1)/2 + a), g f32[M − 1, T, Q'/128, 128] (G_m[order a, order c]).
  """
  q, k = logits.shape
  order = jnp.argsort(logits, axis=1, stable=True).astype(jnp.int32)
  ell = jnp.take_along_axis(logits, order, axis=1)                      # [Q, K]
  a, c = _triangle(k)
  ell_a, ell_c = ell[:, a], ell[:, c]                                   # [Q, T]
  # The gather form's expressions (gather_colex.sorted_tables, _gather_query_last), so the
  # same bits: exp(min(ℓ_a − ℓ_c, 0)) and its product with ℓ_a.
  expo = jnp.exp(jnp.minimum(ell_a - ell_c, 0.0))
  wtd = expo * ell_a
  flat = order[:, a] * k + order[:, c]                                  # [Q, T]
  g = jnp.take_along_axis(pairs.reshape(q, pairs.shape[1], k * k), flat[:, None, :], axis=2)

  def lanes(x):  # [Q, ...] → [..., Q'/128, 128]
    x = jnp.moveaxis(x, 0, -1)
    x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, q_pad - q)])
    return x.reshape(*x.shape[:-1], q_pad // LANES, LANES)
  return order, lanes(ell), lanes(expo), lanes(wtd), lanes(g)


# ---------------------------------------------------------------------------------------------
# The score of one subset, from its members' rows.


def _score(m: int, ell_c, expo, wtd, g):
  """F of an m-subset with the gather form's operations in its order.

  ell_c: ℓ of the largest member c; expo[j], wtd[j]: e_jc and e_jc·ℓ_j of member j < m − 1
  (ascending); g[a][b]: G_m between members a < b. Python's ``sum`` starts from 0, as the
  gather form's does.
  """
  if m == 1:
    return ell_c
  ia, ib = np.triu_indices(m, 1)
  f_set = sum(g[a][b] for a, b in zip(ia.tolist(), ib.tolist()))
  num = ell_c + sum(wtd[j] for j in range(m - 1))
  den = 1.0 + sum(expo[j] for j in range(m - 1))
  return f_set + num / den


def _tri_base(c):
  """c(c − 1)/2: the first triangle row of the pairs (·, c). c ≥ 0, so a truncating division
  (one scalar op on every backend) is exact."""
  return jax.lax.div(c * (c - 1), jnp.int32(2))


# ---------------------------------------------------------------------------------------------
# Best set: nested loops, a running best.


def _walk_size(m: int, k: int, refs, visit, carry):
  """``carry = visit(score, carry)`` for every m-subset in colex order.

  Nested loops from the largest member (position m − 1) down to the smallest (position 0),
  each over [position, next member): the loop order is colex order. A member's rows (its ℓ,
  its e and e·ℓ against c, its G_m against the larger members) are loaded in its own loop.
  """
  ell_ref, expo_ref, wtd_ref, g_ref = refs

  def level(j: int, hi, above: dict, carry):
    # above[i] = (member s_i, its tri base, loaded rows) for positions i > j.
    def body(s, carry):
      rows = {}
      if j == m - 1:
        rows["ell"] = ell_ref[s]
      else:
        base_c = above[m - 1][1]
        rows["expo"] = expo_ref[base_c + s]
        rows["wtd"] = wtd_ref[base_c + s]
        rows["g"] = {i: g_ref[m - 2, above[i][1] + s] for i in range(j + 1, m)}
      here = {**above, j: (s, _tri_base(s) if j > 0 else None, rows)}
      if j > 0:
        return level(j - 1, s, here, carry)
      ell_c = here[m - 1][2]["ell"]
      expo = [here[i][2].get("expo") for i in range(m - 1)]
      wtd = [here[i][2].get("wtd") for i in range(m - 1)]
      g = {a: {b: here[a][2]["g"][b] for b in range(a + 1, m)} for a in range(m - 1)}
      return visit(_score(m, ell_c, expo, wtd, g), carry)
    return jax.lax.fori_loop(jnp.int32(j), hi, body, carry)

  return level(m - 1, jnp.int32(k), {}, carry)


def _best_kernel(ell_ref, expo_ref, wtd_ref, g_ref, best_ref, row_ref, *, k: int,
                 max_size: int):
  """One query block: best_ref f32[S, 128] and row_ref int32[S, 128] of its best subset."""
  shape = best_ref.shape

  def visit(score, carry):
    best, best_row, row = carry
    # The first maximum in table order; a NaN wins over a number, the first NaN stays.
    better = (score > best) | ((score != score) & (best == best))
    return (jnp.where(better, score, best), jnp.where(better, row, best_row), row + 1)

  carry = (jnp.full(shape, -jnp.inf, jnp.float32), jnp.zeros(shape, jnp.int32), jnp.int32(0))
  refs = (ell_ref, expo_ref, wtd_ref, g_ref)
  for m in range(1, max_size + 1):
    carry = _walk_size(m, k, refs, visit, carry)
  best_ref[...] = carry[0]
  row_ref[...] = carry[1]


def _check(logits: jax.Array, pairs: jax.Array, table: subsets.SubsetTable) -> int:
  subsets.check_inputs(logits, pairs, table)
  q = logits.shape[0]
  if not isinstance(q, int):
    raise ValueError("the Pallas kernel needs a concrete batch size (exports use gather)")
  return q


@functools.partial(jax.jit, static_argnums=(2, 3))
def best_rows(logits: jax.Array, pairs: jax.Array, table: subsets.SubsetTable,
              where: str | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The best subset per query, kept on chip.

  Args:
    logits: f32[Q, K] ℓ of the shortlist; pairs: f32[Q, M − 1, K, K] G_m;
    table: ``subsets.subset_table(K, M)``.
    where: one of :data:`PLATFORMS` (default: :func:`platform` of the default backend; a
      device platform on the CPU only lowers, for ahead-of-time checks).

  Returns:
    (best F f32[Q], its row in ``table`` int32[Q], the ascending-ℓ order int32[Q, K] that the
    row's members index), as :func:`hyset_jax.inference.native.best_rows`.

  On a mesh of several devices the call runs per device, over its share of the queries
  (:func:`_per_device`).
  """
  _check(logits, pairs, table)
  return _per_device(functools.partial(_best_rows, table=table, where=where), logits, pairs)


def _best_rows(logits: jax.Array, pairs: jax.Array, table: subsets.SubsetTable,
               where: str | None) -> tuple[jax.Array, jax.Array, jax.Array]:
  """:func:`best_rows` on one device's queries."""
  q = _check(logits, pairs, table)
  k, big_m = table.k_pool, table.max_size
  where = where or platform()
  s = _sublanes(q, k, big_m, where)
  block = s * LANES
  q_pad = -(-q // block) * block
  order, ell, expo, wtd, g = _tables(logits.astype(jnp.float32), pairs.astype(jnp.float32),
                                     q_pad)
  t = k * (k - 1) // 2
  nb = q_pad // block
  tile = lambda *lead: pl.BlockSpec(  # noqa: E731
      (*lead, s, LANES), lambda i: (*(0,) * len(lead), i, 0))
  out_spec = pl.BlockSpec((s, LANES), lambda i: (i, 0))
  best, rows = pl.pallas_call(
      functools.partial(_best_kernel, k=k, max_size=big_m),
      out_shape=(jax.ShapeDtypeStruct((q_pad // LANES, LANES), jnp.float32),
                 jax.ShapeDtypeStruct((q_pad // LANES, LANES), jnp.int32)),
      grid=(nb,),
      in_specs=[tile(k), tile(t), tile(t), tile(big_m - 1, t)],
      out_specs=(out_spec, out_spec),
      interpret=where == "interpret",
      compiler_params=_compiler_params(where, ("parallel",), 2 * _table_bytes(k, big_m, s)),
      name="hyset_best_subset",
  )(ell, expo, wtd, g)
  # NaN scores cannot point past the table here; the clamp keeps the contract of the others.
  return best.reshape(-1)[:q], jnp.minimum(rows.reshape(-1)[:q], len(table) - 1), order


# ---------------------------------------------------------------------------------------------
# Every score: row chunks, colex successor.


def _successor(s: list, k: int) -> list:
  """The next subset in colex order after the ascending members ``s`` (scalars); the last
  subset stays as it is. Colex: raise the smallest member that can rise (s_j + 1 < s_{j+1},
  s_m = K) and reset the ones below it to 0, 1, …"""
  m = len(s)
  can = [s[j] + 1 < (s[j + 1] if j + 1 < m else k) for j in range(m)]
  out, below = [], []
  for j in range(m):
    first = can[j]
    for i in range(j):
      first = first & ~can[i]
    below.append(first)
  for i in range(m):
    reset = False
    for j in range(i + 1, m):
      reset = reset | below[j]
    out.append(jnp.where(below[i], s[i] + 1, jnp.where(reset, jnp.int32(i), s[i])))
  return out


@functools.lru_cache(maxsize=32)
def _chunks(k: int, max_size: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
  """Row chunks of the every-score kernel, each within one size.

  Returns:
    starts: int32[chunks, M + 1], per chunk its size m and its first subset's members
      (ascending, padded with 0).
    keep: int64[n], for each table row its row in the padded output.
  """
  table = subsets.subset_table(k, max_size)
  starts, keep = [], []
  for m in range(1, max_size + 1):
    lo, hi = table.offsets[m - 1], table.offsets[m]
    base = len(starts) * rows
    for start in range(lo, hi, rows):
      starts.append([m, *table.members[start].tolist()])
    keep.append(base + np.arange(hi - lo))
  return np.asarray(starts, np.int32), np.concatenate(keep)


def _scores_kernel(start_ref, ell_ref, expo_ref, wtd_ref, g_ref, out_ref, *, k: int,
                   max_size: int):
  """One (query block, row chunk): out_ref f32[R, S, 128], the chunk's scores."""
  chunk = pl.program_id(1)
  size = start_ref[chunk, 0]
  rows = out_ref.shape[0]
  for m in range(1, max_size + 1):
    @pl.when(size == m)
    def _(m=m):
      def body(r, s):
        c = s[m - 1]
        base_c = _tri_base(c)
        bases = [_tri_base(x) for x in s]
        ell_c = ell_ref[c]
        expo = [expo_ref[base_c + s[j]] for j in range(m - 1)]
        wtd = [wtd_ref[base_c + s[j]] for j in range(m - 1)]
        g = {a: {b: g_ref[m - 2, bases[b] + s[a]] for b in range(a + 1, m)}
             for a in range(m - 1)}
        out_ref[r] = _score(m, ell_c, expo, wtd, g)
        return tuple(_successor(list(s), k))
      jax.lax.fori_loop(0, rows, body, tuple(start_ref[chunk, 1 + i] for i in range(m)))


@functools.partial(jax.jit, static_argnums=(2, 3))
def score_subsets(logits: jax.Array, pairs: jax.Array, table: subsets.SubsetTable,
                  where: str | None = None) -> subsets.SubsetScores:
  """Every subset's F with the Pallas kernel.

  Args and ``where`` as :func:`best_rows` (per device on a mesh, as there).

  Returns:
    SubsetScores: scores f32[Q, n] in table order; positions int32[Q, K], the ascending-ℓ
    reordering (as the gather form).
  """
  _check(logits, pairs, table)
  return subsets.SubsetScores(*_per_device(
      functools.partial(_score_subsets, table=table, where=where), logits, pairs))


def _score_subsets(logits: jax.Array, pairs: jax.Array, table: subsets.SubsetTable,
                   where: str | None) -> tuple[jax.Array, jax.Array]:
  """:func:`score_subsets` on one device's queries: (scores, positions)."""
  q = _check(logits, pairs, table)
  k, big_m = table.k_pool, table.max_size
  where = where or platform()
  biggest = max(math.comb(k, m) for m in range(1, big_m + 1))
  rows = min(SCORES_ROWS_INTERPRET if where == "interpret" else SCORES_ROWS,
             -(-biggest // 8) * 8)
  s = _sublanes(q, k, big_m, where, rows)
  block = s * LANES
  q_pad = -(-q // block) * block
  order, ell, expo, wtd, g = _tables(logits.astype(jnp.float32), pairs.astype(jnp.float32),
                                     q_pad)
  starts, keep = _chunks(k, big_m, rows)
  t = k * (k - 1) // 2
  nb, nc = q_pad // block, len(starts)
  tile = lambda *lead: pl.BlockSpec(  # noqa: E731
      (*lead, s, LANES), lambda i, j, *_: (*(0,) * len(lead), i, 0))
  in_specs = [tile(k), tile(t), tile(t), tile(big_m - 1, t)]
  out_spec = pl.BlockSpec((rows, s, LANES), lambda i, j, *_: (j, i, 0))
  out_shape = jax.ShapeDtypeStruct((nc * rows, q_pad // LANES, LANES), jnp.float32)
  kernel = functools.partial(_scores_kernel, k=k, max_size=big_m)
  vmem = 2 * (_table_bytes(k, big_m, s) + 4 * rows * block)
  params = _compiler_params(where, ("parallel", "parallel"), vmem)
  if where == "tpu":
    from jax.experimental.pallas import tpu as pltpu
    call = pl.pallas_call(
        kernel, out_shape=out_shape, compiler_params=params, name="hyset_subset_scores",
        grid_spec=pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, grid=(nb, nc),
                                               in_specs=in_specs, out_specs=out_spec))
  else:
    # Elsewhere the chunk table is an ordinary input, read whole by every program.
    table_spec = pl.BlockSpec(starts.shape, lambda i, j: (0, 0))
    call = pl.pallas_call(
        kernel, out_shape=out_shape, grid=(nb, nc), in_specs=[table_spec, *in_specs],
        out_specs=out_spec, compiler_params=params, interpret=where == "interpret",
        name="hyset_subset_scores")
  out = call(jnp.asarray(starts), ell, expo, wtd, g)
  scores = out.reshape(nc * rows, q_pad)[keep].T[:q]
  return scores, order
