"""Data specs (docs/contracts.md): the one string that names a data set everywhere.

=====================  ==============================================================
``beir:PATH``          BEIR folder (corpus.jsonl, queries.jsonl, qrels/<split>.tsv)
``toolbench:PATH``     ToolBench G1/G2/G3 instruction JSON (a file or a folder), or a
                       ToolBench release root (``data/`` with the six official test sets)
``bfcl`` / ``bfcl:PATH``  the data shipped in ``bfcl-eval`` (or a folder laid out like it)
``toolret:PATH``       ToolRet's local files (queries and tools as JSON lines)
``ultratool:PATH``     UltraTool as GNN4TaskPlan laid it out (data.json, split_ids.json,
                       tool_desc.json); splits train, test
``seal:PATH``          Seal-Tools (tool.jsonl plus dev / test_in_domain / test_out_domain.jsonl
                       as splits train, test, test_out; any of the three may be absent)
``mcp:FILE.json``      an MCP ``tools/list`` result (a tool library, no queries)
``openai:FILE.json``   OpenAI function tools (a tool library, no queries)
``tfds:DIR``           what ``hyset data prepare`` wrote (read back with tfds.data_source)
=====================  ==============================================================

:func:`load_dataset` reads any of them into a :class:`~hyset_jax.data.types.Dataset`
and applies the checks every consumer relies on (non-empty library, gold sets
no larger than the model's maximum set size).
"""
from __future__ import annotations

import dataclasses
import difflib
import os
from typing import Callable

from hyset_jax.data.types import Dataset
from hyset_jax.errors import UserError

_EXAMPLES = 3


@dataclasses.dataclass(frozen=True)
class DataSpec:
  """A parsed data spec: ``scheme`` plus an optional ``path``."""
  scheme: str
  path: str | None = None

  def __str__(self) -> str:
    return self.scheme if self.path is None else f"{self.scheme}:{self.path}"


def _load_beir(path: str | None) -> Dataset:
  from hyset_jax.data.beir import load_beir
  return load_beir(path)


def _load_toolbench(path: str | None) -> Dataset:
  from hyset_jax.data.toolbench import load_toolbench
  return load_toolbench(path)


def _load_bfcl(path: str | None) -> Dataset:
  from hyset_jax.data.bfcl import load_bfcl
  return load_bfcl(path)


def _load_toolret(path: str | None) -> Dataset:
  from hyset_jax.data.toolret import load_toolret
  return load_toolret(path)


def _load_ultratool(path: str | None) -> Dataset:
  from hyset_jax.data.ultratool import load_ultratool
  return load_ultratool(path)


def _load_seal(path: str | None) -> Dataset:
  from hyset_jax.data.seal import load_seal
  return load_seal(path)


def _load_mcp(path: str | None) -> Dataset:
  from hyset_jax.data.schemas import load_mcp
  return load_mcp(path)


def _load_openai(path: str | None) -> Dataset:
  from hyset_jax.data.schemas import load_openai
  return load_openai(path)


def _load_tfds(path: str | None) -> Dataset:
  from hyset_jax.data.tfds_builder import load_prepared
  return load_prepared(path)


# scheme -> (loader, whether PATH is required, usage)
SCHEMES: dict[str, tuple[Callable[[str | None], Dataset], bool, str]] = {
    "beir": (_load_beir, True, "beir:PATH"),
    "toolbench": (_load_toolbench, True, "toolbench:PATH"),
    "bfcl": (_load_bfcl, False, "bfcl[:PATH]"),
    "toolret": (_load_toolret, True, "toolret:PATH"),
    "ultratool": (_load_ultratool, True, "ultratool:PATH"),
    "seal": (_load_seal, True, "seal:PATH"),
    "mcp": (_load_mcp, True, "mcp:FILE.json"),
    "openai": (_load_openai, True, "openai:FILE.json"),
    "tfds": (_load_tfds, True, "tfds:DIR"),
}


