"""One tool-text rendering for every function-schema library (``bfcl``, ``mcp:``, ``openai:``,
``toolret:``), and the tool definition the server hands back.

The encoder sees a tool as one string. Every format that describes a tool by a name, a
description and a JSON parameter schema renders it the same way (:func:`render_tool`)::

  <name>: <description> parameters: <schema as JSON, keys sorted, non-ASCII kept>

- the description is stripped; with an empty description the text is ``<name>:``;
- `` parameters: …`` is left out when the schema is missing or empty;
- sorted keys make the text independent of key order in the file, so the same tool written
  by two stacks gets the same embedding.

This is the rendering BFCL has always used here, so models trained on ``bfcl`` keep their
tool texts (and cached embeddings). ToolBench APIs (``toolbench:``) keep the ToolLens
flattening of :func:`hyset_jax.data.toolbench.render_api` instead: ToolLens and ToolBench
describe the same APIs, and models move between the two unchanged.

Readers of these formats store ``name``, ``description`` and ``parameters`` in the tool's
metadata; :func:`definition` turns a library row into what ``hyset serve`` returns.
"""
from __future__ import annotations

import json
from typing import Any


def render_tool(name: str, description: str | None, parameters: dict[str, Any] | None) -> str:
  """The tool text of a function schema (see the module docstring).

  >>> render_tool("f", " Add. ", {"type": "object", "properties": {"b": {}, "a": {}}})
  'f: Add. parameters: {"properties": {"a": {}, "b": {}}, "type": "object"}'
  >>> render_tool("g", "", None)
  'g:'
  """
  text = f"{name}: {(description or '').strip()}".rstrip()
  if parameters:
    text += " parameters: " + json.dumps(parameters, sort_keys=True, ensure_ascii=False)
  return text


def schema_metadata(name: str, description: str | None,
                    parameters: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
  """The metadata a function-schema reader stores with each tool (read by :func:`definition`)."""
  return {"name": name, "description": (description or "").strip(),
          "parameters": parameters or {}, **extra}


def definition(tool_id: str, text: str | None, metadata: dict[str, Any] | None) -> dict[str, Any]:
  """What a client is told about one tool: ``id``, ``name``, ``description``, and
  ``parameters`` when the library knew a schema.

  Function-schema libraries give all three; a ToolBench/ToolLens API gives
  ``tool_name / api_name``, its ``api_description`` when recorded, else its whole text; a tool
  known only by id gets its id as name and no description.

  >>> definition("f", "f: Add.", {"name": "f", "description": "Add.", "parameters": {}})
  {'id': 'f', 'name': 'f', 'description': 'Add.', 'parameters': {}}
  >>> definition("t7", None, None)
  {'id': 't7', 'name': 't7', 'description': ''}
  """
  meta = metadata or {}
  out: dict[str, Any] = {"id": tool_id}
  if isinstance(meta.get("name"), str) and meta["name"]:
    out["name"] = meta["name"]
  else:
    api = " / ".join(str(meta[k]) for k in ("tool_name", "api_name") if meta.get(k))
    out["name"] = api or tool_id
  description = meta.get("description")
  out["description"] = description if isinstance(description, str) else (text or "")
  if isinstance(meta.get("parameters"), dict):
    out["parameters"] = meta["parameters"]
  return out
