"""Shared test setup: the path to ../shared/data (fake devices and the compilation cache: see
../conftest.py), and the ``heavy`` mark that runs a test early."""
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = (REPO / ".." / "shared" / "data").resolve()
sys.path.insert(0, str(pathlib.Path(__file__).parent))  # tests/reference_impl.py


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "heavy: a long test (real processes, a real training); it runs first so that "
      "the xdist workers share the long ones and neither is left with one at the end")


def pytest_collection_modifyitems(config, items):
  """Heavy tests first, in their collection order; everything else keeps its order. With
  ``make test``'s ``--dist worksteal`` the first worker starts on them and the other takes its
  share when its own queue runs out, so no long test is left to run alone at the end. Only
  tests without module-scoped fixtures are marked, so moving one never sets a module's fixture
  up a second time."""
  items.sort(key=lambda item: item.get_closest_marker("heavy") is None)


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
  if not SHARED_DATA.is_dir():
    raise RuntimeError(f"the shared data folder {SHARED_DATA} is missing; tests read real data "
                       "from ../shared/data beside the repository")
  return SHARED_DATA
