"""A trained model carried onto another tool library (the paper's cross-domain setting; also a
catalogue that changed since training), used by ``hyset eval --model`` and ``hyset predict
--tools``.

Carrying is exactly the hand-made ``hyset tools add`` + ``hyset tools remove`` steps
(:mod:`hyset_jax.io.tooledit`): a library tool the model has not seen gets its frozen
tool-encoder embedding, normalised (the z a tool gets at initialisation); a model tool the
library does not list is dropped; everything else in θ, and every term that refers to tool rows,
follows as ``hyset tools`` makes it follow. The lexical term gets the added tools' texts from
the library; the kept tools keep the texts the model was saved with.

Row order of the result: the kept tools in the model's order, then the added ones in the
library's order — the rows ``tools remove`` + ``tools add`` give. Predictions name tools by id,
so the order only decides ties; keeping the trained rows where they were means a library that
merely lists the model's tools in another order changes nothing at all.

A library that keeps **none** of the model's tools (the cross-domain setting) is scored by
:func:`carry_onto` without the two pieces that only make sense beside trained tool rows
(:func:`foreign`): the query tower (not in the paper), which maps queries toward the trained Z
that no row of the new library lives in, and a set ranking (``set-max``, ``set-first``, …),
whose pair terms and seen-set prior were fitted on the model's own rows; tools are ranked by ℓ
(``logit``; an explicit ``--ranking`` still wins) and the delivered set is still F's argmax.
Measured on the carried presets that have them (docs/model.md, "A model on a wholly new
library"): ToolLens → ToolBench's six test sets and UltraTool → Seal-Tools go from below dense
on COMP@5 to above it (level on one of the eight test sets). ``hyset_jax.training.warm_start``
calls :func:`carry` itself and keeps both: there θ is trained on the new library.
"""
from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence

import numpy as np

from hyset_jax.errors import UserError

# texts -> f32[n, d_z]: the model's frozen tool encoder.
EncodeTools = Callable[[Sequence[str]], np.ndarray]


@dataclasses.dataclass(frozen=True)
class CarryReport:
  """What carrying did, counted in tools.

  Attributes:
    kept: model tools the library lists too.
    added: library tools the model lacked, added with encoder embeddings.
    dropped: model tools the library does not list.
    left_out: library tools the model lacked that could not be embedded (no encoder named).
  """
  kept: int
  added: int = 0
  dropped: int = 0
  left_out: int = 0

  @property
  def foreign(self) -> bool:
    """Whether no tool of the model's is left (every row is an encoder row)."""
    return self.kept == 0

  @property
  def changed(self) -> bool:
    """Whether the library differed from the model's (as a set of ids)."""
    return bool(self.added or self.dropped or self.left_out)

  def message(self, spec: str) -> str:
    """The stderr line, e.g. ``carried onto SPEC: 120 tools kept, 40 added (encoder
    embeddings), 300 dropped``."""
    line = (f"carried onto {spec}: {self.kept} tools kept, {self.added} added (encoder "
            f"embeddings), {self.dropped} dropped")
    if self.left_out:
      line += (f"; {self.left_out} new tools left out (the model's manifest names no encoder "
               f"to embed them with): they can never be retrieved")
    return line


def tool_encoder(model, loaded=None) -> EncodeTools | None:
  """The model's frozen tool encoder as ``texts -> f32[n, d_z]``, or None when its manifest
  names no encoder.

  The encoder is the one the manifest names (a tool encoder where a format records one, else
  the query encoder, which embedded the tools at initialisation), read through the embedding
  cache: the same vectors training used for the same texts. It is loaded on each call, so a
  carry that adds nothing never loads it; a caller that already holds the query encoder (a
  server) passes it as ``loaded`` and it is used when it is the one the manifest names.
  """
  name = getattr(model, "tool_encoder", None) or model.query_encoder
  if not name:
    return None
  reuse = loaded if loaded is not None and name == model.query_encoder else None

  def encode(texts: Sequence[str]) -> np.ndarray:
    from hyset_jax.encoder import encode_cached, load_encoder
    return np.asarray(encode_cached(reuse or load_encoder(name), list(texts)), np.float32)
  return encode


