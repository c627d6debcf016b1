"""Shared test setup: the path to ../shared/data (fake devices: see ../conftest.py)."""
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = (REPO / ".." / "shared" / "data").resolve()
sys.path.insert(0, str(pathlib.Path(__file__).parent))  # tests/reference_impl.py


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
  if not SHARED_DATA.is_dir():
    raise RuntimeError(f"the shared data folder {SHARED_DATA} is missing; tests read real data "
                       "from ../shared/data beside the repository")
  return SHARED_DATA
