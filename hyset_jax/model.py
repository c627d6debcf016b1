"""The HYSET scorer as a Flax NNX module holding θ = (Z, M_2..M_M, P).

The maths lives in :mod:`hyset_jax.scoring` as pure functions over :class:`HysetParams`; this
module owns the parameters, their initialisation (design.md §1) and the constraint of Eq. 11.

The natural start makes the untrained scorer exactly the dense retriever: Z = the normalised
tool-encoder embeddings, P = identity (when d_r = d_z), M_m = 0. Then ℓ(x, t) = r·z_t is the
cosine similarity (r is unit-norm), F_set = 0, and F_align(E) ≤ max_{t∈E} ℓ with equality only for
singletons of the top tool, so both the stage-1 ranking and the best set agree with cosine.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hyset_jax import scoring
from hyset_jax.errors import UserError
from hyset_jax.scoring import HysetParams


def normalize_rows(x: jax.Array, eps: float = 1e-12) -> jax.Array:
  """Rows scaled to unit L2 norm (the constraint ‖z_j‖ = 1 of Eq. 11). f32[N, d] -> f32[N, d]."""
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), eps)


def init_params(tool_embeddings, query_dim: int, max_set_size: int,
                key: jax.Array | None = None, scale: float = 1.0) -> HysetParams:
  """θ at the natural start of design.md §1.

  Args:
    tool_embeddings: f32[N, d_z] tool-encoder embeddings (normalised here).
    query_dim: d_r of the query encoder.
    max_set_size: M ≥ 2, the largest cardinality scored.
    key: PRNG key for P when d_r ≠ d_z (a random map with orthonormal rows or columns, so
      lengths are preserved as far as the shapes allow). Unused when d_r = d_z.
    scale: P is multiplied by this. ℓ = scale · cos keeps the dense ranking exactly (and the
      best set is still the top singleton) but sets the logit range the softmaxes of
      F_align and of the training loss start from: an inverse temperature, as in
      contrastive retrievers (20 ≈ temperature 0.05).

  Returns:
    HysetParams with Z unit rows, P = scale · I (or the random map) and M_m = 0.
  """
  z = np.asarray(tool_embeddings, dtype=np.float32)
  if z.ndim != 2 or z.shape[0] == 0:
    raise UserError(f"tool embeddings must be a non-empty [N, d] matrix, got shape {z.shape}")
  if max_set_size < 2:
    raise UserError(f"max_set_size must be ≥ 2, got {max_set_size}")
  d_z = z.shape[1]
  if query_dim == d_z:
    p = jnp.eye(d_z, dtype=jnp.float32)
  else:
    key = jax.random.key(0) if key is None else key
    a = jax.random.normal(key, (max(query_dim, d_z), min(query_dim, d_z)), jnp.float32)
    q, _ = jnp.linalg.qr(a)
    p = q if query_dim > d_z else q.T
  return HysetParams(
      tool_embeddings=normalize_rows(jnp.asarray(z)),
      projection=scale * p,
      interactions=jnp.zeros((max_set_size - 1, d_z, d_z), jnp.float32))


class HysetScorer(nnx.Module):
  """θ = (Z, {M_m}, P) and the set score F(x, E) of Eq. 2.

  >>> import numpy as np
  >>> scorer = HysetScorer(init_params(np.eye(3), query_dim=3, max_set_size=2))
  >>> scorer(np.eye(3)[:1], np.array([[[0, 1]]]), np.array([[[True, False]]])).tolist()
  [[1.0]]
  """

  def __init__(self, params: HysetParams):
    self.tool_embeddings = nnx.Param(jnp.asarray(params.tool_embeddings, jnp.float32))
    self.projection = nnx.Param(jnp.asarray(params.projection, jnp.float32))
    self.interactions = nnx.Param(jnp.asarray(params.interactions, jnp.float32))

  @property
  def params(self) -> HysetParams:
    return HysetParams(self.tool_embeddings[...], self.projection[...], self.interactions[...])

  def __call__(self, query_emb: jax.Array, members: jax.Array, mask: jax.Array) -> jax.Array:
    """F(x, E): f32[B, d_r], int[B, C, m], bool[B, C, m] -> f32[B, C]."""
    return scoring.set_scores(self.params, query_emb, members, mask)

  def tool_logits(self, query_emb: jax.Array) -> jax.Array:
    """ℓ(x, t) for every tool: f32[B, d_r] -> f32[B, N]."""
    p = self.params
    return scoring.tool_logits(query_emb, p.projection, p.tool_embeddings)
