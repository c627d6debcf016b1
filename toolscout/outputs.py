"""Checks on the output paths of the ``toolscout`` commands, made before any work.

The project's output rules are :mod:`hyset_jax.io_utils`'s (:func:`~hyset_jax.io_utils.output_file`,
:func:`~hyset_jax.io_utils.output_dir`): no clobbering without ``--force``, never onto an input, a
missing or unwritable parent folder is a clear error. What toolscout adds is how it recognises
its own kinds of directory: by the ``format`` field of their JSON manifest, so ``--force``
never replaces a directory that is not the kind being written (a ``hyset`` model directory also
has a ``manifest.json``).
"""
from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Callable, Iterable

from hyset_jax import io_utils
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
  out = io_utils.output_dir(out, force, inputs=[i for i in inputs if i], what=kind)
  if out.is_dir() and any(out.iterdir()) and not is_kind(out):
    raise UserError(f"--out {out} is a directory but not a {kind} directory; --force only "
                    f"replaces a {kind}, so nothing else is ever deleted: choose another --out")
  return out


def check_file(out: str | os.PathLike, force: bool,
               inputs: Iterable[str | os.PathLike | None] = ()) -> pathlib.Path:
  """``out`` as a path a file may be written to (never a directory, never an input)."""
  return io_utils.output_file(out, force, inputs=[i for i in inputs if i])
