"""A tool catalogue that changes while the server runs (``POST /v1/tools``, MCP ``update_tools``).

An update adds tools (an id already in the library is an update: its row is removed and added
again with the new definition) and removes others. It re-indexes the running model the way
``hyset tools add|remove`` edits a model directory: new rows get the model's frozen tool-encoder
embedding, normalised (:func:`tool_embedder`, the embedding ``hyset tools add`` computes), and
:func:`hyset_jax.io.tooledit.add_tools` / :func:`~hyset_jax.io.tooledit.remove_tools` make every term
that refers to tool rows follow (through the term registry). The definitions the server hands
back follow too.

Atomicity: the server holds one reference, :attr:`Catalogue.current`, to a :class:`Snapshot`
(a :class:`~hyset_jax.serve.retriever.Retriever` and its version). A request reads it once, at
its start, and is validated and answered on that snapshot; the micro-batcher keys batches by
snapshot, so one device call never mixes two libraries. An update builds the new Retriever
entirely off to the side — model edited, every prepared set-size limit prepared again (P Zᵀ,
Z M_m, the neighbour table), the batch shapes compiled, the model directory written when
``persist`` names one — and only then replaces the reference. Requests in flight finish on the
old library; later ones see the new one. Updates run one at a time; one that fails (a bad
value, a write error: :class:`PersistError`) leaves the served library as it was.

Memory: a long-running server must not keep what each update leaves behind. A new library's
compiled prediction programs are its own (:class:`~hyset_jax.serve.retriever.Programs`: shared
with a successor of the same shapes, freed with the last Retriever of a library). The programs
that prepared a library (P Zᵀ and Z M_m, the neighbour table's blocks, eager slices of [N, …]
arrays) are compiled per tool count and are not needed once it is prepared: after a swap to a
library of new shapes they are dropped (:func:`release_memory`), and the allocator gives the
freed pages back to the system (glibc ``malloc_trim``: otherwise each update's temporaries stay
resident as free heap). Measured in process on a 464-tool model with one batch bucket, an update
to a new size each time: ~15 MiB of RSS per update before, ~1.5 MiB after (JAX's own tracing
caches, bounded in size; docs/serving.md); ``tests/test_serve_catalogue.py`` checks the
programs.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import ctypes.util
import dataclasses
import functools
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from hyset_jax.data.tooltext import definition, render_tool, schema_metadata
from hyset_jax.errors import FieldError, UserError
from hyset_jax.inference import pipeline
from hyset_jax.serve.retriever import Options, Retriever, check_text

log = logging.getLogger("hyset.serve")


class PersistError(Exception):
  """An update that could not be written to ``persist``: it is not applied (HTTP 409). The
  message names no path (error bodies never do); the server's log has the reason."""


class ToolIn(BaseModel):
  """A tool definition in the shape the server hands back (``GET /v1/tools``)."""
  model_config = ConfigDict(extra="forbid")
  id: StrictStr = Field(description="tool id; an id already in the library updates that tool")
  name: StrictStr | None = Field(None, description="tool name (default: the id)")
  description: StrictStr | None = Field(None, description="what the tool does")
  parameters: dict[str, Any] | None = Field(None, description="JSON schema of its arguments")


class UpdateRequest(BaseModel):
  """``POST /v1/tools``: tools to add (or update) and ids to remove; at least one of them."""
  model_config = ConfigDict(extra="forbid")
  add: list[ToolIn] | None = Field(None, description="tools to add; an existing id is updated")
  remove: list[StrictStr] | None = Field(None, description="ids of tools to remove")


@dataclasses.dataclass(frozen=True)
class Snapshot:
  """One catalogue version: what a request is validated against and answered with."""
  retriever: Retriever
  version: int


@dataclasses.dataclass(frozen=True)
class Ticket:
  """What a request hands the micro-batcher: its snapshot (the batch key) and its options."""
  snapshot: Snapshot
  options: Options


def batch_key(ticket: Ticket) -> Snapshot:
  return ticket.snapshot


