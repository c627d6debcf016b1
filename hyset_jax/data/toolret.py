"""The ``toolret:PATH`` reader: ToolRet's local files (queries and tools as JSON lines).

Layout (``PATH`` is a folder)::

  PATH/tools.jsonl   or PATH/tools/*.jsonl     {"id", "documentation"}     one tool a line
  PATH/queries.jsonl or PATH/queries/*.jsonl   {"id", "query", "instruction",
                                                "labels": [{"id", "relevance"}, ...]}

- ``documentation`` is the tool's JSON document, as a string (ToolRet's files) or an object
  (``doc`` is read too). A document with ``name`` is rendered by
  :func:`hyset_jax.data.tooltext.render_tool` (name, description, ``parameters``); a ToolBench
  API document (``tool_name`` and ``api_name``) by
  :func:`hyset_jax.data.toolbench.render_api`, as ``toolbench:`` does; any other document is
  its JSON with sorted keys, and a plain-text documentation its text.
- ``labels`` may be a list or a JSON string of one (as on ToolRet's hub); the gold set is the
  distinct ids with ``relevance > 0``. Every label must name a tool of the library.
- Query text: with a non-empty ``instruction``, ``"Instruct: <instruction>\\nQuery: <query>"``
  — the instruction prepended the way ToolRet's evaluation does for sentence-transformers
  models (``add_instruction``); without one, the query alone.
- Splits: one per query file, named after its stem (ToolRet's tasks); a single
  ``queries.jsonl`` is the split ``test`` (ToolRet is an evaluation benchmark).
"""
from __future__ import annotations

import glob
import json
import os
from typing import Any

from hyset_jax.data import files
from hyset_jax.data.toolbench import render_api
from hyset_jax.data.tooltext import render_tool, schema_metadata
from hyset_jax.data.types import Dataset, Query, ToolLibrary
from hyset_jax.errors import UserError


def query_text(query: str, instruction: str | None) -> str:
  """ToolRet's instruction prefix.

  >>> query_text("weather in Paris", "Given a weather task, retrieve tools")
  'Instruct: Given a weather task, retrieve tools\\nQuery: weather in Paris'
  >>> query_text("weather in Paris", "")
  'weather in Paris'
  """
  if instruction and instruction.strip():
    return f"Instruct: {instruction.strip()}\nQuery: {query}"
  return query


def _files(root: str, name: str) -> dict[str, str]:
  """Split (or file) stem -> path: ``name.jsonl`` or every ``name/*.jsonl``."""
  single = os.path.join(root, f"{name}.jsonl")
  if os.path.isfile(single):
    return {name: single}
  paths = sorted(glob.glob(os.path.join(root, name, "*.jsonl")))
  if not paths:
    raise UserError(f"{root}: missing {name}.jsonl (or {name}/*.jsonl); expected ToolRet's "
                    f"{name} as JSON lines")
  return {os.path.splitext(os.path.basename(p))[0]: p for p in paths}


def load_toolret(path: str) -> Dataset:
  """Reads a ToolRet folder (see the module docstring) into a Dataset."""
  root = os.path.expanduser(path)
  if not os.path.isdir(root):
    what = "a file" if os.path.exists(root) else "missing"
    raise UserError(f"{root}: {what}; expected a ToolRet folder with tools.jsonl and "
                    f"queries.jsonl (or tools/*.jsonl and queries/*.jsonl)")
  tools = _read_tools(list(_files(root, "tools").values()))
  known = set(tools.ids)
  query_files = _files(root, "queries")
  seen = files.UniqueIds("query")
  split_queries: dict[str, tuple[Query, ...]] = {}
  notes = []
  for stem, qpath in query_files.items():
    split = "test" if stem == "queries" else stem
    queries, unlabeled = _read_queries(qpath, known, seen, source=split)
    split_queries[split] = queries
    if unlabeled:
      notes.append(f"{split}: {unlabeled} queries have no label with relevance > 0; left out")
  return Dataset(name=os.path.basename(os.path.normpath(root)), tools=tools,
                 splits=split_queries, notes=tuple(notes))


def _documentation(obj: dict[str, Any], where: str) -> dict[str, Any] | str:
  key = "documentation" if "documentation" in obj else "doc"
  doc = files.get_field(obj, key, (str, dict), where)
  if isinstance(doc, str):
    try:
      parsed = json.loads(doc)
    except (ValueError, RecursionError):  # not JSON (or a 4300-digit int): plain text
      parsed = None
    if isinstance(parsed, dict):
      files.check_unicode(parsed, f"{where}: field {key!r}")  # "\\ud800" inside the string
      doc = parsed
  return doc


