"""Per-tool heads on frozen query embeddings: the trained per-tool baselines.

A head maps the frozen query embedding r(x) to one score per tool and is fit on the
training split's (query, gold set) pairs; nothing about sets is modelled, so it is the
baseline that tells how much HYSET's set terms add over ranking tools one by one.

- ``hidden = 0``: a linear head ``x W + b``, W started at 20 · Zᵀ (the tool embeddings, so
  it starts as the dense ranking with HYSET's initial logit scale, model.init_params).
- ``hidden > 0``: a one-hidden-layer MLP ``gelu(x W1 + b1) W2 + b2``.

Two losses (``loss``): ``"softmax"``, the per-tool softmax cross-entropy over the library
with the gold tools as targets (:func:`hyset_jax.training.losses.tool_loss`, the loss HYSET's
stage 1 is trained with), and ``"sigmoid"``, one-vs-rest binary cross-entropy on the
multi-hot gold vector (what a multi-label logistic regression fits). The baseline rows of
docs/results.md say which one they use and why (measured: benchmarks/results/).

Training is Adam on minibatches drawn by a seeded NumPy generator, so a fit is
deterministic given its seed. The trainer :func:`fit_head` is shared with the set
classifier (:mod:`hyset_jax.retrievers.set_classifier`), whose targets are set ids.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from hyset_jax.data.types import Query, ToolLibrary
from hyset_jax.errors import UserError
from hyset_jax.evaluation.metrics import RANK_ONLY_SET_SIZE
from hyset_jax.retrievers.base import Retrieval, check_depth, top_k_ids
from hyset_jax.retrievers.dense import embed

Loss = Literal["softmax", "sigmoid"]
LOSSES = ("softmax", "sigmoid")
SET_RULES = ("top5", "threshold")


@dataclasses.dataclass(frozen=True)
class HeadConfig:
  """How a head is trained (the defaults are the measured ToolLens settings).

  Attributes:
    hidden: hidden units of the MLP; 0 = linear head.
    loss: ``"softmax"`` (multi-target softmax CE) or ``"sigmoid"`` (one-vs-rest BCE).
    steps: Adam steps.
    batch_size: queries per step, drawn with replacement.
    learning_rate: Adam's step size.
    weight_decay: decoupled weight decay (AdamW); 0 = plain Adam.
    seed: initialisation and minibatch order.
  """
  hidden: int = 0
  loss: Loss = "softmax"
  steps: int = 3000
  batch_size: int = 256
  learning_rate: float = 3e-3
  weight_decay: float = 0.0
  seed: int = 0

  def __post_init__(self):
    if self.hidden < 0:
      raise UserError(f"head hidden units must be >= 0 (0 = linear), got {self.hidden}")
    if self.loss not in LOSSES:
      raise UserError(f"head loss must be one of {', '.join(LOSSES)}, got {self.loss!r}")
    if self.steps < 1 or self.batch_size < 1 or self.learning_rate <= 0:
      raise UserError(f"head steps, batch_size and learning_rate must be positive, got "
                      f"{self.steps}, {self.batch_size}, {self.learning_rate}")


def padded_targets(rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
  """Ragged target rows as ``(int32[n, m], bool[n, m])``, m = the longest row.

  >>> t, m = padded_targets([[3], [1, 2]])
  >>> t.tolist(), m.tolist()
  ([[3, 0], [1, 2]], [[True, False], [True, True]])
  """
  width = max(len(r) for r in rows)
  targets = np.zeros((len(rows), width), np.int32)
  mask = np.zeros((len(rows), width), bool)
  for i, r in enumerate(rows):
    targets[i, :len(r)], mask[i, :len(r)] = r, True
  return targets, mask


def head_logits(params: dict[str, Any], x: Any) -> Any:
  """f32[n, n_out] logits of a head for f32[n, d] embeddings (jnp or np arrays)."""
  import jax
  if "w1" in params:
    h = jax.nn.gelu(x @ params["w1"] + params["b1"])
    return h @ params["w2"] + params["b2"]
  return x @ params["w"] + params["b"]


def _loss_fn(loss: Loss):
  import jax.numpy as jnp
  import optax

  from hyset_jax.training import losses

  def softmax(logits, targets, mask):
    return losses.tool_loss(logits, targets, mask)

  def sigmoid(logits, targets, mask):
    # Multi-hot labels from the padded rows; BCE summed over the outputs (the mean over
    # hundreds of outputs would make the few positives' gradient vanish), mean over queries.
    rows = jnp.arange(targets.shape[0])[:, None]
    labels = jnp.zeros(logits.shape).at[rows, targets].max(mask.astype(logits.dtype))
    return jnp.mean(jnp.sum(optax.sigmoid_binary_cross_entropy(logits, labels), axis=-1))

  return {"softmax": softmax, "sigmoid": sigmoid}[loss]


def fit_head(x: np.ndarray, targets: Sequence[Sequence[int]], n_out: int, config: HeadConfig,
             init_w: np.ndarray | None = None) -> dict[str, np.ndarray]:
  """Trains a head on frozen embeddings.

  Args:
    x: f32[n, d] training query embeddings.
    targets: ``n`` non-empty lists of output indices in [0, n_out) (a query's gold tools,
      or its one set id).
    n_out: number of outputs (tools or sets).
    config: the training settings.
    init_w: f32[d, n_out] initial weight of a linear head (default: zeros).

  Returns:
    The trained parameters as NumPy arrays: ``{"w", "b"}`` (linear) or
    ``{"w1", "b1", "w2", "b2"}`` (MLP); feed them to :func:`head_logits`.
  """
  import jax
  import jax.numpy as jnp
  import optax

  x = np.asarray(x, np.float32)
  if x.ndim != 2 or x.shape[0] != len(targets) or not len(targets):
    raise ValueError(f"need f32[n, d] embeddings for n = {len(targets)} target rows, "
                     f"got shape {x.shape}")
  gold, mask = padded_targets(targets)
  if gold.min() < 0 or gold.max() >= n_out:
    raise ValueError(f"targets must lie in [0, {n_out}), got [{gold.min()}, {gold.max()}]")
  d = x.shape[1]
  key = jax.random.key(config.seed)
  if config.loss == "sigmoid":
    # Start each output at its training frequency, as a logistic regression's intercept
    # would settle; from 0 every tool starts at p = 0.5 and the first steps only push
    # hundreds of outputs down.
    freq = np.bincount(gold[mask], minlength=n_out) / len(gold)
    b = np.log(np.clip(freq, 1e-4, None) / np.clip(1.0 - freq, 1e-4, None)).astype(np.float32)
  else:
    b = np.zeros(n_out, np.float32)
  if config.hidden:
    params = {"w1": jax.random.normal(key, (d, config.hidden)) * 0.05,
              "b1": jnp.zeros(config.hidden),
              "w2": jax.random.normal(jax.random.fold_in(key, 1), (config.hidden, n_out)) * 0.05,
              "b2": jnp.asarray(b)}
  else:
    w = np.zeros((d, n_out), np.float32) if init_w is None else np.asarray(init_w, np.float32)
    if w.shape != (d, n_out):
      raise ValueError(f"init_w must be [{d}, {n_out}], got {w.shape}")
    params = {"w": jnp.asarray(w), "b": jnp.asarray(b)}
  if config.weight_decay:
    opt = optax.adamw(config.learning_rate, weight_decay=config.weight_decay)
  else:
    opt = optax.adam(config.learning_rate)
  state = opt.init(params)
  loss_fn = _loss_fn(config.loss)

  @jax.jit
  def step(p, s, xb, gb, mb):
    value, grads = jax.value_and_grad(lambda p: loss_fn(head_logits(p, xb), gb, mb))(p)
    updates, s = opt.update(grads, s, p)
    return optax.apply_updates(p, updates), s, value

  rng = np.random.default_rng(config.seed)
  for _ in range(config.steps):
    idx = rng.integers(0, len(x), config.batch_size)
    params, state, _ = step(params, state, x[idx], gold[idx], mask[idx])
  return {k: np.asarray(v) for k, v in params.items()}


def gold_rows(queries: Sequence[Query], index: dict[str, int], what: str) -> list[list[int]]:
  """Each query's gold tools as library rows; UserError for an empty or unknown gold set."""
  rows = []
  for q in queries:
    missing = [t for t in q.gold if t not in index]
    if not q.gold or missing:
      problem = "has no gold tools" if not q.gold else f"names tools not in the library: {missing[:3]}"
      raise UserError(f"{what} query {q.id!r} {problem}; a trained baseline needs each "
                      f"training query's gold tools in the library")
    rows.append([index[t] for t in q.gold])
  if not rows:
    raise UserError(f"the {what} split has no queries; a trained baseline needs training data")
  return rows


