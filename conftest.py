"""Before jax is imported anywhere in the test run (tests/ and the doctests in the packages):
eight fake CPU devices, so data-parallel code paths run on any machine; and one persistent XLA
compilation cache for the whole run.

The cache is why the suite fits its time budget: many tests start real processes (the CLI,
launchers, killed-and-restarted trainings) that each compile the same small programs again, and
the two xdist workers compile many of the same ones. A cache hit loads the same executable the
compiler would have produced, so nothing a test checks changes. The folder is made fresh for each
run (the xdist workers and every subprocess inherit it through the environment) and removed at
the end, so no run depends on an earlier one.
"""
import os
import shutil
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Most of the suite's time is XLA compiling small programs, not running them: jax's
# "disable most optimizations" (XLA's backend optimisation level 0, fewer HLO passes) compiles
# them faster, and every subprocess inherits it. Measured 2026-12-04 on the 2-core CPU:
# tests/test_pallas.py + test_core.py 78 -> 54 s, test_train.py + test_set_prior.py 153 ->
# 114 s. What the tests compare is computed under the same setting on both sides; the speed
# benchmarks (benchmarks/) and every user run keep the optimised compiler.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")

_OWN_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _OWN_CACHE = tempfile.mkdtemp(prefix="hyset-test-xla-cache-")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_CACHE
  # Cache every program that takes over 0.1 s to compile (jax's default: 1 s), and set a size
  # limit: with one, jax locks the folder, so concurrent processes never read a half-written
  # entry. Not 0: eager op-by-op calls compile hundreds of tiny programs, and with a size limit
  # each write lists the whole folder (measured: tests/test_core.py 54 s at 0, 44 s at 0.1,
  # 47 s at 1, 64 / 7 entries at 0.1 / 1).
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
  os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(4 << 30))


def pytest_unconfigure(config):
  if _OWN_CACHE is not None:
    shutil.rmtree(_OWN_CACHE, ignore_errors=True)
