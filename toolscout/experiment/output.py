"""The report directory: ``config.json``, ``report.json``, ``report.md`` and ``report.png``,
written through one staged directory (:func:`hyset_jax.io_utils.atomic_dir`), so a failed or
interrupted run leaves the previous report untouched."""
from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

import numpy as np

from hyset_jax import io_utils
from toolscout import outputs
from toolscout.config import ExperimentConfig
from toolscout.experiment.data import log
from toolscout.experiment.pipeline import FORMAT, run

REPORT = "report.json"


def jsonable(x: Any) -> Any:
  """``x`` with NumPy values as Python ones, keys as strings and NaN/inf as None (JSON null).

  >>> jsonable({1: np.float32(0.5), "a": [np.int64(2), float("nan")]})
  {'1': 0.5, 'a': [2, None]}
  """
  if isinstance(x, dict):
    return {str(k): jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [jsonable(v) for v in x]
  if isinstance(x, np.ndarray):
    return jsonable(x.tolist())
  if isinstance(x, (np.floating, float)):
    return None if not np.isfinite(x) else round(float(x), 6)
  if isinstance(x, np.integer):
    return int(x)
  if isinstance(x, np.bool_):
    return bool(x)
  return x


def is_report_dir(path: pathlib.Path) -> bool:
  """Whether ``path`` holds a report of any ``toolscout-report/*`` format."""
  return outputs.format_of(path / REPORT).startswith(FORMAT.split("/")[0] + "/")


def data_paths(config: ExperimentConfig) -> list[str]:
  """The data folders ``config`` reads (``beir:PATH``, ``bfcl:PATH``; the installed BFCL has none)."""
  return [spec.partition(":")[2] for spec in (config.toollens_spec, config.bfcl_spec)
          if ":" in spec]


def check_out(out: str | pathlib.Path, force: bool, config: ExperimentConfig) -> pathlib.Path:
  """Fail before any work unless ``out`` may be written (see :func:`toolscout.outputs.check_dir`):
  never over another kind of directory, never over the data it reads."""
  return outputs.check_dir(out, force, "toolscout report", is_report_dir, data_paths(config))


def run_and_write(config: ExperimentConfig, out: str | pathlib.Path,
                  force: bool = False) -> dict[str, Any]:
  """Runs the experiment and writes the report directory ``out``."""
  from toolscout import report as rep
  out = check_out(out, force, config)
  result = jsonable(run(config))
  with io_utils.atomic_dir(out, force) as tmp:
    with io_utils.atomic_write(tmp / "config.json") as f:
      json.dump(jsonable(dataclasses.asdict(config)), f, indent=2)
    with io_utils.atomic_write(tmp / REPORT) as f:
      json.dump(result, f, indent=2, ensure_ascii=False)
    with io_utils.atomic_write(tmp / "report.md") as f:
      f.write(rep.markdown(result))
    rep.figure(result, tmp / "report.png")
  log(f"wrote {out / REPORT}, report.md, report.png ({result['timing']['total_s']:.0f}s)")
  return result