def run_batch(batch: list[tuple[Sequence[str], Ticket]]) -> list[list[dict]]:
  """The micro-batcher's ``run``: one batch, all on one snapshot (:func:`batch_key`)."""
  retriever = batch[0][1].snapshot.retriever
  return retriever.retrieve_batch([(texts, ticket.options) for texts, ticket in batch])


def tool_embedder(model, sentence_encoder=None) -> Callable[[Sequence[str]], np.ndarray] | None:
  """The model's frozen tool encoder, ``texts -> f32[n, d_z]``: what ``hyset tools add`` uses
  (:func:`hyset_jax.io.carry.tool_encoder`), on the query encoder the server already holds
  (``sentence_encoder``) when it is the same one: loading it per update costs ~1.5 s on a
  2-core CPU. None when the model names no encoder."""
  from hyset_jax.io.carry import tool_encoder
  return tool_encoder(model, loaded=sentence_encoder)


@dataclasses.dataclass(frozen=True)
class Plan:
  """A validated update: the tools added (ids new to the library), updated (ids in it, with new
  definitions) and removed, each added or updated tool's text and definition, the sizes."""
  added: tuple[str, ...]
  updated: tuple[str, ...]
  removed: tuple[str, ...]
  texts: dict[str, str]
  definitions: dict[str, dict]
  before: int
  after: int

  def summary(self, version: int) -> dict[str, Any]:
    return {"version": version, "count": self.after, "previous_count": self.before,
            "added": len(self.added), "updated": len(self.updated),
            "removed": len(self.removed),
            "ids": {"added": list(self.added), "updated": list(self.updated),
                    "removed": list(self.removed)}}


def _tool(i: int, tool: ToolIn) -> tuple[str, dict]:
  """An added tool's text (the library rendering, as ``mcp:`` files get it) and definition."""
  where = f"add[{i}]"
  if not tool.id.strip():
    raise FieldError(f"{where}.id", "is empty; expected the tool's id")
  name = tool.id if tool.name is None else tool.name
  for field, value in (("id", tool.id), ("name", name), ("description", tool.description)):
    if value is not None:
      check_text(f"{where}.{field}", value)
  if tool.parameters is not None:
    try:  # NaN/Infinity parse as JSON numbers, and could not be handed back as JSON
      json.dumps(tool.parameters, allow_nan=False)
    except ValueError:
      raise FieldError(f"{where}.parameters", "holds NaN or Infinity; expected a JSON "
                                              "schema") from None
  text = render_tool(name, tool.description, tool.parameters)
  check_text(f"{where}.parameters", text)
  return text, definition(tool.id, text, schema_metadata(name, tool.description,
                                                         tool.parameters))


def plan_update(retriever: Retriever, add: Sequence[ToolIn] | None,
                remove: Sequence[str] | None) -> Plan:
  """Check an update against the library ``retriever`` serves; FieldError naming the field."""
  add, remove = list(add or ()), list(remove or ())
  if not add and not remove:
    raise FieldError("body", "names no change; give 'add' (tool definitions) and/or 'remove' "
                             "(tool ids)")
  present = set(retriever.model.tool_ids)
  texts: dict[str, str] = {}
  definitions: dict[str, dict] = {}
  for i, tool in enumerate(add):
    if tool.id in texts:
      raise FieldError(f"add[{i}].id", f"{tool.id!r} is given twice")
    texts[tool.id], definitions[tool.id] = _tool(i, tool)
  removed: list[str] = []
  for i, tool_id in enumerate(remove):
    if tool_id in texts:
      raise FieldError(f"remove[{i}]", f"{tool_id!r} is also in 'add' (which updates it); "
                                       f"name it in one of them")
    if tool_id in removed:
      raise FieldError(f"remove[{i}]", f"{tool_id!r} is given twice")
    if tool_id not in present:
      raise FieldError(f"remove[{i}]", f"{tool_id!r} is not in the library "
                                       f"({len(present)} tools)")
    removed.append(tool_id)
  added = tuple(t for t in texts if t not in present)
  updated = tuple(t for t in texts if t in present)
  before = len(present)
  after = before + len(added) - len(removed)
  k_pool = retriever.model.k_pool
  if after < k_pool:
    raise FieldError("remove", f"the library would have {after} tools ({before} now, "
                               f"{len(added)} added, {len(removed)} removed), fewer than the "
                               f"model's k_pool {k_pool} (the shortlist size)")
  if updated and before + len(added) <= k_pool:
    # An update removes a row and adds it again; tooledit keeps every step at ≥ k_pool.
    raise FieldError("add", f"updating tools of a library of {before + len(added)} tools "
                            f"(the model's k_pool {k_pool}) would leave it below k_pool between "
                            f"removing and adding them; add a tool first")
  return Plan(added, updated, tuple(removed), texts, definitions, before, after)