def carry(model, library, encode_tools: EncodeTools | None, *, name: str = "the library"):
  """``model`` over ``library``'s tools; returns ``(model, CarryReport)``.

  Args:
    model: a loaded model directory (:class:`hyset_jax.io.modeldir.ModelDir`).
    library: a :class:`hyset_jax.data.types.ToolLibrary` (ids, texts).
    encode_tools: the model's tool encoder (:func:`tool_encoder`), or None when it names none:
      then the library's new tools are left out (counted in the report), and a library that
      shares no tool with the model is refused.
    name: how messages name the library (its data spec).

  The model comes back unchanged (the same object) when the library lists exactly its tools.

  Raises:
    UserError: nothing to carry onto (no shared tool and no encoder), or a result with fewer
      tools than the model's K_pool.
  """
  from hyset_jax.io import tooledit
  known = set(model.tool_ids)
  listed = set(library.ids)
  new = [i for i, t in enumerate(library.ids) if t not in known]
  dropped = [t for t in model.tool_ids if t not in listed]
  kept = len(model.tool_ids) - len(dropped)
  if not new and not dropped:
    return model, CarryReport(kept)
  if not kept and encode_tools is None:
    raise UserError(
        f"{name} shares no tool ids with the model (model: {', '.join(model.tool_ids[:3])}, "
        f"...; library: {', '.join(library.ids[:3])}, ...), and the model's manifest names no "
        f"encoder (query_encoder is null) to embed the library's tools with")
  added = new if encode_tools is not None else []
  size = kept + len(added)
  if size < model.k_pool:
    raise UserError(f"carried onto {name}, the model would have {size} tools ({kept} kept, "
                    f"{len(added)} added), fewer than its k_pool {model.k_pool} (the "
                    f"shortlist size); it needs a library of at least {model.k_pool} tools")
  carried = model
  # Add before removing: the intermediate library is never below K_pool.
  if added:
    ids = [library.ids[i] for i in added]
    texts = [library.texts[i] for i in added]
    carried = tooledit.add_tools(carried, ids, encode_tools(texts), texts)
  if dropped:
    carried = tooledit.remove_tools(carried, dropped)
  return carried, CarryReport(kept, len(added), len(dropped), len(new) - len(added))


def foreign(model) -> tuple[object, list[str]]:
  """``model`` (carried onto a library with none of its tools) without the query tower, with
  the ``logit`` ranking and with the lexical weight its manifest's ``foreign`` records (when it
  records one); returns it and what was changed, in words (empty: nothing to change).

  Why (measured 2026-12-05, docs/model.md): the tower is fitted to map queries toward the
  trained tool rows (ToolLens' trained z sit at cosine 0.57 from their encoder rows), and the
  set rankings read pair terms fitted on those rows; on a library of encoder rows alone both
  rank below the plain dense retriever, ℓ without the tower above it. β was chosen beside the
  trained rows; ``foreign``'s β was chosen by training on its own validation re-scored the way
  this function leaves the model (hyset_jax.training.post_theta.fit_foreign)."""
  changes, params = [], model.params
  if params.tower is not None:
    params = params._replace(tower=None)
    changes.append("its query tower is left out")
  if model.default_ranking != "logit":
    changes.append(f"tools are ranked by ℓ (logit, not {model.default_ranking})")
  lexical = model.lexical
  beta = (model.foreign or {}).get("lexical_weight")
  if beta is not None and model.lexical is not None and beta != params.lexical_weight:
    changes.append(f"the lexical weight is its foreign-library one, β = {beta:g} "
                   f"(not {params.lexical_weight:g})" if beta else
                   "the lexical term is left out (its foreign-library β is 0)")
    params = params._replace(lexical_weight=np.float32(beta) if beta else None)
    lexical = lexical if beta else None
  if not changes:
    return model, changes
  return dataclasses.replace(model, params=params, ranking="logit", lexical=lexical), changes


def carry_onto(model, library, spec: str, log: Callable[[str], None] | None = None):
  """``model`` carried onto ``library`` (read from data spec ``spec``), saying on stderr (or
  through ``log``) what changed when anything did; nothing is said when nothing changed. On a
  library that keeps none of the model's tools, :func:`foreign` follows (and is said too)."""
  carried, report = carry(model, library, tool_encoder(model), name=spec)
  if report.changed:
    message = report.message(spec)
    if report.foreign:
      carried, changes = foreign(carried)
      if changes:
        message += "; none of the model's tools is listed: " + ", ".join(changes)
    (log or (lambda msg: print(msg, file=sys.stderr)))(message)
  return carried
