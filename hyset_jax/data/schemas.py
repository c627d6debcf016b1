"""Tool libraries in the formats agents already hold: ``mcp:FILE.json`` and ``openai:FILE.json``.

Both are libraries only (no queries, no splits): use them wherever a tool library is named
(``hyset serve --tools``, ``hyset tools add --tools``).

``mcp:FILE.json`` — an MCP ``tools/list`` result::

  {"tools": [{"name": "...", "description": "...", "inputSchema": {...}}, ...]}

  (the bare JSON-RPC response ``{"jsonrpc": "2.0", "id": …, "result": {"tools": [...]}}``
  is read too). ``name`` is required; ``description`` and ``inputSchema`` are optional, as in
  the protocol.

``openai:FILE.json`` — OpenAI function tools, as passed in ``tools=[...]``::

  [{"type": "function", "function": {"name", "description", "parameters"}}, ...]

  (or ``{"tools": [...]}``; the flat Responses-API form ``{"type": "function", "name", …}`` is
  read too). Entries of another ``type`` are errors, not silently dropped.

The tool id is the name; names must be distinct. Tool text is
:func:`hyset_jax.data.tooltext.render_tool`. Every bad entry is a UserError naming the file and
the entry's index (``tools[3]``).
"""
from __future__ import annotations

import os
from typing import Any

from hyset_jax.data import files
from hyset_jax.data.tooltext import render_tool, schema_metadata
from hyset_jax.data.types import Dataset, ToolLibrary
from hyset_jax.errors import UserError


def _entries(path: str, data: Any, what: str, example: str) -> list[Any]:
  """The list of tool entries: the document itself, its ``tools``, or ``result.tools``."""
  if isinstance(data, dict) and isinstance(data.get("result"), dict):
    data = data["result"]
  if isinstance(data, dict) and "tools" in data:
    data = data["tools"]
  if not isinstance(data, list):
    raise UserError(f"{path}: expected {what} ({example}), found a JSON "
                    f"{type(data).__name__} without a 'tools' list")
  if not data:
    raise UserError(f"{path}: the tool list is empty; expected at least one tool")
  return data


def _library(path: str, rows: list[tuple[str, str, dict | None, str]],
             source: str) -> ToolLibrary:
  """(name, description, schema, where) per tool -> library with distinct names."""
  seen = files.UniqueIds("tool")
  ids, texts, metadata = [], [], []
  for name, description, schema, where in rows:
    seen.add(name, where)
    ids.append(name)
    texts.append(render_tool(name, description, schema))
    metadata.append(schema_metadata(name, description, schema, source=source))
  return ToolLibrary(tuple(ids), tuple(texts), tuple(metadata))


def _name(entry: dict[str, Any], where: str) -> str:
  name = files.get_field(entry, "name", str, where)
  if not name.strip():
    raise UserError(f"{where}: field 'name' is empty; expected the tool's name")
  return name


def _dataset(path: str, tools: ToolLibrary) -> Dataset:
  name = os.path.splitext(os.path.basename(path))[0]
  return Dataset(name=name, tools=tools, splits={},
                 notes=("a tool library only: no queries, no splits",))


def load_mcp(path: str) -> Dataset:
  """An MCP ``tools/list`` result as a library (see the module docstring)."""
  path = files.require_file(os.path.expanduser(path), "MCP tools/list result (JSON)")
  entries = _entries(path, files.read_json(path), "an MCP tools/list result",
                     '{"tools": [{"name", "description", "inputSchema"}, ...]}')
  rows = []
  for i, entry in enumerate(entries):
    where = f"{path}: tools[{i}]"
    if not isinstance(entry, dict):
      raise UserError(f"{where}: expected a tool object, found {type(entry).__name__}")
    name = _name(entry, where)
    where = f"{path}: tools[{i}] ({name!r})"
    description = files.get_field(entry, "description", (str, type(None)), where, default="")
    schema = files.get_field(entry, "inputSchema", (dict, type(None)), where, default=None)
    rows.append((name, description, schema, where))
  return _dataset(path, _library(path, rows, "mcp"))


def load_openai(path: str) -> Dataset:
  """OpenAI function tools as a library (see the module docstring)."""
  path = files.require_file(os.path.expanduser(path), "OpenAI tools file (JSON)")
  entries = _entries(path, files.read_json(path), "a list of OpenAI function tools",
                     '[{"type": "function", "function": {"name", "description", '
                     '"parameters"}}, ...]')
  rows = []
  for i, entry in enumerate(entries):
    where = f"{path}: tools[{i}]"
    if not isinstance(entry, dict):
      raise UserError(f"{where}: expected a tool object, found {type(entry).__name__}")
    kind = entry.get("type", "function")
    if kind != "function":
      raise UserError(f"{where}: type {kind!r} is not a function tool; expected "
                      f"'type': 'function' (only function tools can be retrieved)")
    fn = files.get_field(entry, "function", dict, where) if "function" in entry else entry
    name = _name(fn, where)
    where = f"{path}: tools[{i}] ({name!r})"
    description = files.get_field(fn, "description", (str, type(None)), where, default="")
    schema = files.get_field(fn, "parameters", (dict, type(None)), where, default=None)
    rows.append((name, description, schema, where))
  return _dataset(path, _library(path, rows, "openai"))
