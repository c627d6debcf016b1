"""How long the full benchmarks/paper_tables.py run takes on this machine, estimated from the
cells a (quick) run measured.

Per cell of the full plan (every data set, method and carried model, seeds 0-2, the presets'
step budgets):

- a HYSET cell: a measured cell of its data set (trained start to end in the measured run)
  with its steps replaced by the preset's step budget at the step rate its training logged
  (an upper bound: early stopping ends runs sooner); a data set without a measured HYSET cell
  takes its preset's documented training time (REFERENCE_TRAIN_S) plus the measured scoring;
- a baseline: its measured time on the same data set, else its mean measured time per training
  query on the data sets measured (or its ToolLens fit time in REFERENCE_FIT_S) × the data
  set's training queries (the untrained ones: the same seconds);
- a carried HYSET cell: the scoring time of a measured HYSET cell (its model is the source's);
- encoding ToolBench's library and queries the first time: the measured one-off
  (ENCODE_S_PER_TEXT; the other data sets' embeddings were already cached).
"""
from __future__ import annotations

import functools
import json
import pathlib

import numpy as np

from benchmarks import paper_cells as pc

# `hyset train` wall time of the presets, measured on this shared 2-core CPU with embeddings
# cached (configs/ultratool.py, configs/seal_tools.py docstrings, 2026-12-03).
REFERENCE_TRAIN_S = {"ultratool": 925.0, "seal_tools": 664.0}
# Fit seconds on ToolLens of the baselines --quick leaves out, measured by
# benchmarks/retrieval_quality.py on this machine (results/retrieval_toollens_baselines.json:
# MLP head; results/retrieval_toollens_setlevel_baselines.json: DeepSets, Set Transformer).
REFERENCE_FIT_S = {"mlp-head": 240.7, "deepsets": 58.1, "set-transformer": 377.1}
# Encoding ToolBench's 2,479 tools and 765 test queries the first time took 745 s here
# (frozen MiniLM, nice 19 on the shared machine, 2026-12-03); they are cached since, so a rerun
# here does not pay it, a fresh machine does (kept in the estimate as that one-off).
ENCODE_S_PER_TEXT = 745 / (2479 + 765)
UNENCODED = {"toolbench": 2479 + 765}


def _measured(plan: list[pc.Cell], out: pathlib.Path) -> dict[tuple[str, str], list[dict]]:
  """{(data set, method): [result.json of each finished cell]} of ``plan`` under ``out``."""
  got: dict[tuple[str, str], list[dict]] = {}
  for cell in plan:
    path = out / "cells" / cell.name / "result.json"
    if path.is_file():
      result = json.loads(path.read_text())
      if result.get("complete"):
        got.setdefault((cell.data, cell.method + (cell.source and "_carried" or "")),
                       []).append(result)
  return got


@functools.lru_cache(maxsize=None)
def _train_queries(data: str) -> int:
  dataset, _ = pc.load_splits(data, ())
  train, _ = pc._train_queries(data, dataset, ())
  return len(train)


def _step_s(workdir: str) -> float | None:
  """Seconds a training step took in a run: batch size over the median examples/s its
  metrics.jsonl logged (compilation and validation excluded)."""
  try:
    folder = pathlib.Path(workdir)
    batch = json.loads((folder / "config.json").read_text())["train"]["batch_size"]
    rates = [json.loads(line).get("examples_per_s")
             for line in (folder / "metrics.jsonl").read_text().splitlines()]
  except (OSError, ValueError, KeyError, TypeError):
    return None
  rates = [r for r in rates if isinstance(r, (int, float)) and r > 0]
  return batch / float(np.median(rates)) if rates else None


def _hyset_s(data: str, measured: dict, steps: int) -> float:
  """A full HYSET cell on ``data`` at ``steps`` training steps: the measured cell's time with
  its steps replaced by ``steps`` at the measured step rate (the rest — data, compilation,
  validation, scoring — kept as measured)."""
  fulls = []
  for k, rs in measured.items():
    for r in rs:
      t = r["training"]
      if k[0] != data or k[1] not in pc.HYSET_METHODS or not t.get("wall_s"):
        continue
      step = _step_s(t.get("workdir") or "")
      if step is not None and t.get("steps"):
        fulls.append(r["wall_s"] + step * (steps - t["steps"]))
  if fulls:
    return float(np.mean(fulls))
  return REFERENCE_TRAIN_S.get(data, 900.0) + _scoring_s(measured)


def _scoring_s(measured: dict) -> float:
  """Mean seconds of a HYSET cell besides its training (reading data, scoring the splits)."""
  scoring = [r["wall_s"] - r["training"]["wall_s"] for k, rs in measured.items()
             if k[1] in pc.HYSET_METHODS for r in rs if r["training"].get("wall_s")]
  return float(np.mean(scoring)) if scoring else 60.0


def _baseline_s(data: str, method: str, measured: dict) -> float | None:
  same = measured.get((data, method))
  if same:
    return float(np.mean([r["wall_s"] for r in same]))
  other = [(d, r["wall_s"]) for (d, m), rs in measured.items() if m == method for r in rs]
  if not other and method in REFERENCE_FIT_S:
    other = [("toollens", REFERENCE_FIT_S[method])]
  if not other:
    return None
  if method in pc.UNTRAINED:
    return float(np.mean([s for _, s in other]))
  return float(np.mean([s / _train_queries(d) for d, s in other]) * _train_queries(data))


def estimate(plan: list[pc.Cell], out: pathlib.Path, overrides: list[str]) -> dict:
  """The full run's estimated seconds, per data set, with the lines that explain it."""
  from hyset_jax import config as config_lib
  measured = _measured(plan, out)
  full = pc.build_plan([*pc.NATIVE, *pc.EVAL_ONLY], list(pc.METHODS), [0, 1, 2], True)
  per_data: dict[str, float] = {}
  missing: set[str] = set()
  for cell in full:
    if cell.source:
      s = _scoring_s(measured)
    elif cell.trains_hyset:
      steps = config_lib.resolve(pc.NATIVE[cell.data][0]).train.num_steps
      s = _hyset_s(cell.data, measured, steps)
    else:
      s = _baseline_s(cell.data, cell.method, measured)
      if s is None:
        missing.add(cell.method)
        continue
    per_data[cell.data] = per_data.get(cell.data, 0.0) + s
  for data, n in UNENCODED.items():
    per_data[data] = per_data.get(data, 0.0) + n * ENCODE_S_PER_TEXT
  total = sum(per_data.values())
  lines = [f"Estimated full run (`python -m benchmarks.paper_tables`: {len(full)} cells, "
           f"seeds 0-2, the presets' step budgets) on this machine: {total / 3600:.1f} h ("
           + ", ".join(f"{d} {s / 60:.0f} min" for d, s in per_data.items()) + "), from this "
           "run's per-cell times (benchmarks/paper_estimate.py says how)."]
  if missing:
    lines.append("Not in the estimate (no measured cell of that method): "
                 + ", ".join(sorted(missing)) + ".")
  return {"total_s": round(total, 1), "per_data_s": {k: round(v, 1) for k, v in
                                                      per_data.items()},
          "unestimated_methods": sorted(missing), "lines": lines}
