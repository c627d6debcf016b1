"""The TF-IDF source fingerprint (paper §3): d_tfidf(Q, R) = 1 − cos(μ(Q), μ(R)).

A :class:`Fingerprint` holds a scikit-learn ``TfidfVectorizer`` fitted on the
reference (training) source R and the centroid μ(R) of R's TF-IDF rows. Incoming
traffic Q is scored against it as

- one request (:func:`request_distances`: μ(Q) is that request's row),
- one batch (:func:`batch_distance`: μ(Q) is the batch centroid),
- a rolling window (:func:`window_distances`: request i is scored with the
  centroid of requests i−N+1 .. i), or consecutive chunks (:func:`chunk_distances`).

TF-IDF rows are non-negative, so every cosine lies in [0, 1] and so does d. A
request with no term of the reference vocabulary has an all-zero row; its cosine
is undefined and we define d = 1: it shares nothing with the reference, which is
exactly the traffic the router must send away from the specialist.

The same centroid rule over any feature matrix (:func:`centroid_distance`) gives
the tool-side fingerprint (gold tool texts instead of queries) and the
sentence-embedding proxy of :mod:`toolscout.proxies`.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.feature_extraction.text import TfidfVectorizer

# The vectorizer settings a router directory records (and rebuilds from):
# scikit-learn's defaults except English stop words. The paper names no settings.
# Stop words are shared by every English source yet dominate the TF-IDF row of a
# short request, so with them kept a single request says little about its source
# (measured on ToolLens-train as reference vs held-out ToolLens and BFCL requests:
# per-request AUC 0.72 with them, 0.89 without; windows of 10: 0.64 vs 0.97).
TFIDF_PARAMS: dict[str, Any] = {
    "stop_words": "english",
    "lowercase": True,
    "token_pattern": r"(?u)\b\w\w+\b",
    "ngram_range": (1, 1),
    "norm": "l2",
    "use_idf": True,
    "smooth_idf": True,
    "sublinear_tf": False,
}


@dataclasses.dataclass(frozen=True)
class Fingerprint:
  """A fitted reference fingerprint.

  Attributes:
    vectorizer: TF-IDF fitted on the reference texts.
    centroid: ``float64[V]``, the mean TF-IDF row of the reference texts.
    n_reference: how many reference texts it was fitted on.
  """
  vectorizer: TfidfVectorizer
  centroid: np.ndarray
  n_reference: int

  @property
  def vocabulary(self) -> list[str]:
    """Terms in column order."""
    return self.vectorizer.get_feature_names_out().tolist()

  def transform(self, texts: Sequence[str]) -> sp.csr_matrix:
    """TF-IDF rows, ``float64[n, V]`` (sparse, each non-zero row of unit norm)."""
    return sp.csr_matrix(self.vectorizer.transform(list(texts)), dtype=np.float64)


def fit_fingerprint(texts: Sequence[str], **params: Any) -> Fingerprint:
  """Fits TF-IDF on the reference texts and takes their centroid.

  Args:
    texts: the reference source's queries (or tool texts), at least one with a
      token of two or more word characters.
    **params: overrides of :data:`TFIDF_PARAMS`.

  Raises:
    ValueError: when the texts yield an empty vocabulary.
  """
  texts = list(texts)
  if not texts:
    raise ValueError("cannot fit a fingerprint on zero reference texts")
  vectorizer = TfidfVectorizer(**{**TFIDF_PARAMS, **params}, dtype=np.float64)
  try:
    rows = vectorizer.fit_transform(texts)
  except ValueError as e:  # "empty vocabulary; perhaps the documents only contain stop words"
    raise ValueError(f"the reference texts give an empty TF-IDF vocabulary ({e})") from None
  return Fingerprint(vectorizer, np.asarray(rows.mean(axis=0)).ravel(), len(texts))


def rebuild_fingerprint(vocabulary: Sequence[str], idf: np.ndarray, centroid: np.ndarray,
                        n_reference: int, params: dict[str, Any]) -> Fingerprint:
  """A :class:`Fingerprint` from its stored parts (what a router directory holds)."""
  params = dict(params)
  if "ngram_range" in params:
    params["ngram_range"] = tuple(params["ngram_range"])  # JSON gives a list
  vectorizer = TfidfVectorizer(**params, vocabulary=list(vocabulary), dtype=np.float64)
  vectorizer.idf_ = np.asarray(idf, np.float64)
  return Fingerprint(vectorizer, np.asarray(centroid, np.float64), int(n_reference))


def _cosines_to(rows: sp.csr_matrix | np.ndarray, centroid: np.ndarray) -> np.ndarray:
  """cos(row_i, centroid) per row, ``float64[n]``; NaN where a row or centroid is zero."""
  dots = np.asarray(rows @ centroid).ravel()
  if sp.issparse(rows):
    norms = np.sqrt(np.asarray(rows.multiply(rows).sum(axis=1)).ravel())
  else:
    norms = np.linalg.norm(rows, axis=1)
  denom = norms * np.linalg.norm(centroid)
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(denom > 0, dots / np.where(denom > 0, denom, 1.0), np.nan)


def _distances(cosines: np.ndarray) -> np.ndarray:
  # Zero rows (NaN) are maximally distant; clip float rounding just outside [0, 1].
  return np.clip(1.0 - np.nan_to_num(cosines, nan=0.0), 0.0, 1.0)


def request_distances(fp: Fingerprint, texts: Sequence[str]) -> np.ndarray:
  """d_tfidf of each request on its own, ``float64[n]`` in [0, 1].

  >>> fp = fit_fingerprint(["book a flight", "book a hotel"])
  >>> request_distances(fp, ["book a flight", "weather today"]).round(3).tolist()
  [0.183, 1.0]
  """
  return _distances(_cosines_to(fp.transform(texts), fp.centroid))


def batch_distance(fp: Fingerprint, texts: Sequence[str]) -> float:
  """d_tfidf of the whole batch (its centroid against the reference centroid).

  >>> fp = fit_fingerprint(["book a flight", "book a hotel"])
  >>> batch_distance(fp, ["book a flight", "book a hotel"])
  0.0
  """
  if not len(texts):
    raise ValueError("cannot score an empty batch")
  rows = fp.transform(texts)
  return float(_distances(_cosines_to(np.asarray(rows.mean(axis=0)), fp.centroid))[0])


def _window_matrix(n: int, window: int) -> sp.csr_matrix:
  """``float64[n, n]`` with row i summing requests max(0, i−window+1) .. i."""
  rows, cols = [], []
  for offset in range(window):
    i = np.arange(offset, n)
    rows.append(i)
    cols.append(i - offset)
  data = np.ones(sum(len(r) for r in rows))
  return sp.csr_matrix((data, (np.concatenate(rows), np.concatenate(cols))), shape=(n, n))


def window_distances(fp: Fingerprint, texts: Sequence[str], window: int) -> np.ndarray:
  """Rolling-window d_tfidf: request i scored with the centroid of the last ``window``.

  The first ``window − 1`` requests use the shorter windows available so far,
  so every request gets a decision as it arrives. A sum and a mean have the
  same direction, so the window's row sum stands in for its centroid.

  Returns:
    ``float64[n]`` in [0, 1]; with ``window = 1`` exactly :func:`request_distances`.

  >>> fp = fit_fingerprint(["book a flight", "book a hotel"])
  >>> window_distances(fp, ["book a flight", "book a hotel", "weather"], 2).round(3).tolist()
  [0.183, 0.0, 0.183]
  """
  if window < 1:
    raise ValueError(f"window must be >= 1, got {window}")
  rows = fp.transform(texts)
  if window == 1 or rows.shape[0] == 0:
    return _distances(_cosines_to(rows, fp.centroid))
  sums = _window_matrix(rows.shape[0], window) @ rows  # [n, V]
  return _distances(_cosines_to(sp.csr_matrix(sums), fp.centroid))


def chunk_distances(fp: Fingerprint, texts: Sequence[str], size: int) -> np.ndarray:
  """Batch mode over a stream: consecutive chunks of ``size`` share one distance.

  Returns:
    ``float64[n]``: entry i is the :func:`batch_distance` of the chunk holding i.

  >>> fp = fit_fingerprint(["book a flight", "book a hotel"])
  >>> chunk_distances(fp, ["book a flight", "book a hotel", "weather"], 2).round(3).tolist()
  [0.0, 0.0, 1.0]
  """
  if size < 1:
    raise ValueError(f"batch size must be >= 1, got {size}")
  rows = fp.transform(texts)
  n = rows.shape[0]
  chunk = np.arange(n) // size
  member = sp.csr_matrix((np.ones(n), (chunk, np.arange(n))), shape=(chunk.max(initial=-1) + 1, n))
  per_chunk = _distances(_cosines_to(sp.csr_matrix(member @ rows), fp.centroid))
  return per_chunk[chunk]


def window_sizes(n: int, window: int) -> np.ndarray:
  """How many requests each rolling-window decision of :func:`window_distances` saw, ``int64[n]``.

  >>> window_sizes(5, 3).tolist()
  [1, 2, 3, 3, 3]
  """
  return np.minimum(np.arange(n) + 1, window)


def chunk_sizes(n: int, size: int) -> np.ndarray:
  """How many requests the chunk of each request in :func:`chunk_distances` holds, ``int64[n]``.

  >>> chunk_sizes(5, 2).tolist()
  [2, 2, 2, 2, 1]
  """
  chunk = np.arange(n) // size
  return np.minimum(size, n - chunk * size)


def centroid_distance(a: np.ndarray | sp.spmatrix, b: np.ndarray | sp.spmatrix) -> float:
  """1 − cos(mean row of ``a``, mean row of ``b``) for any two feature matrices.

  Used for the tool-side fingerprint and the sentence-embedding proxy. With
  non-negative features (TF-IDF) the result is in [0, 1]; with signed features
  (embeddings) it is in [0, 2]. A zero centroid gives 1.

  >>> centroid_distance(np.array([[1.0, 0.0]]), np.array([[0.0, 1.0], [0.0, 3.0]]))
  1.0
  """
  mean_a = np.asarray(a.mean(axis=0)).ravel()
  mean_b = np.asarray(b.mean(axis=0)).ravel()
  denom = np.linalg.norm(mean_a) * np.linalg.norm(mean_b)
  if denom == 0:
    return 1.0
  return float(1.0 - mean_a @ mean_b / denom)