def _render(tool_id: str, doc: dict[str, Any] | str, where: str) -> tuple[str, dict[str, Any]]:
  """(tool text, metadata) of one ToolRet documentation."""
  if isinstance(doc, str):
    if not doc.strip():
      raise UserError(f"{where}: tool {tool_id!r} has empty documentation; expected a "
                      f"description to retrieve it by")
    return doc.strip(), {"name": tool_id, "description": doc.strip()}
  if isinstance(doc.get("tool_name"), str) and isinstance(doc.get("api_name"), str):
    return render_api(doc, where), {
        "category": str(doc.get("category_name") or ""), "tool_name": doc["tool_name"],
        "api_name": doc["api_name"], "description": str(doc.get("api_description") or "")}
  if isinstance(doc.get("name"), str) and doc["name"].strip():
    description = doc.get("description")
    description = description if isinstance(description, str) else ""
    parameters = doc.get("parameters")
    parameters = parameters if isinstance(parameters, dict) else None
    return (render_tool(doc["name"], description, parameters),
            schema_metadata(doc["name"], description, parameters))
  if not doc:
    raise UserError(f"{where}: tool {tool_id!r} has an empty documentation object")
  return json.dumps(doc, sort_keys=True, ensure_ascii=False), {"name": tool_id}


def _read_tools(paths: list[str]) -> ToolLibrary:
  ids, texts, metadata = [], [], []
  seen = files.UniqueIds("tool")
  for path in paths:
    for line, obj in files.read_jsonl(path):
      where = f"{path}:{line}"
      tool_id = files.get_id(obj, "id", where)
      text, meta = _render(tool_id, _documentation(obj, where), where)
      seen.add(tool_id, where)
      ids.append(tool_id)
      texts.append(text)
      metadata.append(meta)
  if not ids:
    raise UserError(f"{', '.join(paths)}: no tools; expected one {{\"id\", \"documentation\"}} "
                    f"object a line")
  return ToolLibrary(tuple(ids), tuple(texts), tuple(metadata))


def _labels(obj: dict[str, Any], where: str) -> list[Any]:
  labels = files.get_field(obj, "labels", (list, str), where)
  if isinstance(labels, str):
    try:
      labels = json.loads(labels)
    except (ValueError, RecursionError) as e:  # also a 4300-digit int, or nesting too deep
      msg = getattr(e, "msg", None) or str(e).split(";")[0] or "nested too deeply"
      raise UserError(f"{where}: field 'labels' is a string but not JSON ({msg}); expected "
                      f"a list of {{\"id\", \"relevance\"}}") from None
    if not isinstance(labels, list):
      raise UserError(f"{where}: field 'labels' should hold a list, found "
                      f"{type(labels).__name__}")
  return labels


def _read_queries(path: str, known: set[str], seen: files.UniqueIds,
                  source: str) -> tuple[tuple[Query, ...], int]:
  out, unlabeled = [], 0
  for line, obj in files.read_jsonl(path):
    where = f"{path}:{line}"
    query_id = files.get_id(obj, "id", where)
    where = f"{path}:{line} (query {query_id!r})"
    seen.add(query_id, where)
    text = files.get_field(obj, "query", str, where)
    if not text.strip():
      raise UserError(f"{where}: query has empty text; expected the request")
    instruction = files.get_field(obj, "instruction", (str, type(None)), where, default="")
    gold = set()
    for k, label in enumerate(_labels(obj, where)):
      lwhere = f"{where} labels[{k}]"
      if not isinstance(label, dict):
        raise UserError(f"{lwhere}: expected {{\"id\", \"relevance\"}}, found "
                        f"{type(label).__name__}")
      tool_id = files.get_id(label, "id", lwhere)
      relevance = files.get_field(label, "relevance", (int, float), lwhere, default=1)
      if tool_id not in known:
        raise UserError(f"{lwhere}: tool id {tool_id!r} is not in the tools files; every "
                        f"label must name a tool of the library")
      if relevance > 0:
        gold.add(tool_id)
    if not gold:
      unlabeled += 1
      continue
    out.append(Query(id=query_id, text=query_text(text, instruction), gold=tuple(sorted(gold)),
                     source=source))
  return tuple(out), unlabeled
