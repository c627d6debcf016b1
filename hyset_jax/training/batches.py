"""One training batch: which queries (stateless in the step), their candidate pools and the
self-training targets. ``make_batch(step, …) -> Batch`` is what the loop and the tests call.

Everything here depends only on (seed, step, global row) and the current θ, never on which
process or device asks, so 1 device, 8 devices and several hosts build the same global batch.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hyset_jax.inference import pipeline
from hyset_jax.training import negatives, sharding
from hyset_jax.model.scoring import HysetParams
from hyset_jax.training.train_data import QuerySet


class Batch(NamedTuple):
  """One process's rows of a global batch, as host arrays (b = rows supplied by this process).

  Attributes:
    query: f32[b, d_r] frozen query embeddings.
    members: int32[b, K_neg, M] candidate sets; position 0 is the gold set E*.
    mask: bool[b, K_neg, M].
    selected: int32[b], the pool position of the model-selected set Ê (Eq. 9).
    reward: f32[b], ρ of Ê (0 when the query has none).
    shortlist: int32[b, K_pool] each query's current inference shortlist (Eq. 12-13), for the
      exhaustive-shortlist loss; int32[b, 0] when that loss is off.
  """
  query: np.ndarray
  members: np.ndarray
  mask: np.ndarray
  selected: np.ndarray
  reward: np.ndarray
  shortlist: np.ndarray


def epoch_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
  return np.random.default_rng((seed, 0x5EED, epoch)).permutation(n)


def batch_indices(seed: int, step: int, batch_size: int, n: int) -> np.ndarray:
  """Training-query rows of a global batch: epochs of fresh permutations, stateless in step."""
  flat = step * batch_size + np.arange(batch_size)
  out = np.empty(batch_size, np.int64)
  for epoch in np.unique(flat // n):
    sel = flat // n == epoch
    out[sel] = epoch_permutation(seed, int(epoch), n)[flat[sel] % n]
  return out


def pad_sets(sets: Sequence[tuple[int, ...]], width: int) -> np.ndarray:
  """Tool-row sets as int32[len(sets), width], padded with row 0."""
  out = np.zeros((len(sets), width), np.int32)
  for i, s in enumerate(sets):
    out[i, :len(s)] = s
  return out


@functools.partial(jax.jit, static_argnames=("k",))
def gold_neighbors(z: jax.Array, gold: jax.Array, k: int) -> jax.Array:
  """The k nearest tools (cosine under Z) of each tool row in ``gold``.
  int[...] -> int32[..., k]."""
  sims = z[gold] @ z.T                                                 # [..., N]
  sims = jnp.where(jnp.arange(z.shape[0]) == gold[..., None], -jnp.inf, sims)
  if sims.ndim == 2 and sharding.tools_shards(z.shape[0]) == 1:
    # Not split over tools: the inference top-k (the native kernel on a CPU, lax.top_k's
    # indices: ~30 ms less of a batch-256 step's pools at the paper's scale than XLA's sort).
    return pipeline.top_indices(sims, k)
  return sharding.top_k(sims, k)[1].astype(jnp.int32)  # per tools shard under a mesh


# Distinct gold tools are searched in blocks of this many rows, so that the steps of a run share
# a few compiled shapes.
NEIGHBOR_ROWS = 64


def set_neighbors(z: jax.Array, gold_sets: Sequence[tuple[int, ...]], width: int,
                  k: int) -> np.ndarray:
  """:func:`gold_neighbors` of every member of ``gold_sets``, searched once per distinct tool.

  A batch's gold sets repeat tools and are padded to ``width``; the search (a [rows, N] product
  and a top-k) is the largest part of building a batch at large libraries (batch 256 at the
  paper's scale: 1,280 padded member slots, ~750 distinct tools), so only the distinct tools
  are searched, padded to a whole number of NEIGHBOR_ROWS blocks.

  Returns:
    int32[len(gold_sets), width, k]; padding slots hold 0.
  """
  out = np.zeros((len(gold_sets), width, k), np.int32)
  tools = np.unique(np.fromiter((t for s in gold_sets for t in s), np.int64))
  if not len(tools):
    return out
  rows = np.zeros(-(-len(tools) // NEIGHBOR_ROWS) * NEIGHBOR_ROWS, np.int32)
  rows[:len(tools)] = tools
  found = np.asarray(gold_neighbors(z, rows, k))[:len(tools)]         # [distinct, k]
  for i, s in enumerate(gold_sets):
    out[i, :len(s)] = found[np.searchsorted(tools, s)]
  return out


# A query's cached self-training target: (Ê as tool rows, ρ).
RewardCache = dict[int, tuple[tuple[int, ...], float]]


def make_batch(step: int, params: HysetParams, queries: QuerySet, rows: Sequence[int], *,
               num_tools: int, mc, tc, rewards: RewardCache) -> Batch:
  """The rows ``rows`` of global batch ``step`` under the current θ.

  Args:
    step: the training step (chooses the queries and seeds the negatives).
    params: the current θ (hard negatives are neighbours under its Z; shortlist negatives
      come from its inference shortlist).
    queries: the training split.
    rows: the global batch rows this process supplies (sharding.process_rows).
    num_tools: N.
    mc, tc: the model and train configs.
    rewards: the reward cache (Ê and ρ per training-query row) from the last refresh.
  """
  idx = batch_indices(tc.seed, step, tc.batch_size, len(queries.ids))
  gold = [queries.gold[i] for i in idx]
  nbrs = set_neighbors(params.tool_embeddings, gold, mc.max_set_size, tc.hard_neighbors)
  shortlists = None
  if tc.shortlist_negatives or tc.exhaustive_loss_weight:
    shortlists = np.asarray(pipeline.shortlist_distinct(
        params, queries.embeddings[idx], k1=mc.k1, k_pool=mc.k_pool,
        max_size=mc.max_set_size).tools)
  targets = [rewards.get(int(i), (None, 0.0)) for i in idx]
  pools = negatives.sample_pools(gold, rows, num_tools=num_tools, k_neg=tc.k_neg,
                                 max_size=mc.max_set_size, mix=tc.negative_mix, neighbors=nbrs,
                                 seed=tc.seed, step=step, forced=[e for e, _ in targets],
                                 shortlists=shortlists, shortlist_fraction=tc.shortlist_negatives)
  reward = np.array([targets[r][1] for r in rows], np.float32)
  listed = (shortlists[list(rows)] if tc.exhaustive_loss_weight
            else np.zeros((len(rows), 0), np.int32))
  query = queries.embeddings[idx[list(rows)]]
  if tc.query_noise:
    query = noisy_queries(query, tc.query_noise, seed=tc.seed, step=step, rows=rows,
                          batch_size=len(idx))
  return Batch(query, pools.members, pools.mask, pools.selected, reward, listed)


def noisy_queries(query: np.ndarray, sigma: float, *, seed: int, step: int,
                  rows: Sequence[int], batch_size: int) -> np.ndarray:
  """``query`` plus Gaussian noise of expected norm σ·‖row‖, each row rescaled to its own norm.

  Args:
    query: f32[b, d] the rows ``rows`` of the global batch.
    sigma: the noise's expected norm relative to the row's.
    seed, step: draw the noise (a resumed run draws the same noise).
    rows: the global batch rows ``query`` holds; batch_size: the global batch size. The noise
      of a row does not depend on which process supplies it.

  Returns:
    f32[b, d], each row as long as the input's.
  """
  d = query.shape[1]
  rng = np.random.default_rng([seed, step, 0x9E3779B9])
  noise = rng.standard_normal((batch_size, d)).astype(np.float32)[list(rows)]
  norm = np.linalg.norm(query, axis=1, keepdims=True)
  out = query + (sigma / np.sqrt(d)) * norm * noise
  return (out * (norm / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12))
          ).astype(np.float32)
