"""Dense retrievers on the frozen encoder with a trained linear projection adapter.

The paper fine-tunes BGE-M3 with MultipleNegativesRankingLoss (MNRL) and
retrieval-confusing hard negatives mined from the current depth-20 pool; its
Table 20 shows the same specialist/aggregate pattern with a frozen backbone and
a shared linear projection trained over query and tool embeddings. This module
is that adapter: one matrix W ∈ R^{d×d} (identity at start, so the untrained
adapter is exactly the off-the-shelf dense retriever) applied to both sides,

  s(q, t) = cos(W·r(q), W·r(t)).

Training (:func:`train_adapter`): one example per query per epoch, the positive
drawn from its gold set; before each epoch every query gets hard negatives
sampled from the non-gold tools of its current top-``mine_depth`` pool. MNRL is
cross-entropy over the in-batch positives plus the batch's hard negatives with
``scale`` 20 (the sentence-transformers default); candidates that are gold for
a query other than as its own target are masked out of that query's softmax, so
a multi-tool query is never pushed away from its other gold tools.

Few-shot continuation repair (paper Table 12) is :func:`train_adapter` started
from a trained W with a handful of matched examples.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from hyset_jax.retrievers.base import Retrieval, check_depth, top_k_ids

_MASKED = -1e9  # a logit no real score reaches (scale · cos ≤ 20)


@dataclasses.dataclass(frozen=True)
class AdapterConfig:
  """Training settings of the projection adapter.

  Attributes:
    epochs: passes over the training queries.
    batch_size: queries per step (in-batch negatives = the other positives).
    learning_rate: Adam step size.
    scale: MNRL logit scale (inverse temperature).
    hard_negatives: mined negatives per query.
    mine_depth: pool depth hard negatives are drawn from (paper: 20).
    seed: shuffling and sampling seed.
  """
  epochs: int = 4
  batch_size: int = 64
  learning_rate: float = 1e-3
  scale: float = 20.0
  hard_negatives: int = 1
  mine_depth: int = 20
  seed: int = 0


def _normalize(x: jax.Array) -> jax.Array:
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def project(w: np.ndarray | jax.Array, x: np.ndarray) -> np.ndarray:
  """Unit rows of ``x @ w``: ``float32[n, d]`` from ``float32[n, d]``."""
  y = np.asarray(x, np.float32) @ np.asarray(w, np.float32)
  return y / np.maximum(np.linalg.norm(y, axis=1, keepdims=True), 1e-12)


def mnrl_loss(w: jax.Array, queries: jax.Array, candidates: jax.Array, candidate_ids: jax.Array,
              gold_ids: jax.Array, scale: float, where: jax.Array | None = None) -> jax.Array:
  """MNRL with masked false negatives.

  Args:
    w: ``float32[d, d]`` projection.
    queries: ``float32[B, d]`` frozen query embeddings.
    candidates: ``float32[C, d]`` frozen tool embeddings, ``C = B·(1 + h)``: the
      ``B`` positives in query order, then ``h`` hard negatives per query
      (query-major, as ``negatives[B, h].ravel()``).
    candidate_ids: ``int32[C]`` library rows of the candidates.
    gold_ids: ``int32[B, G]`` each query's gold rows, padded with −1.
    scale: logit scale.
    where: optional ``bool[B]``; False marks padding rows, which neither count
      in the loss nor serve as candidates (one compiled shape fits any batch).

  Returns:
    Scalar mean cross-entropy of each real query's positive against all real candidates.

  >>> w = jnp.eye(2)
  >>> q = jnp.array([[1.0, 0.0], [0.0, 1.0]])
  >>> loss = mnrl_loss(w, q, q, jnp.array([0, 1]), jnp.array([[0], [1]]), 1.0)
  >>> round(float(loss), 4)  # log(1 + e^-1): each positive beats one orthogonal negative
  0.3133
  >>> pad = mnrl_loss(w, jnp.concatenate([q, q]), jnp.concatenate([q, q]),
  ...                 jnp.array([0, 1, 0, 1]), jnp.array([[0], [1], [0], [1]]), 1.0,
  ...                 where=jnp.array([True, True, False, False]))
  >>> round(float(pad), 4)  # the padding rows change nothing
  0.3133
  """
  b, c = queries.shape[0], candidates.shape[0]
  qp = _normalize(queries @ w)  # [B, d]
  cp = _normalize(candidates @ w)  # [C, d]
  logits = scale * qp @ cp.T  # [B, C]
  is_gold = (gold_ids[:, :, None] == candidate_ids[None, None, :]).any(axis=1)  # [B, C]
  own = jnp.arange(c)[None, :] == jnp.arange(b)[:, None]  # [B, C]
  masked = is_gold & ~own
  if where is None:
    where = jnp.ones((b,), bool)
  owner = jnp.concatenate([jnp.arange(b), jnp.repeat(jnp.arange(b), (c - b) // b)])  # [C]
  masked = masked | ~where[owner][None, :]
  logits = jnp.where(masked, _MASKED, logits)
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.arange(b))
  return jnp.sum(jnp.where(where, losses, 0.0)) / jnp.maximum(where.sum(), 1)


@functools.lru_cache(maxsize=None)
def _make_step(learning_rate: float, scale: float):
  """(optimizer, jitted step); cached so every training run with these settings reuses
  the compiled step instead of tracing and compiling it again."""
  optimizer = optax.adam(learning_rate)

  @jax.jit
  def step(w, opt_state, queries, candidates, candidate_ids, gold_ids, where):
    loss, grad = jax.value_and_grad(mnrl_loss)(w, queries, candidates, candidate_ids,
                                               gold_ids, scale, where)
    updates, opt_state = optimizer.update(grad, opt_state, w)
    return optax.apply_updates(w, updates), opt_state, loss
  return optimizer, step


def pad_gold(gold_rows: Sequence[Sequence[int]], multiple: int = 1) -> np.ndarray:
  """``int32[n, G]`` of gold rows padded with −1; G = the largest set, rounded up to ``multiple``.

  >>> pad_gold([[3], [1, 2]]).tolist()
  [[3, -1], [1, 2]]
  >>> pad_gold([[3]], multiple=4).tolist()
  [[3, -1, -1, -1]]
  """
  width = max((len(g) for g in gold_rows), default=1)
  width = -(-max(width, 1) // multiple) * multiple
  out = np.full((len(gold_rows), width), -1, np.int32)
  for i, g in enumerate(gold_rows):
    out[i, :len(g)] = g
  return out


def mine_hard_negatives(query_emb: np.ndarray, tool_emb: np.ndarray, w: np.ndarray,
                        gold: np.ndarray, depth: int, count: int,
                        rng: np.random.Generator) -> np.ndarray:
  """Hard negatives from each query's current top-``depth`` pool.

  Args:
    query_emb: ``float32[n, d]``; tool_emb: ``float32[N, d]`` (frozen).
    w: current projection ``float32[d, d]``.
    gold: ``int32[n, G]`` padded gold rows.
    depth: pool depth.
    count: negatives per query.
    rng: sampler.

  Returns:
    ``int32[n, count]``: tools drawn uniformly from the non-gold part of the pool
    (a uniformly drawn non-gold tool when the pool is all gold).
  """
  n, n_tools = len(query_emb), len(tool_emb)
  scores = project(w, query_emb) @ project(w, tool_emb).T  # [n, N]
  depth = min(depth, n_tools)
  pool = np.argpartition(-scores, depth - 1, axis=1)[:, :depth]  # [n, depth], unordered
  out = np.zeros((n, count), np.int32)
  for i in range(n):
    golds = set(gold[i][gold[i] >= 0].tolist())
    options = [t for t in pool[i].tolist() if t not in golds]
    if not options:
      options = [t for t in range(n_tools) if t not in golds] or [int(pool[i, 0])]
    out[i] = rng.choice(options, size=count, replace=len(options) < count)
  return out


def train_adapter(query_emb: np.ndarray, gold_rows: Sequence[Sequence[int]],
                  tool_emb: np.ndarray, config: AdapterConfig,
                  init: np.ndarray | None = None) -> tuple[np.ndarray, list[float]]:
  """Trains the projection with MNRL and mined hard negatives.

  Args:
    query_emb: ``float32[n, d]`` frozen embeddings of the training queries.
    gold_rows: ``n`` non-empty lists of library rows.
    tool_emb: ``float32[N, d]`` frozen tool embeddings.
    config: :class:`AdapterConfig`.
    init: starting ``float32[d, d]`` (continuation); identity when None.

  Returns:
    ``(w float32[d, d], mean loss per epoch)``.
  """
  n, d = query_emb.shape
  if n == 0:
    raise ValueError("no training queries")
  if any(not g for g in gold_rows):
    raise ValueError("every training query needs at least one gold tool")
  rng = np.random.default_rng(config.seed)
  # Gold width padded to a multiple of 8 and short batches padded to batch_size
  # (masked): every run with the same settings shares one compiled step.
  gold = pad_gold(gold_rows, multiple=8)
  w = jnp.asarray(np.eye(d, dtype=np.float32) if init is None else init, jnp.float32)
  optimizer, step = _make_step(float(config.learning_rate), float(config.scale))
  opt_state = optimizer.init(w)
  batch = config.batch_size
  query_emb = np.asarray(query_emb, np.float32)
  tool_emb = np.asarray(tool_emb, np.float32)
  sizes = (gold >= 0).sum(axis=1)
  losses = []
  for _ in range(config.epochs):
    negatives = mine_hard_negatives(query_emb, tool_emb, np.asarray(w), gold,
                                    config.mine_depth, config.hard_negatives, rng)
    # One positive per query this epoch, drawn from its gold set.
    positives = gold[np.arange(n), rng.integers(0, sizes)]
    order = rng.permutation(n)
    epoch_losses = []
    # Full batches; a remainder is dropped, unless it is all there is (few-shot).
    for start in range(0, max(n - batch + 1, 1), batch):
      real = order[start:start + batch]
      rows = np.resize(real, batch)  # padding repeats real rows; `where` masks them
      where = np.arange(batch) < len(real)
      cand = np.concatenate([positives[rows], negatives[rows].ravel()]).astype(np.int32)
      # Gathers on the host: jitted gathers would compile once per index shape.
      w, opt_state, loss = step(w, opt_state, query_emb[rows], tool_emb[cand], cand,
                                gold[rows], where)
      epoch_losses.append(float(loss))
    if not np.isfinite(epoch_losses).all():
      raise FloatingPointError(f"non-finite MNRL loss ({epoch_losses[-1]})")
    losses.append(float(np.mean(epoch_losses)))
  return np.asarray(w), losses


class AdapterRetriever:
  """Dense retrieval through a projection: ranks tools by cos(W·r(q), W·r(t)).

  Implements :class:`hyset_jax.retrievers.Retriever`, so BM25+dense fusion and
  the metrics treat it like any other retriever.

  Args:
    tool_ids: library ids in row order.
    tool_emb: ``float32[N, d]`` frozen tool embeddings.
    w: ``float32[d, d]`` projection (identity = off-the-shelf dense).
    encoder: what embeds query texts for :meth:`retrieve` (through the cache).
  """

  def __init__(self, tool_ids: Sequence[str], tool_emb: np.ndarray, w: np.ndarray,
               encoder: Any = None):
    self.tool_ids = tuple(tool_ids)
    self.w = np.asarray(w, np.float32)
    self.tools = project(self.w, tool_emb)  # [N, d]
    self.encoder = encoder

  def scores_from_embeddings(self, query_emb: np.ndarray) -> np.ndarray:
    """``float32[n, N]`` cosine scores for frozen query embeddings ``float32[n, d]``."""
    return project(self.w, query_emb) @ self.tools.T

  def rank_embeddings(self, query_emb: np.ndarray, depth: int) -> list[list[str]]:
    check_depth(depth)
    return top_k_ids(self.scores_from_embeddings(query_emb), self.tool_ids, depth)

  def retrieve(self, queries: Sequence[str], depth: int) -> Retrieval:
    from hyset_jax.retrievers.dense import embed
    if self.encoder is None:
      raise ValueError("this retriever has no encoder; use rank_embeddings")
    return Retrieval(rankings=self.rank_embeddings(embed(self.encoder, queries), depth))
