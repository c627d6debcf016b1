"""Structured fields of a tool, parsed back from the library's tool text.

Two renderings occur in the data we have:

- ToolLens / ToolBench (``beir:``): ``category_name:..., tool_name:..., api_name:...,
  api_description:..., required_params: [...], optional_params: [...],
  return_schema: ...``.
- BFCL (``bfcl``, :func:`hyset_jax.data.bfcl.render_function`):
  ``name: description parameters: {JSON schema}``.

:func:`parse_tool` turns either into :class:`ToolFields`; anything else keeps
its whole text as the description, so no tool is ever dropped.
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

_TOOLBENCH = re.compile(
    r"^category_name:(?P<category>.*?), tool_name:(?P<tool>.*?), api_name:(?P<api>.*?), "
    r"api_description:(?P<description>.*?), required_params: (?P<required>\[.*?\]), "
    r"optional_params: (?P<optional>\[.*?\]), return_schema: ?(?P<returns>.*)$", re.S)
_BFCL_PARAMS = " parameters: {"


@dataclasses.dataclass(frozen=True)
class Param:
  name: str
  type: str
  required: bool
  description: str = ""


@dataclasses.dataclass(frozen=True)
class ToolFields:
  """What a tool exposes: name, description, inputs, output, tags."""
  name: str
  description: str
  params: tuple[Param, ...] = ()
  output: str = ""
  tags: tuple[str, ...] = ()
  group: str = ""  # ToolBench tool name of an API ("Worldwide Recipes"); empty for BFCL


def _json_or_none(text: str) -> Any:
  try:
    return json.loads(text)
  except (json.JSONDecodeError, ValueError):
    return None


def _toolbench_params(text: str, required: bool) -> list[Param]:
  items = _json_or_none(text)
  if not isinstance(items, list):
    return []
  out = []
  for item in items:
    if isinstance(item, dict) and isinstance(item.get("name"), str):
      out.append(Param(item["name"], str(item.get("type", "")).lower(), required,
                       str(item.get("description") or "").strip()))
  return out


def _schema_output(text: str) -> str:
  schema = _json_or_none(text.strip())
  if isinstance(schema, dict) and schema:
    return "returns " + ", ".join(str(k) for k in schema)
  return ""


def _bfcl_params(schema: Any) -> list[Param]:
  if not isinstance(schema, dict):
    return []
  props = schema.get("properties")
  required = set(schema.get("required") or [])
  if not isinstance(props, dict):
    return []
  return [Param(str(k), str(v.get("type", "")) if isinstance(v, dict) else "", k in required,
                str(v.get("description") or "").strip() if isinstance(v, dict) else "")
          for k, v in props.items()]


def parse_tool(text: str) -> ToolFields:
  """Parses one tool text (see the module docstring).

  >>> f = parse_tool('category_name:Food, tool_name:Recipes, api_name:Suggestions, '
  ...                'api_description:Get suggestions, required_params: [{"name": "q", '
  ...                '"type": "STRING", "description": ""}], optional_params: [], '
  ...                'return_schema: {"results": "list"}')
  >>> f.name, f.group, f.params[0].name, f.params[0].required, f.output, f.tags
  ('Suggestions', 'Recipes', 'q', True, 'returns results', ('Food',))
  >>> g = parse_tool('math.add: Add two numbers. parameters: {"properties": {"a": '
  ...                '{"type": "integer"}}, "required": ["a"], "type": "dict"}')
  >>> g.name, g.description, g.params
  ('math.add', 'Add two numbers.', (Param(name='a', type='integer', required=True, description=''),))
  """
  m = _TOOLBENCH.match(text)
  if m:
    params = (_toolbench_params(m["required"], True) + _toolbench_params(m["optional"], False))
    category = m["category"].strip()
    return ToolFields(m["api"].strip(), m["description"].strip(), tuple(params),
                      _schema_output(m["returns"]), (category,) if category else (),
                      m["tool"].strip())
  head, sep, rest = text.partition(": ")
  if sep and " " not in head.strip():
    at = rest.rfind(_BFCL_PARAMS)
    if at >= 0:
      description, schema = rest[:at], _json_or_none(rest[at + len(_BFCL_PARAMS) - 1:])
    else:
      description, schema = rest, None
    return ToolFields(head.strip(), description.strip(), tuple(_bfcl_params(schema)))
  return ToolFields("", text.strip())
