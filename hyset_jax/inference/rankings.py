"""How the shortlist's tools are ranked for Recall/NDCG/COMP@K (:func:`rank_tools`; the names
are :data:`hyset_jax.choices.RANKINGS`). The delivered set is the same under every ranking; the
rankings only order the shortlist around it. Pure functions of the shortlist's ℓ and its pair
matrices G_m, with shapes in the docstrings.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hyset_jax import choices
from hyset_jax.inference import backends, enumeration, subsets
from hyset_jax.io import model_format
from hyset_jax.model import scoring, set_prior, terms
from hyset_jax.errors import UserError

Ranking = choices.Ranking


def greedy_ranking(logits: jax.Array, pairs: jax.Array, steps: int) -> jax.Array:
  """Greedy marginal gain: A_k = A_{k−1} ∪ argmax_t F(A_{k−1} ∪ {t}), for ``steps`` steps.

  Args:
    logits: f32[Q, K] ℓ of the shortlist.
    pairs: f32[Q, M−1, K, K] pair matrices G_m.
    steps: number of greedy picks (≤ M).

  Returns:
    int32[Q, steps] shortlist positions in pick order.
  """
  q, k = logits.shape
  chosen = jnp.zeros((q, k), bool)
  eye = jnp.eye(k, dtype=bool)
  picks = []
  for size in range(1, steps + 1):
    cand = chosen[:, None, :] | eye[None]                                # [Q, K(t), K]
    f = scoring.align_scores(jnp.broadcast_to(logits[:, None, :], cand.shape), cand)
    if size >= 2:
      gm = jnp.where(eye, 0.0, pairs[:, size - 2])
      f = f + 0.5 * jnp.einsum("qti,qij,qtj->qt", cand.astype(gm.dtype), gm, cand.astype(gm.dtype))
    pick = jnp.argmax(jnp.where(chosen, -jnp.inf, f), axis=1)             # [Q]
    picks.append(pick)
    chosen = chosen | jax.nn.one_hot(pick, k, dtype=bool)
  return jnp.stack(picks, axis=1).astype(jnp.int32)


def _first_then_by_logit(first: jax.Array, logits: jax.Array) -> jax.Array:
  """Shortlist positions int32[Q, K]: those marked in ``first`` (bool[Q, K]) by descending ℓ,
  then the others by descending ℓ; equal ℓ keeps shortlist order."""
  k = logits.shape[1]
  pos = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), logits.shape)
  return jax.lax.sort((~first, -logits, pos), dimension=1, num_keys=3)[2]


def _set_first(best_positions: jax.Array, logits: jax.Array) -> jax.Array:
  """The ``set-first`` order: Ê's positions (int32[Q, M], K for padding), then the rest."""
  k = logits.shape[1]
  in_set = jnp.any(best_positions[:, :, None] == jnp.arange(k)[None, None, :], axis=1)
  return _first_then_by_logit(in_set, logits)


def _per_tool(logits: jax.Array, pairs: jax.Array, max_size: int, pool: str) -> jax.Array:
  """The mean or the max of F over the shortlist subsets containing each tool: f32[Q, K]."""
  k = logits.shape[1]
  table = subsets.subset_table(k, max_size)
  sub = enumeration.score_subsets(logits, pairs, table, "gather")       # [Q, n], table order
  # Member incidence f32[K, n] in table order: the matmul scorer's A_m, sizes side by side.
  incidence = np.concatenate([a for a, _ in subsets.incidence(k, max_size)], axis=1)
  if pool == "mean":
    per_slot = (sub.scores @ incidence.T) / incidence[0].sum()          # [Q, K], table slots
  else:
    per_slot = jnp.max(jnp.where(incidence[None] > 0, sub.scores[:, None, :], -jnp.inf), -1)
  # Table slot j of query q is shortlist position sub.positions[q, j] (a one-hot product, not
  # a scatter: it converts to ONNX as it stands).
  slot_to_position = (sub.positions[:, :, None] == jnp.arange(k)).astype(per_slot.dtype)
  return jnp.einsum("qj,qjk->qk", per_slot, slot_to_position)


