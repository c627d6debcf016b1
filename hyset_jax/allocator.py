"""Transparent huge pages for the process's large buffers, asked for before the process starts.

Why: XLA:CPU allocates a compiled program's temporaries afresh on every call — one block of
hundreds of MB for a training step at the paper's scale (13,860 tools, d = 768: ~350 MB at batch
32, ~2.1 GB at 256) — glibc maps a block that large with ``mmap`` and unmaps it on free, and
the kernel zero-fills every 4 KiB page of it again on first touch: ~88,800 / ~515,000 page
faults, ~86 ms / ~0.5 s of each step. With transparent huge pages the same memory is faulted
2 MiB at a time. Measured on the project's 2-core AMD EPYC (2026-12-05, the paper-scale step of
``benchmarks/peer_train.py``, median of 8 / 5 steps): 0.278 → 0.182 s a step at batch 32,
1.362 → 0.958 s at batch 256, the same peak RSS.

How: where the kernel serves huge pages to the mappings that ask
(``/sys/kernel/mm/transparent_hugepage/enabled`` is ``madvise``), glibc ≥ 2.35 asks for them
when the environment variable ``GLIBC_TUNABLES`` holds ``glibc.malloc.hugetlb=1`` — read once,
when the process starts. So the ``hyset`` command (and the benchmarks that time it) re-execute
themselves once with it added (:func:`reexec`), before JAX is imported. Nothing changes in any
result: only how the memory is paged.

Left alone: ``HYSET_HUGEPAGES=0`` in the environment; a ``GLIBC_TUNABLES`` that already names
``glibc.malloc.hugetlb`` (the user's own choice); THP ``always`` (large mappings get huge pages
already) or ``never`` or absent; a C library other than glibc ≥ 2.35. A program that imports
hyset_jax as a library can set the variable itself.
"""
from __future__ import annotations

import os
import pathlib
import platform
import sys
from collections.abc import Mapping

TUNABLE = "glibc.malloc.hugetlb"
VARIABLE = "GLIBC_TUNABLES"
OPT_OUT = "HYSET_HUGEPAGES"
# Set in the re-executed process: never a second re-execution, even where the C library drops
# GLIBC_TUNABLES from the environment (setuid programs).
ASKED = "HYSET_HUGEPAGES_ASKED"
THP_ENABLED = pathlib.Path("/sys/kernel/mm/transparent_hugepage/enabled")
MIN_GLIBC = (2, 35)  # the first glibc with the tunable


def thp_mode(path: pathlib.Path = THP_ENABLED) -> str | None:
  """The kernel's transparent-huge-page mode (``always``, ``madvise``, ``never``): the bracketed
  word of ``path``; None where it cannot be read (not Linux, no THP)."""
  try:
    text = path.read_text()
  except OSError:
    return None
  start, end = text.find("["), text.find("]")
  return text[start + 1:end] if 0 <= start < end else None


def _glibc() -> tuple[int, ...] | None:
  name, version = platform.libc_ver()
  if name != "glibc" or not version:
    return None
  try:
    return tuple(int(p) for p in version.split(".")[:2])
  except ValueError:
    return None


def environment(environ: Mapping[str, str], mode: str | None,
                glibc: tuple[int, ...] | None) -> dict[str, str] | None:
  """The environment to re-execute with (``environ`` with the tunable added to
  ``GLIBC_TUNABLES``), or None when it should be left as it is (the module docstring's cases).
  Pure: ``mode`` is :func:`thp_mode`'s answer, ``glibc`` the C library's (major, minor)."""
  if environ.get(OPT_OUT, "1") == "0" or ASKED in environ or mode != "madvise":
    return None
  if glibc is None or glibc < MIN_GLIBC:
    return None
  tunables = environ.get(VARIABLE, "")
  if any(t.split("=", 1)[0] == TUNABLE for t in tunables.split(":") if t):
    return None
  return {**environ, VARIABLE: ":".join(t for t in (tunables, f"{TUNABLE}=1") if t), ASKED: "1"}


def reexec() -> None:
  """Re-execute this program (``sys.orig_argv``: the interpreter's options, ``-m MODULE`` or
  the script, the arguments) with huge pages asked for, when :func:`environment` says so;
  otherwise return. Call it first thing in a program's entry point, never in a library call."""
  env = environment(os.environ, thp_mode(), _glibc())
  if env is None or not sys.executable:    # an embedded interpreter has no program to re-run
    return
  sys.stdout.flush()
  sys.stderr.flush()
  try:
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
  except OSError:   # not re-executable here: go on as started, with glibc's default paging
    return


def describe(environ: Mapping[str, str] | None = None) -> str:
  """How this process pages its memory, for a result's provenance."""
  environ = os.environ if environ is None else environ
  tunables = environ.get(VARIABLE, "")
  asked = any(t == f"{TUNABLE}=1" for t in tunables.split(":"))
  mode = thp_mode()
  return (f"transparent huge pages {'asked for' if asked else 'not asked for'} "
          f"({VARIABLE}={tunables or 'unset'}; kernel THP mode {mode or 'unknown'})")
