"""The HYSET training objective (paper Eq. 8-10) as pure functions over pool scores.

Scores come from :func:`hyset_jax.model.scoring.set_scores` over each query's candidate pool C_i,
with the gold set E*_i at pool position 0. Losses are means over the batch (the paper writes
sums; a mean keeps the learning rate independent of the batch size).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def retrieval_loss(pool_scores: jax.Array) -> jax.Array:
  """L_ret = −log softmax_{C_i}(F)[E*_i], the gold set at position 0 (Eq. 8).

  Args:
    pool_scores: f32[B, K_neg].

  Returns:
    f32[] mean over the batch.

  >>> import numpy as np
  >>> round(float(retrieval_loss(np.zeros((2, 4)))), 4)  # uniform over 4: log 4
  1.3863
  """
  return -jnp.mean(jax.nn.log_softmax(pool_scores, axis=-1)[:, 0])


def self_training_loss(pool_scores: jax.Array, selected: jax.Array, reward: jax.Array) -> jax.Array:
  """L_self = −ρ_i log softmax_{C_i}(F)[Ê_i] (Eq. 9).

  Ê_i (``selected``) and ρ_i (``reward``) are held constant: no gradient flows through them.

  Args:
    pool_scores: f32[B, K_neg].
    selected: int[B], pool position of Ê_i.
    reward: f32[B], ρ_i ∈ [0, 1] (0 where no reward is known).

  Returns:
    f32[] mean over the batch.
  """
  selected = jax.lax.stop_gradient(selected)
  reward = jax.lax.stop_gradient(reward)
  logp = jnp.take_along_axis(jax.nn.log_softmax(pool_scores, axis=-1), selected[:, None], 1)[:, 0]
  return -jnp.mean(reward * logp)


def tool_loss(tool_logits: jax.Array, gold: jax.Array, gold_mask: jax.Array) -> jax.Array:
  """Per-tool softmax cross-entropy of ℓ over the whole library, the gold tools as targets.

  Not in the paper's objective (Eq. 10): an optional auxiliary term (``train.tool_loss_weight``)
  that trains stage 1 (Eq. 12) directly. The set loss alone ranks tools through F_align, a
  softmax-weighted mean dominated by each set's best member, so the 2nd and 3rd gold tools of
  a query get little gradient and the shortlist S0 misses them.

  Args:
    tool_logits: f32[B, N] ℓ for every tool.
    gold: int[B, m] gold tool rows (padding anywhere ``gold_mask`` is False).
    gold_mask: bool[B, m].

  Returns:
    f32[] mean over the batch of −(1/|E*|) Σ_{t∈E*} log softmax(ℓ)_t.

  >>> import numpy as np
  >>> round(float(tool_loss(np.zeros((1, 4)), np.array([[0, 1]]), np.array([[True, True]]))), 4)
  1.3863
  """
  logp = jnp.take_along_axis(jax.nn.log_softmax(tool_logits, axis=-1), gold, axis=1)
  per_query = jnp.sum(jnp.where(gold_mask, logp, 0.0), -1) / jnp.sum(gold_mask, -1)
  return -jnp.mean(per_query)


def exhaustive_loss(subset_scores: jax.Array, gold_score: jax.Array,
                    gold_listed: jax.Array) -> jax.Array:
  """−log softmax of E* among every subset of the shortlist (and E* itself when it is not one).

  Not in the paper (an optional term, ``train.exhaustive_loss_weight``). The pool loss of
  Eq. 8 ranks E* against K_neg − 1 sampled sets; at inference E* has to win the argmax of
  Eq. 14 against all C(K_pool, ≤ M) subsets of the shortlist, most of them never sampled. This
  term trains against exactly that competition.

  Args:
    subset_scores: f32[B, n] F of every subset of each query's shortlist (any order).
    gold_score: f32[B] F(E*).
    gold_listed: bool[B] whether E* is among those subsets (then it is not added again).

  Returns:
    f32[] mean over the batch.

  >>> import numpy as np
  >>> s = np.zeros((2, 3))
  >>> round(float(exhaustive_loss(s, np.zeros(2), np.array([True, False]))), 4)  # (log 3 + log 4)/2
  1.2425
  """
  extra = jnp.where(gold_listed, -jnp.inf, gold_score)[:, None]
  lse = jax.nn.logsumexp(jnp.concatenate([subset_scores, extra], axis=1), axis=1)
  return jnp.mean(lse - gold_score)


def interaction_penalty(interactions: jax.Array) -> jax.Array:
  """Σ_m ‖M_m‖²_F (the λ term of Eq. 10). f32[M−1, d, d] -> f32[]."""
  return jnp.sum(jnp.square(interactions))


def total_loss(pool_scores: jax.Array, selected: jax.Array, reward: jax.Array,
               interactions: jax.Array, *, eta: float, l2: float) -> tuple[jax.Array, dict]:
  """L = L_ret + η L_self + λ Σ‖M_m‖²_F (Eq. 10), with its parts for logging."""
  l_ret = retrieval_loss(pool_scores)
  l_self = self_training_loss(pool_scores, selected, reward)
  reg = interaction_penalty(interactions)
  loss = l_ret + eta * l_self + l2 * reg
  return loss, {"loss": loss, "loss_ret": l_ret, "loss_self": l_self, "l2": reg}
