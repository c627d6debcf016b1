"""Where a result file came from: the one writer of the benchmarks' JSON results.

Every benchmark that writes a JSON result calls :func:`write_json`, which adds a
``"provenance"`` block — ``{"commit", "command", "date", "machine"}`` — so a number in the README
can be traced to the code and the command that made it (``python -m benchmarks.readme_tables``
builds the README's results tables from these files). ``commit`` is ``git rev-parse HEAD``, with
``+dirty`` when the working tree had uncommitted changes to tracked files; ``date`` is UTC.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


def _git(*args: str) -> str:
  try:
    done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30)
  except (OSError, subprocess.SubprocessError):
    return ""
  return done.stdout.strip() if done.returncode == 0 else ""


def commit() -> str:
  """HEAD's hash, ``+dirty`` when tracked files differ from it; ``unknown`` outside a checkout."""
  head = _git("rev-parse", "HEAD")
  if not head:
    return "unknown"
  return head + ("+dirty" if _git("status", "--porcelain", "--untracked-files=no") else "")


def machine() -> str:
  """The processor, its core count and the OS, in one line (ratios are only same-machine)."""
  cpu = platform.processor() or platform.machine()
  try:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        cpu = line.split(":", 1)[1].strip()
        break
  except OSError:
    pass
  return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.machine()}"


def command(argv: list[str] | None = None) -> str:
  """The command line as a user would type it: ``python -m MODULE ARGS`` when run as a module
  (every benchmark is), else the script and its arguments."""
  args = list(sys.argv[1:] if argv is None else argv)
  spec = getattr(sys.modules.get("__main__"), "__spec__", None)
  if spec is not None and spec.name:
    return " ".join(["python -m", spec.name.removesuffix(".__main__"), *args])
  return " ".join([pathlib.Path(sys.argv[0]).name if sys.argv else "python", *args])


def provenance(command_line: str | None = None) -> dict:
  """``{"commit", "command", "date", "machine", "allocator"}`` of the run writing a result now;
  ``command_line`` when the benchmark has its own (e.g. a path replaced by a placeholder)."""
  from hyset_jax import allocator
  return {"commit": commit(), "command": command_line or command(),
          "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
          "machine": machine(), "allocator": allocator.describe()}


def with_provenance(doc, command_line: str | None = None) -> dict:
  """``doc`` with a ``"provenance"`` block first; a list becomes ``{"provenance", "rows"}``."""
  body = {"rows": doc} if isinstance(doc, list) else {k: v for k, v in doc.items()
                                                      if k != "provenance"}
  return {"provenance": provenance(command_line), **body}


def write_json(path, doc, command_line: str | None = None, indent: int | None = 1):
  """Write ``doc`` (a dict or a list) to ``path`` as JSON, with its provenance; returns the
  path."""
  path = pathlib.Path(path)
  path.write_text(json.dumps(with_provenance(doc, command_line), indent=indent) + "\n",
                  encoding="utf-8")
  return path