def _set_mean_key(logits: jax.Array, pairs: jax.Array, max_size: int,
                  seen: set_prior.SeenSets | None, allowed: jax.Array | None) -> jax.Array:
  """What ``set-mean`` sorts by, f32[Q, K]: the mean F (F' with a prior) per tool."""
  if allowed is not None:
    return _allowed_mean(logits, pairs, max_size, allowed,
                         None if seen is None else seen.member_bonus)
  mean = set_mean(logits, pairs, max_size)
  if seen is not None:  # each tool lies in the same number of subsets
    mean = mean + seen.member_bonus / subsets.subsets_containing(logits.shape[1], max_size)
  return mean


def _allowed_mean(logits: jax.Array, pairs: jax.Array, max_size: int, allowed: jax.Array,
                  bonus: jax.Array | None) -> jax.Array:
  """:func:`set_mean` over the subsets whose members are all ``allowed`` (bool[Q, K]), plus the
  seen sets' ``bonus`` f32[Q, K] summed per tool (seen sets with a disallowed member carry
  none); -inf for disallowed slots. f32[Q, K] in shortlist order."""
  k = logits.shape[1]
  table = subsets.subset_table(k, max_size)
  sub = enumeration.score_subsets(logits, pairs, table, "gather")       # [Q, n], table order
  incidence = np.concatenate([a for a, _ in subsets.incidence(k, max_size)], axis=1)
  slot_ok = jnp.take_along_axis(allowed, sub.positions, axis=1)         # [Q, K], table slots
  valid = ((~slot_ok).astype(jnp.float32) @ incidence) == 0              # [Q, n]
  # A penalised subset's score is finite: times 0 it leaves the sum.
  total = jnp.where(valid, sub.scores, 0.0) @ incidence.T                # [Q, K], table slots
  count = valid.astype(jnp.float32) @ incidence.T
  slot_to_position = (sub.positions[:, :, None] == jnp.arange(k)).astype(total.dtype)
  total, count = (jnp.einsum("qj,qjk->qk", a, slot_to_position) for a in (total, count))
  if bonus is not None:
    total = total + bonus
  return jnp.where(allowed, total / jnp.maximum(count, 1.0), -jnp.inf)


def set_mean(logits: jax.Array, pairs: jax.Array, max_size: int) -> jax.Array:
  """The mean F of the shortlist subsets (sizes 1..M) that contain each shortlist tool.

  Every tool lies in the same number of subsets, so ordering by it is ordering by the tool's
  mean effect on F: the mean score of candidate sets with the tool minus that of those without.

  Args:
    logits: f32[Q, K] ℓ of the shortlist; pairs: f32[Q, M−1, K, K] G_m; max_size: M.

  Returns:
    f32[Q, K] in shortlist order.
  """
  return _per_tool(logits, pairs, max_size, "mean")


def set_max(logits: jax.Array, pairs: jax.Array, max_size: int) -> jax.Array:
  """The best F among the shortlist subsets (sizes 1..M) that contain each shortlist tool.

  The members of the best set share the largest value; the next tool is the one whose best
  set is the runner-up, and so on: the shortlist in the order of the best sets it takes part in.
  Arguments and result as :func:`set_mean`.
  """
  return _per_tool(logits, pairs, max_size, "max")


