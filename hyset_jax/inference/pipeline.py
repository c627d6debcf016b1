"""Two-stage set-level inference (paper Eq. 12-14; docs/model.md, docs/speed.md).

Stage 1 scores every tool by ℓ(x, t) and keeps the top K1 (S0). Complementarity expansion adds
the K_pool − K1 other tools with the largest g(t) = max_{i∈S0} z_tᵀ M_M z_i (Eq. 13). Stage 2
scores every subset of the shortlist S of size 1..M and returns the argmax (Eq. 14). A second
output ranks the shortlist's tools for Recall/NDCG/COMP@K, by one of the methods of
:func:`rank_tools` (names in :data:`hyset_jax.choices.RANKINGS`).

Shortlist order (the ``shortlist`` of ``hyset predict``): S0 by descending ℓ, then the expansion
tools by descending g, ties in g by descending ℓ. Remaining ties go to the lower tool row; the
greedy steps break ties towards the earlier shortlist position.

Two paths compute the same outputs:

- :func:`predict` (from θ): stage 1 and the expansion scan every tool, G_m is built per query
  from Z_S and M_m (K·d² per size). The reference, and what the StableHLO export traces.
- :func:`predict_prepared` (from a :class:`PreparedModel`, built once per model by
  :func:`prepare`): stage 1 is one [Q, d_r]×[d_r, N] product with P already applied to Z
  (taken tool-major, ℓᵀ [N, Q], for the small batches the backend says: :func:`_stage1`), G_m
  gathers rows of the precomputed Z M_m (K²·d per size), and the expansion reads the
  neighbour table of :mod:`hyset_jax.inference.neighbors` (O(K1·K_pool) per query, exact; a
  batch with a boundary tie is scanned in full). :func:`predict_batched` (``hyset predict``)
  uses it.

With an ANN index (``first_stage``, :mod:`hyset_jax.inference.ann`; opt-in per model, for very
large libraries) the prepared path's stage 1 and expansion take their candidates from the index
and score them exactly: approximate in which tools reach the shortlist, same order rules.

Both run stage 2 as :func:`enumeration.best_subset` (the argmax without the [Q, n] scores).
Filters (``QueryInputs.allowed``, bool[Q, N]) act as :mod:`hyset_jax.inference.masks` says: the
delivered set is the exact best set over the allowed tools, and a disallowed slot reads -1.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hyset_jax import choices
from hyset_jax.inference import ann, backends, enumeration, masks, neighbors, subsets
from hyset_jax.model import query_inputs, scoring, set_prior
from hyset_jax.training import sharding
from hyset_jax.inference.rankings import rank_tools
from hyset_jax.model.query_inputs import QueryInputs
from hyset_jax.model.scoring import HysetParams

Ranking = choices.Ranking
# Ranking methods (hyset_jax.choices); DEFAULT_RANKING when no caller or model names one.
RANKINGS = choices.RANKINGS
DEFAULT_RANKING: Ranking = choices.DEFAULT_RANKING
# The expansion's g and tie key of a disallowed tool: finite, so it stays above S0's -inf.
_LOWEST = float(np.finfo(np.float32).min)
# A disallowed slot's tool row as the seen-set prior sees it: no seen set (rows ≥ 0, padding
# -1) contains it, so a seen set holding a disallowed tool is never inside the shortlist.
_NO_ROW = -2


class Shortlist(NamedTuple):
  """tools: int32[Q, K_pool] tool rows in shortlist order; logits: f32[Q, K_pool] their ℓ."""
  tools: jax.Array
  logits: jax.Array


def shortlist(params: HysetParams, x: QueryInputs | jax.Array, k1: int, k_pool: int,
              max_size: int) -> Shortlist:
  """Stage 1 and complementarity expansion (Eq. 12-13).

  Args:
    params: θ.
    x: the queries (:class:`QueryInputs`; an f32[Q, d_r] array is the embedding alone). With
      the lexical term, ℓ' = ℓ + β·b replaces ℓ from here on (:func:`scoring.with_lexical`).
    k1: |S0|.
    k_pool: |S|.
    max_size: M; the expansion uses M_M.

  Returns:
    Shortlist of K_pool tools per query.
  """
  x = query_inputs.of(x)
  z = params.tool_embeddings
  logits, s0 = _stage1_theta(params, x, k1)
  keyed = z[s0] @ params.interactions[max_size - 2]                      # [Q, K1, d]
  extra = _expand_scan(z, keyed, logits, s0, k_pool - k1, x.allowed)
  return _joined(logits, s0, extra)


def _stage1_theta(params: HysetParams, x: QueryInputs, k1: int) -> tuple[jax.Array, jax.Array]:
  """(ℓ' f32[Q, N] with the lexical term and the filter applied, S0 int32[Q, K1])."""
  logits = masks.mask_logits(scoring.with_lexical(params, scoring.query_logits(params, x.embedding),
                                        x.lexical_scores), x.allowed)
  return logits, sharding.top_k(logits, k1)[1]     # S0 per tools shard under a mesh


_stage1_jit = jax.jit(_stage1_theta, static_argnames=("k1",))


def _joined(logits: jax.Array, s0: jax.Array, extra: jax.Array) -> Shortlist:
  tools = jnp.concatenate([s0, extra], axis=1).astype(jnp.int32)
  return Shortlist(tools, jnp.take_along_axis(logits, tools, axis=1))


# shortlist_distinct pads a batch's distinct S0 tools to a multiple of this many rows, so that
# the steps of a training run share a few compiled shapes.
DISTINCT_ROWS = 64


def shortlist_distinct(params: HysetParams, x: QueryInputs | jax.Array, k1: int, k_pool: int,
                       max_size: int) -> Shortlist:
  """:func:`shortlist` for a batch whose S0 tools repeat across queries (a training batch):
  the expansion's scan reads Z M_M z_t once per distinct tool i of the batch's S0 instead of
  once per (query, i). The same tools in the same order; not jittable (the number of distinct
  tools is read on the host), each half is.

  Why: training draws its shortlist negatives from this shortlist at every step, and the scan
  is 2·Q·K1·N·d flops — at N = 10⁴ padded tools, batch 256, K1 = 15, the larger half of a
  step on a 2-core CPU. A batch's 3,840 S0 slots hold ~440 distinct tools there (ToolLens'
  queries share their stage-1 tools), so the scan costs ~9× less.
  """
  x = query_inputs.of(x)
  logits, s0 = _stage1_jit(params, x, k1)
  slots = np.asarray(s0)
  tools = np.unique(slots)
  rows = np.full(-(-len(tools) // DISTINCT_ROWS) * DISTINCT_ROWS, tools[0], np.int32)
  rows[:len(tools)] = tools                  # padding repeats a tool: a max is unchanged
  where = np.searchsorted(tools, slots).astype(np.int32)                 # [Q, K1] into rows
  extra = _expand_distinct(params.tool_embeddings, params.interactions[max_size - 2], rows,
                           where, logits, s0, x.allowed, n_ext=k_pool - k1)
  return _joined(logits, s0, extra)


@functools.partial(jax.jit, static_argnames=("n_ext",))
def _expand_distinct(z: jax.Array, m_m: jax.Array, rows: jax.Array, where: jax.Array,
                     logits: jax.Array, s0: jax.Array, allowed: jax.Array | None, *,
                     n_ext: int) -> jax.Array:
  """Eq. 13 over every tool from the distinct S0 tools ``rows`` int32[U] (``where``
  int32[Q, K1]: each S0 slot's index into ``rows``); otherwise :func:`_expand_scan`."""
  scores = (z[rows] @ m_m) @ z.T                                          # [U, N]
  # One [Q, N] gather per S0 slot, folded by max: never the [Q, K1, N] block.
  g = functools.reduce(jnp.maximum, (scores[where[:, k]] for k in range(where.shape[1])))
  return _select_expansion(g, logits, s0, n_ext, allowed, top_indices)


def _xla_top_indices(x: jax.Array, k: int) -> jax.Array:
  return jax.lax.top_k(x, k)[1]


def _expand_scan(z: jax.Array, keyed: jax.Array, logits: jax.Array, s0: jax.Array,
                 n_ext: int, allowed: jax.Array | None = None,
                 top: Callable = _xla_top_indices) -> jax.Array:
  """Eq. 13 over every tool: int32[Q, n_ext] from Z f32[N, d], keyed = Z_S0 M_M f32[Q, K1, d],
  ℓ f32[Q, N], S0 int32[Q, K1] and the filter ``allowed`` bool[Q, N] (None: every tool);
  ``top``: as :func:`_select_expansion`."""
  g = jnp.max(jnp.einsum("nd,qkd->qnk", z, keyed), axis=-1)              # [Q, N]
  return _select_expansion(g, logits, s0, n_ext, allowed, top)


def _select_expansion(g: jax.Array, logits: jax.Array, s0: jax.Array, n_ext: int,
                      allowed: jax.Array | None, top: Callable = _xla_top_indices
                      ) -> jax.Array:
  """The n_ext tools outside S0 of largest g f32[Q, N], ties by ℓ then row: int32[Q, n_ext].

  ``top(x, k)``: the indices of ``jax.lax.top_k(x, k)``. XLA's (the default: what the exports
  trace) or a backend's kernel (:func:`top_indices`; on a CPU the native one)."""
  if allowed is not None:
    # Below every allowed tool and above S0's -inf (in g and in the tie key): when fewer
    # tools are allowed than the expansion needs, disallowed ones fill it by row, never S0.
    g = jnp.where(allowed, g, _LOWEST)
    logits = jnp.where(allowed, logits, _LOWEST)
  in_s0 = jnp.zeros(g.shape, bool).at[jnp.arange(g.shape[0])[:, None], s0].set(True)
  g = jnp.where(in_s0, -jnp.inf, g)
  # Order the expansion by g, ties by ℓ (then by row). With M_M = 0 every g ties, so the
  # untrained model's shortlist is exactly the top K_pool by ℓ: the dense retriever.
  # The threshold: the value at the n_ext-th index. With XLA's top_k on a CPU, fused into the
  # comparisons below that also read g, it becomes a full sort of every row — 0.36 s against
  # 6 ms with the native kernel (which XLA cannot fuse) at Q = 256, N = 10⁴ (2026-12-05).
  threshold = jnp.take_along_axis(g, top(g, n_ext)[:, -1:], axis=1)
  key = jnp.where(g > threshold, jnp.inf, jnp.where(g == threshold, logits, -jnp.inf))
  cand = jax.lax.top_k(key, n_ext)[1]                                    # [Q, K_pool - K1]
  cand_g = jnp.take_along_axis(g, cand, axis=1)
  cand_l = jnp.take_along_axis(logits, cand, axis=1)
  return jax.lax.sort((-cand_g, -cand_l, cand), dimension=1, num_keys=3)[2].astype(jnp.int32)


class Prediction(NamedTuple):
  """Outputs for a batch of queries; tool fields are rows of the tool library.

  Attributes:
    shortlist: int32[Q, K_pool] in shortlist order.
    set_tools: int32[Q, M] the best set, members in ascending shortlist position, padded with -1.
    set_size: int32[Q].
    set_score: f32[Q].
    ranking: int32[Q, K_pool] the shortlist ranked by the chosen method (:func:`rank_tools`).
  """
  shortlist: jax.Array
  set_tools: jax.Array
  set_size: jax.Array
  set_score: jax.Array
  ranking: jax.Array


class Reranked(NamedTuple):
  """Stage 2 and the ranking from a shortlist: the fields of :class:`Prediction` after
  ``shortlist``, with the same shapes and meaning."""
  set_tools: jax.Array
  set_size: jax.Array
  set_score: jax.Array
  ranking: jax.Array


def _stage2(sl: Shortlist, pairs: jax.Array, *, k_pool: int, max_size: int,
            backend: backends.Backend, rankings: tuple[Ranking, ...],
            prior: scoring.SetPrior | None = None,
            query_emb: jax.Array | None = None,
            allowed: jax.Array | None = None,
            abstention: scoring.Abstention | None = None,
            set_weight: jax.Array | None = None) -> tuple[Reranked, ...]:
  """Stage 2 once and the shortlist ranked by each of ``rankings`` (the set fields shared).

  ``set_weight``: γ (the set_weight term; None: 1): the pair matrices ``pairs`` are scaled by
  it before anything reads them, so the set, its score, the prior and the rankings see F'.

  With a seen-set ``prior`` (which reads ``query_emb``), Ê is the argmax of F' = F + the
  prior's bonus: the enumeration's argmax of F unless a seen set beats it
  (:func:`set_prior.seen_sets`). ``allowed``: bool[Q, K_pool], the shortlist slots a filter
  allows (None: all); the others are penalised (:func:`masks.penalise`) and read -1 in rankings.
  With ``abstention`` (which reads ``query_emb``) the set is empty (size 0, -1s) for the
  queries it answers with no tool (:func:`scoring.no_tool`); the rankings and the score stay.
  """
  tools = sl.tools
  if set_weight is not None:
    pairs = pairs * jnp.asarray(set_weight, pairs.dtype)
  if allowed is not None:
    logits, pairs = masks.penalise(sl.logits, pairs, allowed, max_size)
    sl = Shortlist(sl.tools, logits)
    tools = jnp.where(allowed, sl.tools, _NO_ROW)  # the prior sees no set holding one
  table = subsets.subset_table(k_pool, max_size)
  best = enumeration.best_subset(sl.logits, pairs, table, backend.name)
  # Members in ascending shortlist position, padding (K_pool) last.
  pos = jnp.sort(jnp.where(best.mask[:, 0], best.positions[:, 0], k_pool), axis=1)
  score, seen = best.scores[:, 0], None
  if prior is not None:
    seen = set_prior.seen_sets(prior, query_emb, tools, sl.logits, pairs, score, max_size)
    pos = jnp.where(seen.wins[:, None], seen.positions, pos)
    score = jnp.where(seen.wins, seen.score, score)
  valid = pos < k_pool
  set_tools = jnp.where(valid, jnp.take_along_axis(sl.tools, jnp.minimum(pos, k_pool - 1), 1), -1)
  set_tools, set_size = set_tools.astype(jnp.int32), jnp.sum(valid, 1).astype(jnp.int32)
  if abstention is not None:
    none = scoring.no_tool(abstention, query_emb)
    set_tools, set_size = jnp.where(none[:, None], -1, set_tools), jnp.where(none, 0, set_size)
  return tuple(Reranked(set_tools, set_size, score,
                        _rows(sl.tools, rank_tools(sl.logits, pairs, pos, r, max_size, backend,
                                                   seen, allowed), allowed))
               for r in rankings)


def _rows(tools: jax.Array, order: jax.Array, allowed: jax.Array | None) -> jax.Array:
  """Tool rows int32[Q, K] of shortlist positions ``order``; -1 at disallowed slots."""
  rows = jnp.take_along_axis(tools, order, axis=1)
  if allowed is not None:
    rows = jnp.where(jnp.take_along_axis(allowed, order, axis=1), rows, -1)
  return rows.astype(jnp.int32)


def _slots(x: QueryInputs, tools: jax.Array) -> jax.Array | None:
  """bool[Q, K]: which shortlist slots ``x.allowed`` allows (None without a filter)."""
  return None if x.allowed is None else jnp.take_along_axis(x.allowed, tools, axis=1)


def rerank(params: HysetParams, x: QueryInputs | jax.Array, sl: Shortlist, *, k_pool: int,
           max_size: int, method: enumeration.Method = enumeration.DEFAULT_METHOD,
           ranking: Ranking | None = None) -> Reranked:
  """Stage 2 (Eq. 14) and the tool ranking, from a shortlist.

  Args:
    params: θ; ``params.interactions`` must hold at least M − 1 matrices.
    x: the queries (the query-conditioned set term and the prior read the embedding).
    sl: the shortlist of :func:`shortlist`.
    k_pool, max_size: K_pool, M.
    method: the enumeration implementation.
    ranking: a :data:`hyset_jax.choices.RANKINGS` name; None: :data:`DEFAULT_RANKING`.

  Returns:
    Reranked.
  """
  x = query_inputs.of(x)
  emb = x.embedding
  pairs = scoring.shortlist_pairs(truncate(params, max_size), emb, sl.tools)
  return _stage2(sl, pairs, k_pool=k_pool, max_size=max_size,
                 backend=backends.get(method, k_pool, max_size),
                 rankings=(DEFAULT_RANKING if ranking is None else ranking,),
                 prior=params.prior, query_emb=emb, allowed=_slots(x, sl.tools),
                 abstention=params.abstain, set_weight=params.set_weight)[0]


def _prediction(sl: Shortlist, r: Reranked, allowed: jax.Array | None = None) -> Prediction:
  shortlist_rows = sl.tools if allowed is None else jnp.where(allowed, sl.tools, -1)
  return Prediction(shortlist=shortlist_rows, set_tools=r.set_tools, set_size=r.set_size,
                    set_score=r.set_score, ranking=r.ranking)


@functools.partial(jax.jit, static_argnames=("k1", "k_pool", "max_size", "method", "ranking"))
def predict(params: HysetParams, x: QueryInputs | jax.Array, *, k1: int, k_pool: int,
            max_size: int, method: enumeration.Method = enumeration.DEFAULT_METHOD,
            ranking: Ranking | None = None) -> Prediction:
  """The full two-stage path for a batch of queries: :func:`shortlist`, then :func:`rerank`.

  Args:
    params: θ; ``params.interactions`` must hold at least M − 1 matrices (M_2..M_M are used).
    x: the queries (:class:`QueryInputs`, or the f32[Q, d_r] embedding alone).
    k1, k_pool, max_size: K1, K_pool, M (validate with :func:`subsets.validate_sizes`).
    method: the enumeration implementation.
    ranking: a :data:`hyset_jax.choices.RANKINGS` name; None means the model's default, which
      for bare θ is :data:`DEFAULT_RANKING`.

  Returns:
    Prediction.
  """
  params = truncate(params, max_size)
  x = query_inputs.of(x)
  sl = shortlist(params, x, k1, k_pool, max_size)
  return _prediction(sl, rerank(params, x, sl, k_pool=k_pool, max_size=max_size,
                                method=method, ranking=ranking), _slots(x, sl.tools))


def truncate(params: HysetParams, max_size: int) -> HysetParams:
  """θ for sets of at most ``max_size`` tools (M_2..M_max_size and their conditioned terms)."""
  qi = params.conditioned
  if qi is not None:
    qi = type(qi)(*(a[:max_size - 1] for a in qi))
  return params._replace(interactions=params.interactions[:max_size - 1], conditioned=qi)


# --- The prepared model: per-model products computed once. ---------------------------------


class PreparedModel(NamedTuple):
  """θ with the products every query needs, computed once per model (:func:`prepare`).

  Attributes:
    params: θ with M_2..M_M (M − 1 interaction matrices), :func:`truncate`.
    logit_weights: f32[N, d_r] = Z Pᵀ: stage 1 is q(r) @ logit_weightsᵀ, q the query tower
      (tool-major: a product contracting both operands' last axis runs ~12% faster on a CPU
      than the transposed layout's).
    keyed: f32[N, M − 1, d_z], row t holds z_tᵀ M_m for m = 2..M (tool-major, so a shortlist's
      rows are one contiguous gather): G_m of a shortlist is a gather and a K²·d product.
    neighbors: the Eq. 13 neighbour table under M_M, or None (the expansion scans every tool).

  With ``precision="bf16"`` (:func:`prepare`) logit_weights and keyed are bfloat16: stage 1
  and the pair matrices multiply bf16 operands with f32 accumulation (:func:`_dot`), and
  everything after them (the expansion's g, stage 2, the rankings) is f32 arithmetic on those
  rounded products.
  """
  params: HysetParams
  logit_weights: jax.Array
  keyed: jax.Array
  neighbors: neighbors.NeighborTable | None

  @property
  def max_size(self) -> int:
    return int(self.keyed.shape[1]) + 1

  @property
  def precision(self) -> choices.Precision:
    """``"bf16"`` when the products are stored in bfloat16, else ``"f32"``."""
    return "bf16" if self.keyed.dtype == jnp.bfloat16 else "f32"


PRECISION_DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}


def _dot(subscripts: str, a: jax.Array, b: jax.Array, dtype) -> jax.Array:
  """``einsum(subscripts, a, b)`` with both operands in ``dtype`` (a prepared product's: f32,
  or bf16 under ``precision="bf16"``), accumulated and returned in f32. For f32 it is the
  plain einsum."""
  if dtype == jnp.float32:
    return jnp.einsum(subscripts, a, b)
  return jnp.einsum(subscripts, a.astype(dtype), b.astype(dtype),
                    preferred_element_type=jnp.float32)


@jax.jit
def _products(params: HysetParams) -> tuple[jax.Array, jax.Array]:
  z = params.tool_embeddings
  return z @ params.projection.T, jnp.einsum("nd,mde->nme", z, params.interactions)


def drop_prepare_programs() -> None:
  """Drop the compiled programs :func:`prepare` leaves in JAX's process-wide caches, one set per
  tool count: its products, the neighbour table's blocks and the eager operations on [N, …]
  arrays. They only prepare a library; the next :func:`prepare` compiles them again (once), as
  does the first eager operation of each kind. Prediction programs are not touched. For a
  process whose library changes size while it runs (``hyset serve``'s live catalogue)."""
  _products.clear_cache()
  neighbors.drop_compiled()
  try:  # the eager operations' programs, one per operation and shape: private to JAX, hence
    from jax._src import dispatch  # guarded (a later JAX without this cache is left as it is)
    dispatch.xla_primitive_callable.cache_clear()
  except (ImportError, AttributeError):
    pass


def prepare(params: HysetParams, *, max_size: int, k_pool: int | None = None,
            neighbor_table: bool = True, cache_dir=None, progress: bool = False,
            precision: choices.Precision = choices.DEFAULT_PRECISION) -> PreparedModel:
  """Precompute what :func:`predict_prepared` needs for one model.

  Args:
    params: θ with at least M − 1 interaction matrices.
    max_size: M (the expansion uses M_M; predict_prepared must use the same M).
    k_pool: the largest K_pool the neighbour table must serve (width
      :func:`neighbors.width_for`); required when ``neighbor_table``.
    neighbor_table: build (or load) the neighbour table; False: scan every tool instead.
    cache_dir: where the table is cached by a hash of Z and M_M (None: not cached); see
      :func:`neighbors.cache_dir_beside` for a model directory's place.
    progress: show a progress bar while the table is built.
    precision: ``"f32"`` or ``"bf16"`` (:data:`hyset_jax.choices.PRECISIONS`): the dtype P Zᵀ
      and Z M_m are stored in (computed in f32, then rounded). With bf16 the neighbour table
      is built from the rounded Z M_M, as the expansion's full scan reads it, and cached under
      its own key.

  Returns:
    PreparedModel (device arrays).
  """
  dtype = PRECISION_DTYPES[choices.check("precision", precision, choices.PRECISIONS)]
  # The row blend's trained rows only serve a refit after θ: Z already holds the blend.
  params = truncate(jax.device_put(params._replace(row_blend=None)), max_size)
  logit_weights, keyed = (a.astype(dtype) for a in _products(params))
  table = None
  if neighbor_table:
    if k_pool is None:
      raise ValueError("prepare(neighbor_table=True) needs k_pool")
    width = neighbors.width_for(k_pool, int(params.tool_embeddings.shape[0]))
    table = neighbors.load_or_build(keyed[:, max_size - 2], params.tool_embeddings,
                                    params.interactions[max_size - 2], width, cache_dir,
                                    progress=progress,
                                    tag="" if precision == "f32" else precision)
    table = neighbors.NeighborTable(*jax.device_put(tuple(table)))
  return PreparedModel(params, logit_weights, keyed, table)


def _query_side(params: HysetParams, query_emb: jax.Array) -> jax.Array:
  """f32[Q, d_r]: the query-side vector multiplied into P Zᵀ — the query tower's output."""
  return scoring.query_tower(params.tower, query_emb)


def stage1_prepared(prep: PreparedModel, x: QueryInputs | jax.Array, k1: int,
                    method: enumeration.Method | backends.Backend = enumeration.DEFAULT_METHOD
                    ) -> tuple[jax.Array, jax.Array]:
  """Stage 1 from a prepared model: (ℓ f32[Q, N], the K1 tools of largest ℓ int32[Q, K1]);
  ℓ' with the lexical term (:func:`scoring.with_lexical`), -inf for a tool ``x.allowed`` rules
  out; the K1 by :func:`top_indices`."""
  logits, top, by_tool = _stage1(prep, query_inputs.of(x), k1, backends.get(method, k1))
  return (logits.T if by_tool else logits), top


def _stage1(prep: PreparedModel, x: QueryInputs, k1: int, backend: backends.Backend
            ) -> tuple[jax.Array, jax.Array, bool]:
  """:func:`stage1_prepared`'s (ℓ, S0) and whether ℓ is tool-major: ℓᵀ f32[N, Q] for a batch
  the backend reads that way (``backend.by_tool_queries``; unfiltered: a filter's expansion
  scans every tool per query), else ℓ f32[Q, N]."""
  q = x.embedding.shape[0]
  by_tool = q <= backend.by_tool_queries and x.allowed is None
  r = _query_side(prep.params, x.embedding)
  w = prep.logit_weights
  if by_tool:
    lexical = None if x.lexical_scores is None else x.lexical_scores.T
    logits = scoring.with_lexical(prep.params, _dot("nd,qd->nq", w, r, w.dtype), lexical)
    return logits, backend.top_k(logits, k1, by_tool=True), True
  logits = masks.mask_logits(scoring.with_lexical(
      prep.params, _dot("qd,nd->qn", r, w, w.dtype), x.lexical_scores), x.allowed)
  return logits, top_indices(logits, k1, backend), False


def top_indices(logits: jax.Array, k: int,
                method: enumeration.Method | backends.Backend = enumeration.DEFAULT_METHOD
                ) -> jax.Array:
  """``jax.lax.top_k(logits, k)``'s indices, int32[Q, k], by the backend's ``top_k`` kernel
  where it has one (native: the same indices, faster on a CPU)."""
  kernel = backends.get(method, k).top_k
  return kernel(logits, k) if kernel is not None else jax.lax.top_k(logits, k)[1]


SCAN_CHUNK = 8  # queries per chunk of the expansion's full-scan fallback


def shortlist_prepared(prep: PreparedModel, x: QueryInputs | jax.Array, k1: int, k_pool: int,
                       method: enumeration.Method | backends.Backend = enumeration.DEFAULT_METHOD,
                       first_stage: ann.Index | None = None) -> Shortlist:
  """:func:`shortlist` from a prepared model: the same tools in the same order.

  The neighbour table answers the expansion when it is wide enough (W ≥ K_pool − 1); a batch
  in which some query has a boundary tie (:func:`neighbors.expand`) is scanned in full for
  those queries, so the answer is always the full scan's. The backend's ``expand`` kernel
  reads the table where it has one (native: :func:`hyset_jax.inference.native.expand`, the same
  answers); JAX otherwise. With a filter (``x.allowed``) the expansion always scans every
  tool: the table's neighbours are the unfiltered ones.

  ``first_stage``: an ANN index over Z (:mod:`hyset_jax.inference.ann`) proposes the candidates
  of stage 1 and the expansion instead (approximate); a batch with a filter or lexical scores
  runs the exact path all the same.
  """
  x = query_inputs.of(x)
  if first_stage is not None and x.allowed is None and x.lexical_scores is None:
    return Shortlist(*ann.shortlist(first_stage, prep, x.embedding, k1, k_pool))
  backend = backends.get(method, k_pool)
  logits, s0, by_tool = _stage1(prep, x, k1, backend)
  n_ext = k_pool - k1
  z = prep.params.tool_embeddings

  top = functools.partial(top_indices, method=backend)

  def scan():
    # In chunks of queries: the branch's temporaries ([Q, N] several times over) would be
    # allocated on every call, taken or not (measured at N = 13,860, batch 256: 57 MB against
    # 14 MB without the branch, 6-8 ms of page faults per call).
    lq = logits.T if by_tool else logits
    if x.allowed is not None:
      return enumeration.map_query_chunks(
          lambda keyed, lg, s, a: _expand_scan(z, keyed, lg, s, n_ext, a, top), SCAN_CHUNK,
          prep.keyed[s0, -1], lq, s0, x.allowed)
    return enumeration.map_query_chunks(
        lambda keyed, lg, s: _expand_scan(z, keyed, lg, s, n_ext, top=top), SCAN_CHUNK,
        prep.keyed[s0, -1], lq, s0)

  table = prep.neighbors
  if table is None or table.ids.shape[1] < k_pool - 1 or x.allowed is not None:
    extra = scan()
  else:
    exp = (backend.expand(table, logits, s0, n_ext, by_tool=True) if by_tool
           else (backend.expand or neighbors.expand)(table, logits, s0, n_ext))
    extra = jax.lax.cond(jnp.any(exp.tie),
                         lambda: jnp.where(exp.tie[:, None], scan(), exp.extra),
                         lambda: exp.extra)
  tools = jnp.concatenate([s0, extra], axis=1).astype(jnp.int32)
  picked = (logits[tools, jnp.arange(tools.shape[0])[:, None]] if by_tool
            else jnp.take_along_axis(logits, tools, axis=1))
  return Shortlist(tools, picked)


PAIRS_CHUNK = 8  # queries per chunk of pair_matrices_prepared


def pair_matrices_prepared(prep: PreparedModel, x: QueryInputs | jax.Array | None,
                           tools: jax.Array,
                           method: enumeration.Method | backends.Backend
                           = enumeration.DEFAULT_METHOD) -> jax.Array:
  """G_m of each shortlist, f32[Q, M−1, K, K], from the precomputed Z M_m (K²·d per size).

  A model with the query-conditioned set term (``params.conditioned``) uses
  :func:`scoring.shortlist_pairs` instead: that term is per query, nothing to precompute.
  The backend's ``pair_matrices`` kernel computes G_m where it has one (native:
  :func:`hyset_jax.inference.native.pair_matrices`, the upper triangle, mirrored); JAX otherwise.
  """
  if prep.params.conditioned is not None:
    return scoring.shortlist_pairs(prep.params, query_inputs.of(x).embedding, tools)
  kernel = backends.get(method, tools.shape[1]).pair_matrices
  if kernel is not None and prep.precision == "f32":  # the native kernel reads f32 only
    return kernel(prep.keyed, prep.params.tool_embeddings, tools)
  def chunk(t):
    q, k = t.shape
    keyed = prep.keyed[t].reshape(q, -1, prep.keyed.shape[-1])            # [q, K·(M−1), d]
    g = _dot("qad,qjd->qaj", keyed, prep.params.tool_embeddings[t], keyed.dtype)  # f32
    return g.reshape(q, k, -1, k).transpose(0, 2, 1, 3)                  # [q, M−1, K, K]
  # The gathered rows are 245 KB per query at d = 768, M = 5: in chunks of 8 queries they
  # stay in cache (measured, batch 256: 4x faster than one [Q, K·(M−1), d] gather).
  return enumeration.map_query_chunks(chunk, PAIRS_CHUNK, tools)


def _predict_prepared(prep: PreparedModel, x: QueryInputs, k1: int, k_pool: int,
                      max_size: int, method: enumeration.Method,
                      rankings: tuple[Ranking, ...], first_stage: ann.Index | None = None
                      ) -> tuple[Prediction, ...]:
  if max_size != prep.max_size:
    raise ValueError(f"the model was prepared for max_size {prep.max_size}, not {max_size}")
  backend = backends.get(method, k_pool, max_size)  # once, for every step
  x = query_inputs.of(x)
  sl = shortlist_prepared(prep, x, k1, k_pool, backend, first_stage)
  pairs = pair_matrices_prepared(prep, x, sl.tools, backend)
  allowed = _slots(x, sl.tools)
  return tuple(_prediction(sl, r, allowed)
               for r in _stage2(sl, pairs, k_pool=k_pool, max_size=max_size, backend=backend,
                                rankings=rankings, prior=prep.params.prior,
                                query_emb=x.embedding, allowed=allowed,
                                abstention=prep.params.abstain,
                                set_weight=prep.params.set_weight))


@functools.partial(jax.jit, static_argnames=("k1", "k_pool", "max_size", "method", "ranking",
                                             "first_stage"))
def predict_prepared(prep: PreparedModel, x: QueryInputs | jax.Array, *, k1: int, k_pool: int,
                     max_size: int, method: enumeration.Method = enumeration.DEFAULT_METHOD,
                     ranking: Ranking | None = None,
                     first_stage: ann.Index | None = None) -> Prediction:
  """:func:`predict` from a prepared model (same outputs; see the module docstring).

  ``max_size`` must be the M the model was prepared for (its expansion uses M_M).
  ``first_stage``: an ANN index (:mod:`hyset_jax.inference.ann`; approximate shortlist), or
  None for the exact first stage.
  """
  return _predict_prepared(prep, x, k1, k_pool, max_size, method,
                           (DEFAULT_RANKING if ranking is None else ranking,), first_stage)[0]


_RANKINGS_STATIC = ("k1", "k_pool", "max_size", "method", "rankings", "first_stage")


def _predict_rankings(prep: PreparedModel, x: QueryInputs | jax.Array, *, k1: int,
                      k_pool: int, max_size: int, rankings: tuple[Ranking, ...],
                      method: enumeration.Method = enumeration.DEFAULT_METHOD,
                      first_stage: ann.Index | None = None) -> tuple[Prediction, ...]:
  return _predict_prepared(prep, x, k1, k_pool, max_size, method, rankings, first_stage)


@functools.partial(jax.jit, static_argnames=_RANKINGS_STATIC)
def predict_prepared_rankings(prep: PreparedModel, x: QueryInputs | jax.Array, *, k1: int,
                              k_pool: int, max_size: int, rankings: tuple[Ranking, ...],
                              method: enumeration.Method = enumeration.DEFAULT_METHOD,
                              first_stage: ann.Index | None = None
                              ) -> tuple[Prediction, ...]:
  """:func:`predict_prepared` for several ranking methods in one program (stage 1, the expansion
  and stage 2 once; the i-th Prediction ranks by ``rankings[i]``, its other fields shared)."""
  return _predict_rankings(prep, x, k1=k1, k_pool=k_pool, max_size=max_size, rankings=rankings,
                           method=method, first_stage=first_stage)


def own_rankings_program(on_trace=None):
  """A ``jax.jit`` of :func:`predict_prepared_rankings`' computation that is the caller's own
  (for :func:`predict_batched`'s ``program``): JAX keys compiled programs by the function, so
  they are freed with this one, where the module-level function keeps one per argument shape
  for the life of the process (a server whose library changes size: serve/retriever.py).
  ``on_trace``: called each time it traces, i.e. compiles."""
  def run(prep, x, **kw):
    if on_trace is not None:
      on_trace()
    return _predict_rankings(prep, x, **kw)
  return jax.jit(run, static_argnames=_RANKINGS_STATIC)


def predict_batched(model: HysetParams | PreparedModel, x: QueryInputs | np.ndarray, *, k1: int,
                    k_pool: int, max_size: int, batch_size: int = 256,
                    method: enumeration.Method = enumeration.DEFAULT_METHOD,
                    ranking: Ranking | None = None, progress: bool = False,
                    neighbor_table: bool | None = None,
                    rankings: tuple[Ranking, ...] | None = None,
                    first_stage: ann.Index | None = None, program=None,
                    precision: choices.Precision = choices.DEFAULT_PRECISION
                    ) -> Prediction | tuple[Prediction, ...]:
  """:func:`predict_prepared` over any number of queries in fixed-size chunks (one compilation
  of :func:`predict_prepared_rankings`, which the single-ranking case runs with one name).

  Args:
    model: θ (prepared here) or a :class:`PreparedModel` (prepared with this ``max_size``).
    x: the queries (:class:`QueryInputs` with what the model's terms need, e.g. lexical scores,
      else ValueError; an f32[Q, d_r] array is the embedding alone).
    k1, k_pool, max_size, method, ranking: as :func:`predict`.
    batch_size: queries per call; the last chunk is padded so every call has the same shape.
    progress: show a progress bar.
    neighbor_table: when ``model`` is θ, whether to build the neighbour table; None: when it
      pays for itself here (Q·K1 ≥ N: the table costs N²·d, a full scan N·K1·d per query).
    precision: when ``model`` is θ, the dtype it is prepared in (:func:`prepare`).
    rankings: instead of ``ranking``, several methods at once (one stage 2 for all of them).
    first_stage: an ANN index over the model's Z (:func:`ann.load_or_build`): stage 1 and the
      expansion through it (approximate; filtered or lexical queries stay exact); None: exact.
      With it, a θ ``model`` is prepared without the neighbour table unless asked for.
    program: the compiled function each chunk runs through (:func:`own_rankings_program`);
      None: the module-level :func:`predict_prepared_rankings`.

  Returns:
    Prediction of NumPy arrays; with ``rankings``, one per method, in that order.
  """
  if rankings is not None and ranking is not None:
    raise ValueError("predict_batched takes ranking or rankings, not both")
  names = tuple(rankings) if rankings is not None else (ranking or DEFAULT_RANKING,)
  params = model.params if isinstance(model, PreparedModel) else model
  num_tools = int(params.tool_embeddings.shape[0])
  subsets.validate_sizes(k_pool, max_size, k1=k1, num_tools=num_tools)
  x = query_inputs.check(query_inputs.of(x), params)
  n = x.num_queries
  if not isinstance(model, PreparedModel):
    if neighbor_table is None:
      neighbor_table = first_stage is None and n * k1 >= num_tools
    model = prepare(model, max_size=max_size, k_pool=k_pool, neighbor_table=neighbor_table,
                    precision=precision)
  batch_size = max(1, min(batch_size, n))
  chunks, starts = [], range(0, n, batch_size)
  if progress:
    from tqdm import tqdm
    starts = tqdm(starts, desc="predict", unit="batch")
  for start in starts:
    pad = batch_size - min(batch_size, n - start)

    def rows(a, start=start, pad=pad):  # this chunk's rows, padded to batch_size
      a = np.asarray(a[start:start + batch_size])
      # A filter's padding rows allow every tool (a row with none would be undefined).
      dtype, fill = (bool, True) if a.dtype == bool else (np.float32, 0)
      a = a.astype(dtype)
      return np.concatenate([a, np.full((pad,) + a.shape[1:], fill, dtype)]) if pad else a
    out = (program or predict_prepared_rankings)(
        model, jax.tree.map(rows, x), k1=k1, k_pool=k_pool, max_size=max_size, method=method,
        rankings=names, first_stage=first_stage)
    chunks.append(jax.tree.map(lambda a, m=batch_size - pad: np.asarray(a)[:m], out))
  preds = tuple(Prediction(*(np.concatenate(parts) for parts in zip(*(c[i] for c in chunks))))
                for i in range(len(names)))
  return preds[0] if rankings is None else preds
