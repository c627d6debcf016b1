"""Output paths for every command: check before any work, write atomically, respect the umask.

The rules (docs/contracts.md, "Outputs"), one place for all of them:

- an existing output is not replaced without ``--force``;
- ``--force`` never replaces something of another kind: a directory where a file is written, a
  file where a directory is written, or a non-empty directory that is not an earlier output of
  the same kind (it lacks the kind's marker file);
- an output is never one of the command's own inputs, never inside an input folder's existing
  files, and an output directory never contains an input;
- a missing, non-directory or unwritable parent folder is a clear error, not a traceback;
- files and folders get the permissions the umask gives (``tempfile`` alone would give
  0600/0700), and replacing an existing file or folder keeps its permissions.

:func:`output_file` and :func:`output_dir` are the checks; :func:`atomic_write` and
:func:`atomic_dir` the writers (they repeat the checks, so library callers get them too).
"""
from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import stat
import tempfile
import uuid
from collections.abc import Iterable, Iterator

from hyset_jax.errors import UserError

PathLike = str | os.PathLike


def umask() -> int:
  """The process umask (read by setting and restoring it; there is no getter)."""
  mask = os.umask(0o022)
  os.umask(mask)
  return mask


def _mode(path: pathlib.Path, is_dir: bool) -> int:
  """Permissions for a new file or folder at ``path``: an existing one's, else the umask's."""
  try:
    return stat.S_IMODE(path.stat().st_mode)
  except OSError:
    return (0o777 if is_dir else 0o666) & ~umask()


def ensure_writable_dir(path: PathLike, what: str = "folder") -> pathlib.Path:
  """Create ``path`` (and parents) if needed; UserError unless it is a writable directory."""
  path = pathlib.Path(path)
  try:
    path.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise UserError(f"cannot create {what} {path}: {e.strerror}") from None
  if not os.access(path, os.W_OK):
    raise UserError(f"{what} {path} is not writable")
  return path


def _check_parent(path: pathlib.Path, flag: str) -> None:
  parent = path.parent
  if parent.is_dir():
    if not os.access(parent, os.W_OK | os.X_OK):
      raise UserError(f"{flag} {path}: folder {parent} is not writable")
    return
  # Walk up to the first ancestor that exists, to name what is wrong with the path.
  ancestor = parent
  while not ancestor.exists() and ancestor != ancestor.parent:
    ancestor = ancestor.parent
  if ancestor.exists() and not ancestor.is_dir():
    raise UserError(f"{flag} {path}: {ancestor} is a file, not a folder")
  raise UserError(f"{flag} {path}: folder {parent} does not exist; create it first "
                  f"(mkdir -p {parent})")


def _same(a: pathlib.Path, b: pathlib.Path) -> bool:
  try:
    return os.path.samefile(a, b)
  except OSError:
    return a.resolve() == b.resolve()


def _check_inputs(path: pathlib.Path, inputs: Iterable[PathLike], flag: str,
                  is_dir: bool) -> None:
  """Refuse an output that is, holds, or overwrites part of one of ``inputs``."""
  target = path.resolve()
  for given in inputs:
    if given is None:
      continue
    source = pathlib.Path(given)
    if not source.exists():
      continue
    if _same(path, source):
      raise UserError(f"{flag} {path} is one of this command's inputs; refusing to overwrite "
                      f"it (also with --force); choose another {flag}")
    src = source.resolve()
    if is_dir and target in src.parents:
      raise UserError(f"{flag} {path} holds this command's input {source}; refusing to "
                      f"replace it (also with --force); choose another {flag}")
    if source.is_dir() and src in target.parents and path.exists():
      raise UserError(f"{flag} {path} is inside this command's input folder {source}; "
                      f"refusing to overwrite a file there (also with --force)")


def output_file(path: PathLike, force: bool, *, inputs: Iterable[PathLike] = (),
                flag: str = "--out") -> pathlib.Path:
  """Check an output file before any work; returns it as a Path.

  Raises:
    UserError: if ``path`` is a directory, is (or is an existing file inside) one of
      ``inputs``, exists without ``force``, or its folder is missing or unwritable.
  """
  path = pathlib.Path(path)
  if path.is_dir():
    raise UserError(f"{flag} {path} is a directory; {flag} takes a file name "
                    f"(e.g. {path / 'out.json'})")
  _check_inputs(path, inputs, flag, is_dir=False)
  if path.exists() and not force:
    raise UserError(f"{flag} {path} already exists; pass --force to overwrite it")
  _check_parent(path, flag)
  return path


def check_writable(path: PathLike, force: bool) -> pathlib.Path:
  """:func:`output_file` with the default flag name (kept for existing callers)."""
  return output_file(path, force)


