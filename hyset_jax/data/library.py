"""Assembling a tool library from tool definitions repeated across queries.

ToolBench and BFCL ship each query with its own list of candidate tools, so the
same tool appears many times, and now and then the same id comes with a
different definition (an edited description, an extra parameter). The library
needs exactly one row per id, chosen the same way on every run.
"""
from __future__ import annotations

from typing import Any

from hyset_jax.data.types import ToolLibrary


class LibraryBuilder:
  """Deduplicates tools by id.

  Rows are in order of first appearance. When one id has several distinct
  texts, the most frequent text wins (it is the definition most queries were
  written against); ties go to the text seen first. Such ids are counted in
  :attr:`conflicts` so the reader can report them instead of hiding them.
  """

  def __init__(self) -> None:
    # id -> text -> [count, first-seen rank, metadata of that first sighting]
    self._defs: dict[str, dict[str, list[Any]]] = {}
    self._rank = 0

  def add(self, tool_id: str, text: str, metadata: dict[str, Any]) -> None:
    texts = self._defs.setdefault(tool_id, {})
    entry = texts.get(text)
    if entry is None:
      texts[text] = [1, self._rank, metadata]
      self._rank += 1
    else:
      entry[0] += 1

  def __contains__(self, tool_id: str) -> bool:
    return tool_id in self._defs

  def __len__(self) -> int:
    return len(self._defs)

  @property
  def conflicts(self) -> list[str]:
    """Ids that came with more than one distinct definition."""
    return [i for i, texts in self._defs.items() if len(texts) > 1]

  def build(self) -> ToolLibrary:
    ids, texts, metadata = [], [], []
    for tool_id, defs in self._defs.items():
      text, (_, _, meta) = min(defs.items(), key=lambda kv: (-kv[1][0], kv[1][1]))
      ids.append(tool_id)
      texts.append(text)
      metadata.append(meta)
    return ToolLibrary(tuple(ids), tuple(texts), tuple(metadata))

  def conflict_note(self, what: str) -> str | None:
    """A line for ``Dataset.notes`` if any id had differing definitions."""
    conflicts = self.conflicts
    if not conflicts:
      return None
    examples = ", ".join(repr(c) for c in conflicts[:3])
    return (f"{len(conflicts)} {what} names had differing definitions (e.g. {examples}); "
            f"kept the most frequent definition of each (ties: first seen)")

