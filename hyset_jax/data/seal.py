"""The ``seal:PATH`` reader: Seal-Tools (tool.jsonl and its request files).

Layout (``PATH`` is a folder)::

  PATH/tool.jsonl             one tool a line: {"api_name", "api_description", "field",
                              "parameters": {name: {"type", "description"}, ...},
                              "required": [name, ...], "responses": {...}}
  PATH/dev.jsonl              split ``train``     one request a line:
  PATH/test_in_domain.jsonl   split ``test``      {"id", "query",
  PATH/test_out_domain.jsonl  split ``test_out``   "calling": [{"api", "parameters", ...}]}

- Every request file is optional, but at least one must exist: a root with test files only is
  valid for evaluation (training needs ``train``). The release's train split is not read
  (``dev.jsonl`` is the labelled split to train on).
- Library: one tool per line of tool.jsonl, in file order; the tool id is ``api_name``
  (distinct). Tool text is :func:`hyset_jax.data.tooltext.render_tool` — the rendering of every
  function-schema format — of ``api_name``, ``api_description`` and the parameters as a JSON
  schema (:func:`parameter_schema`); ``responses`` are not part of it. The metadata keeps
  ``field`` (the domain, e.g. ``"Chemical Engineering/Forensic engineering"``) and
  ``category`` (the same, what exports label tools by).
- Gold set: the distinct ``calling[*].api`` (sorted); every one must be a tool of tool.jsonl (a
  request naming another is an error naming the request). A request with an empty ``calling``
  has no gold set: it is left out and counted in the notes.
- Query text: ``query``. Source: the request file's stem (``dev``, ``test_in_domain``,
  ``test_out_domain``). Request ids are unique across the files.
- There is no validation split: training and ``--split validation`` carve one out of train by
  id hash (:func:`hyset_jax.data.splits.with_validation`).
"""
from __future__ import annotations

import os
from typing import Any

from hyset_jax.data import files
from hyset_jax.data.tooltext import render_tool, schema_metadata
from hyset_jax.data.types import Dataset, Query, ToolLibrary
from hyset_jax.errors import UserError

# Request file -> split, in the order the splits are listed.
SPLIT_FILES = (("dev.jsonl", "train"), ("test_in_domain.jsonl", "test"),
               ("test_out_domain.jsonl", "test_out"))


def parameter_schema(parameters: dict[str, Any], required: list[str]) -> dict[str, Any]:
  """Seal-Tools' parameters as a JSON schema object (each parameter's own fields unchanged).

  >>> parameter_schema({"city": {"type": "str", "description": "City"}}, ["city"])
  {'type': 'object', 'properties': {'city': {'type': 'str', 'description': 'City'}}, \
'required': ['city']}
  """
  return {"type": "object", "properties": parameters, "required": list(required)}


def load_seal(path: str) -> Dataset:
  """Reads a Seal-Tools folder (see the module docstring) into a Dataset."""
  root = os.path.expanduser(path)
  names = ", ".join(name for name, _ in SPLIT_FILES)
  if not os.path.isdir(root):
    what = "a file" if os.path.exists(root) else "missing"
    raise UserError(f"{root}: {what}; expected a Seal-Tools folder with tool.jsonl and at "
                    f"least one of {names}")
  tools = read_tools(files.require_file(os.path.join(root, "tool.jsonl"),
                                        "Seal-Tools tools (tool.jsonl)"))
  present = [(os.path.join(root, name), split) for name, split in SPLIT_FILES
             if os.path.exists(os.path.join(root, name))]
  if not present:
    raise UserError(f"{root}: no request file; expected at least one of {names}")
  known = set(tools.ids)
  seen = files.UniqueIds("request")
  split_queries: dict[str, tuple[Query, ...]] = {}
  notes = []
  for request_path, split in present:
    files.require_file(request_path, "Seal-Tools requests (JSON lines)")
    queries, no_gold = read_requests(request_path, known, seen)
    split_queries[split] = queries
    if no_gold:
      notes.append(f"{split}: {len(no_gold)} requests have an empty 'calling' (no gold set), "
                   f"e.g. {no_gold[0]!r}; left out")
  absent = [name for name, split in SPLIT_FILES if split not in split_queries]
  if absent:
    notes.append(f"not present: {', '.join(absent)}")
  return Dataset(name=os.path.basename(os.path.normpath(root)), tools=tools,
                 splits=split_queries, notes=tuple(notes))


