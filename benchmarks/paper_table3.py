"""Table 3 of the paper on our data: every generalisation setting × HYSET and the baselines
that apply there, per seed, as resumable cells; one table with the paper's figures beside ours.

  python -m benchmarks.paper_tables --table 3              # the full run (estimate printed)
  python -m benchmarks.paper_tables --table 3 --quick      # ToolLens only, seed 0, short training
  python -m benchmarks.paper_tables --table 3 --settings UT sets --seeds 0 1
  python -m benchmarks.paper_tables --table 3 [--quick] --estimate-only   # its duration only
  python -m benchmarks.paper_tables --table 3 --report-only    # the tables of what is finished

Duration: the report's last lines (and ``--estimate-only``) estimate the full run from the
cells measured under --out, REF_* below where none is. On 2026-12-05 (2-core AMD EPYC): 11.9 h,
within one night — 10.5 h from the full run's cells (9.9 h before UltraTool's UT and UC
settings joined it) plus Seal-Tools' UT and UC cells, 85 min measured; REF_* are that run's
measurements, and from them alone (an empty --out) the estimate is 12.5 h. In it: the
10⁵-tool row's three trainings over the padded library 61 minutes each (seed 0 measured, after
the training speed-ups of that day: docs/speed.md) and the encoding of its 90,000 new tool
texts 84 min; --quick 0.7 h, over its ~20-minute aim (nine trainings of ~2 min fixed cost
each).

Settings (each split is made by the setting's own builder, from the seed):

- ``UT``: held-out tools (generalisation_splits ``--kind tools``): HYSET trained without them,
  carried onto the whole library;
- ``UC-0``, ``UC-1``, ``UC-5``, ``UC-10``, ``UC-full``: held-out categories (benchmarks/kshot.py
  builds the split and one data set per setting): 0-shot is the base model; k-shot continues θ
  from it on the base's queries plus k per category over the base's library plus the tools the
  shots name (kshot's recipe: ``--adapt-steps`` at the preset's rate, the last step kept,
  ``train.keep=last``; ``--adapt-set`` adds overrides to it, e.g. another rate);
  full supervision trains from the start with every adapt query;
- ``sets``, ``pairs``: unseen gold sets (unseen_split.py) and unseen tool pairs
  (generalisation_splits ``--kind pairs``): every tool seen, the combination new;
- ``CD``, ``CD+target``: benchmarks/cross_domain.py's pairs SOURCE:TARGET: the SOURCE model
  scored on TARGET's test split zero-shot, and after ``--adapt-steps`` steps on
  ``--target-queries`` TARGET training queries; the in-domain row is TARGET's own model;
- ``dist-base``, ``dist-1000``, ``dist-10000``, ``dist-100000``: the data set's model scored on
  its test split with the library padded by benchmarks/distractors.py (real tools of other data
  sets, then generated ones) to that size; ``dist-base`` is the library as it is. Beside it the
  ``hyset-padded`` row: the same preset trained on the same queries with the padded library in
  place (the distractors among its negatives) — the library grown before training, not after.

HYSET is each data set's preset (``--set`` overrides apply to every training). A cell is
(setting, data set, method, seed) and writes ``<out>/cells/<setting>/<data>/<method>[/s<seed>]/``
``pred.test.jsonl`` then ``result.json`` (benchmarks/paper_cells.py's rules: a finished cell is
skipped on a rerun, a partial or stale one redone). Trainings live in ``<out>/train`` and are
shared by the cells that read the same model (the data set's model: CD, in-domain, distractors).
The table: R@5 and COMP@5 (mean ± std over seeds; in the split settings the split changes with
the seed too), the ratio the paper states (recovers / retains X%, +Y% over the best baseline,
Δ under distractors), HYSET against the best baseline on the seed-0 predictions (paired
bootstrap, exact McNemar: benchmarks/paper_report.py), the paper's figure (its text gives only
the ratios quoted; "—" where it gives none), and each setting's wall time; a UC setting's
share of full supervision also over every seed's test queries pooled (the mean over seeds
weighs a small split like a large one). For the UC settings a second table splits COMP@5
(every seed pooled) between the test queries whose every gold tool some training query names
and the rest, and between those whose gold set some training query has and the rest, each with
the share of full supervision that a model answering the first group as UC-full does and the
rest as the best row does would recover. Written to
``--results``/``<tag>.{md,json,png}``; the full run's duration is estimated from the cells.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import pathlib
import sys
import time
from typing import Any, NamedTuple

import numpy as np

from benchmarks import paper_cells as pc

UC_SHOTS = (1, 5, 10)
DIST_SIZES = (1_000, 10_000, 100_000)
SPLIT_SETTINGS = ("UT", "UC-0", *(f"UC-{k}" for k in UC_SHOTS), "UC-full", "sets", "pairs")
CD_SETTINGS = ("CD", "CD+target")
# The settings whose HYSET model is adapted from another (--adapt-steps, --adapt-set).
ADAPT_SETTINGS = (*(f"UC-{k}" for k in UC_SHOTS), "CD+target")
DIST_SETTINGS = ("dist-base", *(f"dist-{n}" for n in DIST_SIZES))
SETTINGS = (*SPLIT_SETTINGS, *CD_SETTINGS, *DIST_SETTINGS)
# The in-library settings run on the ToolBench-like library (the paper's Table 3 is on
# ToolBench); CD on cross_domain.py's pairs.
FULL_DATASETS = ("toollens",)
# Beside them, by default, every split setting of UltraTool too: the new-combination target asks
# for every data set whose split holds ≥ 100 test queries, and UltraTool's test sets, like
# ToolLens', occur in training; its held-out tools and categories (its `domain`) are the paper's
# UT and UC there. Seal-Tools' held-out tools and categories (its `field`) as well, but not its
# unseen sets and pairs: its official test sets are new combinations already (BFCL's too).
NEW_COMBINATION_SETTINGS = ("sets", "pairs")
FULL_EXTRA_DATASETS = {setting: ("ultratool",) + (() if setting in NEW_COMBINATION_SETTINGS
                                                  else ("seal_tools",))
                       for setting in SPLIT_SETTINGS}
FULL_PAIRS = ("toollens:toolbench", "ultratool:seal_tools", "seal_tools:ultratool",
              "bfcl:seal_tools")
# Baselines that apply per setting. A set classifier or a set-level scorer over a library
# whose tools (UT, UC) or whose domain (CD) training never saw cannot name them; a per-tool
# head can still rank them by its shared query tower (kshot.py's baseline).
HELD_OUT_BASELINES = ("bm25", "dense", "fusion", "linear-head", "mlp-head")
COMBINATION_BASELINES = pc.BASELINES
CD_BASELINES = pc.UNTRAINED
DIST_BASELINES = ("bm25", "dense")
QUICK_METHODS = ("hyset", "hyset-in-domain", "bm25", "dense", "fusion", "linear-head",
                 "set-classifier", "cardinality", "mmr", "facility-location")
METHODS = ("hyset", "hyset-in-domain", "hyset-padded", *pc.BASELINES)
QUICK_STEPS, QUICK_ADAPT_STEPS, QUICK_PAIRS = 60, 20, ("toollens:toolbench",)
# --quick leaves out what repeats a setting kind: 1- and 10-shot (5-shot is the paper's figure)
# and the two larger distractor libraries (their encoding dominates).
QUICK_SKIP = ("UC-1", "UC-10", "dist-10000", "dist-100000")
ADAPT_STEPS, TARGET_QUERIES = 100, 50  # kshot.py's and cross_domain.py's defaults
# What the paper's text (§3.4, §3.5) states; no per-cell values are given there.
PAPER = {"UC-5": "5-shot UC recovers 93.2% of fully supervised",
         "CD": "CD retains 79.9% of in-domain set completeness",
         "sets": "+13.1% COMP@5 over the strongest baseline (unseen sets)",
         "pairs": "+15.9% COMP@5 over the strongest baseline (unseen pair required)",
         **{s: "R@5 and COMP@5 stable (no figure given)" for s in DIST_SETTINGS[1:]}}
PAPER_ULTRATOOL_CD = "from ToolBench, no target training: retains 77.9% of in-domain"
PAPER_ULTRATOOL_IN_DOMAIN = "+11.5% COMP@5 over ToolGen (HYSET trained on UltraTool)"


@dataclasses.dataclass(frozen=True)
class Cell:
  """One run: ``method`` in ``setting`` on ``data`` (a data set, or ``SOURCE:TARGET`` for CD)
  with ``seed`` (None: a method whose test and fit are the same on every seed)."""
  setting: str
  data: str
  method: str
  seed: int | None
  source = None  # paper_report reads rows of carried models by it: none here

  @property
  def name(self) -> str:
    return (f"{self.setting}/{self.data.replace(':', '-to-')}/{self.method}"
            + ("" if self.seed is None else f"/s{self.seed}"))


def baselines_of(setting: str) -> tuple[str, ...]:
  if setting in ("UT",) or setting.startswith("UC-"):
    return HELD_OUT_BASELINES
  if setting in ("sets", "pairs"):
    return COMBINATION_BASELINES
  return CD_BASELINES if setting in CD_SETTINGS else DIST_BASELINES


def _seeded(setting: str, method: str) -> bool:
  """The split settings draw a split per seed; elsewhere only what trains has a seed."""
  return setting in SPLIT_SETTINGS or method.startswith("hyset") or method in pc.TRAINED


def build_plan(settings: list[str], datasets: list[str], pairs: list[str], methods: list[str],
               seeds: list[int], extra: dict[str, tuple[str, ...]] | None = None) -> list[Cell]:
  """Every cell, in run order: per setting and data set HYSET's seeds, the in-domain reference
  (CD), then the baselines; seeds ascending (the first seed's predictions are the tested ones).
  ``extra``: setting -> data sets it also runs on (:data:`FULL_EXTRA_DATASETS`)."""
  cells = []
  for setting in settings:
    more = [d for d in (extra or {}).get(setting, ()) if d not in datasets]
    for data in (pairs if setting in CD_SETTINGS else [*datasets, *more]):
      own = ["hyset", *(["hyset-in-domain"] if setting in CD_SETTINGS else []),
             *(["hyset-padded"] if setting in DIST_SETTINGS[1:] else []),
             *baselines_of(setting)]
      for method in (m for m in own if m in methods):
        for seed in (seeds if _seeded(setting, method) else [None]):
          cells.append(Cell(setting, data, method, seed))
  return cells


def data_spec(name: str) -> tuple[str, str]:
  """(data spec, preset) of a data set, as benchmarks/cross_domain.py names them."""
  from benchmarks import cross_domain
  return cross_domain.DATASETS[name]


@dataclasses.dataclass(frozen=True)
class SettingData:
  """What a setting scores on (``tools``, ``test``) and the data spec whose train and validation
  splits its trained baselines fit on (read only when one runs)."""
  tools: Any
  test: tuple
  fit_spec: str = ""
  label: str = ""


def _builder(main, argv: list[str], folder: pathlib.Path) -> pathlib.Path:
  """Runs a split builder's ``main`` once (its split.json marks it done)."""
  from hyset_jax.errors import UserError
  if not (folder / "split.json").exists():
    folder.parent.mkdir(parents=True, exist_ok=True)
    if main([*argv, "--out", str(folder), "--force"]) != 0:
      raise UserError(f"building the split {folder} failed (the error is above)")
  return folder


@functools.lru_cache(maxsize=8)
def _load(spec: str):
  from hyset_jax.data.specs import load_dataset
  return load_dataset(spec)


@functools.lru_cache(maxsize=4)
def fit_data(spec: str) -> tuple[tuple, tuple]:
  """(train, validation) queries of ``spec`` (validation carved from train when it has none)."""
  from hyset_jax.data.splits import with_validation
  d = with_validation(_load(spec))
  return tuple(d.split("train")), tuple(d.split("validation"))


@functools.lru_cache(maxsize=None)
def uc_settings(out: pathlib.Path, data: str, seed: int) -> dict[str, dict]:
  """kshot.py's split and per-setting data sets (base, k-shot, full) for ``data`` and ``seed``."""
  from benchmarks import generalisation_splits as gs, kshot
  ns = argparse.Namespace(data=data_spec(data)[0], seed=seed, categories=gs.DEFAULT_CATEGORIES,
                          shots=list(UC_SHOTS), shot_share=0.1)
  work = out / "splits" / "UC" / data / f"s{seed}"
  work.mkdir(parents=True, exist_ok=True)
  return kshot._settings(ns, work)


def _uc_name(setting: str) -> str:
  k = setting.split("-", 1)[1]
  return {"0": "base", "full": "full"}.get(k, f"{k}-shot")


def split_folder(out: pathlib.Path, setting: str, data: str, seed: int) -> pathlib.Path:
  """The UT, sets or pairs split of ``data`` for ``seed``, built by its own script."""
  from benchmarks import generalisation_splits as gs, unseen_split
  folder = out / "splits" / setting / data / f"s{seed}"
  base = ["--data", data_spec(data)[0], "--seed", str(seed)]
  if setting == "sets":
    return _builder(unseen_split.main, base, folder)
  kind = {"UT": "tools", "pairs": "pairs"}[setting]
  return _builder(gs.main, ["--kind", kind, *base], folder)


@functools.lru_cache(maxsize=None)
def distractor_texts(data: str, size: int) -> tuple[str, ...]:
  """benchmarks/distractors.py's padding of ``data``'s library up to ``size`` (seed 0: the same
  library for every seed, so the seedless baselines compare with each seed's model)."""
  from benchmarks import distractors
  base = _load(data_spec(data)[0]).tools
  real = distractors.real_distractors(base, distractors.SOURCES, 0)
  made = distractors.generated(real, max(0, size - len(base) - len(real)), 0,
                               set(real) | set(base.texts))
  return tuple(real + made)


@functools.lru_cache(maxsize=None)
def prepare(out: pathlib.Path, setting: str, data: str, seed: int, max_queries: int
            ) -> SettingData:
  """The setting's library, test queries (the first ``max_queries``; 0 = all) and fit data."""
  cut = lambda qs: tuple(qs)[:max_queries or None]
  if setting in ("UT", "sets", "pairs"):
    folder = split_folder(out, setting, data, seed)
    spec = f"beir:{folder}" + ("/train" if setting == "UT" else "")
    test = _load(f"beir:{folder}" + ("/test" if setting == "UT" else ""))
    return SettingData(test.tools, cut(test.split("test")), spec, str(folder))
  if setting.startswith("UC-"):
    s = uc_settings(out, data, seed)[_uc_name(setting)]
    # Every UC setting has the split's test queries over the whole library (kshot.py): read
    # them once from the split's own test folder.
    test = _load(f"beir:{out / 'splits' / 'UC' / data / f's{seed}' / 'split' / 'test'}")
    return SettingData(test.tools, cut(test.split("test")), s["spec"] if setting == "UC-0"
                       else s["eval"], s["eval"])
  if setting in CD_SETTINGS:
    target = data.split(":")[1]
    test = _load(data_spec(target)[0])
    return SettingData(test.tools, cut(test.split("test")), label=target)
  from benchmarks import distractors
  own = _load(data_spec(data)[0])
  tools = own.tools
  if setting != "dist-base":
    size = int(setting.split("-")[1])
    tools = distractors.padded(tools, list(distractor_texts(data, size)), size)
  return SettingData(tools, cut(own.split("test")), label=f"{data} + distractors ({len(tools)})")


# --- HYSET's models --------------------------------------------------------------------------

def _runs(out: pathlib.Path, overrides: list[str]) -> pathlib.Path:
  # One folder per --set list: a workdir refuses a config other than the one it was made with.
  digest = hashlib.sha256(json.dumps(list(overrides)).encode()).hexdigest()[:10]
  return out / "train" / ("preset" if not overrides else f"set-{digest}")


def adaptation(args: Any, last: bool, init: pathlib.Path | None = None) -> list[str]:
  """An adaptation's overrides: kshot.py's (``last``: a k-shot one, its last step kept), from θ
  of ``init`` (None: the recipe less its start), followed by --adapt-set."""
  from benchmarks import kshot
  own = (kshot.adapt_overrides(init, args.adapt_steps, last) if init is not None
         else kshot.adapt_recipe(args.adapt_steps, last))
  return [*own, *args.adapt_sets]


def train(out: pathlib.Path, args: Any, preset: str, spec: str, seed: int, tag: str,
          init: pathlib.Path | None = None, last: bool = False) -> tuple[pathlib.Path, dict]:
  """A HYSET training of ``preset`` on ``spec`` (an adaptation from ``init``, its last step kept
  when ``last``), resumed or reused when its workdir exists; returns the workdir and what the
  cell records about it."""
  from benchmarks import retrieval_quality
  # An adaptation's folder is named by its recipe too: a workdir refuses another config, and
  # the models it starts from stay where they are.
  folder = _runs(out, [*args.overrides, *(adaptation(args, last) if init else [])])
  summary = retrieval_quality.run_hyset(preset, "hyset", [*args.overrides, f"data.spec={spec}",
                                                          *(adaptation(args, last, init) if init
                                                            else [])], seed, folder, tag)
  record = {"tag": tag, "preset": preset, "kind": "adapt" if init else "full",
            "steps": summary.get("steps"), "wall_s": summary.get("wall_s"),
            "workdir": summary["workdir"]}
  return pathlib.Path(summary["workdir"]), record


def native(out: pathlib.Path, args: Any, data: str, seed: int, size: int = 0
           ) -> tuple[pathlib.Path, dict]:
  """``data``'s own model: its preset on its training queries that fit the preset's M (as
  cross_domain.py trains its source and in-domain models). ``size``: over the library padded to
  that many tools as the distractor setting scores it, the distractors in the library while θ
  is trained (uniform and hard negatives, the shortlist, validation) — the library grown before
  training rather than after it."""
  from benchmarks import cross_domain, distractors, kshot
  from hyset_jax import config as config_lib
  spec, preset = data_spec(data)
  m = config_lib.resolve(preset, list(args.overrides)).model.max_set_size
  work = out / "cd_data"
  work.mkdir(parents=True, exist_ok=True)
  fitting = cross_domain._fitting(data, m, work)
  if not size:
    return train(out, args, preset, fitting, seed, f"native-{data}")
  library = distractors.padded(_load(spec).tools, list(distractor_texts(data, size)), size)
  padded = kshot._write_setting(work / f"data_{data}_m{m}_padded{size}", library,
                                *fit_data(fitting), ())
  return train(out, args, preset, padded, seed, f"padded-{data}-{size}")


def hyset_model(cell: Cell, out: pathlib.Path, args: Any) -> tuple[pathlib.Path, list[dict]]:
  """The model directory a HYSET cell scores, trained first where needed, and the trainings
  this cell ran or reused."""
  from benchmarks import cross_domain
  seed, data = cell.seed or 0, cell.data
  if cell.setting in ("UT", "sets", "pairs"):
    folder = split_folder(out, cell.setting, data, seed)
    spec = f"beir:{folder}/train" if cell.setting == "UT" else f"beir:{folder}"
    wd, rec = train(out, args, data_spec(data)[1], spec, seed, f"{cell.setting}-{data}")
    return wd / "best", [rec]
  if cell.setting.startswith("UC-"):
    s, preset = uc_settings(out, data, seed), data_spec(data)[1]
    base, rec = train(out, args, preset, s["base"]["spec"], seed, f"UC-{data}-base")
    name = _uc_name(cell.setting)
    if name == "base":
      return base / "best", [rec]
    if name == "full":
      wd, full = train(out, args, preset, s["full"]["spec"], seed, f"UC-{data}-full")
      return wd / "best", [full]
    # Validation holds no held-out-category query: the last step is kept, with the post-θ fits
    # chosen on it (kshot.py).
    wd, adapted = train(out, args, preset, s[name]["spec"], seed, f"UC-{data}-{name}",
                        init=base / "best", last=True)
    return wd / "best", [rec, adapted]
  if cell.setting in CD_SETTINGS:
    source, target = data.split(":")
    if cell.method == "hyset-in-domain":
      wd, rec = native(out, args, target, seed)
      return wd / "best", [rec]
    wd, rec = native(out, args, source, seed)
    if cell.setting == "CD":
      return wd / "best", [rec]
    config = json.loads((wd / "config.json").read_text())
    work = out / "cd_data"
    spec = cross_domain._fitting(target, config["model"]["max_set_size"], work,
                                 args.target_queries)
    wd2, adapted = train(out, args, data_spec(source)[1], spec, seed,
                         f"CD-{source}-{target}-adapted", init=wd / "best")
    return wd2 / "best", [rec, adapted]
  size = int(cell.setting.split("-")[1]) if cell.method == "hyset-padded" else 0
  wd, rec = native(out, args, data, seed, size)
  return wd / "best", [rec]


def build_retriever(cell: Cell, sd: SettingData, out: pathlib.Path, args: Any
                    ) -> tuple[Any, list[dict]]:
  """The retriever a cell scores (HYSET trained, or a baseline fit, first) and its trainings."""
  from hyset_jax.commands.eval import build_retriever as eval_retriever
  from hyset_jax.retrievers.trained import fit_baseline
  if cell.method.startswith("hyset"):
    model, trainings = hyset_model(cell, out, args)
    return eval_retriever("hyset", sd.tools, model=str(model), data=sd.label), trainings
  if cell.method in pc.TRAINED:
    rule = "threshold" if cell.method in pc.HEADS else "top5"
    train, validation = fit_data(sd.fit_spec)
    return fit_baseline(cell.method, sd.tools, pc._encoder(), train, seed=cell.seed or 0,
                        validation=validation, set_rule=rule), []
  return eval_retriever(cell.method, sd.tools), []


# --- cells -----------------------------------------------------------------------------------

def cell_spec(cell: Cell, args: Any) -> dict:
  """What a finished cell must have been made with (a --quick result is not a full one's)."""
  spec = {"setting": cell.setting, "data": cell.data, "method": cell.method, "seed": cell.seed,
          "overrides": list(args.overrides), "adapt_steps": args.adapt_steps,
          "target_queries": args.target_queries, "max_queries": args.max_queries}
  if cell.method == "hyset" and cell.setting in ADAPT_SETTINGS:
    # The adapted model's recipe (but its start), so that a changed one makes the cell stale
    # and the others stay finished.
    spec["adaptation"] = adaptation(args, last=cell.setting.startswith("UC-"))
  return spec


def finished(out: pathlib.Path, cell: Cell, args: Any) -> bool:
  return pc.finished(out, cell, cell_spec(cell, args), splits=("test",))


def run_cell(cell: Cell, out: pathlib.Path, args: Any) -> dict:
  """Runs one cell from the start: its predictions, then its result.json."""
  from hyset_jax import io_utils
  from hyset_jax.evaluation.metrics import RANK_ONLY_SET_SIZE, evaluate
  folder = io_utils.ensure_writable_dir(out / "cells" / cell.name, "cell folder")
  (folder / "result.json").unlink(missing_ok=True)  # a partial cell is redone whole
  t0 = time.time()
  sd = prepare(out, cell.setting, cell.data, cell.seed or 0, args.max_queries)
  retriever, trainings = build_retriever(cell, sd, out, args)
  got = retriever.retrieve([q.text for q in sd.test], depth=pc.DEPTH)
  sets = got.sets or [r[:RANK_ONLY_SET_SIZE] for r in got.rankings]
  with io_utils.atomic_write(folder / "pred.test.jsonl") as f:
    for q, ranking, chosen in zip(sd.test, got.rankings, sets):
      f.write(json.dumps({"query_id": q.id, "ranking": list(ranking), "set": list(chosen)})
              + "\n")
  result = {"spec": cell_spec(cell, args), "trainings": trainings, "tools": len(sd.tools),
            "splits": {"test": evaluate(got.rankings, [q.gold for q in sd.test], sets)},
            "wall_s": round(time.time() - t0, 1), "complete": True}
  with io_utils.atomic_write(folder / "result.json") as f:
    f.write(json.dumps(result, indent=1) + "\n")
  return result


def run_plan(plan: list[Cell], out: pathlib.Path, args: Any, log=print) -> dict[str, float]:
  """Every unfinished cell in order, one progress line each (paper_tables.run_cells); {cell:
  seconds} of those run."""
  from benchmarks.paper_tables import run_cells
  log(f"cells under {out}")
  return run_cells(plan, lambda c: finished(out, c, args), lambda c: run_cell(c, out, args), log)


# --- the table -------------------------------------------------------------------------------

def _result(out: pathlib.Path, cell: Cell) -> dict:
  return json.loads((out / "cells" / cell.name / "result.json").read_text())


def tables(plan: list[Cell], out: pathlib.Path, args: Any) -> list[dict]:
  """One paper_report.table per (setting, data set), with its setting, wall time and the
  paper's figure; then the derived ratios, which need other settings' rows."""
  from benchmarks import paper_report
  docs, pooled_by = [], {}
  for setting, data in dict.fromkeys((c.setting, c.data) for c in plan):
    cells = [c for c in plan if (c.setting, c.data) == (setting, data)]
    first = min((c.seed for c in cells if c.seed is not None), default=0)
    queries = list(prepare(out, setting, data, first, args.max_queries).test)
    rows = paper_report._rows(cells, out, "test", queries)
    doc = paper_report.table(f"{setting}, {data} ({len(queries):,} queries)", rows,
                             "hyset" if "hyset" in rows else None, args.resamples,
                             baselines_of(setting))
    doc.update(setting=setting, data=data, wall_s=round(sum(_result(out, c)["wall_s"]
                                                           for c in cells), 1),
               paper=_paper(setting, data))
    if setting.startswith("UC-"):
      pooled_by[setting, data] = pooled = uc_pooled(cells, out, setting, data, args.max_queries)
      doc["labels"] = {kind: labels(pooled.comp5, mask) | {"seeds": list(pooled.seeds)}
                       for kind, mask in pooled.masks.items()}
    docs.append(doc)
  for doc in docs:
    full = pooled_by.get(("UC-full", doc["data"]))
    if doc["setting"] != "UC-full" and "labels" in doc and full is not None:
      pooled = pooled_by[doc["setting"], doc["data"]]
      # The same seeds, so the same test queries in the same order (each seed's split).
      same = full.seeds == pooled.seeds
      for kind, lab in doc["labels"].items():
        lab["ceiling"] = (ceiling(pooled.masks[kind], pooled.comp5, full.comp5.get("hyset"))
                          if same else None)
      if same and "hyset" in pooled.comp5 and "hyset" in full.comp5:
        doc["pooled_share"] = _share(float(pooled.comp5["hyset"].mean()),
                                     float(full.comp5["hyset"].mean()))
    doc["derived"] = derived(doc, docs)
  return docs


# --- where the labels reach (UC) -------------------------------------------------------------

LABEL_KINDS = ("tools", "sets")  # what a training query labels of a test query (labelled())


def labelled(spec: str, queries: tuple) -> dict[str, np.ndarray]:
  """bool[Q] per kind of :data:`LABEL_KINDS`: whether the training queries of ``spec`` name
  every gold tool of each query (``tools``: what the held-out categories' shots label; UC-0 none
  of their tools, UC-full all) and whether one of them has its gold set (``sets``: what the
  seen-set prior and θ's pair terms were shown; a shot names its tools and only its own set)."""
  train, _ = fit_data(spec)
  named = {t for q in train for t in q.gold}
  seen = {frozenset(q.gold) for q in train}
  return {"tools": np.array([set(q.gold) <= named for q in queries], bool),
          "sets": np.array([frozenset(q.gold) in seen for q in queries], bool)}


class Pooled(NamedTuple):
  """A UC setting's test queries of every seed, pooled (seeds ascending, each its own split):
  ``masks`` {kind of :data:`LABEL_KINDS`: bool[Q]}, ``comp5`` {row: f32[Q] per-query COMP@5}
  (a row without a cell at every seed is left out)."""
  seeds: tuple[int, ...]
  masks: dict[str, np.ndarray]
  comp5: dict[str, np.ndarray]


def uc_pooled(cells: list[Cell], out: pathlib.Path, setting: str, data: str, max_queries: int
              ) -> Pooled:
  """:class:`Pooled` of a UC setting's finished ``cells`` (one data set)."""
  from benchmarks import paper_report
  seeds = tuple(sorted({c.seed for c in cells}))
  masks, comp = {k: [] for k in LABEL_KINDS}, {}
  for seed in seeds:
    queries = list(prepare(out, setting, data, seed, max_queries).test)
    spec = uc_settings(out, data, seed)[_uc_name(setting)]["spec"]
    for kind, mask in labelled(spec, tuple(queries)).items():
      masks[kind].append(mask)
    for cell in (c for c in cells if c.seed == seed):
      comp.setdefault(cell.method, []).append(
          paper_report._per_query(out, cell, "test", queries)["comp@5"])
  return Pooled(seeds, {k: np.concatenate(v) for k, v in masks.items()},
                {k: np.concatenate(v) for k, v in comp.items() if len(v) == len(seeds)})


def labels(comp5: dict[str, np.ndarray], named: np.ndarray) -> dict:
  """The share of test queries ``named`` marks, and each row's COMP@5 (``comp5``: per query)
  on those and on the rest."""
  part = lambda a, m: float(a[m].mean()) if m.any() else None
  return {"labelled": float(named.mean()), "queries": int(named.size),
          "rows": {k: {"labelled": part(a, named), "unlabelled": part(a, ~named)}
                   for k, a in comp5.items()}}


def ceiling(named: np.ndarray, comp5: dict[str, np.ndarray], full: np.ndarray | None
            ) -> dict | None:
  """What a k-shot model would recover of full supervision (HYSET's UC-full COMP@5) if it
  answered the queries ``named`` marks (the shots label their tools, or have their set) as well
  as the fully supervised model does, and the others as well as the best row here does:
  {"share", "best_unlabelled"}.

  Not a bound (a better method would lift the second part), but the shots cannot teach a tool
  they never name, nor show a combination none of them has."""
  if full is None or not full.mean():
    return None
  rest = {k: float(a[~named].mean()) for k, a in comp5.items() if (~named).any()}
  best = max(rest, key=rest.get) if rest else None
  got = full[named].sum() + (rest[best] * (~named).sum() if best else 0.0)
  return {"share": float(got / full.sum()), "best_unlabelled": best}


def labels_markdown(docs: list[dict]) -> list[str]:
  """The UC settings' COMP@5 split by what training labels (every seed pooled), per kind of
  :data:`LABEL_KINDS`, with the ceilings."""
  uc = [d for d in docs if "labels" in d]
  if not uc:
    return []
  lines = ["## Held-out categories: what the labels reach", "",
           "Test queries whose every gold tool some training query names (\"tools\"; the shots "
           "name only their own tools) and those whose gold set some training query has "
           "(\"sets\"), each against the rest; COMP@5 in percent over every seed's test queries "
           "(each seed its own split). \"ceiling\": the "
           "share of UC-full's HYSET COMP@5 a model would recover answering the first group as "
           "the fully supervised model does and the rest as the best row here does.", "",
           "| setting | data | labelled by | queries | method | COMP@5, labelled | COMP@5, rest "
           "| ceiling |", "|---|---|---|---:|---|---:|---:|---|"]
  pct = lambda v: "–" if v is None else f"{100 * v:.2f}"
  for doc in uc:
    for j, (kind, lab) in enumerate(doc["labels"].items()):
      top = lab.get("ceiling")
      for i, (key, row) in enumerate(lab["rows"].items()):
        cap = ("–" if i or not top else
               f"{100 * top['share']:.1f}% (rest as "
               f"{doc['rows'][top['best_unlabelled']]['label']})")
        first = i == 0 and j == 0
        lines.append(f"| {doc['setting'] if first else ''} | {doc['data'] if first else ''} | "
                     f"{kind if i == 0 else ''} | "
                     + (f"{100 * lab['labelled']:.1f}% of {lab['queries']:,}" if i == 0 else "")
                     + f" | {doc['rows'][key]['label']} | {pct(row['labelled'])} | "
                     f"{pct(row['unlabelled'])} | {cap} |")
  return lines + [""]


def _paper(setting: str, data: str) -> dict[str, str]:
  """{row: the paper's statement} for the HYSET row (and the in-domain row of a CD pair)."""
  got = {"hyset": PAPER.get(setting, "—")}
  if setting == "CD" and data.endswith(":ultratool"):
    got["hyset"] += f"; {PAPER_ULTRATOOL_CD}"
  if setting in CD_SETTINGS and data.endswith(":ultratool"):
    got["hyset-in-domain"] = PAPER_ULTRATOOL_IN_DOMAIN
  return got


def _comp5(doc: dict | None, row: str = "hyset") -> float | None:
  if not doc or row not in doc["rows"]:
    return None
  return doc["rows"][row]["metrics"]["comp@5"]["mean"]


def _share(a: float | None, b: float | None) -> float | None:
  return a / b if a is not None and b else None


def derived(doc: dict, docs: list[dict]) -> dict[str, dict]:
  """The paper's kind of figure for ``doc``'s rows: {row: {"text", "value"}} (value: a ratio,
  or points for distractors; None where it cannot be computed)."""
  find = lambda s: next((d for d in docs if (d["setting"], d["data"]) == (s, doc["data"])), None)
  setting, got = doc["setting"], {}
  best = doc["vs_best"].get("comp@5")
  over = (lambda v: {"text": "n/a" if v is None else f"{100 * (v - 1):+.1f}% COMP@5 over the "
                             f"best baseline ({best['best']})", "value": v})
  if setting.startswith("UC-") and setting != "UC-full":
    # The mean over seeds weighs each seed's split alike, however few its queries: the share
    # over every seed's queries pooled (the same splits) stands beside it.
    v, pooled = _share(_comp5(doc), _comp5(find("UC-full"))), doc.get("pooled_share")
    got["hyset"] = {"text": "n/a (no UC-full)" if v is None
                    else f"recovers {100 * v:.1f}% of fully supervised COMP@5" + (
                        f" ({100 * pooled:.1f}% pooled per query)" if pooled is not None
                        else ""), "value": v, "pooled": pooled}
  elif setting in CD_SETTINGS:
    v = _share(_comp5(doc), _comp5(doc, "hyset-in-domain"))
    got["hyset"] = {"text": "n/a" if v is None else f"retains {100 * v:.1f}% of in-domain "
                                                     "COMP@5", "value": v}
    base = [r for r in doc["rows"] if r in baselines_of(setting)]
    if base and "hyset-in-domain" in doc["rows"]:
      top = max(base, key=lambda r: _comp5(doc, r))
      v = _share(_comp5(doc, "hyset-in-domain"), _comp5(doc, top))
      got["hyset-in-domain"] = {"text": "n/a" if v is None else
                                f"{100 * (v - 1):+.1f}% COMP@5 over the best baseline ({top})",
                                "value": v}
  elif setting in DIST_SETTINGS[1:]:
    # Both HYSET rows against the one undistracted model (the padded one's library grew before
    # training, the other's after).
    ref = find("dist-base")
    for key in ("hyset", "hyset-padded"):
      if ref and key in doc["rows"] and "hyset" in ref["rows"]:
        m, r = doc["rows"][key]["metrics"], ref["rows"]["hyset"]["metrics"]
        d = {k: 100 * (m[k]["mean"] - r[k]["mean"]) for k in ("recall@5", "comp@5")}
        got[key] = {"text": f"Δ vs the undistracted library: R@5 {d['recall@5']:+.2f}, "
                            f"COMP@5 {d['comp@5']:+.2f} points", "value": d["comp@5"]}
  elif best and "hyset" in doc["rows"]:
    got["hyset"] = over(best["ratio"])
  return got


def _fmt(stat: dict) -> str:
  m = 100 * stat["mean"]
  return f"{m:.2f}" if stat["std"] is None else f"{m:.2f} ± {100 * stat['std']:.2f}"


COLUMNS = ("setting", "data", "method", "seeds", "R@5", "COMP@5", "ours (derived)",
           "HYSET − best baseline, COMP@5 [95% CI]; McNemar p", "paper", "setting wall")


def markdown(docs: list[dict]) -> list[str]:
  """The one table: rows = setting × method."""
  lines = ["| " + " | ".join(COLUMNS) + " |", "|---|---|---|---|---:|---:|---|---|---|---:|"]
  for doc in docs:
    best = doc["vs_best"].get("comp@5")
    for i, (key, row) in enumerate(doc["rows"].items()):
      sig = "–"
      if key == "hyset" and best:
        v = doc["rows"][best["best"]]["vs_hyset"]["comp@5"]
        sig = (f"{100 * best['diff']:+.2f} [{100 * best['ci_low']:+.2f}, "
               f"{100 * best['ci_high']:+.2f}] vs {best['best']}; p = {v['mcnemar_p']:.3g}")
      seeds = ", ".join("–" if s is None else str(s) for s in row["seeds"])
      m = row["metrics"]
      lines.append(
          f"| {doc['setting'] if i == 0 else ''} | {doc['data'] if i == 0 else ''} | "
          f"{row['label']} | {seeds} | {_fmt(m['recall@5'])} | {_fmt(m['comp@5'])} | "
          f"{doc['derived'].get(key, {}).get('text', '–')} | {sig} | "
          f"{doc['paper'].get(key, '')} | "
          f"{_clock(doc['wall_s']) if i == 0 else ''} |")
  return lines


def _clock(seconds: float) -> str:
  from benchmarks.paper_tables import _clock as clock
  return clock(seconds)


# --- the estimate ----------------------------------------------------------------------------
# Seconds measured on this shared 2-core CPU, used where this run's cells measured nothing of
# the kind (a cell's own measurement always wins). From the full Table 3 run of 2026-12-05
# (2-core AMD EPYC; results/paper_table3.json and paper_table3_seal.json, their cells'
# "trainings" and wall times), means over the seeds:
# - a preset's whole training (its step budget): ToolLens 250 s (1,000 steps; 233-272 s over
#   the UT, UC, sets, pairs and native trainings), ToolBench with the ToolLens preset 596 s
#   (561-647), BFCL 154 s (600 steps), UltraTool 104 s (500 steps; 95-111), Seal-Tools 128 s
#   (400 steps; 121-135);
# - over ToolLens' library padded to 10³ / 10⁴ / 10⁵ tools: 319 / 1,361 / 2,997 s;
# - an adaptation of 100 steps: 151 s (ToolLens' k-shot runs, 123-191 s; UltraTool's and
#   Seal-Tools' ~50 s, the CD ones 17-109 s: the largest library's, so it errs long);
# - a training's fixed part (data, compilation, the first validation): 34 s (UltraTool's
#   100-step adaptations took 48 s, its 500-step trainings 104 s), the rest scaling with the
#   steps;
# - scoring a setting's test split with a trained HYSET: 27 s (24 s median over 102 cells);
# - a baseline's fit and scoring: its mean over the run's cells;
# - a distractor tool's first encoding: the 10⁵ row's 90,000 new texts (those past the 10⁴
#   library) took 5,012 s (frozen MiniLM, nice 15, tests and profiling beside it for ~15 min,
#   2026-12-05 10:13-11:33 UTC).
# From these alone (an empty --out) the full run is estimated at 12.5 h; from its own cells and
# Seal-Tools' (those --out folders), 11.9 h.
REF_TRAIN_S = {"toollens": 250.0, "toolbench": 596.0, "bfcl": 154.0, "ultratool": 104.0,
               "seal_tools": 128.0}
REF_PADDED_S = {1_000: 319.0, 10_000: 1361.0, 100_000: 2997.0}
REF_ADAPT_S = 151.0
REF_OVERHEAD_S = 34.0
REF_ENCODE_S_PER_TEXT = 5012.0 / 90_000
REF_SCORE_S = 27.0
REF_BASELINE_S = {"bm25": 0.5, "dense": 0.7, "fusion": 0.6, "linear-head": 13.3,
                  "mlp-head": 55.3, "set-classifier": 9.5, "cardinality": 5.3, "mmr": 0.8,
                  "facility-location": 0.2, "deepsets": 5.9, "set-transformer": 58.7}


def trainings_of(cell: Cell) -> list[str]:
  """The trainings a cell reads, by the tag :func:`hyset_model` gives them (with the seed)."""
  seed, data = cell.seed or 0, cell.data
  if not cell.method.startswith("hyset"):
    return []
  if cell.setting in ("UT", "sets", "pairs"):
    tags = [f"{cell.setting}-{data}"]
  elif cell.setting.startswith("UC-"):
    name = _uc_name(cell.setting)
    tags = ([f"UC-{data}-full"] if name == "full" else
            [f"UC-{data}-base"] + ([] if name == "base" else [f"UC-{data}-{name}"]))
  elif cell.method == "hyset-padded":
    tags = [f"padded-{data}-{cell.setting.split('-')[1]}"]
  elif cell.setting in CD_SETTINGS:
    source, target = data.split(":")
    tags = ([f"native-{target}"] if cell.method == "hyset-in-domain" else
            [f"native-{source}"] + ([f"CD-{source}-{target}-adapted"]
                                    if cell.setting == "CD+target" else []))
  else:
    tags = [f"native-{data}"]
  return [f"{t}/s{seed}" for t in tags]


def _training_data(tag: str) -> str:
  """The data set a training (by tag) runs on: its preset's step time is that library's."""
  if tag.startswith("native-"):
    return tag.split("/")[0][len("native-"):]
  if tag.startswith("CD-"):
    return tag.split("-")[1]
  return tag.split("-")[1].split("/")[0]


def _target_steps(preset: str, adapt: bool, overrides: list[str], adapt_steps: int) -> int:
  from hyset_jax import config as config_lib
  return adapt_steps if adapt else config_lib.resolve(preset, list(overrides)).train.num_steps


def measured_training_s(record: dict, steps: int) -> float:
  """A measured training's seconds at ``steps``: its steps replaced at the step rate it logged
  (the rest — data, compilation, validation — kept as measured)."""
  from benchmarks import paper_estimate
  step = paper_estimate._step_s(record["workdir"])
  if step is None or not record.get("steps"):
    return record["wall_s"]
  return max(0.0, record["wall_s"] + step * (steps - record["steps"]))


def reference_training_s(tag: str, steps: int) -> float:
  """A training's seconds at ``steps`` from the REF_* measurements: the fixed part plus the
  steps at the rate the reference run had."""
  from hyset_jax import config as config_lib
  if "-adapted" in tag or "-shot" in tag:
    return REF_OVERHEAD_S + (REF_ADAPT_S - REF_OVERHEAD_S) / ADAPT_STEPS * steps
  data = _training_data(tag)
  total = (REF_PADDED_S[int(tag.split("/")[0].rsplit("-", 1)[1])] if tag.startswith("padded-")
           else REF_TRAIN_S[data])
  preset_steps = config_lib.resolve(data_spec(data)[1]).train.num_steps
  return REF_OVERHEAD_S + (total - REF_OVERHEAD_S) / preset_steps * steps


def padded_training_s(trained: dict[str, list[dict]], tag: str, steps: int) -> float:
  """A padded-library training (``padded-DATA-SIZE``) not measured yet: the largest measured
  one of the same data set scaled linearly with the library's size (measured on ToolLens, 10×
  the tools took 4.2× the time from 10³ to 10⁴: linear errs long); the reference without one."""
  _, data, size = tag.rsplit("-", 2)
  sizes = {int(t.rsplit("-", 1)[1]): recs for t, recs in trained.items()
           if t.startswith(f"padded-{data}-")}
  if not sizes:
    return reference_training_s(tag, steps)
  n = max(sizes)
  return float(np.mean([measured_training_s(r, steps) for r in sizes[n]])) * int(size) / n


def _measured(out: pathlib.Path) -> tuple[dict, dict]:
  """From the finished cells under ``out`` made with the presets' settings (other step budgets
  allowed) on whole test splits: ({training tag without seed: [its records]},
  {(setting, method): [scoring s]})."""
  trained, scored = {}, {}
  for path in sorted((out / "cells").glob("**/result.json")):
    r = json.loads(path.read_text())
    spec = r.get("spec", {})
    # Only a cell of the presets (at most their step budget changed) over its whole test split
    # says how long the full run's cell takes.
    if (not r.get("complete") or "trainings" not in r or spec.get("max_queries")
        or any(not o.startswith("train.num_steps=") for o in spec.get("overrides", []))):
      continue
    own = 0.0
    for t in r["trainings"]:
      if t.get("wall_s"):
        own += t["wall_s"]
        trained.setdefault(t["tag"], []).append(t)
    scored.setdefault((spec["setting"], spec["method"]), []).append(max(0.0, r["wall_s"] - own))
  return trained, scored


def _extra_text(extra: dict[str, tuple[str, ...]]) -> str:
  """' (+ ultratool for sets, pairs)' for :data:`FULL_EXTRA_DATASETS`; '' for none."""
  by_data: dict[str, list[str]] = {}
  for setting, names in extra.items():
    for d in names:
      by_data.setdefault(d, []).append(setting)
  return "".join(f" (+ {d} for {', '.join(ss)})" for d, ss in by_data.items())


def full_plan() -> list[Cell]:
  return build_plan(list(SETTINGS), list(FULL_DATASETS), list(FULL_PAIRS), list(METHODS),
                    [0, 1, 2], FULL_EXTRA_DATASETS)


def estimate(out: pathlib.Path, plan: list[Cell] | None = None, overrides: list[str] = (),
             adapt_steps: int = ADAPT_STEPS) -> dict:
  """The seconds per setting of ``plan`` (default: the full run) at the step budgets that
  ``overrides`` and ``adapt_steps`` give: each cell is its scoring (measured for that setting
  and method under ``out``, else a reference) plus each training it is the first to need
  (measured under ``out`` for that training, rescaled to the steps, else the reference), plus
  for a distractor library the encoding of its added tools (the measured seconds per added tool
  under ``out``, else the reference), paid once per size."""
  full = plan or full_plan()
  trained, scored = _measured(out)
  mean = lambda xs: float(np.mean(xs))
  done, sized = set(), set()
  per_setting: dict[str, float] = {}
  sources = {"measured": 0, "reference": 0}
  for cell in full:
    s = 0.0
    got = scored.get((cell.setting, cell.method))
    if got:
      s += mean(got)
    elif cell.method.startswith("hyset"):
      s += REF_SCORE_S
    else:
      s += REF_BASELINE_S[cell.method]
    sources["measured" if got else "reference"] += 1
    for tag in trainings_of(cell):
      if tag in done:
        continue
      done.add(tag)
      bare = tag.split("/")[0]
      adapt = "-adapted" in bare or "-shot" in bare
      preset = ("toollens" if adapt else data_spec(_training_data(bare))[1])
      steps = _target_steps(preset if not adapt else "toollens", adapt, list(overrides),
                            adapt_steps)
      if trained.get(bare):
        s += mean([measured_training_s(t, steps) for t in trained[bare]])
      elif bare.startswith("padded-"):
        s += padded_training_s(trained, bare, steps)
      else:
        s += reference_training_s(bare, steps)
    # Each distractor library's new tools are encoded once, at REF_ENCODE_S_PER_TEXT. The 10⁵
    # row's were encoded ahead of its cells (no cell's time holds them); the 10³ and 10⁴ cells'
    # measured times hold their own encoding as well, so it is counted twice there (≤ 9,536
    # texts, ~9 minutes: the estimate errs long).
    if cell.setting in DIST_SETTINGS[1:] and (cell.data, cell.setting) not in sized:
      sized.add((cell.data, cell.setting))
      added = int(cell.setting.split("-")[1]) - _base_size(cell.data)
      s += REF_ENCODE_S_PER_TEXT * max(0, added - _previous_size(cell.setting, cell.data))
    per_setting[cell.setting] = per_setting.get(cell.setting, 0.0) + s
  total = sum(per_setting.values())
  what = ("the full Table 3 (`python -m benchmarks.paper_tables --table 3`: seeds 0-2, data "
          f"sets {', '.join(FULL_DATASETS)}{_extra_text(FULL_EXTRA_DATASETS)}, CD pairs "
          f"{', '.join(FULL_PAIRS)}, "
          if plan is None else "this plan (")
  lines = [f"Estimated {what}{len(full)} cells, "
           + ("the presets' step budgets" if not overrides else
              f"the presets with {' '.join(overrides)}")
           + f", {adapt_steps} adaptation steps) on this machine: "
           f"{total / 3600:.1f} h ("
           + ", ".join(f"{k} {v / 60:.0f} min" for k, v in per_setting.items())
           + f"); {sources['measured']} cells' scoring and {len(trained)} trainings measured "
           f"under `{out}`, the rest from earlier measurements on this machine "
           "(benchmarks/paper_table3.py, REF_*)."]
  return {"total_s": round(total, 1), "per_setting_s": {k: round(v, 1)
                                                         for k, v in per_setting.items()},
          "cells": len(full), "measured_trainings": sorted(trained), "lines": lines}


@functools.lru_cache(maxsize=None)
def _base_size(data: str) -> int:
  return len(_load(data_spec(data)[0]).tools)


def _previous_size(setting: str, data: str) -> int:
  """Tools already encoded by the next smaller distractor library (they are its prefix)."""
  size = int(setting.split("-")[1])
  smaller = [n for n in DIST_SIZES if n < size]
  return max(smaller) - _base_size(data) if smaller else 0


# --- the command -----------------------------------------------------------------------------

def make_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.paper_tables --table 3",
                                   description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--quick", action="store_true",
                      help=f"ToolLens only ({', '.join(QUICK_PAIRS)} for CD), no "
                           f"{', '.join(QUICK_SKIP)}, seed 0, {QUICK_STEPS} "
                           f"training and {QUICK_ADAPT_STEPS} adaptation steps, the cheap "
                           "baselines (each still overridable)")
  parser.add_argument("--settings", nargs="+", choices=SETTINGS, metavar="NAME",
                      help=f"default: all ({', '.join(SETTINGS)})")
  parser.add_argument("--datasets", nargs="+", metavar="NAME",
                      choices=("toollens", "bfcl", "ultratool", "seal_tools"),
                      help=f"data sets of the in-library settings (default "
                           f"{' '.join(FULL_DATASETS)}{_extra_text(FULL_EXTRA_DATASETS)})")
  parser.add_argument("--pairs", nargs="+", metavar="SOURCE:TARGET",
                      help=f"CD pairs (default {' '.join(FULL_PAIRS)})")
  parser.add_argument("--methods", nargs="+", choices=METHODS, metavar="NAME",
                      help=f"default: all that apply ({', '.join(METHODS)})")
  parser.add_argument("--seeds", nargs="+", type=int, help="default: 0 1 2 (--quick: 0)")
  parser.add_argument("--set", dest="overrides", action="append", default=[],
                      metavar="KEY=VALUE", help="config override for every HYSET training")
  parser.add_argument("--adapt-set", dest="adapt_sets", action="append", default=[],
                      metavar="KEY=VALUE",
                      help="config override for the adaptations only (k-shot, CD+target), "
                           "after the recipe's own, e.g. train.learning_rate=0.0003")
  parser.add_argument("--adapt-steps", type=int,
                      help=f"k-shot and CD+target adaptation steps (default {ADAPT_STEPS}, "
                           f"--quick {QUICK_ADAPT_STEPS})")
  parser.add_argument("--target-queries", type=int, default=TARGET_QUERIES,
                      help=f"CD+target: target training queries (default {TARGET_QUERIES})")
  parser.add_argument("--max-queries", type=int, default=0,
                      help="score the first N test queries of each setting (0 = all)")
  from benchmarks.paper_tables import add_output_args
  add_output_args(parser, "paper_table3")
  parser.add_argument("--estimate-only", action="store_true",
                      help="print the selected plan's duration (by default the full run's), "
                           "estimated from the cells under --out and earlier measurements "
                           "where there are none, and stop: nothing runs")
  parser.add_argument("--report-only", action="store_true",
                      help="build the tables from the selected cells that are finished, "
                           "nothing runs; the others are listed as not run (a long run's "
                           "state so far)")
  return parser