def threshold_sets(probs: np.ndarray, threshold: float,
                   max_size: int = RANK_ONLY_SET_SIZE) -> list[np.ndarray]:
  """Per query, the rows with probability ≥ ``threshold`` (at least the top one), best first,
  at most ``max_size``.

  Args:
    probs: f32[n, N] per-tool probabilities.

  Returns:
    ``n`` int arrays of library rows.

  >>> [s.tolist() for s in threshold_sets(np.array([[0.1, 0.7, 0.4], [0.2, 0.1, 0.3]]), 0.35)]
  [[1, 2], [2]]
  """
  order = np.argsort(-probs, axis=1, kind="stable")[:, :max_size]
  keep = np.take_along_axis(probs, order, axis=1) >= threshold
  keep[:, 0] = True
  return [row[k] for row, k in zip(order, keep)]


def choose_threshold(probs: np.ndarray, gold: Sequence[Sequence[int]],
                     max_size: int = RANK_ONLY_SET_SIZE) -> float:
  """The threshold that maximises mean set F1 on held-out (validation) queries.

  Candidates are the probabilities themselves at the first ``max_size`` ranks (every
  distinct cut), so the search is exact over thresholds; the highest of equally good
  thresholds wins (smaller sets).

  Args:
    probs: f32[n, N] per-tool probabilities of the validation queries.
    gold: ``n`` gold rows.
  """
  top = -np.sort(-probs, axis=1)[:, :max_size]  # f32[n, max_size]
  candidates = np.unique(top)[::-1]
  if len(candidates) > 512:  # a quantile grid is as good and keeps this instant
    candidates = np.unique(np.quantile(top, np.linspace(0, 1, 512)))[::-1]
  gold_sets = [set(g) for g in gold]
  order = np.argsort(-probs, axis=1, kind="stable")[:, :max_size]
  hits = np.array([[t in g for t in row] for row, g in zip(order, gold_sets)])  # bool[n, k]
  n_gold = np.array([len(g) for g in gold_sets], np.float64)
  best, best_f1 = float(candidates[0]), -1.0
  for tau in candidates:
    keep = top >= tau
    keep[:, 0] = True
    f1 = np.mean(2.0 * (hits & keep).sum(1) / (keep.sum(1) + n_gold))
    if f1 > best_f1 + 1e-12:
      best, best_f1 = float(tau), f1
  return best


