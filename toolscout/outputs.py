"""Checks on the output paths of the ``toolscout`` commands, made before any work.

The project's output rules:

- an existing output is not replaced without ``--force``;
- ``--force`` never replaces something of another kind — a file where a directory is
  written, a directory where a file is written, or a directory that is not the kind being
  written (a ``hyset`` model directory is never replaced by a router); each directory kind
  is recognised by the ``format`` field of its JSON manifest;
- an output is never one of the command's inputs, never an existing file inside an input
  folder, and an output directory (replaced as a whole) never holds an input;
- a missing, non-directory or unwritable parent folder is a clear error.

Every message starts with ``--out PATH``. The writers themselves are
:func:`hyset_jax.io_utils.atomic_write` and :func:`hyset_jax.io_utils.atomic_dir`.
"""
from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Callable, Iterable

from hyset_jax.errors import UserError


def format_of(manifest: pathlib.Path) -> str:
  """The ``format`` string of a JSON manifest; ``""`` when it is missing, unreadable or has none.

  >>> format_of(pathlib.Path("/no/such/manifest.json"))
  ''
  """
  try:
    found = json.loads(manifest.read_text(encoding="utf-8")).get("format")
  except (OSError, UnicodeDecodeError, ValueError, AttributeError):
    return ""
  return found if isinstance(found, str) else ""


def _check_parent(out: pathlib.Path) -> None:
  parent = out.parent
  if parent.is_dir():
    if not os.access(parent, os.W_OK | os.X_OK):
      raise UserError(f"--out {out}: folder {parent} is not writable")
    return
  ancestor = parent
  while not ancestor.exists() and ancestor != ancestor.parent:
    ancestor = ancestor.parent
  if ancestor.exists() and not ancestor.is_dir():
    raise UserError(f"--out {out}: {ancestor} is a file, not a folder")
  raise UserError(f"--out {out}: folder {parent} does not exist; create it first "
                  f"(mkdir -p {parent})")


def _check_inputs(out: pathlib.Path, inputs: Iterable[str | os.PathLike | None]) -> None:
  target = out.resolve()
  for given in inputs:
    if not given or not pathlib.Path(given).exists():
      continue
    source = pathlib.Path(given).resolve()
    if source == target:
      raise UserError(f"--out {out} is one of this command's inputs; refusing to overwrite it "
                      f"(also with --force): choose another --out")
    if target in source.parents:
      raise UserError(f"--out {out} holds this command's input {given}; refusing to replace it "
                      f"(also with --force): choose another --out")
    if source.is_dir() and source in target.parents and out.exists():
      raise UserError(f"--out {out} is inside this command's input folder {given}; refusing to "
                      f"overwrite a file there (also with --force)")


def check_dir(out: str | os.PathLike, force: bool, kind: str,
              is_kind: Callable[[pathlib.Path], bool],
              inputs: Iterable[str | os.PathLike | None] = ()) -> pathlib.Path:
  """``out`` as a path a ``kind`` directory may be written to, else a UserError.

  Args:
    out: the directory to write (replaced as a whole, :func:`hyset_jax.io_utils.atomic_dir`).
    force: the user passed ``--force``.
    kind: what is written, for messages (``"toolscout router"``).
    is_kind: whether an existing directory is of that kind (the only kind ``--force`` replaces).
    inputs: the command's input files and folders.
  """
  out = pathlib.Path(out)
  if out.exists() and not out.is_dir():
    raise UserError(f"--out {out} is a file; expected a {kind} directory (a file is never "
                    f"replaced by a directory, also with --force)")
  _check_inputs(out, inputs)
  if out.is_dir() and any(out.iterdir()):
    if not force:
      raise UserError(f"--out {out} exists and is not empty; pass --force to replace it")
    if not is_kind(out):
      raise UserError(f"--out {out} is a directory but not a {kind} directory; --force only "
                      f"replaces a {kind}, so nothing else is ever deleted: choose another --out")
  _check_parent(out)
  return out


def check_file(out: str | os.PathLike, force: bool,
               inputs: Iterable[str | os.PathLike | None] = ()) -> pathlib.Path:
  """``out`` as a path a file may be written to (never a directory, never an input)."""
  out = pathlib.Path(out)
  if out.is_dir():
    raise UserError(f"--out {out} is a directory; give a file such as routes.jsonl")
  _check_inputs(out, inputs)
  if out.exists() and not force:
    raise UserError(f"--out {out} already exists; pass --force to overwrite it")
  _check_parent(out)
  return out