def with_defaults(args: argparse.Namespace) -> argparse.Namespace:
  """``args`` with what --quick (or its absence) chooses for the options not given."""
  q = args.quick
  suffix = "_quick" if q else ""
  args.settings = args.settings or [s for s in SETTINGS if not q or s not in QUICK_SKIP]
  # Named data sets are the plan's; the extra ones come with the default only.
  args.extra = {} if (args.datasets or q) else dict(FULL_EXTRA_DATASETS)
  args.datasets = args.datasets or (["toollens"] if q else list(FULL_DATASETS))
  args.pairs = args.pairs or list(QUICK_PAIRS if q else FULL_PAIRS)
  args.methods = args.methods or list(QUICK_METHODS if q else METHODS)
  args.seeds = args.seeds or ([0] if q else [0, 1, 2])
  if args.adapt_steps is None:
    args.adapt_steps = QUICK_ADAPT_STEPS if q else ADAPT_STEPS
  if q and not any(o.startswith("train.num_steps=") for o in args.overrides):
    args.overrides = [f"train.num_steps={QUICK_STEPS}", *args.overrides]
  args.out = pathlib.Path(args.out or f"runs/paper_table3{suffix}")
  args.tag = args.tag or f"paper_table3{suffix}"
  return args


def check(args: argparse.Namespace) -> None:
  """Bad options fail before any cell runs, naming the option."""
  from benchmarks import cross_domain
  from hyset_jax import config as config_lib
  from hyset_jax.errors import UserError
  for name, value, low in (("--resamples", args.resamples, 1), ("--adapt-steps",
                           args.adapt_steps, 1), ("--target-queries", args.target_queries, 1),
                           ("--max-queries", args.max_queries, 0)):
    if value < low:
      raise UserError(f"{name} must be at least {low}, got {value}")
  for pair in args.pairs:
    ends = pair.split(":")
    if len(ends) != 2 or not set(ends) <= set(cross_domain.DATASETS) or ends[0] == ends[1]:
      raise UserError(f"--pairs {pair!r}: expected SOURCE:TARGET, two of "
                      f"{', '.join(cross_domain.DATASETS)}")
  for preset in {data_spec(d)[1] for d in [*args.datasets, *(p for x in args.pairs
                                                             for p in x.split(":"))]}:
    # A bad --set or --adapt-set fails before any cell.
    config_lib.resolve(preset, [*args.overrides, *args.adapt_sets])


