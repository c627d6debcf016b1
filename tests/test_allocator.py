"""hyset_jax.allocator: when the ``hyset`` command asks glibc for transparent huge pages, and
that the command line really re-executes itself with them."""
import json
import os
import subprocess
import sys

import pytest

from hyset_jax import allocator

GLIBC = (2, 36)


@pytest.mark.parametrize("environ, mode, glibc, want", [
    ({}, "madvise", GLIBC, "glibc.malloc.hugetlb=1"),
    ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "madvise", GLIBC,
     "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"),            # the user's kept, first
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, "madvise", GLIBC, None),  # their choice
    ({"HYSET_HUGEPAGES": "0"}, "madvise", GLIBC, None),              # opted out
    ({"HYSET_HUGEPAGES": "1"}, "madvise", GLIBC, "glibc.malloc.hugetlb=1"),
    ({}, "always", GLIBC, None),       # every large mapping gets huge pages already
    ({}, "never", GLIBC, None),
    ({}, None, GLIBC, None),           # no THP (not Linux, or no sysfs)
    ({}, "madvise", (2, 34), None),    # glibc before the tunable
    ({}, "madvise", None, None),       # another C library
    ({"HYSET_HUGEPAGES_ASKED": "1"}, "madvise", GLIBC, None),  # re-executed once already
])
def test_environment(environ, mode, glibc, want):
  env = allocator.environment({"PATH": "/bin", **environ}, mode, glibc)
  if want is None:
    assert env is None
  else:
    assert env["GLIBC_TUNABLES"] == want and env["PATH"] == "/bin"
    assert env["HYSET_HUGEPAGES_ASKED"] == "1"
    # Re-executed with it, the next start leaves the environment alone: no loop.
    assert allocator.environment(env, mode, glibc) is None


def test_thp_mode_reads_the_bracketed_word(tmp_path):
  f = tmp_path / "enabled"
  f.write_text("always [madvise] never\n")
  assert allocator.thp_mode(f) == "madvise"
  f.write_text("[always] madvise never\n")
  assert allocator.thp_mode(f) == "always"
  assert allocator.thp_mode(tmp_path / "missing") is None


@pytest.mark.parametrize("opt_out", [False, True])
def test_the_command_reexecutes_with_huge_pages(tmp_path, opt_out):
  """``hyset`` run as a program asks for huge pages where this machine serves them (what
  :func:`allocator.environment` says here), and not when opted out; the result's machine block
  says which. A library call (``cli.main([...])``) never re-executes: this test process is one."""
  env = {k: v for k, v in os.environ.items()
         if k not in ("GLIBC_TUNABLES", "HYSET_HUGEPAGES", "HYSET_HUGEPAGES_ASKED")}
  if opt_out:
    env["HYSET_HUGEPAGES"] = "0"
  out = tmp_path / "bench.json"
  done = subprocess.run(
      [sys.executable, "-m", "hyset_jax.cli", "bench", "enumerate", "--k-pool", "6",
       "--max-size", "2", "--batch", "4", "--repeats", "1", "--json", str(out)],
      env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  described = json.loads(out.read_text())["machine"]["allocator"]
  expected = allocator.environment(env, allocator.thp_mode(), allocator._glibc()) is not None
  assert described.startswith("transparent huge pages " + ("asked for" if expected
                                                            else "not asked for")), described
  assert ("glibc.malloc.hugetlb=1" in described) == expected


def test_reexec_goes_on_where_it_cannot(monkeypatch):
  """No program to re-run (embedded interpreter) or an exec that fails: hyset goes on as started
  instead of failing."""
  monkeypatch.setattr(allocator, "environment", lambda *a: {"GLIBC_TUNABLES": "x"})
  calls = []

  def fail(*a):
    calls.append(a)
    raise PermissionError("no exec here")
  monkeypatch.setattr(allocator.os, "execve", fail)
  assert allocator.reexec() is None and len(calls) == 1
  monkeypatch.setattr(allocator.sys, "executable", "")
  assert allocator.reexec() is None and len(calls) == 1     # not even tried
