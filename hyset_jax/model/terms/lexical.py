"""The lexical term (not in the paper; :mod:`hyset_jax.model.lexical`): ℓ' = ℓ + β·b with b the
query's BM25 scores over the tool texts. β is its tensor; the tool texts, one per tool row, are
its file (``lexical.json``), so the index is rebuilt over the new library's texts whenever the
library changes (document frequencies included): an added tool's text is required.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from hyset_jax.errors import UserError
from hyset_jax.model.terms.base import Term


def reindex(model, rows: np.ndarray, added_texts=None):
  from hyset_jax.model.lexical import LexicalIndex
  old = model.lexical
  texts: list[str | None] = [None] * len(model.tool_ids)
  for i, r in enumerate(np.asarray(rows).tolist()):
    if r >= 0:
      texts[r] = old.tool_texts[i]
  free = [j for j, t in enumerate(texts) if t is None]
  added = list(added_texts or ())
  if len(added) != len(free):
    raise UserError(f"this model has a lexical term (BM25 over its tool texts): the "
                    f"{len(free)} new tools' texts are needed")
  for j, t in zip(free, added):
    texts[j] = t
  return dataclasses.replace(model, lexical=LexicalIndex(tuple(texts), k1=old.k1, b=old.b))


TERM = Term(name="lexical", acts_on="logits", inputs=("lexical_scores",), reindex=reindex,
            fitted_after_theta=True)
