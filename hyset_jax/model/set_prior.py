"""The seen-set prior: a term of F for the gold sets seen in training (not in the paper).

HYSET's F composes a set's score from its tools and their pairs, which is what lets it name a
set never seen in training. Where the sets asked for later *are* the training sets (ToolLens is
scene-based: every official test set occurs in training), a free score per seen set is the
strongest signal there is — the set classifier baseline is exactly that. The prior adds it to F
without taking anything away:

  F'(x, E) = F(x, E) + λ · max(0, log p(E | r) − log τ)   for E one of the S seen sets,
  F'(x, E) = F(x, E)                                     for every other set,

where p(· | r) is a softmax over the S seen sets on the query embedding r (a linear classifier
fitted after θ, on the training queries; :func:`hyset_jax.retrievers.heads.fit_head`), and λ ≥ 0
and τ are chosen on validation data. The bonus is never negative and is 0 for every set that
is not a seen set, so the exact argmax of F' over all subsets of the shortlist is either the
enumeration's argmax E₀ of F or a seen set inside the shortlist whose bonus lifts it above
F(E₀): stage 2 stays one enumeration plus a gather over the S seen sets (:func:`seen_sets`),
and the enumeration kernels do not change. λ = 0 is the model without the prior.

Ties: a seen set replaces E₀ only when its F' is strictly larger; among seen sets, the first
maximum in the prior's set order wins.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hyset_jax.model import scoring
from hyset_jax.errors import UserError
from hyset_jax.model.scoring import SetPrior


def bonus(prior: SetPrior, query_emb: jax.Array) -> jax.Array:
  """λ · max(0, log p(s | r) − log τ) for every seen set: f32[Q, d_r] -> f32[Q, S]."""
  logp = jax.nn.log_softmax(query_emb @ prior.w.T + prior.b, axis=-1)
  return prior.weight * jnp.maximum(logp - prior.floor, 0.0)


def shortlist_positions(members: jax.Array, tools: jax.Array, max_size: int
                        ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Where each seen set's members sit in each shortlist.

  Args:
    members: int32[S, M'] seen sets (tool rows, -1 padding).
    tools: int32[Q, K] shortlists.
    max_size: M: sets larger than this are never inside (stage 2 scores sizes 1..M only).

  Returns:
    (positions int32[Q, S, M'] (K for padding and for members outside the shortlist),
     member mask bool[S, M'], inside bool[Q, S]: every member is in the shortlist,
     hit bool[Q, S, M', K]: member slot j of set s is shortlist position k).
  """
  k = tools.shape[1]
  real = members >= 0                                                   # [S, M']
  hit = members[None, :, :, None] == tools[:, None, None, :]            # [Q, S, M', K]
  found = jnp.any(hit, axis=-1)                                         # [Q, S, M']
  positions = jnp.where(found, jnp.argmax(hit, axis=-1), k).astype(jnp.int32)
  small = jnp.sum(real, axis=-1) <= max_size                            # [S]
  inside = jnp.all(found | ~real, axis=-1) & small & jnp.any(real, axis=-1)
  return positions, real, inside, hit


def seen_set_scores(logits: jax.Array, pairs: jax.Array, positions: jax.Array,
                    real: jax.Array) -> jax.Array:
  """F of each seen set from the shortlist's ℓ and pair matrices (meaningful where inside).

  Args:
    logits: f32[Q, K] ℓ of the shortlist.
    pairs: f32[Q, M−1, K, K] G_m (M_m and the conditioned term already folded in).
    positions, real: from :func:`shortlist_positions`.

  Returns:
    f32[Q, S].
  """
  q, k = logits.shape
  padded = jnp.concatenate([logits, jnp.zeros((q, 1), logits.dtype)], axis=1)
  member_logits = jnp.take_along_axis(padded, positions.reshape(q, -1), axis=1).reshape(
      positions.shape)                                                  # [Q, S, M']
  align = scoring.align_scores(member_logits, real[None])
  size = jnp.sum(real, axis=-1)                                         # [S]
  m_idx = jnp.clip(size - 2, 0, pairs.shape[1] - 1)                     # [S]
  width = positions.shape[-1]
  a, b = jnp.triu_indices(width, 1)
  pa, pb = positions[..., a], positions[..., b]                         # [Q, S, P]
  ok = real[:, a] & real[:, b]                                          # [S, P]
  safe_a, safe_b = jnp.minimum(pa, k - 1), jnp.minimum(pb, k - 1)
  qi = jnp.arange(q)[:, None, None]
  g = pairs[qi, m_idx[None, :, None], safe_a, safe_b]                   # [Q, S, P]
  return align + jnp.sum(jnp.where(ok[None], g, 0.0), axis=-1)


