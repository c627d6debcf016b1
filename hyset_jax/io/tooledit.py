"""Adding tools to a trained model, or removing them, without retraining.

A new tool gets the z a tool gets at initialisation (:func:`hyset_jax.model.parameters.init_params`): its
frozen tool-encoder embedding, normalised to unit length (Eq. 11). Everything else in θ — P,
M_2..M_M, the other tools' z — is kept as trained; removing a tool drops its row of Z. So
stage 1 scores a new tool by ℓ = rᵀ P z_new and stage 2 pairs it with the others through the
trained M_m, which is the paper's setting for tools unseen in training.

What refers to tool rows follows them: every term the model carries that refers to rows
(:mod:`hyset_jax.model.terms`; today the seen-set prior and the lexical term) is re-indexed by its own
``reindex``, so no term can be forgotten here. The lexical term needs the added tools' texts.

Anything derived from Z (neighbour tables a server caches beside a model) is keyed by Z and
must be rebuilt: ``hyset tools`` writes only the model files, never such caches.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from hyset_jax.errors import UserError


def _with_tools(model, tool_ids: tuple[str, ...], z: np.ndarray, rows: np.ndarray,
                added_texts: Sequence[str] | None = None):
  """``model`` over a new library: ``rows`` int[N_old] is each old row's new row (-1: removed),
  ``added_texts`` the texts of the rows that are new (for a term that keeps tool texts)."""
  from hyset_jax.model import terms
  from hyset_jax.inference.subsets import validate_sizes
  try:
    validate_sizes(model.k_pool, model.max_set_size, k1=model.k1, num_tools=len(tool_ids))
  except UserError as e:
    raise UserError(f"the edited library would have {len(tool_ids)} tools: {e}") from None
  params = model.params._replace(tool_embeddings=np.asarray(z, np.float32))
  edited = dataclasses.replace(model, params=params, tool_ids=tool_ids, path=None,
                               fits=())  # chosen for the old library: no longer a record of it
  for term in terms.carried(model.params):
    if term.refers_to_rows:
      edited = term.reindex(edited, rows, added_texts)
  return edited


def add_tools(model, tool_ids: Sequence[str], embeddings: np.ndarray,
              texts: Sequence[str] | None = None):
  """``model`` with tools appended (rows after the existing ones).

  Args:
    model: a loaded model directory.
    tool_ids: n new ids, none already in the model and none repeated.
    embeddings: f32[n, d_z] their tool-encoder embeddings (normalised here).
    texts: their n tool texts; required when a term keeps tool texts (the lexical term).
  """
  from hyset_jax.model.parameters import normalize_rows
  tool_ids = tuple(tool_ids)
  present = set(model.tool_ids)
  clash = [t for t in tool_ids if t in present]
  if clash:
    raise UserError(f"{len(clash)} tools are already in the model (e.g. {clash[0]!r}); remove "
                    f"them first (hyset tools remove) to replace their definitions")
  if len(set(tool_ids)) != len(tool_ids):
    seen: set[str] = set()
    dup = next(t for t in tool_ids if t in seen or seen.add(t))
    raise UserError(f"tool id {dup!r} is given twice")
  z = model.params.tool_embeddings
  emb = np.asarray(embeddings, np.float32)
  if emb.shape != (len(tool_ids), z.shape[1]):
    raise UserError(f"new tool embeddings have shape {emb.shape}; the model's tool "
                    f"embeddings are {z.shape[1]}-d, so expected ({len(tool_ids)}, {z.shape[1]})")
  if not np.all(np.isfinite(emb)):
    raise UserError("new tool embeddings contain NaN or inf")
  new = np.asarray(normalize_rows(emb), np.float32)
  return _with_tools(model, tuple(model.tool_ids) + tool_ids,
                     np.concatenate([np.asarray(z, np.float32), new]),
                     np.arange(len(model.tool_ids)), texts)


def remove_tools(model, tool_ids: Sequence[str]):
  """``model`` without the given tools (the other rows keep their order)."""
  drop = set(tool_ids)
  missing = sorted(drop - set(model.tool_ids))
  if missing:
    raise UserError(f"{len(missing)} tools to remove are not in the model (e.g. "
                    f"{missing[0]!r})")
  keep = [i for i, t in enumerate(model.tool_ids) if t not in drop]
  z = np.asarray(model.params.tool_embeddings, np.float32)[keep]
  rows = np.full(len(model.tool_ids), -1)
  rows[keep] = np.arange(len(keep))
  return _with_tools(model, tuple(model.tool_ids[i] for i in keep), z, rows)
