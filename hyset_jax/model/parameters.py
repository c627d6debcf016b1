"""θ's parametrisation, in one place: initialisation, the trained leaves, the ablations and the
constraints of Eq. 11.

θ = (Z, M_2..M_M, P, q) is a pytree of arrays (:class:`hyset_jax.model.scoring.HysetParams`); the maths
that uses it lives in :mod:`hyset_jax.model.scoring` as pure functions. Training updates a flat dict of
*trained leaves* (``init_theta``); :func:`materialize` turns it into the full θ for the configured
ablation and :func:`constrain` projects it back onto unit rows and symmetric M_m after every
update and before every export.

We keep θ as a plain pytree rather than a Flax NNX module: every consumer (the jitted train step,
Orbax, the exports, the NumPy reference scorer, sharding annotations) wants the arrays, and a
module would only wrap them. The query tower is a handful of stacked matrices, not a network
with state.

The natural start makes the untrained scorer exactly the dense retriever: Z = the normalised
tool-encoder embeddings, P = identity (when d_r = d_z), M_m = 0 and a tower whose output layers are
0. Then ℓ(x, t) = r·z_t is the cosine similarity (r is unit-norm), F_set = 0, and
F_align(E) ≤ max_{t∈E} ℓ with equality only for singletons of the top tool, so both the stage-1
ranking and the best set agree with cosine.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hyset_jax.errors import UserError
from hyset_jax.model.scoring import HysetParams, QueryInteraction, QueryTower, symmetrize

# The ablations of paper §3.3: per-cardinality M_m (HYSET), one shared learned M, a fixed
# identity M, or no F_set at all.
INTERACTIONS = ("per_cardinality", "shared", "identity", "none")


def normalize_rows(x: jax.Array, eps: float = 1e-12) -> jax.Array:
  """Rows scaled to unit L2 norm (the constraint ‖z_j‖ = 1 of Eq. 11). f32[N, d] -> f32[N, d]."""
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), eps)


def init_tower(query_dim: int, depth: int, hidden: int, key: jax.Array) -> QueryTower | None:
  """A depth-``depth`` residual tower that starts as the identity (output layers 0); None for 0.

  The input layers are He-initialised so that gradients reach the (zero) output layers.
  """
  if depth == 0:
    return None
  hidden = hidden or query_dim
  w_in = jax.random.normal(key, (depth, query_dim, hidden), jnp.float32) * np.sqrt(2 / query_dim)
  return QueryTower(w_in, jnp.zeros((depth, hidden), jnp.float32),
                    jnp.zeros((depth, hidden, query_dim), jnp.float32),
                    jnp.zeros((depth, query_dim), jnp.float32))


def init_conditioned(query_dim: int, tool_dim: int, max_set_size: int, rank: int,
                     key: jax.Array) -> QueryInteraction:
  """The query-conditioned set term at 0 (W, v, b = 0); u random so W gets gradients."""
  k = max_set_size - 1
  u = jax.random.normal(key, (k, tool_dim, rank), jnp.float32) / np.sqrt(tool_dim)
  return QueryInteraction(u, jnp.zeros((k, query_dim, rank), jnp.float32),
                          jnp.zeros((k, query_dim), jnp.float32), jnp.zeros((k,), jnp.float32))


def init_params(tool_embeddings, query_dim: int, max_set_size: int,
                key: jax.Array | None = None, scale: float = 1.0, tower_depth: int = 0,
                tower_hidden: int = 0, conditioned_rank: int | None = None) -> HysetParams:
  """θ at the natural start (see the module docstring).

  Args:
    tool_embeddings: f32[N, d_z] tool-encoder embeddings (normalised here).
    query_dim: d_r of the query encoder.
    max_set_size: M ≥ 2, the largest cardinality scored.
    key: PRNG key for P when d_r ≠ d_z (a random map with orthonormal rows or columns, so
      lengths are preserved as far as the shapes allow) and for the tower's input layers.
    scale: P is multiplied by this. ℓ = scale · cos keeps the dense ranking exactly (and the
      best set is still the top singleton) but sets the logit range the softmaxes of
      F_align and of the training loss start from: an inverse temperature, as in
      contrastive retrievers (20 ≈ temperature 0.05).
    tower_depth, tower_hidden: the query tower's layers and width (0 = d_r).
    conditioned_rank: R of the query-conditioned set term; None = no such term.

  Returns:
    HysetParams with Z unit rows, P = scale · I (or the random map), M_m = 0 and an
    identity tower.
  """
  z = jnp.asarray(tool_embeddings, dtype=jnp.float32)  # jnp: traceable, for jax.eval_shape
  if z.ndim != 2 or z.shape[0] == 0:
    raise UserError(f"tool embeddings must be a non-empty [N, d] matrix, got shape {z.shape}")
  if max_set_size < 2:
    raise UserError(f"max_set_size must be ≥ 2, got {max_set_size}")
  key = jax.random.key(0) if key is None else key
  p_key, tower_key, cond_key = jax.random.split(key, 3)
  d_z = z.shape[1]
  if query_dim == d_z:
    p = jnp.eye(d_z, dtype=jnp.float32)
  else:
    a = jax.random.normal(p_key, (max(query_dim, d_z), min(query_dim, d_z)), jnp.float32)
    q, _ = jnp.linalg.qr(a)
    p = q if query_dim > d_z else q.T
  return HysetParams(
      tool_embeddings=normalize_rows(jnp.asarray(z)),
      projection=scale * p,
      interactions=jnp.zeros((max_set_size - 1, d_z, d_z), jnp.float32),
      tower=init_tower(query_dim, tower_depth, tower_hidden, tower_key),
      conditioned=None if conditioned_rank is None else init_conditioned(
          query_dim, d_z, max_set_size, conditioned_rank, cond_key))


def init_theta(tool_embeddings: np.ndarray, query_dim: int, mc, seed: int) -> dict:
  """The trained leaves of θ for ``mc`` (a :class:`hyset_jax.config.ModelConfig`).

  Keys: ``z``, ``p``, ``m`` (per-cardinality: f32[M-1, d, d]; shared: f32[1, d, d]; absent for
  the fixed ablations), ``tower`` (absent at depth 0) and ``conditioned`` (absent when off).
  """
  p = init_params(tool_embeddings, query_dim, mc.max_set_size, jax.random.key(seed),
                  scale=mc.init_scale, tower_depth=mc.tower_depth, tower_hidden=mc.tower_hidden,
                  conditioned_rank=mc.conditioned_rank if mc.conditioned else None)
  return theta_of(p, mc)


def theta_of(params: HysetParams, mc) -> dict:
  """The trained leaves of full θ for ``mc``'s interaction mode (inverse of :func:`materialize`
  for per-cardinality and shared M; a trained model restarts from them)."""
  theta = {"z": params.tool_embeddings, "p": params.projection}
  if mc.interaction == "per_cardinality":
    theta["m"] = params.interactions
  elif mc.interaction == "shared":
    theta["m"] = params.interactions[:1]
  if params.tower is not None:
    theta["tower"] = params.tower
  if params.conditioned is not None:
    theta["conditioned"] = params.conditioned
  return theta


def materialize(theta: dict, mc) -> HysetParams:
  """Full θ (M_2..M_M) from the trained leaves; shared, identity and none are the ablations."""
  z = theta["z"]
  d, k = z.shape[1], mc.max_set_size - 1
  if mc.interaction == "per_cardinality":
    ms = theta["m"]
  elif mc.interaction == "shared":
    ms = jnp.broadcast_to(theta["m"], (k, d, d))
  elif mc.interaction == "identity":
    ms = jnp.broadcast_to(jnp.eye(d, dtype=z.dtype), (k, d, d))
  else:
    ms = jnp.zeros((k, d, d), z.dtype)
  return HysetParams(z, theta["p"], ms, theta.get("tower"), theta.get("conditioned"))


def constrain(theta: dict) -> dict:
  """The constraints of Eq. 11, after every update: unit rows of Z, symmetric M_m."""
  out = dict(theta, z=normalize_rows(theta["z"]))
  if "m" in out:
    out["m"] = symmetrize(out["m"])
  return out


def host_params(params: HysetParams) -> HysetParams:
  """θ as f32 NumPy arrays with the constraints applied, for model directories and exports."""
  host = jax.tree.map(lambda a: np.asarray(a, np.float32), jax.device_get(params))
  if params.prior is not None:  # its members are tool rows
    host = host._replace(prior=host.prior._replace(
        members=np.asarray(jax.device_get(params.prior.members), np.int32)))
  return host._replace(tool_embeddings=np.asarray(normalize_rows(host.tool_embeddings)),
                       interactions=np.asarray(symmetrize(host.interactions)))