class SeenSets(NamedTuple):
  """Stage 2's view of the prior for a batch of shortlists.

  Attributes:
    wins: bool[Q]: a seen set's F' is strictly above F(E₀), so it is Ê.
    positions: int32[Q, M] that set's shortlist positions, ascending, K for padding.
    score: f32[Q] its F'.
    member_bonus: f32[Q, K]: for each shortlist position, the sum of the bonuses of the seen
      sets inside the shortlist that contain it (what the ``set-mean`` ranking adds).
    member_best: f32[Q, K]: for each shortlist position, the largest F' of a seen set with a
      positive bonus that contains it, -inf if none (what ``set-max`` compares with F's).
    named: bool[Q]: every tool of the shortlist (slots holding a negative row excepted) is a
      member of some seen set, i.e. training named it (``set-max`` ranks only such queries).
  """
  wins: jax.Array
  positions: jax.Array
  score: jax.Array
  member_bonus: jax.Array
  member_best: jax.Array
  named: jax.Array


def named_tools(hit: jax.Array, tools: jax.Array) -> jax.Array:
  """bool[Q]: every shortlist tool is a member of some seen set (negative rows, the slots a
  filter rules out, count as named). ``hit``: :func:`shortlist_positions`' bool[Q, S, M', K];
  ``tools``: int32[Q, K]."""
  return jnp.all(jnp.any(hit, axis=(1, 2)) | (tools < 0), axis=1)


def seen_sets(prior: SetPrior, query_emb: jax.Array, tools: jax.Array, logits: jax.Array,
              pairs: jax.Array, best_score: jax.Array, max_size: int) -> SeenSets:
  """The seen sets inside each shortlist under F', against the enumeration's F(E₀).

  Args:
    prior: the prior.
    query_emb: f32[Q, d_r] r.
    tools, logits: the shortlist int32[Q, K] and its ℓ f32[Q, K].
    pairs: f32[Q, M−1, K, K] G_m.
    best_score: f32[Q] F(E₀), the enumeration's best score.
    max_size: M (≤ the prior's width).

  Returns:
    SeenSets.
  """
  positions, real, inside, member = shortlist_positions(prior.members, tools, max_size)
  extra = jnp.where(inside, bonus(prior, query_emb), 0.0)               # [Q, S]
  # Only a set with a positive bonus can beat E₀: F(E₀) ≥ F of every subset of the shortlist.
  total = jnp.where(inside & (extra > 0),
                    seen_set_scores(logits, pairs, positions, real) + extra, -jnp.inf)
  s = jnp.argmax(total, axis=1)                                         # first maximum
  score = jnp.take_along_axis(total, s[:, None], axis=1)[:, 0]
  best = jnp.sort(jnp.take_along_axis(positions, s[:, None, None], axis=1)[:, 0], axis=1)
  # Members of a set inside have size ≤ M, so after the sort its first M slots hold them all.
  member_best = jnp.max(jnp.where(member, total[:, :, None, None], -jnp.inf), axis=(1, 2))
  return SeenSets(score > best_score, best[:, :max_size], score,
                  jnp.einsum("qs,qsmk->qk", extra, member.astype(extra.dtype)), member_best,
                  named_tools(member, tools))


def fit(query_emb: np.ndarray, gold: Sequence[Sequence[int]], max_size: int, seed: int = 0
        ) -> SetPrior:
  """The prior's classifier over the distinct gold sets of the training queries, weight 0.

  The set classifier baseline's fit (:mod:`hyset_jax.retrievers.set_classifier`: a linear
  softmax over the sets from zero weights, its step budget), so the prior and that baseline
  are the same function of r.

  Args:
    query_emb: f32[n, d_r] training query embeddings (the query encoder's, as at inference).
    gold: ``n`` gold sets as tool rows.
    max_size: M, the prior's width; larger gold sets are left out.
    seed: minibatch order.

  Returns:
    SetPrior (NumPy arrays) with λ = 0 and log τ = 0: set them with :func:`with_weight`.
  """
  from hyset_jax.retrievers.heads import fit_head
  from hyset_jax.retrievers.set_classifier import DEFAULT_CONFIG, distinct_sets
  keep = [i for i, g in enumerate(gold) if 1 <= len(g) <= max_size]
  if not keep:
    raise UserError(f"the seen-set prior needs training queries with 1..{max_size} gold tools; "
                    f"there are none")
  sets, labels = distinct_sets([gold[i] for i in keep])
  params = fit_head(np.asarray(query_emb, np.float32)[keep], [[c] for c in labels], len(sets),
                    dataclasses.replace(DEFAULT_CONFIG, seed=seed))
  members = np.full((len(sets), max_size), -1, np.int32)
  for s, tools in enumerate(sets):
    members[s, :len(tools)] = tools
  return SetPrior(members, np.ascontiguousarray(params["w"].T, np.float32),
                  np.asarray(params["b"], np.float32), np.float32(0.0), np.float32(0.0))


def with_weight(prior: SetPrior, weight: float, tau: float) -> SetPrior:
  """``prior`` with λ = ``weight`` and τ = ``tau`` (0 < τ ≤ 1)."""
  if weight < 0 or not 0 < tau <= 1:
    raise UserError(f"the seen-set prior needs λ ≥ 0 and 0 < τ ≤ 1, got λ = {weight}, "
                    f"τ = {tau}")
  return prior._replace(weight=np.float32(weight), floor=np.float32(np.log(tau)))
