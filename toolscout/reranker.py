"""The lightweight learned reranker over a candidate pool (paper §3, A.1).

Each (query, candidate) pair of a depth-20 pool gets a feature vector in four
groups (paper Table 4; no execution feedback exists offline, so that group is
absent):

- retrieval: the retriever's score, its gap to the pool's best score, the rank
  (as rank/depth and 1/(rank+1)), the BM25 score relative to the query's best
  BM25 score, and whether the tool is in BM25's own top 20;
- lexical: share of the query's content words found in the tool text, Jaccard of
  the two word sets, share of the tool's name words found in the query;
- metadata: required and total parameter counts, tool text length, whether the
  tool's full name (identifier) appears in the query;
- query: query length (constant within a pool, so it can only matter to the MLP
  through interactions; kept because the paper reports its weight).

Models (scikit-learn, features standardised): logistic regression ("linear")
and a two-hidden-layer MLP ("mlp"), both trained as pointwise gold/non-gold
classifiers on pools that hold at least one gold tool; the reranked first tool
is the candidate with the highest predicted probability.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Sequence

import numpy as np
from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS
from sklearn.linear_model import LogisticRegression
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler

from hyset_jax.retrievers.bm25 import normalize_text
from toolscout.tooltext import parse_tool

FEATURES: tuple[tuple[str, str], ...] = (
    ("score", "retrieval"), ("score_gap", "retrieval"), ("rank_frac", "retrieval"),
    ("reciprocal_rank", "retrieval"), ("bm25_rel", "retrieval"), ("bm25_top20", "retrieval"),
    ("query_coverage", "lexical"), ("jaccard", "lexical"), ("name_coverage", "lexical"),
    ("n_required", "metadata"), ("n_params", "metadata"), ("log_length", "metadata"),
    ("name_in_query", "metadata"),
    ("query_length", "query"),
)
GROUPS = ("retrieval", "metadata", "lexical", "query")


def words(text: str) -> set[str]:
  """Content words: identifiers split, lower-cased, stop words and 1-letter tokens out.

  >>> sorted(words("Get the weatherForecast for Boston"))
  ['boston', 'forecast', 'weather']
  """
  return {w for w in normalize_text(text).split() if len(w) > 1 and w not in ENGLISH_STOP_WORDS}


@dataclasses.dataclass(frozen=True)
class ToolStats:
  """Per-tool inputs of the lexical and metadata features, in library row order."""
  words: tuple[frozenset[str], ...]
  name_words: tuple[frozenset[str], ...]
  name_key: tuple[str, ...]  # normalised full name, for the name-in-query test
  n_required: np.ndarray  # float32[N]
  n_params: np.ndarray  # float32[N]
  log_length: np.ndarray  # float32[N]

  @classmethod
  def from_texts(cls, texts: Sequence[str]) -> "ToolStats":
    fields = [parse_tool(t) for t in texts]
    return cls(
        tuple(frozenset(words(t)) for t in texts),
        tuple(frozenset(words(f"{f.group} {f.name}")) for f in fields),
        tuple(normalize_text(f.name) for f in fields),
        np.array([sum(p.required for p in f.params) for f in fields], np.float32),
        np.array([len(f.params) for f in fields], np.float32),
        np.array([math.log1p(len(t.split())) for t in texts], np.float32))


@dataclasses.dataclass(frozen=True)
class Pools:
  """Depth-``k`` candidate pools: library rows and retriever scores, best first.

  Attributes:
    rows: ``int64[n, k]``.
    scores: ``float32[n, k]``.
  """
  rows: np.ndarray
  scores: np.ndarray


def pools_from_scores(scores: np.ndarray, depth: int) -> Pools:
  """Top-``depth`` pools of a score matrix ``float[n, N]`` (ties: lower row first)."""
  order = np.argsort(-scores, axis=1, kind="stable")[:, :depth]
  return Pools(order, np.take_along_axis(scores, order, axis=1).astype(np.float32))


def bm25_pool_features(bm25_scores: np.ndarray, rows: np.ndarray,
                       top: int = 20) -> tuple[np.ndarray, np.ndarray]:
  """BM25 score relative to the query's best, and top-``top`` membership.

  Args:
    bm25_scores: ``float32[n, N]`` BM25 scores of the queries against the library.
    rows: ``int[n, k]`` pool rows.

  Returns:
    ``(relative float32[n, k], in_top float32[n, k])``.
  """
  pool = np.take_along_axis(bm25_scores, rows, axis=1)
  best = bm25_scores.max(axis=1, keepdims=True)
  rel = np.divide(pool, best, out=np.zeros_like(pool), where=best > 0)
  kth = np.partition(bm25_scores, -top, axis=1)[:, -top][:, None] if bm25_scores.shape[1] > top \
      else np.zeros((len(rows), 1), np.float32)
  return rel.astype(np.float32), ((pool >= kth) & (pool > 0)).astype(np.float32)


def pool_features(queries: Sequence[str], pools: Pools, bm25_scores: np.ndarray,
                  stats: ToolStats) -> np.ndarray:
  """Features of every pool candidate, ``float32[n, k, F]`` in :data:`FEATURES` order."""
  n, k = pools.rows.shape
  out = np.zeros((n, k, len(FEATURES)), np.float32)
  bm25_rel, bm25_top = bm25_pool_features(bm25_scores, pools.rows)
  out[:, :, 0] = pools.scores
  out[:, :, 1] = pools.scores - pools.scores[:, :1]
  out[:, :, 2] = np.arange(k)[None, :] / k
  out[:, :, 3] = 1.0 / (np.arange(k)[None, :] + 1.0)
  out[:, :, 4] = bm25_rel
  out[:, :, 5] = bm25_top
  out[:, :, 9] = stats.n_required[pools.rows]
  out[:, :, 10] = np.log1p(stats.n_params[pools.rows])
  out[:, :, 11] = stats.log_length[pools.rows]
  for i, query in enumerate(queries):
    q_words = words(query)
    q_norm = f" {normalize_text(query)} "
    out[i, :, 13] = math.log1p(len(query.split()))
    for j, row in enumerate(pools.rows[i]):
      t_words, name = stats.words[row], stats.name_words[row]
      shared = len(q_words & t_words)
      out[i, j, 6] = shared / len(q_words) if q_words else 0.0
      union = len(q_words | t_words)
      out[i, j, 7] = shared / union if union else 0.0
      out[i, j, 8] = len(name & q_words) / len(name) if name else 0.0
      key = stats.name_key[row]
      out[i, j, 12] = float(bool(key) and f" {key} " in q_norm)
  return out


def pool_labels(pools: Pools, gold_rows: Sequence[Collection[int]]) -> np.ndarray:
  """``bool[n, k]``: which candidates are gold."""
  return np.array([[r in set(g) for r in row] for row, g in zip(pools.rows.tolist(), gold_rows)],
                  bool).reshape(pools.rows.shape)


def fit_reranker(features: np.ndarray, labels: np.ndarray, kind: str, seed: int = 0,
                 hidden: tuple[int, ...] = (64, 32), max_iter: int = 200) -> Pipeline:
  """Fits a pointwise reranker on covered pools.

  Args:
    features: ``float32[n, k, F]``.
    labels: ``bool[n, k]``; pools without a gold candidate are dropped.
    kind: ``"linear"`` or ``"mlp"``.

  Raises:
    ValueError: no covered pool to learn from.
  """
  covered = labels.any(axis=1)
  if not covered.any():
    raise ValueError("no covered pool to train the reranker on")
  x = features[covered].reshape(-1, features.shape[-1])
  y = labels[covered].reshape(-1)
  if kind == "linear":
    model = LogisticRegression(max_iter=2000)
  elif kind == "mlp":
    model = MLPClassifier(hidden_layer_sizes=hidden, max_iter=max_iter, early_stopping=True,
                          random_state=seed)
  else:
    raise ValueError(f"unknown reranker kind {kind!r}; expected linear or mlp")
  return make_pipeline(StandardScaler(), model).fit(x, y)


def rerank_top1(model: Pipeline, features: np.ndarray, pools: Pools) -> np.ndarray:
  """The library row each query's reranker puts first, ``int64[n]``."""
  n, k, f = features.shape
  if n == 0:
    return np.zeros(0, np.int64)
  prob = model.predict_proba(features.reshape(-1, f))[:, 1].reshape(n, k)
  return pools.rows[np.arange(n), prob.argmax(axis=1)]


def coefficient_mass(model: Pipeline) -> dict[str, float]:
  """Share of the linear model's absolute (standardised) coefficients per feature group."""
  coef = np.abs(model[-1].coef_).ravel()
  total = coef.sum() or 1.0
  return {g: float(sum(c for c, (_, grp) in zip(coef, FEATURES) if grp == g) / total)
          for g in GROUPS}
