"""What the paper's set-level baselines (§3.3) share: ℓ, the shortlist, the size predictor and
the choice of hyper-parameters on validation.

Every set-level baseline (:mod:`~hyset_jax.retrievers.greedy_sets`,
:mod:`~hyset_jax.retrievers.set_scorers`) works on the same inputs:

- ℓ: the per-tool linear head's logits (``linear-head``: ``x W + b``, W started at 20 · Zᵀ, the
  per-tool softmax loss of HYSET's stage 1). It plays the part of the paper's stage-1 score
  r(x)ᵀ P z_j (Eq. 12), which is also a linear map of the frozen query embedding trained on
  the annotations; the dense cosine would hand every baseline a ranking no training improved.
- the shortlist S: the K_pool tools of highest ℓ (ties: library order). HYSET widens its S0 by
  the complementarity of M_M (Eq. 13); the baselines have no M, so their S is ℓ's top K_pool.
- M: the largest training gold set, within 2..5 (the paper sets M = 5, its largest set size).
- the frozen tool embeddings Z (unit rows): the tool-tool similarity of MMR and facility
  location, and the set elements of DeepSets and the Set Transformer.

Hyper-parameters are chosen on the validation queries: rank settings by the mean of
R@3/5, NDCG@3/5 and COMP@3/5 (as ``LexicalHeadRetriever`` chooses β), set-size settings by the
mean set F1 (as a head's threshold is chosen); the first of equally good grid values wins.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hyset_jax.evaluation import metrics
from hyset_jax.data.types import Query, ToolLibrary
from hyset_jax.errors import UserError
from hyset_jax.retrievers.base import Retrieval, check_depth
from hyset_jax.retrievers.dense import embed
from hyset_jax.retrievers.heads import (HeadConfig, ToolHeadRetriever, fit_head, gold_rows,
                                        head_logits)

RANK_KEYS = ("recall@3", "recall@5", "ndcg@3", "ndcg@5", "comp@3", "comp@5")
# The paper's largest M: beyond it the exhaustive decoding of the set scorers grows fast
# (Σ_m C(20, m) = 21,699 sets at M = 5, 60,459 at M = 6).
MAX_M = 5


@dataclasses.dataclass(frozen=True)
class SetBaselineConfig:
  """Settings of the set-level baselines (defaults: the measured ToolLens settings).

  Attributes:
    k_pool: shortlist length K_pool (the paper's 20).
    max_size: M; None = the largest training gold set, within 2..:data:`MAX_M` (the subset
      tables start at pairs).
    seed: initialisation, minibatch order and negative sampling.
    size_steps: Adam steps of the set-size classifier (a convex linear softmax).
    width: hidden width of DeepSets / the Set Transformer.
    heads: attention heads of the Set Transformer (``width`` must divide by it).
    steps: most Adam steps of a set scorer (early stopping usually ends it sooner).
    batch_size: training queries per step.
    negatives: negative candidate sets per training query (the pool is these + E*).
    learning_rate: Adam's step size for the set scorers.
    eval_every: steps between validation losses (early stopping).
    patience: validation losses without improvement before stopping.
  """
  k_pool: int = 20
  max_size: int | None = None
  seed: int = 0
  size_steps: int = 2000
  width: int = 64
  heads: int = 4
  steps: int = 600
  batch_size: int = 64
  negatives: int = 31
  learning_rate: float = 3e-3
  eval_every: int = 50
  patience: int = 3

  def __post_init__(self):
    if self.max_size is not None and not 2 <= self.max_size <= MAX_M:
      raise UserError(f"set baselines' max_size must be in 2..{MAX_M}, got {self.max_size}")
    if self.k_pool < 2 or min(self.size_steps, self.width, self.heads, self.steps,
                              self.batch_size, self.negatives, self.eval_every,
                              self.patience) < 1 or self.learning_rate <= 0:
      raise UserError(f"invalid set-baseline settings: {self}")
    if self.width % self.heads:
      raise UserError(f"width {self.width} must be a multiple of heads {self.heads}")


@dataclasses.dataclass(frozen=True)
class Stage1:
  """ℓ's head, the frozen tool embeddings and the sizes every set baseline reads.

  Attributes:
    head: the fitted per-tool linear head (ℓ).
    tool_z: f32[N, d] unit-norm frozen tool embeddings.
    k_pool: K_pool, at most N − 1 (a set baseline needs a tool outside any set).
    max_size: M, below K_pool.
  """
  head: ToolHeadRetriever
  tool_z: np.ndarray
  k_pool: int
  max_size: int

  @property
  def tool_ids(self) -> tuple[str, ...]:
    return self.head.tool_ids

  def embed(self, texts: Sequence[str]) -> np.ndarray:
    """f32[n, d] unit-norm frozen query embeddings."""
    return embed(self.head.encoder, list(texts))

  def inputs(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x f32[n, d] query embeddings, ℓ f32[n, N], shortlist int[n, K] rows by descending ℓ)."""
    x = self.embed(texts)
    logits = np.asarray(head_logits(self.head.params, x), np.float32)
    return x, logits, shortlist(logits, self.k_pool)


def shortlist(logits: np.ndarray, k: int) -> np.ndarray:
  """int[n, k] the rows of the k highest logits, best first, ties by row order.

  >>> shortlist(np.array([[0.1, 0.5, 0.5, 0.2]]), 3).tolist()
  [[1, 2, 3]]
  """
  return np.argsort(-logits, axis=1, kind="stable")[:, :k]


# ℓ's head is the same for every set baseline fit on the same data and seed; the benchmark
# fits five of them in one process, so the head (30-65 s on ToolLens) is fit once. Entries
# keep their encoder alive, so its id cannot be reused while the entry exists.
_STAGE1_CACHE: list[tuple[tuple, Any, ToolHeadRetriever]] = []
_STAGE1_CACHE_SIZE = 4


def _stage1_head(tools: ToolLibrary, encoder: Any, train: Sequence[Query],
                 seed: int) -> ToolHeadRetriever:
  key = (tools.ids, tools.texts, tuple((q.text, q.gold) for q in train), seed)
  for k, enc, head in _STAGE1_CACHE:
    if enc is encoder and k == key:
      return head
  head = ToolHeadRetriever.fit(tools, encoder, train, HeadConfig(hidden=0, seed=seed))
  _STAGE1_CACHE.append((key, encoder, head))
  del _STAGE1_CACHE[:-_STAGE1_CACHE_SIZE]
  return head


def fit_stage1(tools: ToolLibrary, encoder: Any, train: Sequence[Query],
               config: SetBaselineConfig) -> tuple[Stage1, list[list[int]]]:
  """ℓ's head on ``train`` and the sizes; also returns the training queries' gold rows."""
  rows = gold_rows(train, tools.index(), "training")
  largest = max(len(r) for r in rows)
  max_size = int(np.clip(largest, 2, MAX_M)) if config.max_size is None else config.max_size
  k_pool = min(config.k_pool, len(tools) - 1)
  if k_pool <= max_size:
    raise UserError(f"the set baselines need K_pool > M; got K_pool = {k_pool} "
                    f"(library of {len(tools)}), M = {max_size}")
  head = _stage1_head(tools, encoder, train, config.seed)
  z = embed(encoder, tools.texts)
  return Stage1(head, z, k_pool, max_size), rows


def fit_size_classifier(x: np.ndarray, rows: Sequence[Sequence[int]], max_size: int,
                        config: SetBaselineConfig) -> dict[str, np.ndarray]:
  """A linear softmax over set sizes 1..M on the query embedding (sizes above M count as M).

  Args:
    x: f32[n, d] training query embeddings.
    rows: ``n`` gold rows.
  """
  labels = [[min(len(r), max_size) - 1] for r in rows]
  return fit_head(x, labels, max_size, HeadConfig(steps=config.size_steps, seed=config.seed))


def predict_sizes(params: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
  """int[n] the most probable set size (1-based; ties: the smaller size)."""
  return np.argmax(np.asarray(head_logits(params, x)), axis=1) + 1


def query_rows(queries: Sequence[Query], stage1: Stage1, what: str) -> list[list[int]]:
  """Gold rows of held-out queries (UserError when empty: a choice needs validation)."""
  if not queries:
    raise UserError(f"the set-level baselines choose their settings on validation queries; "
                    f"the {what} split is empty")
  return gold_rows(queries, {t: i for i, t in enumerate(stage1.tool_ids)}, what)


def rank_quality(rankings: np.ndarray, gold: Sequence[Sequence[int]]) -> float:
  """Mean of R@3/5, NDCG@3/5 and COMP@3/5 of int[n, K] row rankings."""
  m = metrics.evaluate([r.tolist() for r in rankings], [list(g) for g in gold])
  return float(np.mean([m[k] for k in RANK_KEYS]))


def choose(grid: Sequence[Any], quality: Callable[[Any], float]) -> Any:
  """The grid value of highest quality; the first of equals (grids list the simpler first)."""
  scored = [(quality(v), -i) for i, v in enumerate(grid)]
  return grid[-max(scored)[1]]


def prefix_sets(rows: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
  """The first ``sizes[i]`` rows of each ranking: ``n`` int arrays."""
  return [r[:s] for r, s in zip(rows, sizes)]


def to_retrieval(tool_ids: Sequence[str], rankings: np.ndarray, sets: Sequence[np.ndarray],
                 depth: int) -> Retrieval:
  """Rows to ids: rankings cut to ``depth`` (at most K_pool long, as HYSET's), the sets."""
  check_depth(depth)
  ids = np.asarray(tool_ids, dtype=object)
  return Retrieval(rankings=[ids[r[:depth]].tolist() for r in rankings],
                   sets=[ids[s].tolist() for s in sets])
