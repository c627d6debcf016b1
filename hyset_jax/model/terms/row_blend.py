"""The row blend (not in the paper): after θ, Z is blended toward the tool encoder's embeddings,
z'_t = normalize(α·z_t + (1 − α)·e_t), with α chosen on validation from 0.75, 0.5 and 0.25
against α = 1 (Z as trained, the paper's model), which wins ties.

Why: training moves each tool's row toward the tools it was named with, which is what a
request for a seen combination needs and what a request for a new combination does not. Which
kind a library's requests are is what validation says: on Table 3's unseen-pair splits of
ToolLens (validation carved by gold set; ``--config toollens``, seeds 0-2) it chose α = 0.25 /
0.25 / 0.5 and test COMP@5 went from 10.08 to 17.05; on the official split (validation carved by
query) it keeps α = 1 at every seed (docs/model.md, "The row blend").

The blended rows are the model's Z — every consumer (stage 1, the expansion, the pair
matrices, the exports, the NumPy reference) reads them and nothing else; the term's tensors
keep Z as trained (and α), so that a refit after θ starts from the trained rows again. A tool
added later gets its encoder row in both. A model whose Z is the encoder's
(``model.train_tool_embeddings = false``) has nothing to blend: no candidate is scored.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from hyset_jax.model.parameters import normalize_rows
from hyset_jax.model.scoring import RowBlend
from hyset_jax.model.terms.base import Fit, Term
from hyset_jax.model.terms.lexical import SET_CHOICE_METRICS

# The trained rows' share α beside α = 1 (the term absent).
ALPHAS = (0.75, 0.5, 0.25)


def _unit(x) -> np.ndarray:
  return np.asarray(normalize_rows(np.asarray(x, np.float32)), np.float32)


def blended(model, encoder_rows: np.ndarray, alpha: float):
  """``model`` (without the term) with Z blended toward ``encoder_rows`` f32[N, d_z] (the
  tool encoder's embeddings in the model's row order) by ``alpha``."""
  trained = np.asarray(model.params.tool_embeddings, np.float32)
  z = _unit(alpha * trained + (1 - alpha) * _unit(encoder_rows))
  return dataclasses.replace(model, params=model.params._replace(
      tool_embeddings=z, row_blend=RowBlend(trained, np.float32(alpha))))


def candidates(model, data, config):
  """``model`` with Z blended toward ``data``'s encoder rows at each α of :data:`ALPHAS`
  (none when Z is not trained)."""
  if not config.model.train_tool_embeddings:
    return
  if tuple(model.tool_ids) != tuple(data.tool_ids):
    raise ValueError("the row blend needs the model on the training data's tools, in its order")
  for alpha in ALPHAS:
    yield f"α={alpha:g}", blended(model, data.tool_embeddings, alpha)


def remove(model):
  """``model`` with Z as trained again."""
  rb = model.params.row_blend
  if rb is None:
    return model
  return dataclasses.replace(model, params=model.params._replace(
      tool_embeddings=np.asarray(rb.trained, np.float32), row_blend=None))


def reindex(model, rows: np.ndarray, added_texts=None):
  """The trained rows follow their tools; a new row's trained row is its Z row (the encoder's
  embedding, as ``hyset tools add`` gives it)."""
  del added_texts
  rb = model.params.row_blend
  trained = np.array(model.params.tool_embeddings, np.float32)
  rows = np.asarray(rows)
  kept = rows >= 0
  trained[rows[kept]] = np.asarray(rb.trained, np.float32)[kept]
  return dataclasses.replace(model, params=model.params._replace(
      row_blend=rb._replace(trained=trained)))


TERM = Term(name="row_blend", acts_on="rows", container=RowBlend, reindex=reindex,
            remove=remove,
            fit=Fit(switch="row_blend", candidates=candidates, criterion=SET_CHOICE_METRICS))
