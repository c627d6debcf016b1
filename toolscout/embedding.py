"""The frozen encoder the experiment embeds with, and a fast stand-in for smoke tests.

``minilm`` is :func:`hyset_jax.encoder.load_encoder` (all-MiniLM-L6-v2 by
default) through the on-disk embedding cache. ``hashing`` is
:class:`HashingEncoder`: word uni- and bigrams hashed into ``dim`` signed
buckets, L2-normalised. It has the encoder interface and needs no model, so the
``tiny`` config runs in seconds; it is a plumbing check, not a sentence encoder.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from sklearn.feature_extraction.text import HashingVectorizer


class HashingEncoder:
  """``encode(texts) -> float32[n, dim]`` unit rows from hashed word n-grams.

  >>> e = HashingEncoder(dim=64)
  >>> x = e.encode(["get the weather", "get the weather", ""])
  >>> x.shape, bool(np.allclose(x[0], x[1])), float(np.abs(x[2]).sum())
  ((3, 64), True, 0.0)
  """

  def __init__(self, dim: int = 512):
    self.dim = dim
    self.name = f"hashing-{dim}"
    self._vectorizer = HashingVectorizer(n_features=dim, ngram_range=(1, 2), norm="l2",
                                         alternate_sign=True)

  def encode(self, texts: Sequence[str], **_: Any) -> np.ndarray:
    return self._vectorizer.transform(list(texts)).toarray().astype(np.float32)


def get_encoder(kind: str, model_dir: str = "") -> Any:
  """The encoder a config names (``minilm`` or ``hashing``)."""
  if kind == "hashing":
    return HashingEncoder()
  from hyset_jax.encoder import load_encoder
  return load_encoder(model_dir or None)


def embed(encoder: Any, texts: Sequence[str]) -> np.ndarray:
  """Unit-row embeddings ``float32[n, d]`` through the cache (zero rows stay zero)."""
  if not len(texts):
    return np.zeros((0, encoder.dim), np.float32)
  if isinstance(encoder, HashingEncoder):  # no cache to consult; skips importing JAX/transformers
    return encoder.encode(texts)
  from hyset_jax.retrievers.dense import embed as cached_embed
  return cached_embed(encoder, list(texts))