def output_dir(out: PathLike, force: bool, *, marker: str | tuple[str, ...] | None = None,
               inputs: Iterable[PathLike] = (), flag: str = "--out",
               what: str = "output") -> pathlib.Path:
  """Check an output directory before any work; returns it as a Path.

  An existing empty directory is fine. A non-empty one needs ``force`` and, when ``marker`` (a
  file name or several) is given, must hold every marker file (an earlier output of the same
  kind): ``--force`` never replaces an unrelated folder.

  Raises:
    UserError: naming ``out`` and what is wrong with it.
  """
  out = pathlib.Path(out)
  if out.exists() and not out.is_dir():
    raise UserError(f"{flag} {out} is a file; {flag} takes a directory (also with --force)")
  _check_inputs(out, inputs, flag, is_dir=True)
  if out.is_dir() and any(out.iterdir()):
    if not force:
      raise UserError(f"{flag} {out} exists and is not empty; pass --force to replace it")
    markers = (marker,) if isinstance(marker, str) else tuple(marker or ())
    missing = [m for m in markers if not (out / m).exists()]
    if missing:
      raise UserError(f"{flag} {out} is not empty and is not a {what} (it has no "
                      f"{', '.join(missing)}); "
                      f"refusing to replace it (also with --force); choose a new or empty "
                      f"directory")
  _check_parent(out, flag)
  return out


def check_target(out: PathLike, force: bool) -> pathlib.Path:
  """:func:`output_dir` without a kind check (kept for existing callers)."""
  return output_dir(out, force)


def apply_umask(root: PathLike) -> None:
  """Give everything under ``root`` the umask's permissions (writers such as safetensors and
  tempfile create 0600/0700 files)."""
  file_mode, dir_mode = 0o666 & ~umask(), 0o777 & ~umask()
  for dirpath, dirnames, filenames in os.walk(root):
    for name in dirnames:
      os.chmod(os.path.join(dirpath, name), dir_mode)
    for name in filenames:
      p = os.path.join(dirpath, name)
      if not os.path.islink(p):
        os.chmod(p, file_mode)


@contextlib.contextmanager
def atomic_write(path: PathLike, mode: str = "w", encoding: str | None = "utf-8"):
  """Open a temporary file beside ``path``; rename it over ``path`` only on success.

  A crash or a full disk therefore never leaves a partial file under the final name. The file
  gets the permissions of the file it replaces, else those the umask gives.
  """
  path = pathlib.Path(path)
  if path.is_dir():
    raise UserError(f"cannot write {path}: it is a directory")
  _check_parent(path, "cannot write")
  permissions = _mode(path, is_dir=False)
  try:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
  except OSError as e:
    raise UserError(f"cannot write {path}: {e.strerror or e}") from None
  try:
    os.fchmod(fd, permissions)
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


def replace_dir(staged: PathLike, out: PathLike) -> None:
  """Move the finished directory ``staged`` to ``out``, replacing what is there.

  The old ``out`` is first renamed aside and deleted only after the new one is in place, so a
  failure (a read-only folder, say) leaves the old output whole. ``staged`` and ``out`` must be
  in the same folder. The new directory keeps the permissions of the one it replaces.
  """
  staged, out = pathlib.Path(staged), pathlib.Path(out)
  os.chmod(staged, _mode(out, is_dir=True))
  aside = None
  try:
    if out.exists():
      aside = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
      os.replace(out, aside)
    os.replace(staged, out)
  except OSError as e:
    if aside is not None and not out.exists():
      with contextlib.suppress(OSError):
        os.replace(aside, out)
    raise UserError(f"cannot write {out}: {e.strerror or e}") from None
  if aside is not None:
    shutil.rmtree(aside, ignore_errors=True) if aside.is_dir() else aside.unlink()


@contextlib.contextmanager
def atomic_dir(out: PathLike, force: bool, *, marker: str | tuple[str, ...] | None = None,
               what: str = "output") -> Iterator[pathlib.Path]:
  """Yield a temporary directory beside ``out``; it replaces ``out`` only if the block succeeds.

  ``out`` is checked with :func:`output_dir` (``marker``, ``what``) first.
  """
  out = output_dir(out, force, marker=marker, what=what)
  try:
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
  except OSError as e:
    raise UserError(f"cannot write {out}: {e.strerror or e}") from None
  try:
    yield tmp
    apply_umask(tmp)
    replace_dir(tmp, out)
  except OSError as e:
    shutil.rmtree(tmp, ignore_errors=True)
    raise UserError(f"cannot write {out}: {e.strerror or e}") from None
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
