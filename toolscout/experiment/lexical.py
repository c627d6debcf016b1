"""BM25 scores shared by the lexical controls and the rerankers' lexical features."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from hyset_jax.data.types import ToolLibrary
from toolscout.experiment.data import Prepared, reranker_sample

_CHUNK = 1000  # queries scored at once (bounds the dense [chunk, N] score matrix)


@dataclasses.dataclass(frozen=True)
class Lexical:
  """BM25 over one rendering of the library.

  Attributes:
    bm25: the :class:`hyset_jax.retrievers.BM25Retriever`.
    test: ``[s] -> float32[n_s, N]`` scores of each source's test queries.
    train: ``float32[n, N]`` scores of the reranker's training sample
      (:func:`toolscout.experiment.data.reranker_sample`), in sample order.
  """
  bm25: Any
  test: dict[str, np.ndarray]
  train: np.ndarray


def bm25_scores(bm25: Any, texts: Sequence[str]) -> np.ndarray:
  """``float32[n, N]`` BM25 scores of ``texts`` against every tool."""
  if not texts:
    return np.zeros((0, len(bm25.tool_ids)), np.float32)
  return np.concatenate([bm25.scores(texts[i:i + _CHUNK]) for i in range(0, len(texts), _CHUNK)])


def lexical_scores(data: Prepared, library: ToolLibrary) -> Lexical:
  """BM25 fitted on ``library`` (the tool texts or their skill cards) and its scores."""
  from hyset_jax.retrievers import BM25Retriever
  bm25 = BM25Retriever(library)
  test = {s: bm25_scores(bm25, data.texts(s, "test")) for s in data.names}
  train = bm25_scores(bm25, [data.queries[s]["train"][i].text for s, i in reranker_sample(data)])
  return Lexical(bm25, test, train)
