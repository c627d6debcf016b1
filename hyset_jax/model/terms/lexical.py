"""The lexical term (not in the paper; :mod:`hyset_jax.model.lexical`): ℓ' = ℓ + β·b with b the
query's BM25 scores over the tool texts. β is its tensor; the tool texts, one per tool row, are
its file (``lexical.json``), so the index is rebuilt over the new library's texts whenever the
library changes (document frequencies included): an added tool's text is required.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from hyset_jax.errors import UserError
from hyset_jax.model.terms.base import Fit, Term

# What the choices of β (and of the prior's λ, τ) maximise: the mean of the rank metrics and the
# set metrics, since both terms move the delivered set, not only the ranking (on an unseen-set
# split, rank metrics alone chose a prior that cost 6 points of set F1: docs/results.md).
SET_CHOICE_METRICS = ("recall@3", "recall@5", "ndcg@3", "ndcg@5", "comp@3", "comp@5",
                      "set_f1", "set_exact")


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


def candidates(model, data, config):
  """``model`` with the term over the library's tool texts, β in :data:`WEIGHTS`."""
  del config
  from hyset_jax.model.lexical import WEIGHTS, LexicalIndex
  index = LexicalIndex(data.tool_texts)
  for weight in WEIGHTS:
    yield f"β={weight:g}", dataclasses.replace(
        model, params=model.params._replace(lexical_weight=np.float32(weight)), lexical=index)


def remove(model):
  return dataclasses.replace(model, params=model.params._replace(lexical_weight=None),
                             lexical=None)


TERM = Term(name="lexical", acts_on="logits", inputs=("lexical_scores",), reindex=reindex,
            remove=remove,
            fit=Fit(switch="lexical", candidates=candidates, criterion=SET_CHOICE_METRICS))
