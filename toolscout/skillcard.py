"""Deterministic skill-card rendering of tools (paper Table 32, §5.4, A.5).

The card changes only the visible text of a tool; ids, labels, splits,
retrievers and the routing policy stay the same. Template (one field a line)::

  Skill: {tool_name}
  Capability: This skill enables the agent to {description}.
  When to use: Use this skill when the user request matches {tags/categories/description}.
  Inputs: {arguments or schema fields}
  Output/effect: {available output or API-effect description}
  Metadata: {tags and categories}

Missing fields read "none" (inputs, metadata) or "not documented" (output), so
every card has all six lines. BFCL functions carry no tags; the BFCL category a
function was first seen in is a source label, not a tag, and is not shown.
"""
from __future__ import annotations

from toolscout.tooltext import Param, ToolFields, parse_tool


def _sentence(text: str) -> str:
  """Lower-cases the first letter and drops a final period, to fit "enables the agent to ..."."""
  text = " ".join(text.split()).rstrip(".")
  return text[:1].lower() + text[1:] if text[:2] != text[:2].upper() else text


def _inputs(params: tuple[Param, ...]) -> str:
  if not params:
    return "none"
  parts = []
  for p in params:
    kind = ", ".join(x for x in (p.type, "required" if p.required else "optional") if x)
    parts.append(f"{p.name} ({kind})" + (f": {p.description}" if p.description else ""))
  return "; ".join(parts)


def render_card(fields: ToolFields) -> str:
  """The six-line card of one tool.

  >>> print(render_card(ToolFields("Suggestions", "Get suggestions.", (), "returns results",
  ...                              ("Food",), "Recipes")))
  Skill: Recipes: Suggestions
  Capability: This skill enables the agent to get suggestions.
  When to use: Use this skill when the user request matches Food: get suggestions.
  Inputs: none
  Output/effect: returns results
  Metadata: Food
  """
  name = f"{fields.group}: {fields.name}" if fields.group else (fields.name or "unnamed tool")
  description = _sentence(fields.description) or name
  tags = ", ".join(fields.tags)
  when = f"{tags}: {description}" if tags else description
  return "\n".join([
      f"Skill: {name}",
      f"Capability: This skill enables the agent to {description}.",
      f"When to use: Use this skill when the user request matches {when}.",
      f"Inputs: {_inputs(fields.params)}",
      f"Output/effect: {fields.output or 'not documented'}",
      f"Metadata: {tags or 'none'}",
  ])


def render_cards(texts: tuple[str, ...] | list[str]) -> list[str]:
  """Skill cards of a library's tool texts, in the same order."""
  return [render_card(parse_tool(t)) for t in texts]