def run(args: argparse.Namespace) -> int:
  from benchmarks import paper_report
  from hyset_jax import io_utils
  from hyset_jax.errors import UserError
  args = with_defaults(args)
  check(args)
  if args.estimate_only:
    plan = build_plan(args.settings, args.datasets, args.pairs, args.methods, args.seeds,
                      args.extra)
    same = (plan == full_plan() and not args.overrides and not args.adapt_sets
            and args.adapt_steps == ADAPT_STEPS)
    print("\n".join(estimate(args.out, None if same else plan, args.overrides,
                             args.adapt_steps)["lines"]))
    return 0
  outputs = paper_report.check_outputs(pathlib.Path(args.results), args.tag, args.force)
  io_utils.ensure_writable_dir(args.out, "--out folder")
  plan = build_plan(args.settings, args.datasets, args.pairs, args.methods, args.seeds,
                    args.extra)
  if not plan:
    raise UserError(f"no cell to run: --settings {' '.join(args.settings)} with --methods "
                    f"{' '.join(args.methods)} selects nothing")
  t0, left = time.time(), []
  if args.report_only:
    left = [c for c in plan if not finished(args.out, c, args)]
    plan, ran = [c for c in plan if c not in left], {}
    if not plan:
      raise UserError(f"--report-only: none of the {len(left)} selected cells under "
                      f"{args.out} is finished")
  else:
    ran = run_plan(plan, args.out, args)
  report = build_report(plan, args, ran, time.time() - t0, left)
  write(report, outputs, args)
  print("\n".join(report["markdown"]))
  print("wrote " + ", ".join(str(p) for p in outputs.values()))
  return 0


