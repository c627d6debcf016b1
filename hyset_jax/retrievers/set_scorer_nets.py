"""The two learned set scorers of the paper's baselines (§3.3), as plain JAX pytrees.

Both score a candidate set E of a query's items (its shortlist tools) from per-item features

  e_t = gelu(z_t A + (x ⊙ z_t) B + ℓ̃_t c + b),   ℓ̃ = log-softmax of ℓ over the shortlist,

so a set is judged by which tools it holds (z_t, frozen), how each matches the query (x ⊙ z_t)
and how ℓ ranks it (ℓ̃_t): the query conditions every element.

- DeepSets (Zaheer et al., 2017): F(x, E) = w · gelu(Σ_{t ∈ E} φ(e_t) W + x U + b₂) + b₃ with
  φ(e) = gelu(e W₁ + b₁): a sum over the members, then ρ with the query added.
- Set Transformer (Lee et al., 2019): one SAB over the members (multi-head self-attention
  and a feed-forward block, each residual with LayerNorm), then PMA with one seed s = s₀ + x U
  attending over them, a residual feed-forward block, and a linear read-out.

Shapes: ``items`` f32[B, I, h] (the e_t of each query's I items), ``members`` int[B, C, M] item
positions of C candidate sets a query (or int[C, M], one table for all), ``mask`` (True for
real members); scores f32[B, C]. e_t (and DeepSets' φ) are computed once per item, before the
members are gathered; the sets are then one flat batch of B·C.
"""
from __future__ import annotations

from typing import Any

KINDS = ("deepsets", "set-transformer")


def init_params(kind: str, dim: int, width: int, key: Any) -> dict[str, Any]:
  """Initial parameters: ``dim`` = d of the frozen embeddings, ``width`` = h.

  Matrices ~ N(0, 1/fan_in) (unit-scale activations), vectors ~ N(0, 1/h), biases and
  LayerNorm shifts 0, scales 1.
  """
  import jax
  import jax.numpy as jnp

  shapes = {"a": (dim, width), "b": (dim, width), "u": (dim, width), "c": (width,)}
  if kind == "deepsets":
    shapes.update(w1=(width, width), w2=(width, width), w3=(width,))
  elif kind == "set-transformer":
    shapes.update({n: (width, width) for n in ("wq", "wk", "wv", "wo", "f1", "f2", "pq", "pk",
                                                "pv", "po", "g1", "g2")}, s0=(width,),
                  w3=(width,))
  else:
    raise ValueError(f"unknown set scorer {kind!r}; choose from {', '.join(KINDS)}")
  params = {}
  for i, (name, shape) in enumerate(sorted(shapes.items())):
    std = 1.0 / shape[0] ** 0.5 if len(shape) == 2 else 1.0 / width ** 0.5
    params[name] = jax.random.normal(jax.random.fold_in(key, i), shape) * std
  for name in ("b0", "b1", "b2", "bf1", "bf2", "bg1", "bg2"):
    params[name] = jnp.zeros(width)
  params["b3"] = jnp.zeros(())
  for n in range(4):
    params[f"ln{n}_g"], params[f"ln{n}_b"] = jnp.ones(width), jnp.zeros(width)
  return params


def item_features(params: dict[str, Any], x: Any, z: Any, ell: Any) -> Any:
  """f32[..., I, h] e_t for f32[..., d] queries, f32[..., I, d] tools, f32[..., I] ℓ̃."""
  import jax
  mixed = z @ params["a"] + (x[..., None, :] * z) @ params["b"]
  return jax.nn.gelu(mixed + ell[..., None] * params["c"] + params["b0"])


def _layer_norm(params: dict[str, Any], n: int, h: Any) -> Any:
  mean = h.mean(-1, keepdims=True)
  var = ((h - mean) ** 2).mean(-1, keepdims=True)
  return (h - mean) * (var + 1e-5) ** -0.5 * params[f"ln{n}_g"] + params[f"ln{n}_b"]


