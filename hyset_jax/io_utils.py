"""Small file helpers shared by the commands: refuse to clobber, write atomically."""
from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import tempfile
from collections.abc import Iterator

from hyset_jax.errors import UserError


def ensure_writable_dir(path: str | os.PathLike, what: str = "folder") -> pathlib.Path:
  """Create ``path`` (and parents) if needed; UserError unless it is a writable directory."""
  path = pathlib.Path(path)
  try:
    path.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise UserError(f"cannot create {what} {path}: {e.strerror}") from None
  if not os.access(path, os.W_OK):
    raise UserError(f"{what} {path} is not writable")
  return path


def check_writable(path: str | os.PathLike, force: bool) -> pathlib.Path:
  """Fail before any work if ``path`` exists (without ``force``) or its folder is unwritable."""
  path = pathlib.Path(path)
  if path.exists() and not force:
    raise UserError(f"{path} already exists; pass --force to overwrite it")
  ensure_writable_dir(path.parent if str(path.parent) else ".")
  return path


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8"):
  """Open a temporary file beside ``path``; rename it over ``path`` only on success.

  A crash or a full disk therefore never leaves a partial file under the final name.
  """
  path = pathlib.Path(path)
  fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
  try:
    with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except OSError as e:
    with contextlib.suppress(OSError):
      os.unlink(tmp)
    raise UserError(f"cannot write {path}: {e.strerror or e}") from None
  except BaseException:
    with contextlib.suppress(OSError):
      os.unlink(tmp)
    raise


def check_target(out: str | os.PathLike, force: bool) -> pathlib.Path:
  """Fail before any work if ``out`` exists and is not an empty directory (without ``force``)."""
  out = pathlib.Path(out)
  if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
    raise UserError(f"{out} exists and is not empty; pass --force to replace it")
  return out


@contextlib.contextmanager
def atomic_dir(out: str | os.PathLike, force: bool) -> Iterator[pathlib.Path]:
  """Yield a temporary directory beside ``out``; it replaces ``out`` only if the block succeeds."""
  out = check_target(out, force)
  try:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
  except OSError as e:
    raise UserError(f"cannot write {out}: {e.strerror or e}") from None
  try:
    yield tmp
    if out.exists():
      shutil.rmtree(out) if out.is_dir() else out.unlink()
    os.replace(tmp, out)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