def read_tools(path: str) -> ToolLibrary:
  """``tool.jsonl`` -> the library (row order = file order)."""
  seen = files.UniqueIds("tool")
  ids, texts, metadata = [], [], []
  for line, obj in files.read_jsonl(path):
    where = f"{path}:{line}"
    name = files.get_field(obj, "api_name", str, where).strip()
    if not name:
      raise UserError(f"{where}: field 'api_name' is empty; expected the tool's name")
    where = f"{path}:{line} ({name!r})"
    description = files.get_field(obj, "api_description", (str, type(None)), where,
                                  default="") or ""
    field = files.get_field(obj, "field", (str, type(None)), where, default="") or ""
    parameters = files.get_field(obj, "parameters", (dict, type(None)), where, default={}) or {}
    required = files.get_field(obj, "required", (list, type(None)), where, default=[]) or []
    for key, spec in parameters.items():
      if not isinstance(spec, dict):
        raise UserError(f"{where}: parameters[{key!r}] should be an object "
                        f"{{\"type\", \"description\"}}, found {type(spec).__name__}")
    for k, key in enumerate(required):
      if not isinstance(key, str) or key not in parameters:
        raise UserError(f"{where}: required[{k}] = {key!r:.60} is not one of its parameters "
                        f"({', '.join(parameters) or 'none'}); expected parameter names")
    schema = parameter_schema(parameters, required)
    seen.add(name, where)
    ids.append(name)
    texts.append(render_tool(name, description, schema))
    metadata.append(schema_metadata(name, description, schema, field=field, category=field))
  if not ids:
    raise UserError(f"{path}: no tools; expected one {{\"api_name\", \"api_description\", "
                    f"\"parameters\", \"required\"}} object a line")
  return ToolLibrary(tuple(ids), tuple(texts), tuple(metadata))


def read_requests(path: str, known: set[str],
                  seen: files.UniqueIds) -> tuple[tuple[Query, ...], list[str]]:
  """One request file -> (queries with a gold set, ids of requests with an empty calling)."""
  source = os.path.splitext(os.path.basename(path))[0]
  out: list[Query] = []
  no_gold: list[str] = []
  for line, obj in files.read_jsonl(path):
    where = f"{path}:{line}"
    request_id = files.get_id(obj, "id", where)
    where = f"{path}:{line} (request {request_id!r})"
    seen.add(request_id, where)
    text = files.get_field(obj, "query", str, where)
    if not text.strip():
      raise UserError(f"{where}: field 'query' is empty; expected the request")
    gold: set[str] = set()
    for k, call in enumerate(files.get_field(obj, "calling", list, where)):
      cwhere = f"{where} calling[{k}]"
      if not isinstance(call, dict):
        raise UserError(f"{cwhere}: expected a call {{\"api\", \"parameters\"}}, found "
                        f"{type(call).__name__}")
      api = files.get_id(call, "api", cwhere)
      if api not in known:
        raise UserError(f"{cwhere}: api {api!r} is not in tool.jsonl; every call must name a "
                        f"tool of the library")
      gold.add(api)
    if not gold:
      no_gold.append(request_id)
      continue
    out.append(Query(id=request_id, text=text, gold=tuple(sorted(gold)), source=source))
  if not out and not no_gold:
    raise UserError(f"{path}: no requests; expected one {{\"id\", \"query\", \"calling\"}} "
                    f"object a line")
  return tuple(out), no_gold