def probabilities(logits: np.ndarray, loss: Loss) -> np.ndarray:
  """f32[n, N] per-tool probabilities under the head's own loss (softmax or sigmoid)."""
  logits = np.asarray(logits, np.float64)
  if loss == "sigmoid":
    return (1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
  z = np.exp(logits - logits.max(axis=1, keepdims=True))
  return (z / z.sum(axis=1, keepdims=True)).astype(np.float32)


class ToolHeadRetriever:
  """Ranks tools by a trained per-tool head; the predicted set is the top 5 or thresholded.

  Build it with :meth:`fit`. ``threshold = None`` scores the top 5 as the set, as the other
  rank-only retrievers do (metrics.RANK_ONLY_SET_SIZE); a threshold (chosen on validation
  queries by :meth:`fit`) gives a variable-size set: the tools whose probability reaches it,
  at least one, at most 5.
  """

  def __init__(self, params: dict[str, np.ndarray], tool_ids: Sequence[str], encoder: Any,
               config: HeadConfig, threshold: float | None = None):
    self.params = params
    self.tool_ids = tuple(tool_ids)
    self.encoder = encoder
    self.config = config
    self.threshold = threshold

  @classmethod
  def fit(cls, tools: ToolLibrary, encoder: Any, train: Sequence[Query],
          config: HeadConfig = HeadConfig(), *, set_rule: str = "top5",
          validation: Sequence[Query] = ()) -> ToolHeadRetriever:
    """Trains the head on ``train``; ``set_rule="threshold"`` picks τ on ``validation``."""
    if set_rule not in SET_RULES:
      raise UserError(f"set rule must be one of {', '.join(SET_RULES)}, got {set_rule!r}")
    if len(tools) == 0:
      raise ValueError("cannot fit a head over an empty tool library")
    index = tools.index()
    rows = gold_rows(train, index, "training")
    x = embed(encoder, [q.text for q in train])
    init_w = None if config.hidden else 20.0 * embed(encoder, tools.texts).T
    params = fit_head(x, rows, len(tools), config, init_w=init_w)
    head = cls(params, tools.ids, encoder, config)
    if set_rule == "threshold":
      if not validation:
        raise UserError("a thresholded set needs validation queries to choose the threshold on")
      probs = head.probabilities([q.text for q in validation])
      head.threshold = choose_threshold(probs, gold_rows(validation, index, "validation"))
    return head

  def logits(self, queries: Sequence[str]) -> np.ndarray:
    """f32[n_queries, n_tools] the head's logits."""
    return np.asarray(head_logits(self.params, embed(self.encoder, queries)))

  def probabilities(self, queries: Sequence[str]) -> np.ndarray:
    """f32[n_queries, n_tools] per-tool probabilities (softmax or sigmoid of the logits)."""
    return probabilities(self.logits(queries), self.config.loss)

  def retrieve(self, queries: Sequence[str], depth: int) -> Retrieval:
    check_depth(depth)
    probs = self.probabilities(queries)
    rankings = top_k_ids(probs, self.tool_ids, depth)
    if self.threshold is None:
      return Retrieval(rankings=rankings)
    ids = np.asarray(self.tool_ids, dtype=object)
    return Retrieval(rankings=rankings,
                     sets=[ids[s].tolist() for s in threshold_sets(probs, self.threshold)])


class LexicalHeadRetriever:
  """A per-tool head with HYSET's lexical term: logits + β · b(x, t) (:mod:`hyset_jax.model.lexical`),
  β chosen on validation queries from ``lexical.WEIGHTS`` (0 competes and wins ties) by the mean
  of R@3/5, NDCG@3/5 and COMP@3/5 — the baseline that HYSET with the term is compared with, so
  that the words' gain is not counted as the set term's. Ranks only (its set: the top 5)."""

  def __init__(self, head: ToolHeadRetriever, index: Any, weight: float = 0.0):
    self.head, self.index, self.weight = head, index, float(weight)
    self.tool_ids = head.tool_ids

  def scores(self, queries: Sequence[str]) -> np.ndarray:
    return self.head.logits(queries) + self.weight * self.index.scores(queries)

  @classmethod
  def fit(cls, head: ToolHeadRetriever, index: Any,
          validation: Sequence[Query]) -> LexicalHeadRetriever:
    from hyset_jax.evaluation import metrics
    from hyset_jax.model import lexical
    texts = [q.text for q in validation]
    logits, b = head.logits(texts), index.scores(texts)
    gold = [list(q.gold) for q in validation]
    keys = ("recall@3", "recall@5", "ndcg@3", "ndcg@5", "comp@3", "comp@5")
    def mean(weight):
      m = metrics.evaluate(top_k_ids(logits + weight * b, head.tool_ids, 20), gold)
      return float(np.mean([m[k] for k in keys]))
    best = max((0.0,) + lexical.WEIGHTS, key=lambda w: (mean(w), -w))
    return cls(head, index, best)

  def retrieve(self, queries: Sequence[str], depth: int) -> Retrieval:
    check_depth(depth)
    return Retrieval(rankings=top_k_ids(self.scores(queries), self.tool_ids, depth))
