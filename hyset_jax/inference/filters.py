"""Tool filters: which tools of a library a request may be answered with.

A filter has three optional parts; a tool is allowed when it passes all three:

- ``allow``: tool ids, or ``prefix*`` for every id that starts with ``prefix``; the tool
  matches one of them (None: every tool).
- ``tags``: the tool carries one of these tags (None: any tool); tags come from the library's
  metadata (:func:`tags_of`).
- ``deny``: ids or prefixes as ``allow``; the tool matches none of them.

Filters are applied before retrieval (:attr:`hyset_jax.model.query_inputs.QueryInputs.allowed`), so
the answer is the exact best set over the allowed tools. A request's filter is intersected with
its API key's policy (:mod:`hyset_jax.serve.policies`): it can narrow it, never widen it.

Strict matching (a request's filter, ``hyset predict --allow``): an exact id the library lacks
and a tag no tool carries are errors naming the entry (a typo should not silently shrink or
empty the result); a prefix may match nothing. A filter that leaves no tool is an error too.
"""
from __future__ import annotations

import bisect
import dataclasses
import pathlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from hyset_jax.errors import FieldError, UserError

FIELDS = ("allow", "deny", "tags")


@dataclasses.dataclass(frozen=True)
class ToolFilter:
  """allow / deny: ids or ``prefix*`` patterns; tags: tag names (None: no restriction)."""
  allow: tuple[str, ...] | None = None
  deny: tuple[str, ...] = ()
  tags: tuple[str, ...] | None = None

  @property
  def unrestricted(self) -> bool:
    return self.allow is None and not self.deny and self.tags is None


EVERYTHING = ToolFilter()


def from_json(obj: Any, where: str) -> ToolFilter:
  """A filter from its JSON form ``{"allow": [...], "deny": [...], "tags": [...]}`` (each
  optional; ``null`` as absent); FieldError naming a bad or unknown entry."""
  if obj is None:
    return EVERYTHING
  if not isinstance(obj, Mapping):
    raise FieldError(where, f"expected an object with {', '.join(FIELDS)}, got "
                             f"{type(obj).__name__}")
  for key in obj:
    if key not in FIELDS:
      raise FieldError(f"{where}.{key}", f"unknown field; expected {', '.join(FIELDS)}")
  parts = {}
  for key in FIELDS:
    value = obj.get(key)
    if value is None:
      continue
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
      raise FieldError(f"{where}.{key}", "expected a list of strings")
    for i, v in enumerate(value):
      if not v.strip():
        raise FieldError(f"{where}.{key}[{i}]", "is empty; expected a tool id or tag")
    parts[key] = tuple(value)
  return ToolFilter(parts.get("allow"), parts.get("deny", ()), parts.get("tags"))


def read_id_file(path: str | pathlib.Path, flag: str) -> tuple[str, ...]:
  """The ids (or ``prefix*`` patterns) of an id-list file: one a line, surrounding spaces
  stripped, blank lines and lines starting with ``#`` skipped. UserError naming ``flag``."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise UserError(f"{flag} {path}: no such file")
  try:
    lines = path.read_text(encoding="utf-8").splitlines()
  except (OSError, UnicodeDecodeError) as e:
    raise UserError(f"{flag} {path}: cannot read it ({e})") from None
  return tuple(s for s in (line.strip() for line in lines) if s and not s.startswith("#"))


def tags_of(metadata: Mapping[str, Any] | None) -> frozenset[str]:
  """The tags a library gives a tool: its ``category`` (ToolBench's category, BFCL's test
  category, Seal-Tools' field), ``field`` (Seal-Tools), each ``domain`` (UltraTool) and
  ``server`` (an MCP server's name: ``mcp:FILE.json`` libraries, the file's stem)."""
  meta = metadata or {}
  out = set()
  for key in ("category", "field", "server"):
    value = meta.get(key)
    if isinstance(value, str) and value.strip():
      out.add(value.strip())
  domain = meta.get("domain")
  if isinstance(domain, list):
    # UltraTool's category is its domains joined by ", ": the domains are the tags.
    out.discard(str(meta.get("category", "")).strip())
    out.update(d.strip() for d in domain if isinstance(d, str) and d.strip())
  return frozenset(out)


class FilterIndex:
  """A library's ids and tags, indexed once, turning filters into masks.

  Args:
    tool_ids: the library's ids in row order.
    tags: per row, its tags (None: no tool has any).
  """

  def __init__(self, tool_ids: Sequence[str], tags: Sequence[Iterable[str]] | None = None):
    self.tool_ids = tuple(tool_ids)
    self.row = {t: i for i, t in enumerate(self.tool_ids)}
    order = sorted(range(len(self.tool_ids)), key=self.tool_ids.__getitem__)
    self._order = np.asarray(order, np.int64)
    self._sorted = [self.tool_ids[i] for i in order]
    self._tags: dict[str, list[int]] = {}
    for i, row_tags in enumerate(tags or ()):
      for tag in row_tags:
        self._tags.setdefault(tag, []).append(i)

  @property
  def num_tools(self) -> int:
    return len(self.tool_ids)

  @property
  def tag_names(self) -> tuple[str, ...]:
    return tuple(sorted(self._tags))

  def _ids(self, patterns: Sequence[str], field: str, strict: bool) -> np.ndarray:
    mask = np.zeros(self.num_tools, bool)
    for i, pattern in enumerate(patterns):
      if pattern.endswith("*"):
        prefix = pattern[:-1]
        lo = bisect.bisect_left(self._sorted, prefix)
        hi = bisect.bisect_left(self._sorted, prefix + "\U0010ffff")
        mask[self._order[lo:hi]] = True
      elif pattern in self.row:
        mask[self.row[pattern]] = True
      elif strict:
        raise FieldError(f"{field}[{i}]", f"tool {pattern!r} is not in the library "
                                           f"({self.num_tools} tools); a trailing * matches "
                                           f"a prefix")
    return mask

  def mask(self, f: ToolFilter, field: str = "tools", *, strict: bool = True,
           require: bool = True) -> np.ndarray | None:
    """bool[N]: the tools ``f`` allows; None when it restricts nothing. FieldError for an
    unknown id or tag (``strict``) and, with ``require``, for a filter that allows no tool."""
    if f.unrestricted:
      return None
    out = np.ones(self.num_tools, bool)
    if f.allow is not None:
      out &= self._ids(f.allow, f"{field}.allow", strict)
    if f.tags is not None:
      tagged = np.zeros(self.num_tools, bool)
      for i, tag in enumerate(f.tags):
        if tag in self._tags:
          tagged[self._tags[tag]] = True
        elif strict:
          known = ", ".join(self.tag_names[:20]) or "none"
          raise FieldError(f"{field}.tags[{i}]", f"no tool has the tag {tag!r} (tags: "
                                                  f"{known})")
      out &= tagged
    if f.deny:
      out &= ~self._ids(f.deny, f"{field}.deny", strict)
    if require and not out.any():
      raise FieldError(field, f"allows none of the library's {self.num_tools} tools")
    return out


def intersect(*masks: np.ndarray | None) -> np.ndarray | None:
  """The tools every mask allows (None masks restrict nothing; None when all are None)."""
  real = [m for m in masks if m is not None]
  if not real:
    return None
  out = real[0].copy()
  for m in real[1:]:
    out &= m
  return out
