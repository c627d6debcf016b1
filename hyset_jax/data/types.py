"""The one in-memory representation every data set is read into.

Readers (``beir:``, ``toolbench:``, ``bfcl``) all return a :class:`Dataset`; everything
downstream (encoder, metrics, baselines, training, ToolScout) consumes only this.
"""
from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class ToolLibrary:
  """The tool library V. Row order is the tool index used everywhere else."""
  ids: tuple[str, ...]
  texts: tuple[str, ...]
  metadata: tuple[dict[str, Any], ...]

  def __len__(self) -> int:
    return len(self.ids)

  def index(self) -> dict[str, int]:
    """Tool id -> row."""
    return {t: i for i, t in enumerate(self.ids)}


@dataclasses.dataclass(frozen=True)
class Query:
  """One request with its annotated tool set E* (tool ids, sorted, distinct)."""
  id: str
  text: str
  gold: tuple[str, ...]
  source: str = ""


@dataclasses.dataclass(frozen=True)
class Dataset:
  """A tool library plus queries per split (e.g. ``train``, ``validation``, ``test``)."""
  name: str
  tools: ToolLibrary
  splits: dict[str, tuple[Query, ...]]
  notes: tuple[str, ...] = ()  # e.g. "skipped 3 categories without answers"

  def split(self, name: str) -> tuple[Query, ...]:
    from hyset_jax.errors import UserError
    if name not in self.splits:
      raise UserError(
          f"data set {self.name!r} has no split {name!r}; it has: {', '.join(sorted(self.splits))}")
    return self.splits[name]
