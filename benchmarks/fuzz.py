"""The long fuzzing run: the targets of tests/test_fuzz.py, for N minutes instead of a bound.

  python -m benchmarks.fuzz --minutes 3 [--json benchmarks/results/fuzz.json] [--targets a,b]

Each target gets an equal share of the time and runs in rounds of Hypothesis examples (random,
not derandomized: every round draws new cases) until its share is spent. Printed and written as
JSON per target: cases tried, outcomes (``ok``, ``user_error``, ``http_422``, …) and failures
(the falsifying example and its error, shrunk by Hypothesis). A failure is a bug: a traceback
other than UserError, a 5xx, or a wrong answer.

Memory, per target: resident memory (RSS) when it starts, its largest and its last value, and
the cases that raised it most (``rss_jumps``: MiB and the case), so that growth can be traced to a
target and a case. Targets are independent: between two, the previous one's fixture is closed
and dropped, JAX's compiled programs and caches are cleared (one target's tiny models are no use
to the next) and the heap's free pages go back to the system (glibc ``malloc_trim``), so one
target's memory is not carried into the next one's numbers.
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import ctypes.util
import gc
import heapq
import logging
import pathlib
import platform
import sys
import time

from benchmarks import provenance

REPO = pathlib.Path(__file__).resolve().parents[1]


def _rss_mb() -> float:
  """This process's resident memory now (Linux /proc; 0 where there is none)."""
  try:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) / 1024
  except OSError:
    pass
  return 0.0


def _release_memory() -> None:
  """What a finished target leaves: its objects, JAX's compiled programs and caches (when JAX
  was loaded), and free heap pages the allocator keeps (glibc only)."""
  gc.collect()
  jax = sys.modules.get("jax")
  if jax is not None:
    jax.clear_caches()
  try:
    ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)
  except (OSError, AttributeError, TypeError):
    pass  # another C library: nothing to trim


JUMPS = 3  # the cases that raised a target's RSS most, kept in the report


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--minutes", type=float, required=True, help="total time, split over targets")
  p.add_argument("--json", help="also write the results here")
  p.add_argument("--targets", help="comma-separated subset (default: all)")
  p.add_argument("--round", type=int, default=200, help="examples per Hypothesis round")
  args = p.parse_args(argv)

  # The MCP SDK logs every request at INFO; the results are the counts printed below.
  logging.disable(logging.WARNING)
  sys.path.insert(0, str(REPO / "tests"))
  from hypothesis import HealthCheck, given, settings
  import test_fuzz

  names = args.targets.split(",") if args.targets else list(test_fuzz.TARGETS)
  share = args.minutes * 60 / len(names)
  report = {"minutes": args.minutes, "machine": f"{platform.machine()}, "
            f"{platform.python_implementation()} {platform.python_version()}",
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "targets": {}}
  for name in names:
    _release_memory()
    rss_before = _rss_mb()
    target = test_fuzz.TARGETS[name]
    fixture = target.fixture() if target.fixture else None
    check = fixture.check if fixture else target.check
    outcomes: collections.Counter = collections.Counter()
    failures: list[dict] = []
    start = time.monotonic()

    failing: list = []  # the last case that failed: after shrinking, the smallest one
    peak = [rss_before]
    jumps: list = []  # a heap of (MiB, n, case): the JUMPS largest RSS rises in one case

    def counted(case):
      before = _rss_mb()
      try:
        outcomes[check(case)] += 1
      except Exception:
        failing[:] = [repr(case)[:1000]]
        raise
      finally:
        after = _rss_mb()
        peak[0] = max(peak[0], after)
        if after - before > 1.0:  # below a MiB: the allocator's noise
          entry = (after - before, sum(outcomes.values()), repr(case)[:300])
          (heapq.heappush if len(jumps) < JUMPS else heapq.heappushpop)(jumps, entry)

    @settings(max_examples=args.round, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(target.strategy)
    def run(case):
      counted(case)

    try:
      while time.monotonic() - start < share:
        tried = sum(outcomes.values())
        try:
          run()
        except Exception as e:  # noqa: BLE001 - a failure found: record it, keep fuzzing
          failures.append({"error": f"{type(e).__name__}: {str(e)[:2000]}",
                           "case": failing[0] if failing else None})
        if sum(outcomes.values()) == tried:
          break  # Hypothesis ran out of distinct cases
    finally:
      if fixture:
        fixture.close()
    cases = sum(outcomes.values())
    after = _rss_mb()
    report["targets"][name] = {
        "cases": cases, "failures": len(failures), "outcomes": dict(outcomes),
        "seconds": round(time.monotonic() - start, 1), "failed": failures,
        "rss_mb_before": round(rss_before, 1), "rss_mb_max": round(peak[0], 1),
        "rss_mb_after": round(after, 1),
        "rss_jumps": [{"mb": round(mb, 1), "at_case": n, "case": case}
                      for mb, n, case in sorted(jumps, reverse=True)]}
    print(f"{name:12s} {cases:7d} cases  {len(failures)} failures  {dict(outcomes)}  "
          f"RSS {rss_before:.0f} -> {after:.0f} MB (max {peak[0]:.0f})", flush=True)
    fixture = check = target = None  # dropped before the next target clears the caches
  total = sum(t["cases"] for t in report["targets"].values())
  bad = sum(t["failures"] for t in report["targets"].values())
  report["total_cases"], report["total_failures"] = total, bad
  print(f"total        {total:7d} cases  {bad} failures")
  if args.json:
    pathlib.Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    provenance.write_json(args.json, report)
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