def _gather(items: Any, onehot: Any) -> Any:
  """f32[B·C, M, h] the members' rows of ``items`` (f32[B, I, h]) for ``onehot`` f32[B, C, M, I]
  or f32[C, M, I] (one candidate table for every query). A one-hot product, not an indexed
  gather: its gradient is a matmul where a gather's is a scatter-add, slower on XLA:CPU."""
  import jax.numpy as jnp
  spec = "bcmi,bih->bcmh" if onehot.ndim == 4 else "cmi,bih->bcmh"
  out = jnp.einsum(spec, onehot, items)
  return out.reshape(-1, *out.shape[2:])


def _deepsets(params: dict[str, Any], items: Any, u: Any, onehot: Any, mask: Any) -> Any:
  import jax
  phi = jax.nn.gelu(items @ params["w1"] + params["b1"])  # [B, I, h]
  pooled = (_gather(phi, onehot) * mask[..., None]).sum(-2)  # [B·C, h]
  hidden = jax.nn.gelu(pooled @ params["w2"] + u + params["b2"])
  return hidden @ params["w3"] + params["b3"]


def _attend(q: Any, k: Any, v: Any, mask: Any, heads: int) -> Any:
  """Masked multi-head attention: q f32[C, Q, h], k/v f32[C, M, h], mask bool[C, M]."""
  import jax
  import jax.numpy as jnp
  c, nq, h = q.shape
  split = lambda a: a.reshape(*a.shape[:-1], heads, h // heads)
  logits = jnp.einsum("cqhd,cmhd->chqm", split(q), split(k)) * (h // heads) ** -0.5
  logits = jnp.where(mask[:, None, None, :], logits, -1e9)
  out = jnp.einsum("chqm,cmhd->cqhd", jax.nn.softmax(logits, axis=-1), split(v))
  return out.reshape(c, nq, h)


def _set_transformer(params: dict[str, Any], items: Any, u: Any, onehot: Any, mask: Any,
                     heads: int) -> Any:
  import jax
  p = params
  # One gather, then the projections as flat matmuls: each further batched one-hot product
  # cost more than the three projections of every member (measured, XLA:CPU).
  h0 = _gather(items, onehot)  # [B·C, M, h]
  q, k, v = h0 @ p["wq"], h0 @ p["wk"], h0 @ p["wv"]
  h1 = _layer_norm(p, 0, h0 + _attend(q, k, v, mask, heads) @ p["wo"])
  ff = jax.nn.gelu(h1 @ p["f1"] + p["bf1"]) @ p["f2"] + p["bf2"]
  h2 = _layer_norm(p, 1, h1 + ff)
  seeds = (p["s0"] + u)[:, None, :]  # [B·C, 1, h]: PMA's one seed, conditioned on the query
  o1 = _layer_norm(p, 2, seeds + _attend(seeds @ p["pq"], h2 @ p["pk"], h2 @ p["pv"], mask,
                                         heads) @ p["po"])
  o2 = _layer_norm(p, 3, o1 + jax.nn.gelu(o1 @ p["g1"] + p["bg1"]) @ p["g2"] + p["bg2"])
  return o2[:, 0] @ p["w3"] + p["b3"]


def set_scores(kind: str, params: dict[str, Any], x: Any, items: Any, members: Any, mask: Any,
               heads: int = 4) -> Any:
  """F(x, E) of C candidate sets of each of B queries.

  Args:
    kind: one of :data:`KINDS`.
    x: f32[B, d] the query embeddings.
    items: f32[B, I, h] their items' features (:func:`item_features`).
    members: int[B, C, M] item positions, or int[C, M] the same candidates for every query;
      masked slots may hold any valid position.
    mask: bool, the shape of ``members``.
    heads: attention heads (Set Transformer).

  Returns:
    f32[B, C] scores.
  """
  import jax
  import jax.numpy as jnp
  b, c = x.shape[0], members.shape[-2]
  onehot = jax.nn.one_hot(members, items.shape[1], dtype=items.dtype)
  flat_mask = jnp.broadcast_to(mask, (b, *mask.shape[-2:])).reshape(b * c, -1)
  u = jnp.repeat(x @ params["u"], c, axis=0)  # [B·C, h]
  if kind == "deepsets":
    return _deepsets(params, items, u, onehot, flat_mask).reshape(b, c)
  return _set_transformer(params, items, u, onehot, flat_mask, heads).reshape(b, c)
