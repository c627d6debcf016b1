"""Shared test setup: eight fake CPU devices, and the path to ../shared/data."""
import os
import pathlib
import sys

# Before jax is imported anywhere: data-parallel code paths run on 8 fake CPU devices.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = (REPO / ".." / "shared" / "data").resolve()
sys.path.insert(0, str(pathlib.Path(__file__).parent))  # tests/reference_impl.py


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
  if not SHARED_DATA.is_dir():
    raise RuntimeError(f"the shared data folder {SHARED_DATA} is missing; tests read real data "
                       "from ../shared/data beside the repository")
  return SHARED_DATA
