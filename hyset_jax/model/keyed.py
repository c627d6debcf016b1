"""z_t M_{|E|} for the member slots of a batch of candidate sets, computed once per distinct
(cardinality, tool) pair the batch holds: ``scoring.set_scores``' "keyed" order.

The training step's pools at large libraries are its user: a batch of 32 pools at the paper's
scale (13,860 tools, d = 768) holds ~3,200 distinct (cardinality, tool) pairs of the 55,440 that
the gather order multiplies, forward and backward. Pure functions, jit-friendly; the loop's
gradient is written out (:func:`chunk_products`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


# Rows per matrix product in :func:`member_products`. Each cardinality's rows are padded to a whole
# number of chunks, so smaller chunks waste less; 256 rows keep each product fast.
KEYED_CHUNK = 256


def _chunk_products(x: jax.Array, card: jax.Array, count: jax.Array,
                    interactions: jax.Array) -> jax.Array:
  """out[c] = x[c] M_{card[c]} for the first ``count`` chunks, 0 after; a loop of ``count``
  steps, so padding chunks cost nothing.
  f32[C, T, d], int32[C], int32[], f32[K, d, d] -> f32[C, T, d]."""
  def body(c, out):
    return jax.lax.dynamic_update_index_in_dim(out, x[c] @ interactions[card[c]], c, 0)
  return jax.lax.fori_loop(0, count, body, jnp.zeros_like(x))


@jax.custom_vjp
def chunk_products(x: jax.Array, card: jax.Array, count: jax.Array,
                   interactions: jax.Array) -> jax.Array:
  """:func:`_chunk_products` with its gradient written out, for the M_m only: autodiff of the
  loop would need a fixed trip count (every padding chunk run) and would move a zero [K, d, d]
  cotangent per chunk and matrix. x gets none: its rows' gradient is the caller's
  (``scoring.symmetric_interaction_scores``), which saves a product per chunk."""
  return _chunk_products(x, card, count, interactions)


def _chunk_products_fwd(x, card, count, interactions):
  return _chunk_products(x, card, count, interactions), (x, card, count, interactions)


def _chunk_products_bwd(res, ct):
  """dM_j = Σ_{card[c] = j} x[c]ᵀ ct[c], over the same chunks; x's cotangent 0."""
  x, card, count, interactions = res

  def body(c, dm):
    j = card[c]
    dm_j = jax.lax.dynamic_index_in_dim(dm, j, keepdims=False) + x[c].T @ ct[c]
    return jax.lax.dynamic_update_index_in_dim(dm, dm_j, j, 0)
  dm = jax.lax.fori_loop(0, count, body, jnp.zeros_like(interactions))
  return jnp.zeros_like(x), None, None, dm


chunk_products.defvjp(_chunk_products_fwd, _chunk_products_bwd)


def member_products(z: jax.Array, interactions: jax.Array, members: jax.Array, card: jax.Array,
                    used: jax.Array) -> jax.Array:
  """z_t M_{card} for the member slots of a batch's pools, computed once per (card, tool) pair
  the batch holds instead of for the whole library; differentiable in the M_m only (z's
  gradient is ``scoring.symmetric_interaction_scores``', through the gathered rows).

  ``set_scores``' gather order computes Z M_m for all N tools and M − 1 matrices:
  (M − 1)·N·d² multiply-adds, twice that in the backward pass, ~200 GFLOP per step at the
  paper's scale (13,860 tools, d = 768) whatever the batch, while a batch of 32 pools holds
  ~3,200 distinct (card, tool) pairs of the 55,440. Here the distinct pairs are sorted
  (jnp.unique under a static bound), each cardinality's rows padded to whole chunks of
  KEYED_CHUNK rows, and each chunk multiplied by its one matrix (:func:`chunk_products`). The
  same products, so the same values up to rounding.

  Args:
    z: f32[N, d] tool embeddings.
    interactions: f32[K, d, d] the M_m (K = M − 1).
    members: int[B, C, m] tool rows of each candidate set.
    card: int[B, C] each set's matrix, in [0, K).
    used: bool[B, C, m] the slots whose product is read (members of sets of ≥ 2 tools).

  Returns:
    f32[B, C, m, d]; 0 at unused slots.
  """
  z, interactions = jnp.asarray(z), jnp.asarray(interactions)       # indexed by tracers below
  n, d = z.shape
  k, t = interactions.shape[0], KEYED_CHUNK
  sentinel = k * n                                                   # sorts after every key
  keys = jnp.where(used, card[..., None] * n + members, sentinel).reshape(-1)
  size = min(keys.shape[0], k * n + 1)       # never more distinct keys than pairs + sentinel
  uniq, inverse = jnp.unique(keys, size=size, fill_value=sentinel, return_inverse=True)
  group = uniq // n                                                  # K for the sentinel
  counts = jnp.sum(group[None, :] == jnp.arange(k)[:, None], axis=1)  # [K] rows per card
  padded = (counts + t - 1) // t * t
  start, pstart = jnp.cumsum(counts) - counts, jnp.cumsum(padded) - padded
  length = (size + t - 1) // t * t + k * t                           # ≥ Σ padded, static
  gi = jnp.minimum(group, k - 1)
  pos = jnp.where(group < k, pstart[gi] + jnp.arange(size) - start[gi], length)  # [size]
  tool = jnp.zeros(length, jnp.int32).at[pos].set((uniq % n).astype(jnp.int32), mode="drop")
  bounds = jnp.cumsum(padded)                                        # each card's end row
  chunk_card = jnp.sum(bounds[None, :] <= jnp.arange(0, length, t)[:, None], axis=1)
  out = chunk_products(jax.lax.stop_gradient(z)[tool].reshape(-1, t, d),
                       jnp.minimum(chunk_card, k - 1).astype(jnp.int32),
                       (bounds[-1] // t).astype(jnp.int32), interactions).reshape(length, d)
  slot = jnp.minimum(pos, length - 1)[inverse.reshape(members.shape)]  # [B, C, m]
  return jnp.where(used[..., None], out[slot], 0.0)
