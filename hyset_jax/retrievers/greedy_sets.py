"""The paper's untrained-scorer set baselines (§3.3): cardinality prediction, maximal marginal
relevance and facility location, each over ℓ's shortlist (:mod:`~.shortlist`).

Each orders the shortlist S (its ranking, K_pool long) and delivers a prefix of that order as
its set:

- ``cardinality``: the order is ℓ's; the set is its first m̂ tools, m̂ the argmax of a linear
  softmax over set sizes 1..M on the query embedding.
- ``mmr``: maximal marginal relevance (Carbonell & Goldstein, 1998):
  pick argmax_t λ · rel(t) − (1 − λ) · max_{s ∈ A} cos(z_t, z_s), rel = ℓ min-max scaled to
  [0, 1] over S, Z the frozen tool embeddings; λ chosen on validation (λ = 1 is ℓ's order);
  the set is the first m̂ picks, m̂ from the same size classifier.
- ``facility-location``: greedy maximisation of f(A) = Σ_{j ∈ S} w_j max_{i ∈ A} s(i, j), the
  query's relevant mass w = softmax(ℓ_S / τ) covered by A, s = max(cos(z_i, z_j), 0); the set
  is the greedy prefix whose marginal gains reach an opening cost γ (at least 1 tool, at most
  M). τ is chosen on validation by the rank metrics, then γ by set F1 (exact over the gains).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hyset_jax.data.types import Query, ToolLibrary
from hyset_jax.retrievers.base import Retrieval
from hyset_jax.retrievers.heads import choose_threshold
from hyset_jax.retrievers.shortlist import (SetBaselineConfig, Stage1, choose, fit_size_classifier,
                                            fit_stage1, predict_sizes, prefix_sets, query_rows,
                                            rank_quality, to_retrieval)

# λ = 1 is ℓ's own order, so MMR can only be chosen over it on validation evidence.
MMR_LAMBDAS = (1.0, 0.95, 0.9, 0.8, 0.7, 0.6, 0.5, 0.3)
# ℓ is a logit (the linear head's, ~20 · cosine at its start): τ = 1 weighs S by the head's own
# probabilities; large τ spreads w over all of S (pure coverage), small τ onto ℓ's top tool.
FL_TEMPERATURES = (1.0, 0.5, 2.0, 4.0, 8.0, 16.0)


def pair_similarity(tool_z: np.ndarray, rows: np.ndarray) -> np.ndarray:
  """f32[n, K, K] cosine between the frozen embeddings of each shortlist's tools.

  Args:
    tool_z: f32[N, d] unit rows.
    rows: int[n, K] shortlists.
  """
  z = tool_z[rows]  # [n, K, d]
  return np.einsum("nkd,njd->nkj", z, z)


def mmr_order(rel: np.ndarray, sim: np.ndarray, lam: float) -> np.ndarray:
  """int[n, K] shortlist positions in MMR order; ties: the lower position (higher ℓ).

  Args:
    rel: f32[n, K] relevance in [0, 1].
    sim: f32[n, K, K] tool-tool similarity.
    lam: λ, the weight of relevance against redundancy.

  >>> sim = np.array([[[1, .9, 0], [.9, 1, 0], [0, 0, 1]]], np.float32)
  >>> mmr_order(np.array([[1, .9, .5]]), sim, 0.5).tolist()
  [[0, 2, 1]]
  """
  n, k = rel.shape
  redundancy = np.zeros((n, k), np.float32)  # max similarity to the picks; 0 before any pick
  taken = np.zeros((n, k), bool)
  order = np.zeros((n, k), np.int64)
  rows = np.arange(n)
  for step in range(k):
    score = np.where(taken, -np.inf, lam * rel - (1.0 - lam) * redundancy)
    pick = np.argmax(score, axis=1)
    order[:, step], taken[rows, pick] = pick, True
    redundancy = np.maximum(redundancy, sim[rows, pick]) if step else sim[rows, pick]
  return order


def facility_order(weights: np.ndarray, sim: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Greedy facility location over the whole shortlist.

  Args:
    weights: f32[n, K] w_j ≥ 0, the mass to cover.
    sim: f32[n, K, K] s(i, j) ≥ 0 with s(j, j) = 1.

  Returns:
    (int[n, K] positions in pick order, f32[n, K] each pick's marginal gain). The gains of a
    greedy run on a monotone submodular f do not increase; they are clamped so rounding
    cannot break that (the set rule cuts the order where they fall below γ).

  >>> o, g = facility_order(np.array([[.5, .3, .2]]), np.array([[[1, .9, 0], [.9, 1, 0],
  ...                                                               [0, 0, 1.]]]))
  >>> o.tolist(), g.round(2).tolist()
  ([[0, 2, 1]], [[0.77, 0.2, 0.03]])
  """
  n, k = weights.shape
  covered = np.zeros((n, k), np.float64)
  taken = np.zeros((n, k), bool)
  order, gains = np.zeros((n, k), np.int64), np.zeros((n, k), np.float64)
  rows = np.arange(n)
  for step in range(k):
    gain = np.einsum("nij,nj->ni", np.maximum(sim - covered[:, None, :], 0.0), weights)
    pick = np.argmax(np.where(taken, -np.inf, gain), axis=1)
    order[:, step], gains[:, step], taken[rows, pick] = pick, gain[rows, pick], True
    covered = np.maximum(covered, sim[rows, pick])
  return order, np.minimum.accumulate(gains, axis=1)