def edit_model(model, plan: Plan, embeddings: dict[str, np.ndarray]):
  """``model`` with ``plan`` applied through :mod:`hyset_jax.io.tooledit`: new tools appended,
  updated ones removed and appended again (in chunks that keep the library at ≥ k_pool), then
  the removed ones dropped."""
  from hyset_jax.io import tooledit

  def add(m, ids):
    return tooledit.add_tools(m, ids, np.stack([embeddings[t] for t in ids]),
                              [plan.texts[t] for t in ids])

  if plan.added:
    model = add(model, plan.added)
  step = max(1, len(model.tool_ids) - model.k_pool)  # the slack is > 0 (plan_update)
  for start in range(0, len(plan.updated), step):
    chunk = plan.updated[start:start + step]
    model = add(tooledit.remove_tools(model, chunk), chunk)
  if plan.removed:
    model = tooledit.remove_tools(model, plan.removed)
  return model


def build_successor(retriever: Retriever, plan: Plan, embeddings: dict[str, np.ndarray], *,
                    warm_up: bool = True, persist=None, foreign: bool = False) -> Retriever:
  """The Retriever for the edited library, complete before anyone sees it: the model edited,
  every set-size limit ``retriever`` had prepared prepared again (neighbour tables included),
  the default options compiled for every batch bucket (``warm_up``), and the edited model
  directory written to ``persist`` (atomically) when given. ``foreign``: none of the tools the
  model came with is left, so it is scored as ``hyset predict --tools`` scores a model on a
  library with none of its tools (:func:`hyset_jax.io.carry.foreign`)."""
  model = edit_model(retriever.model, plan, embeddings)
  if foreign:
    from hyset_jax.io import carry
    model, changes = carry.foreign(model)
    if changes:
      log.info("catalogue: none of the model's own tools is left: %s", ", ".join(changes))
  defs = {d["id"]: d for d in retriever.definitions}
  defs.update(plan.definitions)
  successor = retriever.with_library(model, [defs[t] for t in model.tool_ids])
  for max_size in retriever.prepared_sizes:
    successor.prepared(max_size)
  if warm_up:
    successor.warm_up(encoder=False)  # a new library size is a new shape to compile
  if persist is not None:
    from hyset_jax.io import modeldir
    try:
      modeldir.save_model_dir(persist, model, force=True)
    except (UserError, OSError) as e:  # a folder removed or replaced, a full disk
      log.error("catalogue update not persisted: %s", e)
      raise PersistError("the update could not be written to the --persist directory (the "
                         "reason is in the server's log); the catalogue is unchanged") from None
  return successor


@functools.cache
def _malloc_trim():
  """glibc's ``malloc_trim``, or None (another C library, another system)."""
  name = ctypes.util.find_library("c")
  try:
    trim = getattr(ctypes.CDLL(name), "malloc_trim")
  except (OSError, AttributeError, TypeError):
    return None
  trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
  return trim


