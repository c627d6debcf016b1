"""Exact complementarity expansion (paper Eq. 13) from a per-tool neighbour table.

The expansion adds to S0 (the K1 tools of largest ℓ) the K_pool − K1 other tools of largest
g(t) = max_{i∈S0} z_tᵀ M_M z_i, ties in g by larger ℓ, then by lower row. Scanning every tool
costs 2·N·d·K1 flops per query (~320 MFLOP at N = 13,860, d = 768). This module makes it
O(K1·W) per query with a table built once per model:

  row i of the table = the W tools t ≠ i with the largest s(i, t) = z_iᵀ M_M z_t, W ≥ K_pool − 1.

Why scanning the union of S0's rows is exact. Let t be one of the true expansion tools and i*
a maximiser of g(t). If t is not in row i*, all W tools of row i* have s(i*, ·) ≥ s(i*, t) = g(t);
at most K1 − 1 of them are in S0 (row i* excludes i* itself), so ≥ W − K1 + 1 ≥ K_pool − K1 tools
outside S0 have g ≥ g(t). If those were all *strictly* larger, t could not be among the top
K_pool − K1 — so a miss needs row i*'s last kept score b_{i*} to equal g(t). Moreover every row
holds ≥ K_pool − K1 tools outside S0 with g ≥ b_i, so the (K_pool − K1)-th best g found, τ,
satisfies τ ≥ b_i for every i ∈ S0, and a miss needs b_{i*} = g(t) = τ. :func:`expand` therefore
reports a *boundary tie* when some b_i ≥ τ, and the caller falls back to the full scan for that
batch (with M_M = 0, an untrained model, every g ties and the full scan's ℓ order is used).

Scores of the union come from the table itself: for a candidate u the largest s(i, u) over the
rows holding it is ≤ g(u), and equals g(u) for every true expansion tool (it is in its
maximiser's row), so the top K_pool − K1 and their order are those of the full scan. Comparing
table scores with table scores also makes the tie test exact in floating point.

The table is built in row blocks, N²·d flops (seconds at N = 13,860), and cached on disk
keyed by a hash of Z, M_M and W (:func:`load_or_build`).
"""
from __future__ import annotations

import hashlib
import os
import pathlib
import zipfile
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

# Bump when the table's definition changes (what rows hold, tie order).
TABLE_VERSION = 1


class NeighborTable(NamedTuple):
  """ids: int32[N, W] per tool i the W tools t ≠ i of largest z_iᵀ M_M z_t, best first (ties:
  lower row first); scores: f32[N, W] those values."""
  ids: jax.Array
  scores: jax.Array


def width_for(k_pool: int, num_tools: int) -> int:
  """Table width for a shortlist of K_pool: W = K_pool (≥ K_pool − 1 is what exactness needs),
  capped at N − 1 (then every row holds all other tools and no boundary tie can occur)."""
  return min(k_pool, num_tools - 1)


@jax.jit
def _block(keyed_rows: jax.Array, z: jax.Array, start: jax.Array) -> jax.Array:
  s = keyed_rows @ z.T                                                    # [B, N]
  rows = start + jnp.arange(keyed_rows.shape[0])
  return jnp.where(jnp.arange(z.shape[0])[None, :] == rows[:, None], -jnp.inf, s)


def drop_compiled() -> None:
  """Drop :func:`build`'s compiled block programs (one per library shape) from JAX's cache: a
  long-running process whose library changes size (a live catalogue) would otherwise keep one
  per size it has seen. The next :func:`build` compiles again."""
  _block.clear_cache()


def build(keyed: jax.Array, z: jax.Array, width: int, block: int = 1024,
          progress: bool = False) -> NeighborTable:
  """The neighbour table from ``keyed`` = Z M_M (f32[N, d]) and Z (f32[N, d]), in row blocks.

  Args:
    keyed: f32[N, d], row i is z_iᵀ M_M.
    z: f32[N, d].
    width: W (see :func:`width_for`), ≤ N − 1.
    block: rows per block; a block holds f32[block, N] scores.
    progress: show a progress bar.

  Returns:
    NeighborTable of NumPy arrays.
  """
  n = z.shape[0]
  if not 1 <= width <= n - 1:
    raise ValueError(f"neighbour table width must be in [1, N − 1 = {n - 1}], got {width}")
  top = jax.jit(lambda s: jax.lax.top_k(s, width))
  ids = np.empty((n, width), np.int32)
  scores = np.empty((n, width), np.float32)
  starts = range(0, n, block)
  if progress:
    from tqdm import tqdm
    starts = tqdm(starts, desc="neighbour table", unit="block")
  z = jnp.asarray(z)
  for start in starts:
    rows = keyed[start:start + block]
    if rows.shape[0] < block and n > block:     # pad the last block: one compilation
      rows = jnp.concatenate([rows, jnp.zeros((block - rows.shape[0], rows.shape[1]),
                                              rows.dtype)])
    sc, ix = top(_block(rows, z, jnp.int32(start)))
    m = min(block, n - start)
    scores[start:start + m] = np.asarray(sc[:m])
    ids[start:start + m] = np.asarray(ix[:m])
  return NeighborTable(ids, scores)


def fingerprint(z: np.ndarray, m_m: np.ndarray, width: int, tag: str = "") -> str:
  """A hex sha256 of (Z, M_M, W, table version) and ``tag`` (how Z M_M was rounded, e.g.
  ``"bf16"``; "" for f32, which keeps the keys of earlier tables): what decides the table's
  contents."""
  h = hashlib.sha256(f"hyset-neighbors/{TABLE_VERSION}/{width}".encode())
  if tag:
    h.update(f"/{tag}".encode())
  for a in (z, m_m):
    a = np.ascontiguousarray(a, np.float32)
    h.update(str(a.shape).encode())
    h.update(a.tobytes())
  return h.hexdigest()


