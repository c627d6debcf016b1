"""Brute-force NumPy references for the HYSET maths, straight from the paper's equations.

Written for clarity, not speed: itertools over subsets, one set at a time, float64.
"""
from __future__ import annotations

import itertools

import numpy as np


def f_align(r, p, z, members):
  """Eq. 4-6."""
  ell = np.array([r @ p @ z[j] for j in members], np.float64)
  a = np.exp(ell - ell.max())
  a /= a.sum()
  return float((a * ell).sum())


def f_set(z, interactions, members):
  """Eq. 3: Σ_{a<b} z_aᵀ M_m z_b, 0 for singletons."""
  m = len(members)
  if m < 2:
    return 0.0
  mm = interactions[m - 2]
  return float(sum(z[a] @ mm @ z[b] for a, b in itertools.combinations(members, 2)))


def score(r, z, p, interactions, members):
  """Eq. 2."""
  return f_set(z, interactions, members) + f_align(r, p, z, members)


def best_subset(r, z, p, interactions, pool, max_size):
  """Eq. 14 by brute force over every subset of `pool`: (best set as sorted tuple, score)."""
  best, best_score = None, -np.inf
  for m in range(1, max_size + 1):
    for e in itertools.combinations(pool, m):
      s = score(r, z, p, interactions, e)
      if s > best_score:
        best, best_score = tuple(sorted(e)), s
  return best, best_score


def two_stage(r, z, p, interactions, k1, k_pool, max_size):
  """Eq. 12-14 by brute force: (shortlist, best set, score, greedy picks)."""
  z = np.asarray(z, np.float64)
  ell = z @ (r @ p)
  s0 = list(np.argsort(-ell, kind="stable")[:k1])
  mm = interactions[max_size - 2]
  rest = [t for t in range(len(z)) if t not in s0]
  g = {t: max(z[t] @ mm @ z[i] for i in s0) for t in rest}
  extra = sorted(rest, key=lambda t: (-g[t], -ell[t], t))[:k_pool - k1]
  shortlist = s0 + extra
  best, best_score = best_subset(r, z, p, interactions, shortlist, max_size)
  chosen = []
  for _ in range(max_size):
    cands = [t for t in shortlist if t not in chosen]
    scores = [score(r, z, p, interactions, chosen + [t]) for t in cands]
    chosen.append(cands[int(np.argmax(scores))])
  return shortlist, best, best_score, chosen


def mobius(f, universe):
  """Möbius transform f̃(E) = Σ_{T⊆E} (-1)^{|E|-|T|} f(T) for every E ⊆ universe (f(∅) = 0)."""
  out = {}
  for m in range(1, len(universe) + 1):
    for e in itertools.combinations(universe, m):
      out[e] = sum((-1) ** (m - k) * f(t) for k in range(1, m + 1)
                   for t in itertools.combinations(e, k))
  return out
