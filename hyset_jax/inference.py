"""Two-stage set-level inference (paper Eq. 12-14, design.md §3).

Stage 1 scores every tool by ℓ(x, t) and keeps the top K1 (S0). Complementarity expansion adds
the K_pool − K1 other tools with the largest g(t) = max_{i∈S0} z_tᵀ M_M z_i (Eq. 13). Stage 2
scores every subset of the shortlist S of size 1..M and returns the argmax (Eq. 14). A second
output ranks tools for Recall/NDCG/COMP@K: greedy marginal gain under F for the first M positions,
then the rest of the shortlist by ℓ.

Shortlist order (the ``shortlist`` of ``hyset predict``): S0 by descending ℓ, then the expansion
tools by descending g, ties in g by descending ℓ. Remaining ties go to the lower tool row; the
greedy steps break ties towards the earlier shortlist position.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hyset_jax import enumeration, scoring
from hyset_jax.scoring import HysetParams

# Ranking methods for Recall/NDCG/COMP@K (the delivered set is the exact argmax of Eq. 14 for
# every one of them). "greedy" is the paper's greedy marginal gain.
RANKINGS = ("greedy", "logit", "set-first")
DEFAULT_RANKING = "greedy"


class Shortlist(NamedTuple):
  """tools: int32[Q, K_pool] tool rows in shortlist order; logits: f32[Q, K_pool] their ℓ."""
  tools: jax.Array
  logits: jax.Array


def shortlist(params: HysetParams, query_emb: jax.Array, k1: int, k_pool: int,
              max_size: int) -> Shortlist:
  """Stage 1 and complementarity expansion (Eq. 12-13).

  Args:
    params: θ.
    query_emb: f32[Q, d_r].
    k1: |S0|.
    k_pool: |S|.
    max_size: M; the expansion uses M_M.

  Returns:
    Shortlist of K_pool tools per query.
  """
  z = params.tool_embeddings
  logits = scoring.query_logits(params, query_emb)                       # [Q, N]
  s0_logits, s0 = jax.lax.top_k(logits, k1)                              # [Q, K1]
  keyed = z[s0] @ params.interactions[max_size - 2]                      # [Q, K1, d]
  g = jnp.max(jnp.einsum("nd,qkd->qnk", z, keyed), axis=-1)              # [Q, N]
  in_s0 = jnp.zeros(g.shape, bool).at[jnp.arange(g.shape[0])[:, None], s0].set(True)
  g = jnp.where(in_s0, -jnp.inf, g)
  # Order the expansion by g, ties by ℓ (then by row). With M_M = 0 every g ties, so the
  # untrained model's shortlist is exactly the top K_pool by ℓ: the dense retriever.
  n_ext = k_pool - k1
  threshold = jax.lax.top_k(g, n_ext)[0][:, -1:]
  key = jnp.where(g > threshold, jnp.inf, jnp.where(g == threshold, logits, -jnp.inf))
  cand = jax.lax.top_k(key, n_ext)[1]                                    # [Q, K_pool - K1]
  cand_g = jnp.take_along_axis(g, cand, axis=1)
  cand_l = jnp.take_along_axis(logits, cand, axis=1)
  extra = jax.lax.sort((-cand_g, -cand_l, cand), dimension=1, num_keys=3)[2]
  tools = jnp.concatenate([s0, extra], axis=1).astype(jnp.int32)
  return Shortlist(tools, jnp.take_along_axis(logits, tools, axis=1))


def greedy_ranking(logits: jax.Array, pairs: jax.Array, steps: int) -> jax.Array:
  """Greedy marginal gain: A_k = A_{k−1} ∪ argmax_t F(A_{k−1} ∪ {t}), for ``steps`` steps.

  Args:
    logits: f32[Q, K] ℓ of the shortlist.
    pairs: f32[Q, M−1, K, K] pair matrices G_m.
    steps: number of greedy picks (≤ M).

  Returns:
    int32[Q, steps] shortlist positions in pick order.
  """
  q, k = logits.shape
  chosen = jnp.zeros((q, k), bool)
  eye = jnp.eye(k, dtype=bool)
  picks = []
  for size in range(1, steps + 1):
    cand = chosen[:, None, :] | eye[None]                                # [Q, K(t), K]
    f = scoring.align_scores(jnp.broadcast_to(logits[:, None, :], cand.shape), cand)
    if size >= 2:
      gm = jnp.where(eye, 0.0, pairs[:, size - 2])
      f = f + 0.5 * jnp.einsum("qti,qij,qtj->qt", cand.astype(gm.dtype), gm, cand.astype(gm.dtype))
    pick = jnp.argmax(jnp.where(chosen, -jnp.inf, f), axis=1)             # [Q]
    picks.append(pick)
    chosen = chosen | jax.nn.one_hot(pick, k, dtype=bool)
  return jnp.stack(picks, axis=1).astype(jnp.int32)


class Prediction(NamedTuple):
  """Outputs for a batch of queries; tool fields are rows of the tool library.

  Attributes:
    shortlist: int32[Q, K_pool] in shortlist order.
    set_tools: int32[Q, M] the best set, members in ascending shortlist position, padded with -1.
    set_size: int32[Q].
    set_score: f32[Q].
    ranking: int32[Q, K_pool] greedy picks, then the rest of the shortlist by descending ℓ.
  """
  shortlist: jax.Array
  set_tools: jax.Array
  set_size: jax.Array
  set_score: jax.Array
  ranking: jax.Array


def rerank(params: HysetParams, query_emb: jax.Array, sl: Shortlist, *, k_pool: int,
           max_size: int, method: enumeration.Method = enumeration.DEFAULT_METHOD):
  """Stage 2 (Eq. 14) and the greedy ranking, from a shortlist.

  Args:
    params: θ; ``params.interactions`` must hold at least M − 1 matrices.
    query_emb: f32[Q, d_r] (the query-conditioned set term needs it).
    sl: the shortlist of :func:`shortlist`.
    k_pool, max_size: K_pool, M.
    method: the enumeration implementation.

  Returns:
    (set_tools int32[Q, M] padded with -1, set_size int32[Q], set_score f32[Q],
    ranking int32[Q, K_pool]) — the fields of :class:`Prediction` after ``shortlist``.
  """
  params = truncate(params, max_size)
  table = enumeration.subset_table(k_pool, max_size)
  pairs = scoring.shortlist_pairs(params, query_emb, sl.tools)
  best = enumeration.best_sets(enumeration.score_subsets(sl.logits, pairs, table, method),
                               table, k=1)
  # Members in ascending shortlist position, padding (-1) last.
  pos = jnp.sort(jnp.where(best.mask[:, 0], best.positions[:, 0], k_pool), axis=1)
  valid = pos < k_pool
  set_tools = jnp.where(valid, jnp.take_along_axis(sl.tools, jnp.minimum(pos, k_pool - 1), 1), -1)

  picks = greedy_ranking(sl.logits, pairs, max_size)                     # [Q, M]
  picked = jnp.any(jax.nn.one_hot(picks, k_pool, dtype=bool), axis=1)   # [Q, K]
  rest = jnp.argsort(jnp.where(picked, jnp.inf, -sl.logits), axis=1,
                     stable=True)[:, :k_pool - max_size]
  ranking = jnp.take_along_axis(sl.tools, jnp.concatenate([picks, rest], axis=1), axis=1)
  return (set_tools.astype(jnp.int32), jnp.sum(valid, 1).astype(jnp.int32), best.scores[:, 0],
          ranking.astype(jnp.int32))


@functools.partial(jax.jit, static_argnames=("k1", "k_pool", "max_size", "method"))
def predict(params: HysetParams, query_emb: jax.Array, *, k1: int, k_pool: int, max_size: int,
            method: enumeration.Method = enumeration.DEFAULT_METHOD) -> Prediction:
  """The full two-stage path for a batch of queries: :func:`shortlist`, then :func:`rerank`.

  Args:
    params: θ; ``params.interactions`` must hold at least M − 1 matrices (M_2..M_M are used).
    query_emb: f32[Q, d_r].
    k1, k_pool, max_size: K1, K_pool, M (validate with :func:`enumeration.validate_sizes`).
    method: the enumeration implementation.

  Returns:
    Prediction.
  """
  params = truncate(params, max_size)
  sl = shortlist(params, query_emb, k1, k_pool, max_size)
  return Prediction(sl.tools, *rerank(params, query_emb, sl, k_pool=k_pool, max_size=max_size,
                                      method=method))


def truncate(params: HysetParams, max_size: int) -> HysetParams:
  """θ for sets of at most ``max_size`` tools (M_2..M_max_size and their conditioned terms)."""
  qi = params.conditioned
  if qi is not None:
    qi = type(qi)(*(a[:max_size - 1] for a in qi))
  return params._replace(interactions=params.interactions[:max_size - 1], conditioned=qi)


def predict_batched(params: HysetParams, query_emb: np.ndarray, *, k1: int, k_pool: int,
                    max_size: int, batch_size: int = 256,
                    method: enumeration.Method = enumeration.DEFAULT_METHOD,
                    progress: bool = False) -> Prediction:
  """:func:`predict` over any number of queries in fixed-size chunks (one compilation).

  The last chunk is padded to ``batch_size`` so every call has the same shape.
  Returns NumPy arrays.
  """
  enumeration.validate_sizes(k_pool, max_size, k1=k1,
                             num_tools=int(params.tool_embeddings.shape[0]))
  n = query_emb.shape[0]
  batch_size = max(1, min(batch_size, n))
  chunks = []
  starts = range(0, n, batch_size)
  if progress:
    from tqdm import tqdm
    starts = tqdm(starts, desc="predict", unit="batch")
  for start in starts:
    chunk = np.asarray(query_emb[start:start + batch_size], np.float32)
    pad = batch_size - chunk.shape[0]
    if pad:
      chunk = np.concatenate([chunk, np.zeros((pad, chunk.shape[1]), np.float32)])
    out = predict(params, chunk, k1=k1, k_pool=k_pool, max_size=max_size, method=method)
    chunks.append(jax.tree.map(lambda a, m=batch_size - pad: np.asarray(a)[:m], out))
  return Prediction(*(np.concatenate(parts) for parts in zip(*chunks)))