def build_report(plan: list[Cell], args: Any, ran: dict[str, float], wall_s: float,
                 left: list[Cell] = ()) -> dict:
  """The tables of ``plan``'s cells (all finished) as Markdown and JSON; ``left``: the selected
  cells not run yet (--report-only), named in the report."""
  docs = tables(plan, args.out, args)
  est = estimate(args.out)
  night = est["total_s"] <= 12 * 3600
  # The CD pairs only where a CD setting ran: a plan without one has none.
  pairs = (f"; CD pairs {', '.join(args.pairs)}"
           if any(s in CD_SETTINGS for s in args.settings) else "")
  md = [f"Cells under `{args.out}`: settings {', '.join(args.settings)}; data sets "
        f"{', '.join(args.datasets)}{_extra_text(args.extra)}{pairs}; seeds "
        f"{', '.join(map(str, args.seeds))}; overrides {args.overrides or 'none'}; "
        f"{args.adapt_steps} adaptation steps"
        f"{f' with {args.adapt_sets}' if args.adapt_sets else ''}. R@5 and COMP@5 in percent, "
        "mean ± std over seeds (a single value: one run; in UT, UC, sets and pairs each seed "
        "draws its own split). Significance: HYSET against the best baseline on COMP@5, seed-0 "
        "predictions "
        f"(paired bootstrap over queries, {args.resamples} resamples; exact McNemar on "
        "COMP@5). \"paper\": the figure its text (§3.4-3.5) states; \"—\": none given. "
        "\"setting wall\": the seconds its cells took (each model's training is counted in "
        "the first cell that needed it).",
        *([f"Not run yet, so not in the tables (--report-only): {len(left)} cells, "
           + ", ".join(c.name for c in left) + "."] if left else []),
        "", "## Table 3: generalisation settings", "",
        *markdown(docs), "", *labels_markdown(docs), "## Time", "",
        f"This invocation: {wall_s / 60:.1f} min wall for {len(ran)} cells run "
        f"({len(plan) - len(ran)} reused).", *est["lines"],
        f"- the full Table 3 within one night (≤ 12 h): {'met' if night else 'missed'} "
        f"(estimated {est['total_s'] / 3600:.1f} h)"]
  if args.quick:
    md.append(f"- --quick within ~20 minutes: {'met' if wall_s <= 1200 else 'missed'} "
              f"({wall_s / 60:.1f} min{'' if len(ran) == len(plan) else ', cells reused'})")
  return {"tables": docs, "cells": {c.name: {k: v for k, v in _result(args.out, c).items()
                                             if k in ("wall_s", "trainings", "tools")}
                                    for c in plan},
          "wall_s": round(wall_s, 1), "ran_s": {k: round(v, 1) for k, v in ran.items()},
          "not_run": [c.name for c in left],
          "estimate": est, "settings": {k: getattr(args, k) for k in (
              "settings", "datasets", "pairs", "methods", "seeds", "overrides", "adapt_sets",
              "adapt_steps", "target_queries", "max_queries", "quick")} | {"out": str(args.out)},
          "markdown": md}


def write(report: dict, outputs: dict[str, pathlib.Path], args: Any) -> None:
  from benchmarks import paper_report, provenance
  command = "python -m benchmarks.paper_tables " + " ".join(args.argv)
  doc = {k: v for k, v in report.items() if k != "markdown"}
  provenance.write_json(outputs["json"], paper_report._jsonable(doc), command)
  prov = provenance.provenance(command)
  head = [f"# Paper Table 3{' (--quick)' if args.quick else ''}", "",
          f"`{command}`; {prov['machine']}; {prov['date']}; commit {prov['commit']}.", ""]
  outputs["md"].write_text("\n".join(head + report["markdown"]) + "\n", encoding="utf-8")
  paper_report.plot(report["tables"], outputs["png"])


def main(argv: list[str] | None = None) -> int:
  from hyset_jax import cli
  argv = list(sys.argv[1:] if argv is None else argv)
  parser = make_parser()
  parser.set_defaults(func=run, argv=["--table", "3", *argv])
  return cli.run(parser, argv)


if __name__ == "__main__":
  sys.exit(main())
