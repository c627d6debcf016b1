"""The lexical term of ℓ: BM25 over the tool texts, beside the dense score (not in the paper).

A dense query vector averages a request's intents: "find the area of a square and the weather in
Queenstown" lands near weather tools and the square's tool falls out of the shortlist, while
BM25 matches both by their words (measured on BFCL's multi-tool queries: docs/results.md). The
term adds the query's BM25 scores, scaled to its best match, to every tool's logit:

  ℓ'(x, t) = ℓ(x, t) + β · b(x, t),   b(x, t) = BM25(x, t) / max_t' BM25(x, t')  ∈ [0, 1]

(b = 0 for every tool when no query word occurs in the library). Scaling by the query's best
match keeps b in [0, 1] whatever the library size and the query length, so β is in nats of ℓ:
the best lexical match gains β. β ≥ 0 is chosen on validation after θ is trained, with the
ranking (β = 0, the model without the term, competes and wins ties;
:mod:`hyset_jax.model.terms.lexical`, :mod:`hyset_jax.training.post_theta`). ℓ' replaces ℓ
everywhere — the shortlist, the expansion's tie-breaks, F_align and the rankings — so the
delivered set is still the exact argmax of F over every subset of the (new) shortlist.

BM25 is Okapi BM25 as ``bm25s`` computes it (Lucene variant, k1 = 1.5, b = 0.75) over the tool
texts, each text split into lower-case words by :func:`hyset_jax.retrievers.bm25.normalize_text`
(identifiers split at ``_``, ``.``, camelCase) and English stop words dropped — the BM25
baseline's own scores. The model directory keeps the tool texts (``lexical.json``), so the
scores are rebuilt exactly wherever the model goes.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

# BM25 parameters: the baseline's (bm25s defaults).
BM25_K1 = 1.5
BM25_B = 0.75
# β candidates chosen from on validation (0, no term, competes). Up to 64: on Seal-Tools, whose
# requests name what the tools' texts say, validation rose with every doubling to β = 32 and fell
# at 64 (the grid ended at 8 before; 2026-12-04, docs/baselines.md). The per-tool head's lexical
# variant (retrievers.heads.LexicalHeadRetriever) chooses from the same grid.
WEIGHTS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
TOKENIZER = "hyset-bm25/1"  # normalize_text, bm25s English stop words, no stemming


@dataclasses.dataclass(frozen=True, eq=False)
class LexicalIndex:
  """BM25 over the tool texts, in tool-row order.

  Attributes:
    tool_texts: one text per tool row of the model.
    k1, b: BM25's parameters.
  """
  tool_texts: tuple[str, ...]
  k1: float = BM25_K1
  b: float = BM25_B

  def __post_init__(self):
    from hyset_jax.data.types import ToolLibrary
    from hyset_jax.retrievers.bm25 import BM25Retriever
    ids = tuple(str(i) for i in range(len(self.tool_texts)))
    lib = ToolLibrary(ids=ids, texts=tuple(self.tool_texts), metadata=tuple({} for _ in ids))
    object.__setattr__(self, "_bm25", BM25Retriever(lib, k1=self.k1, b=self.b))

  def scores(self, queries: Sequence[str]) -> np.ndarray:
    """b(x, t): f32[Q, N], each row's BM25 scores divided by the row's largest (0 rows stay 0).

    >>> idx = LexicalIndex(("get the weather forecast", "area of a square", "convert currency"))
    >>> [round(float(v), 2) for v in idx.scores(["area of a square and the weather"])[0]]
    [0.41, 1.0, 0.0]
    """
    raw = self._bm25.scores(list(queries))
    top = raw.max(axis=1, keepdims=True) if raw.size else raw
    return np.where(top > 0, raw / np.where(top > 0, top, 1.0), 0.0).astype(np.float32)


def query_scores(weight, index: LexicalIndex | None, queries: Sequence[str]) -> np.ndarray | None:
  """The lexical scores a model with β = ``weight`` needs for ``queries`` (None without the
  term); an index is required when it has one."""
  if weight is None:
    return None
  if index is None:
    raise ValueError("the model has a lexical term but no lexical index (tool texts) was given")
  return index.scores(queries)