def cache_dir_beside(model_dir: str | os.PathLike) -> pathlib.Path:
  """Where a model directory's tables are cached: ``<model_dir>.cache/`` next to it when that
  folder can be written, else ``$HYSET_CACHE/neighbors`` (``~/.cache/hyset_jax/neighbors``)."""
  model_dir = pathlib.Path(model_dir).resolve()
  beside = model_dir.parent / f"{model_dir.name}.cache"
  if os.access(beside if beside.exists() else model_dir.parent, os.W_OK):
    return beside
  from hyset_jax.encoder.cache import default_cache_dir
  return default_cache_dir() / "neighbors"


def load_or_build(keyed: jax.Array, z: jax.Array, m_m: jax.Array, width: int,
                  cache_dir: str | os.PathLike | None = None,
                  progress: bool = False, tag: str = "") -> NeighborTable:
  """The table for (Z, M_M, W): the last one this process made when it has the same
  fingerprint, else read from ``cache_dir/neighbors-<hash>.npz`` when present, else built (and
  written there when ``cache_dir`` is given). An unreadable or mismatched cache file is
  rebuilt, never trusted. ``tag`` names a rounding of ``keyed`` (:func:`fingerprint`)."""
  key = fingerprint(np.asarray(z), np.asarray(m_m), width, tag)
  if key in _LAST:
    return _LAST[key]
  table = _load_or_build(key, keyed, z, width, cache_dir, progress)
  _LAST.clear()
  _LAST[key] = table
  return table


# The last table this process built or read, by its fingerprint: choosing what follows θ
# (training/post_theta.py) scores ~25 candidate models that share Z and M_M, and rebuilding the
# same table for each was a third of that choice at 10⁴ tools (N²·d each time).
_LAST: dict[str, NeighborTable] = {}


def _load_or_build(key: str, keyed: jax.Array, z: jax.Array, width: int, cache_dir,
                   progress: bool) -> NeighborTable:
  if cache_dir is None:
    return build(keyed, z, width, progress=progress)
  path = pathlib.Path(cache_dir) / f"neighbors-{key[:32]}.npz"
  n = z.shape[0]
  try:
    with np.load(path, allow_pickle=False) as f:
      if str(f["key"]) == key and f["ids"].shape == (n, width):
        return NeighborTable(f["ids"], f["scores"])
  except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile):
    pass
  table = build(keyed, z, width, progress=progress)
  from hyset_jax import io_utils
  from hyset_jax.errors import UserError
  try:
    io_utils.ensure_writable_dir(path.parent, "neighbour-table cache folder")
    with io_utils.atomic_write(path, "wb") as f:
      np.savez(f, key=np.array(key), ids=table.ids, scores=table.scores)
  except UserError as e:  # a cache that cannot be written only costs a rebuild next time
    import sys
    print(f"warning: neighbour table not cached ({e})", file=sys.stderr)
  return table


class Expansion(NamedTuple):
  """extra: int32[Q, K_pool − K1] expansion tools in order; tie: bool[Q], True where a boundary
  tie makes the table's answer uncertain (the caller must use the full scan there)."""
  extra: jax.Array
  tie: jax.Array


def expand(table: NeighborTable, logits: jax.Array, s0: jax.Array, n_ext: int) -> Expansion:
  """Eq. 13 from the table (see the module docstring).

  Args:
    table: the neighbour table, W ≥ K_pool − 1.
    logits: f32[Q, N] ℓ of every tool (the tie-break).
    s0: int32[Q, K1] stage-1 tools.
    n_ext: K_pool − K1.

  Returns:
    Expansion.
  """
  q, k1 = s0.shape
  width = table.ids.shape[1]
  cand = table.ids[s0].reshape(q, k1 * width)                            # [Q, K1·W]
  score = table.scores[s0].reshape(q, k1 * width)
  in_s0 = jnp.any(cand[:, :, None] == s0[:, None, :], axis=-1)
  g = jnp.where(in_s0, -jnp.inf, score)
  ell = jnp.take_along_axis(logits, cand, axis=1)
  # n_ext selections of the best remaining candidate under (g desc, ℓ desc, row asc), each
  # removing every entry of the picked tool: a candidate's first pick is at its largest score
  # (its g), duplicates need no sort, and the picks come out in expansion order. Three
  # reductions over K1·W entries per pick; XLA:CPU's comparator sorts were ~10x slower here.
  big = jnp.iinfo(jnp.int32).max
  picks = []
  for _ in range(n_ext):
    best_g = jnp.max(g, axis=1, keepdims=True)
    at_g = g == best_g
    best_l = jnp.max(jnp.where(at_g, ell, -jnp.inf), axis=1, keepdims=True)
    pick = jnp.min(jnp.where(at_g & (ell == best_l), cand, big), axis=1)
    picks.append(pick)
    g = jnp.where(cand == pick[:, None], -jnp.inf, g)
  tau = best_g[:, 0]
  complete = width >= logits.shape[1] - 1
  tie = (jnp.zeros((q,), bool) if complete
         else jnp.any(table.scores[s0][:, :, -1] >= tau[:, None], axis=1))
  return Expansion(jnp.stack(picks, axis=1).astype(jnp.int32), tie)
