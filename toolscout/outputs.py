"""Checks on the output paths of the ``toolscout`` commands, made before any work.

The project's rules (:mod:`hyset_jax.io_utils`): an existing output is not replaced
without ``--force``, and ``--force`` never replaces something of another kind — a file
where a directory is written, or a directory that is not the kind being written (a
``hyset`` model directory is never replaced by a router). Each directory kind is
recognised by the ``format`` field of its JSON manifest.
"""
from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Callable

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
              is_kind: Callable[[pathlib.Path], bool]) -> pathlib.Path:
  """``out`` as a path a ``kind`` directory may be written to, else a UserError.

  Args:
    out: the directory to write (replaced as a whole, :func:`hyset_jax.io_utils.atomic_dir`).
    force: the user passed ``--force``.
    kind: what is written, for messages (``"toolscout router"``).
    is_kind: whether an existing directory is of that kind (the only kind ``--force`` replaces).

  Raises:
    UserError: ``out`` is a file; it is a non-empty directory and ``force`` is false; it is a
      non-empty directory of another kind; or its folder cannot be created or written.
  """
  out = pathlib.Path(out)
  if out.exists() and not out.is_dir():
    raise UserError(f"--out {out} is a file; expected a {kind} directory (a file is never "
                    f"replaced by a directory, even with --force)")
  io_utils.check_target(out, force)
  if out.is_dir() and any(out.iterdir()) and not is_kind(out):
    raise UserError(f"--out {out} is a directory but not a {kind} directory; --force only "
                    f"replaces a {kind}, so nothing else is ever deleted: choose another --out")
  io_utils.ensure_writable_dir(out.parent, "output folder")
  return out


def check_file(out: str | os.PathLike, force: bool) -> pathlib.Path:
  """``out`` as a path a file may be written to (never a directory), else a UserError."""
  out = pathlib.Path(out)
  if out.is_dir():
    raise UserError(f"--out {out} is a directory; give a file such as routes.jsonl")
  return io_utils.check_writable(out, force)
