"""How a tool mask (:attr:`hyset_jax.model.query_inputs.QueryInputs.allowed`, built by
:mod:`hyset_jax.inference.filters`) acts on inference: stage 1 never picks a disallowed tool, and
stage 2 never prefers a set that holds one. Pure functions with shapes in the docstrings.

A disallowed tool's ℓ is -inf for the top K1 and its g the lowest finite value in the expansion,
so the shortlist holds the allowed tools the unfiltered rules pick from the allowed library
(disallowed ones only in its tail when fewer than K_pool are allowed); stage 2 scores any set
holding one far below every all-allowed set, and every output slot one occupies reads -1. With a
mask the expansion scans every tool (the neighbour table cannot know it); without one nothing of
this is traced.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def mask_logits(logits: jax.Array, allowed: jax.Array | None) -> jax.Array:
  """ℓ f32[Q, N] with -inf for the tools ``allowed`` (bool[Q, N] or None) rules out."""
  return logits if allowed is None else jnp.where(allowed, logits, -jnp.inf)


def penalise(logits: jax.Array, pairs: jax.Array, allowed: jax.Array, max_size: int
              ) -> tuple[jax.Array, jax.Array]:
  """ℓ f32[Q, K] and G_m f32[Q, M−1, K, K] with the slots ``allowed`` (bool[Q, K]) rules out
  set to -(4B + 1) in ℓ and in their pair rows and columns, B = max|ℓ| + C(M, 2)·max|G| over
  the allowed slots (per query).

  Why that value: an all-allowed set scores ≥ -B (F_align is a mean of its ℓ, F_set at most
  C(M, 2) pairs). A set holding a disallowed d and an allowed tool scores ≤ B + (-(4B + 1)):
  F_align ≤ its largest ℓ, and at least one of its pairs is d's. A set of disallowed tools
  scores ≤ -(4B + 1) (F_align is then the penalty itself; singletons included). So each is
  strictly below every all-allowed set, and the argmax, the greedy picks and the per-tool
  maxima never prefer one. Finite, because F_align's softmax of an -inf ℓ is 0·(-inf) = NaN.
  """
  pair_ok = allowed[:, None, :, None] & allowed[:, None, None, :]        # [Q, 1, K, K]
  bound = (jnp.max(jnp.where(allowed, jnp.abs(logits), 0.0), axis=1)
           + math.comb(max_size, 2) * jnp.max(jnp.where(pair_ok, jnp.abs(pairs), 0.0),
                                              axis=(1, 2, 3)))
  low = -(4.0 * bound + 1.0)                                             # [Q]
  return (jnp.where(allowed, logits, low[:, None]),
          jnp.where(pair_ok, pairs, low[:, None, None, None]))
