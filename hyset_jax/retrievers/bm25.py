"""BM25 over tool texts, with the maintained ``bm25s`` implementation."""
from __future__ import annotations

import re
from collections.abc import Sequence

import bm25s
import numpy as np

from hyset_jax.data.types import ToolLibrary
from hyset_jax.retrievers.base import Retrieval, check_depth, top_k_ids

# Tool texts are full of identifiers ("getWeatherForecast", "math.factorial",
# "/v1/nutrition", "api_name:Suggestions"). Splitting them into words lets a query
# that says "weather forecast" match; bm25s's default token pattern keeps
# "get_weather" as one token (``\w`` includes "_") and never splits camelCase.
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_SEPARATORS = re.compile(r"[_\W]+")


def normalize_text(text: str) -> str:
  """Splits identifiers into lower-case words before BM25 tokenisation.

  >>> normalize_text("api_name:getWeatherForecast, tool:math.factorial /v1/JSONParser")
  'api name get weather forecast tool math factorial v1 json parser'
  """
  text = _CAMEL.sub(" ", text)
  return _SEPARATORS.sub(" ", text).strip().lower()


def _tokenize(texts: Sequence[str]) -> list[list[str]]:
  # English stop words out, no stemmer: PyStemmer is not a dependency, and
  # BM25 on tool docs works well enough on surface forms.
  return bm25s.tokenize([normalize_text(t) for t in texts], stopwords="en",
                        return_ids=False, show_progress=False)


class BM25Retriever:
  """Okapi BM25 (bm25s defaults: Lucene variant, k1 = 1.5, b = 0.75).

  Ties (common: short queries, tools sharing a template) are broken by library
  row order, so rankings are reproducible.

  >>> from hyset_jax.data.types import ToolLibrary
  >>> lib = ToolLibrary(ids=("w", "c"), texts=("Get the weather forecast", "Convert currency"),
  ...                   metadata=({}, {}))
  >>> BM25Retriever(lib).retrieve(["will it rain? weather please"], depth=2).rankings
  [['w', 'c']]
  """

  def __init__(self, tools: ToolLibrary, *, k1: float = 1.5, b: float = 0.75):
    if len(tools) == 0:
      raise ValueError("cannot index an empty tool library")
    self.tool_ids = tuple(tools.ids)
    self._bm25 = bm25s.BM25(k1=k1, b=b)
    self._bm25.index(_tokenize(tools.texts), show_progress=False)

  def scores(self, queries: Sequence[str]) -> np.ndarray:
    """BM25 scores, ``float32[n_queries, n_tools]``; 0 where no term matches."""
    out = np.zeros((len(queries), len(self.tool_ids)), dtype=np.float32)
    for i, tokens in enumerate(_tokenize(queries)):
      ids = self._bm25.get_tokens_ids(tokens)  # drops words the library never uses
      if ids:
        out[i] = self._bm25.get_scores_from_ids(ids)
    return out

  def retrieve(self, queries: Sequence[str], depth: int) -> Retrieval:
    check_depth(depth)
    return Retrieval(rankings=top_k_ids(self.scores(queries), self.tool_ids, depth))
