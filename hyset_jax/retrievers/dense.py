"""Frozen dense retrieval: cosine between encoder embeddings of query and tool text."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hyset_jax.data.types import ToolLibrary
from hyset_jax.retrievers.base import Retrieval, check_depth, top_k_ids


def embed(encoder: Any, texts: Sequence[str]) -> np.ndarray:
  """Unit-norm embeddings ``float32[n, d]`` through the on-disk embedding cache.

  The cache (keyed by model and text hash) means a tool library, or a test split
  evaluated by several methods, is encoded once. Rows are renormalised here so the
  dot product is a cosine even for an encoder that does not normalise.
  """
  from hyset_jax.encoder import encode_cached  # lazy: pulls in JAX and the tokenizer
  x = np.asarray(encode_cached(encoder, list(texts)), dtype=np.float32)
  if x.ndim != 2 or x.shape[0] != len(texts):
    raise ValueError(f"encoder returned shape {x.shape} for {len(texts)} texts")
  return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


class DenseRetriever:
  """Ranks tools by cosine(r(query), r(tool text)) with a frozen encoder.

  Args:
    tools: the tool library; its texts are encoded once, at construction.
    encoder: a sentence encoder with ``encode(texts) -> float32[n, d]``, ``name``
      and ``dim`` (``hyset_jax.encoder.load_encoder()``).
  """

  def __init__(self, tools: ToolLibrary, encoder: Any):
    if len(tools) == 0:
      raise ValueError("cannot index an empty tool library")
    self.tool_ids = tuple(tools.ids)
    self.encoder = encoder
    self.tool_embeddings = embed(encoder, tools.texts)  # [n_tools, d]

  def scores(self, queries: Sequence[str]) -> np.ndarray:
    """Cosine similarities, ``float32[n_queries, n_tools]``."""
    return embed(self.encoder, queries) @ self.tool_embeddings.T

  def retrieve(self, queries: Sequence[str], depth: int) -> Retrieval:
    check_depth(depth)
    return Retrieval(rankings=top_k_ids(self.scores(queries), self.tool_ids, depth))