def release_memory(new_shapes: bool) -> None:
  """After a swap: drop the prepare programs when the new library has new shapes
  (:func:`pipeline.drop_prepare_programs`), then hand the heap's free pages back to the
  system. Without the trim, what an update freed (the old library, a compilation's
  temporaries) stays in the process's resident memory as free heap, and each update can raise
  that high-water mark."""
  if new_shapes:
    pipeline.drop_prepare_programs()
  trim = _malloc_trim()
  if trim is not None:
    trim(0)


class Catalogue:
  """The served library and its version; :meth:`update` swaps in a new one atomically.

  Args:
    retriever: the library served at start (version 1).
    warm_up: compile each new library's batch shapes before it is served.
    persist: a model directory each update is written to (checked at start-up by
      ``hyset serve --persist``); None: the model on disk is never touched.
  """

  def __init__(self, retriever: Retriever, *, warm_up: bool = True, persist=None):
    self._current = Snapshot(retriever, 1)
    # The tools the served model came with, less those removed or redefined since (a redefined
    # tool gets an encoder row): when none is left, the library is wholly new to the model.
    self._own = frozenset(retriever.model.tool_ids)
    self.warm_up = warm_up
    self.persist = persist
    self._lock = asyncio.Lock()
    # Builds run here, beside the batches' thread: requests keep being answered meanwhile.
    self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="hyset-update")

  @property
  def current(self) -> Snapshot:
    """The snapshot a request starting now uses (one reference, replaced whole)."""
    return self._current

  def close(self) -> None:
    self._executor.shutdown(wait=True)

  async def update(self, add: Sequence[ToolIn] | None, remove: Sequence[str] | None,
                   batcher) -> dict[str, Any]:
    """Apply an update; returns what changed (:meth:`Plan.summary`). FieldError for a bad
    update (the library is unchanged). Shielded: a client that hangs up does not cancel an
    update half-way (after a write to ``persist`` but before the swap)."""
    return await asyncio.shield(self._update(add, remove, batcher))

  async def _update(self, add, remove, batcher) -> dict[str, Any]:
    async with self._lock:  # one update at a time, each on the library the last one left
      snapshot = self._current
      plan = plan_update(snapshot.retriever, add, remove)
      if plan.texts and self._embedder(snapshot.retriever) is None:
        # `hyset serve` refuses such a model at start; an app built on one can only remove.
        raise FieldError("add", "the model names no encoder, so new tools cannot be embedded "
                                "the way its tools were")
      embeddings: dict[str, np.ndarray] = {}
      if plan.texts:
        ids = list(plan.texts)
        # On the batches' thread: the encoder (and its tokenizer) is used from one thread.
        vectors = await batcher.call(self._embed, snapshot.retriever,
                                     [plan.texts[t] for t in ids])
        embeddings = dict(zip(ids, vectors))
      own = self._own - set(plan.updated) - set(plan.removed)
      successor = await asyncio.get_running_loop().run_in_executor(
          self._executor, lambda: build_successor(snapshot.retriever, plan, embeddings,
                                                  warm_up=self.warm_up, persist=self.persist,
                                                  foreign=not own))
      self._current, self._own = Snapshot(successor, snapshot.version + 1), own
      # Off the event loop, before the next update: the new library is served meanwhile.
      try:
        await asyncio.get_running_loop().run_in_executor(
            self._executor, release_memory,
            successor.programs is not snapshot.retriever.programs)
      except Exception:  # noqa: BLE001 - the update is applied; memory is only not given back
        log.warning("catalogue version %d: memory not released", snapshot.version + 1,
                    exc_info=True)
    log.info("catalogue version %d: %d added, %d updated, %d removed; %d tools",
             snapshot.version + 1, len(plan.added), len(plan.updated), len(plan.removed),
             plan.after)
    return plan.summary(snapshot.version + 1)

  @staticmethod
  def _embedder(retriever: Retriever):
    return tool_embedder(retriever.model, retriever.sentence_encoder)

  def _embed(self, retriever: Retriever, texts: list[str]) -> np.ndarray:
    return self._embedder(retriever)(texts)