def _softmax(logits: np.ndarray, temperature: float) -> np.ndarray:
  z = np.asarray(logits, np.float64) / temperature
  z = np.exp(z - z.max(axis=1, keepdims=True))
  return z / z.sum(axis=1, keepdims=True)


def _minmax(logits: np.ndarray) -> np.ndarray:
  lo, hi = logits.min(axis=1, keepdims=True), logits.max(axis=1, keepdims=True)
  return (logits - lo) / np.maximum(hi - lo, 1e-12)


def _cut_sizes(gains: np.ndarray, gamma: float, max_size: int) -> np.ndarray:
  """int[n] how many greedy picks have gain ≥ γ, clipped to 1..M."""
  return np.clip((gains[:, :max_size] >= gamma).sum(1), 1, max_size)


class GreedySetRetriever:
  """A set baseline that orders ℓ's shortlist and delivers a prefix. Build with :meth:`fit`.

  Attributes:
    method: ``"cardinality"``, ``"mmr"`` or ``"facility-location"``.
    stage1: ℓ and the shortlist.
    size_params: the set-size classifier (cardinality, mmr) or None.
    setting: λ (mmr), τ (facility-location) or None.
    gamma: facility location's opening cost γ, or None.
  """

  def __init__(self, method: str, stage1: Stage1, size_params: dict | None,
               setting: float | None = None, gamma: float | None = None):
    self.method, self.stage1, self.size_params = method, stage1, size_params
    self.setting, self.gamma = setting, gamma
    self.tool_ids = stage1.tool_ids

  @classmethod
  def fit(cls, method: str, tools: ToolLibrary, encoder: Any, train: Sequence[Query],
          validation: Sequence[Query], config: SetBaselineConfig) -> GreedySetRetriever:
    """ℓ and the size classifier on ``train``; λ, τ and γ on ``validation``."""
    stage1, rows = fit_stage1(tools, encoder, train, config)
    size_params = None
    if method in ("cardinality", "mmr"):
      x = stage1.embed([q.text for q in train])
      size_params = fit_size_classifier(x, rows, stage1.max_size, config)
    if method == "cardinality":
      return cls(method, stage1, size_params)
    gold = query_rows(validation, stage1, "validation")
    x, logits, sl = stage1.inputs([q.text for q in validation])
    ell = np.take_along_axis(logits, sl, axis=1)
    sim = pair_similarity(stage1.tool_z, sl)
    def ranked(order):
      return np.take_along_axis(sl, order, axis=1)
    if method == "mmr":
      rel = _minmax(ell)
      lam = choose(MMR_LAMBDAS, lambda v: rank_quality(ranked(mmr_order(rel, sim, v)), gold))
      return cls(method, stage1, size_params, setting=lam)
    sim = np.maximum(sim, 0.0)
    tau = choose(FL_TEMPERATURES, lambda t: rank_quality(
        ranked(facility_order(_softmax(ell, t), sim)[0]), gold))
    order, gains = facility_order(_softmax(ell, tau), sim)
    ranking = ranked(order)
    # Gold rows as pick positions (a gold tool outside S gets a position no pick has), so the
    # exact threshold search of the per-tool heads finds γ over the gains' order.
    where = [{int(r): p for p, r in enumerate(row)} for row in ranking]
    positions = [[w.get(t, -1 - i) for i, t in enumerate(g)] for w, g in zip(where, gold)]
    gamma = choose_threshold(gains, positions, max_size=stage1.max_size)
    return cls(method, stage1, None, setting=tau, gamma=gamma)

  def decode(self, x: np.ndarray, logits: np.ndarray,
             sl: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """(int[n, K] ranked rows, ``n`` set rows) from the stage-1 inputs."""
    ell = np.take_along_axis(logits, sl, axis=1)
    if self.method == "cardinality":
      return sl, prefix_sets(sl, predict_sizes(self.size_params, x))
    sim = pair_similarity(self.stage1.tool_z, sl)
    if self.method == "mmr":
      ranking = np.take_along_axis(sl, mmr_order(_minmax(ell), sim, self.setting), axis=1)
      return ranking, prefix_sets(ranking, predict_sizes(self.size_params, x))
    order, gains = facility_order(_softmax(ell, self.setting), np.maximum(sim, 0.0))
    ranking = np.take_along_axis(sl, order, axis=1)
    return ranking, prefix_sets(ranking, _cut_sizes(gains, self.gamma, self.stage1.max_size))

  def retrieve(self, queries: Sequence[str], depth: int) -> Retrieval:
    rankings, sets = self.decode(*self.stage1.inputs(queries))
    return to_retrieval(self.tool_ids, rankings, sets, depth)