def rank_tools(logits: jax.Array, pairs: jax.Array, best_positions: jax.Array,
               ranking: Ranking, max_size: int,
               method: enumeration.Method | backends.Backend = choices.PORTABLE_METHOD,
               seen: set_prior.SeenSets | None = None,
               allowed: jax.Array | None = None) -> jax.Array:
  """Order the shortlist for the rank metrics (issue: paper's greedy vs alternatives).

  - ``greedy`` (the paper): M greedy marginal-gain picks under F (:func:`greedy_ranking`),
    then the rest of the shortlist by descending ℓ.
  - ``logit``: the shortlist order itself — S0 by descending ℓ, then the expansion tools by
    descending g. The per-tool ranking stage 1 already computes.
  - ``set-first``: the exact Ê of Eq. 14 first, then the rest of the shortlist. Within Ê by
    descending ℓ, and the rest by descending ℓ. Why these two orders: Ê is delivered as a set,
    so its internal order only matters when a cut-off K < |Ê|, and ℓ is the best per-tool
    signal we have (on ToolLens, ranking all tools by ℓ beats greedy by 29 COMP@3 points);
    continuing greedily given Ê re-introduces the marginal-gain picks that the measurements
    show are worse than ℓ (ToolLens, toollens preset: Ê-then-ℓ COMP@5 85.3 vs Ê-then-greedy
    73.9; Ê in ℓ order 48.9 COMP@3 vs 48.7 in greedy order).
  - ``set-mean``: the shortlist by :func:`set_mean` (ties by descending ℓ) — each tool by the
    mean F of every candidate set it belongs to, not by the one best set. Where Ê is seldom
    right (tool sets unseen in training) the evidence of all sets is steadier than the argmax;
    where it is right (seen sets) the average drowns it (docs/results.md, unseen-set split).
    Needs every subset's score: the [Q, n] matrix that the best-set path otherwise never writes.
  - ``set-max``: the shortlist by :func:`set_max` (ties by descending ℓ) — each tool by the best
    F of any candidate set it belongs to. Ê's members come first (by ℓ, as in ``set-first``),
    then the tools of the runner-up sets: where Ê is often right (sets seen in training) the
    next places go to the sets that almost won instead of to single tools by ℓ
    (docs/results.md, the seen-set prior: +0.3-0.6 COMP@5 over set-first). With a seen-set
    prior, a query whose shortlist holds a tool no seen set names (one training never named:
    added with ``hyset tools add``, or a library the model was carried onto) is ranked
    ``set-first``: sets holding such a tool have no trained pairs, so set-max would rank it
    below every trained tool whatever its ℓ (held-out tools, ToolLens: COMP@5 1.60 under
    set-max, 14.30 set-first; docs/baselines.md).

  The delivered set is the same under every ranking.

  Args:
    logits: f32[Q, K] ℓ of the shortlist (shortlist order).
    pairs: f32[Q, M−1, K, K] G_m (read by ``greedy`` only).
    best_positions: int32[Q, M] shortlist positions of Ê, padded with K.
    ranking: one of :data:`hyset_jax.choices.RANKINGS`.
    max_size: M.
    method: the backend (:func:`backends.get`); its ``greedy`` kernel, when it has one, ranks
      ``greedy`` (the native kernel: :func:`hyset_jax.inference.native.greedy_ranking`, the same order).
    seen: with a seen-set prior, :class:`set_prior.SeenSets`: ``set-mean`` and ``set-max`` rank
      by F' = F + the prior's bonus. ``greedy`` does not support the prior.
    allowed: bool[Q, K], the shortlist slots a filter allows (None: all), with ``logits`` and
      ``pairs`` penalised (:func:`_penalise`). Every other ranking then orders the allowed
      slots as over the allowed tools alone and puts the others last; ``set-mean`` is made
      so by averaging over the all-allowed subsets only.

  Returns:
    int32[Q, K] shortlist positions, best first.
  """
  choices.check("ranking", ranking, choices.RANKINGS)
  if seen is not None and ranking in terms.REGISTRY["prior"].rankings_excluded:
    raise UserError(f"the {ranking} ranking does not support a seen-set prior (its marginal "
                    f"gains are under F alone); rank with "
                    f"{', '.join(model_format.allowed_rankings(['prior']))}")
  q, k = logits.shape
  if ranking == "logit":
    return jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), (q, k))
  if ranking == "set-first":
    return _set_first(best_positions, logits)
  if ranking == "set-mean":
    pos = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), (q, k))
    mean = _set_mean_key(logits, pairs, max_size, seen, allowed)
    return jax.lax.sort((-mean, -logits, pos), dimension=1, num_keys=3)[2]
  if ranking == "set-max":
    pos = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), (q, k))
    best = set_max(logits, pairs, max_size)
    if seen is not None:  # F' ≥ F: a seen set can only raise its members' best
      best = jnp.maximum(best, seen.member_best)
    order = jax.lax.sort((-best, -logits, pos), dimension=1, num_keys=3)[2]
    if seen is None:
      return order
    # A tool training never named (added to the library, or carried onto) has no trained pairs,
    # so every set holding it scores low and set-max sinks it below the trained tools whatever
    # its ℓ: such a query is ranked set-first.
    return jnp.where(seen.named[:, None], order, _set_first(best_positions, logits))
  backend = backends.get(method, k, max_size)
  if backend.greedy is not None:
    return backend.greedy(logits, pairs[:, :max_size - 1])
  picks = greedy_ranking(logits, pairs, max_size)                        # [Q, M]
  picked = jnp.any(jax.nn.one_hot(picks, k, dtype=bool), axis=1)         # [Q, K]
  rest = _first_then_by_logit(~picked, logits)[:, :k - max_size]
  return jnp.concatenate([picks, rest], axis=1)