def spec_forms() -> str:
  """Every scheme's form, for help and error texts."""
  return ", ".join(usage for _, _, usage in SCHEMES.values())


def parse_spec(spec: str) -> DataSpec:
  """Splits ``scheme:PATH`` and checks the scheme.

  >>> parse_spec("beir:../shared/data/toollens")
  DataSpec(scheme='beir', path='../shared/data/toollens')
  >>> parse_spec("bfcl")
  DataSpec(scheme='bfcl', path=None)
  """
  if not isinstance(spec, str) or not spec.strip():
    raise UserError(f"empty data spec; expected one of: {spec_forms()}")
  scheme, sep, path = spec.strip().partition(":")
  scheme = scheme.strip().lower()
  if scheme not in SCHEMES:
    close = difflib.get_close_matches(scheme, list(SCHEMES), n=1, cutoff=0.5)
    if close:
      hint = f"; did you mean {close[0]}:{path}?" if sep else f"; did you mean {close[0]}?"
    elif not sep and os.path.exists(spec):
      hint = f"; a path needs a scheme, e.g. beir:{spec} or toolbench:{spec}"
    else:
      hint = ""
    raise UserError(f"unknown data spec scheme {scheme!r} in {spec!r}; valid schemes: "
                    f"{spec_forms()}{hint}")
  _, needs_path, usage = SCHEMES[scheme]
  path = path.strip() if sep else ""
  if needs_path and not path:
    raise UserError(f"data spec {spec!r} names no path; expected {usage}")
  return DataSpec(scheme, path or None)


def input_paths(spec: str) -> tuple[str, ...]:
  """The files or folders ``spec`` reads (none for the packaged BFCL data): outputs must not
  overwrite them (:func:`hyset_jax.io_utils.output_file`).

  >>> input_paths("beir:data/toollens")
  ('data/toollens',)
  """
  parsed = parse_spec(spec)
  return () if parsed.path is None else (os.path.expanduser(parsed.path),)


# How a user raises the maximum set size, by default: training's config key.
SIZE_KNOB = "model.max_set_size (hyset train --set model.max_set_size=N)"


def load_dataset(spec: str, *, max_set_size: int | None = None,
                 size_knob: str = SIZE_KNOB) -> Dataset:
  """Reads the data set named by ``spec`` and checks it.

  Args:
    spec: a data spec (see the module docstring).
    max_set_size: if given, every gold set must have at most this many tools
      (the model cannot output a larger set; a silent truncation would inflate
      or deflate every metric).
    size_knob: what the error message tells the user to raise (the caller's flag or
      config key), e.g. ``"--max-size"``.

  Raises:
    UserError: for a bad spec, unreadable or malformed files, or failed checks.
  """
  parsed = parse_spec(spec)
  loader, _, _ = SCHEMES[parsed.scheme]
  dataset = loader(parsed.path)
  check_dataset(dataset, spec=str(parsed), max_set_size=max_set_size, size_knob=size_knob)
  return dataset


def check_dataset(dataset: Dataset, *, spec: str, max_set_size: int | None = None,
                  size_knob: str = SIZE_KNOB) -> None:
  """Checks shared by every reader (they already check their own files)."""
  if not len(dataset.tools):
    raise UserError(f"{spec}: the tool library is empty; expected at least one tool")
  if max_set_size is None:
    return
  if max_set_size < 1:
    raise UserError(f"max_set_size must be at least 1, got {max_set_size}")
  too_big = [(split, q) for split, queries in dataset.splits.items()
             for q in queries if len(q.gold) > max_set_size]
  if too_big:
    largest = max(len(q.gold) for _, q in too_big)
    examples = ", ".join(f"{q.id!r} ({split}, {len(q.gold)} tools)"
                         for split, q in too_big[:_EXAMPLES])
    raise UserError(
        f"{spec}: {len(too_big)} queries have gold sets larger than max_set_size="
        f"{max_set_size} (largest: {largest} tools), e.g. {examples}; raise {size_knob} "
        f"to at least {largest} or remove those queries")
