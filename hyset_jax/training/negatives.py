"""Candidate pools C_i = {E*_i} ∪ N_i for the retrieval loss (paper §2.4, Algorithm 1).

|C_i| = K_neg distinct sets: the gold set first, then negatives drawn in the fixed proportion
uniform / in-batch / hard (default 50% / 30% / 20%):

- uniform: size-matched sets sampled uniformly from the |E*|-subsets of the library;
- in-batch: the gold sets of the other queries of the (global) batch;
- hard: E* with one or two tools replaced by nearest neighbours under the current Z.

A source that cannot supply its share (a small batch, a tiny library) is topped up with uniform
sets, first size-matched, then of any size ≤ M. The gold set is never a negative.

Each pool depends only on (seed, step, global row), never on which process or device builds it,
so a run gives the same pools on 1 device, 8 devices or several hosts.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from hyset_jax.errors import UserError


class Pools(NamedTuple):
  """members: int32[B, K_neg, M] tool rows (padding 0); mask: bool[B, K_neg, M];
  source: int8[B, K_neg] — 0 gold, 1 uniform, 2 in-batch, 3 hard, 4 forced (Ê), 5 shortlist;
  selected: int32[B] — the pool position of the forced set Ê (0, the gold set, when Ê is the
  gold set or there is none)."""
  members: np.ndarray
  mask: np.ndarray
  source: np.ndarray
  selected: np.ndarray


GOLD, UNIFORM, IN_BATCH, HARD, FORCED, SHORTLIST = range(6)


def split_counts(num_negatives: int, mix: Sequence[float]) -> tuple[int, int, int]:
  """Negatives per source (uniform, in-batch, hard): in-batch and hard rounded to the nearest
  count, uniform takes the rest.

  >>> split_counts(63, (0.5, 0.3, 0.2))
  (31, 19, 13)
  """
  n_batch = int(round(num_negatives * mix[1]))
  n_hard = int(round(num_negatives * mix[2]))
  n_hard = min(n_hard, num_negatives - n_batch)
  return num_negatives - n_batch - n_hard, n_batch, n_hard


def _uniform(rng: np.random.Generator, num_tools: int, size: int, count: int) -> list[tuple]:
  """Up to ``count`` random ``size``-sets (sorted tuples), vectorised; may return fewer/dupes."""
  draws = rng.integers(0, num_tools, size=(count, size))
  draws.sort(axis=1)
  ok = np.all(np.diff(draws, axis=1) > 0, axis=1) if size > 1 else np.ones(count, bool)
  return [tuple(r) for r in draws[ok].tolist()]


def _hard(rng: np.random.Generator, gold: tuple, neighbors: np.ndarray, count: int) -> list[tuple]:
  """``count`` tries at E* with one or two members replaced by one of their nearest neighbours.

  neighbors: int[|E*|, k] the k nearest tools of each gold member (excluding itself).
  Vectorised over the tries; tries that repeat a tool are dropped.
  """
  m = len(gold)
  if m == 0 or neighbors.shape[1] == 0 or count == 0:
    return []
  rows = np.arange(count)
  new = np.tile(np.asarray(gold), (count, 1))
  first = rng.integers(0, m, count)
  new[rows, first] = neighbors[first, rng.integers(0, neighbors.shape[1], count)]
  if m >= 2:
    two = rng.random(count) < 0.5
    second = (first + rng.integers(1, m, count)) % m              # a different position
    pick = neighbors[second, rng.integers(0, neighbors.shape[1], count)]
    new[rows[two], second[two]] = pick[two]
  new.sort(axis=1)
  ok = np.all(np.diff(new, axis=1) > 0, axis=1) if m > 1 else np.ones(count, bool)
  return [tuple(r) for r in new[ok].tolist()]


def _shortlist_subsets(rng: np.random.Generator, universe: np.ndarray, max_size: int,
                       count: int) -> list[tuple]:
  """``count`` random subsets (sizes uniform in 1..M) of ``universe`` = S ∪ E*."""
  u = len(universe)
  sizes = rng.integers(1, min(max_size, u) + 1, count)
  order = np.argsort(rng.random((count, u)), axis=1)
  return [tuple(sorted(universe[order[c, :sizes[c]]].tolist())) for c in range(count)]


def sample_pools(gold_sets: Sequence[tuple[int, ...]], rows: Sequence[int], *, num_tools: int,
                 k_neg: int, max_size: int, mix: Sequence[float], neighbors: np.ndarray,
                 seed: int, step: int, forced: Sequence[tuple[int, ...] | None] | None = None,
                 shortlists: np.ndarray | None = None, shortlist_fraction: float = 0.0
                 ) -> Pools:
  """Candidate pools for the batch rows ``rows`` (indices into the global batch).

  Args:
    gold_sets: the gold set (sorted tool rows) of every query of the global batch.
    rows: which of them to build pools for (this process's share).
    num_tools: N.
    k_neg: |C_i|.
    max_size: M (padding width).
    mix: fractions (uniform, in-batch, hard).
    neighbors: int[B_global, M, k] nearest neighbours of each gold member under the current Z.
    seed, step: with the global row, the only inputs to the random stream.
    forced: per global row, a model-selected set Ê to include (L_self), or None.
    shortlists: int[B_global, K_pool] each query's current inference shortlist S (Eq. 13).
    shortlist_fraction: share of the negatives drawn as random subsets of S ∪ E* — the sets
      stage 2 actually compares (supersets, subsets and near misses of E*). Not in the paper,
      whose mix is the remaining (1 − fraction) share; 0 disables it.

  Returns:
    Pools for ``len(rows)`` queries; pool position 0 is the gold set.
  """
  b = len(rows)
  members = np.zeros((b, k_neg, max_size), np.int32)
  mask = np.zeros((b, k_neg, max_size), bool)
  source = np.zeros((b, k_neg), np.int8)
  for i, row in enumerate(rows):
    rng = np.random.default_rng((seed, step, row))
    gold = tuple(gold_sets[row])
    pool: list[tuple] = [gold]
    tags = [GOLD]
    seen = {gold}

    def add(cands, tag, limit):
      added = 0
      for s in cands:
        if added >= limit or len(pool) >= k_neg:
          break
        if s not in seen:
          seen.add(s)
          pool.append(s)
          tags.append(tag)
          added += 1
      return added

    extra = forced[row] if forced is not None else None
    if extra is not None and len(extra):
      add([tuple(sorted(extra))], FORCED, 1)
    if shortlist_fraction > 0 and shortlists is not None:
      n_short = int(round(shortlist_fraction * (k_neg - len(pool))))
      universe = np.union1d(shortlists[row], gold)
      add(_shortlist_subsets(rng, universe, max_size, 2 * n_short + 4), SHORTLIST, n_short)
    n_uni, n_batch, n_hard = split_counts(k_neg - len(pool), mix)
    # Other queries' gold sets, in random order; a few spares cover duplicates.
    picks = rng.choice(len(gold_sets), size=min(len(gold_sets), 2 * n_batch + 2), replace=False)
    others = [tuple(gold_sets[j]) for j in picks if j != row]
    n_batch -= add(others, IN_BATCH, n_batch)
    n_hard -= add(_hard(rng, gold, neighbors[row, :len(gold)], 4 * n_hard + 4), HARD, n_hard)
    # Uniform, topping up what the other sources could not supply.
    for size in [len(gold)] * 8 + list(range(1, max_size + 1)) * 8:
      if len(pool) >= k_neg:
        break
      add(_uniform(rng, num_tools, size, 2 * (k_neg - len(pool)) + 4), UNIFORM, k_neg)
    if len(pool) < k_neg:
      raise UserError(f"cannot draw {k_neg} distinct candidate sets from a library of "
                      f"{num_tools} tools with sets of size ≤ {max_size}; lower train.k_neg")
    lengths = np.fromiter(map(len, pool), np.int64, len(pool))
    mask[i] = np.arange(max_size) < lengths[:, None]
    members[i][mask[i]] = np.fromiter((t for s in pool for t in s), np.int32, int(lengths.sum()))
    source[i] = tags
  selected = np.argmax(source == FORCED, axis=1).astype(np.int32)  # 0 where none is forced
  return Pools(members, mask, source, selected)
