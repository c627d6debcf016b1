"""The cells of benchmarks/paper_tables.py: which (data set, method, seed) runs there are, how
one runs, and when one counts as finished.

A cell scores one method on every test split of one data set and writes, under
``<out>/cells/<cell name>/``, one prediction file per split (``pred.<split>.jsonl``: the
``{"query_id", "ranking", "set"}`` lines ``hyset compare`` reads) and, last, ``result.json``
(the metrics per split, the cell's spec, its wall time). A cell is finished when
``result.json`` holds ``"complete": true``, the same spec as the plan's (a changed step budget
or config reruns it) and every prediction file has one line per scored query; anything else (a
run killed half way) is redone from the start. HYSET's training lives in
``<out>/train/<"preset" or a hash of the --set list>/<name>``, which
``hyset_jax.training.train`` itself resumes from its checkpoints (a redone HYSET cell goes on
from the last one).

Cells:

- native: a method trained (where it trains) and scored on the same data set: HYSET (the
  preset, ``--config <data set>``), its Table 2 ablations, and every baseline of
  benchmarks/retrieval_quality.py (BM25, dense, BM25+dense RRF, the per-tool heads, the set
  classifier, the set-level baselines of docs/baselines.md);
- carried: a HYSET model trained on one library scored on another's test splits
  (hyset_jax.io.carry): ToolLens → ToolBench's six test sets (zero-shot; ToolLens' tools are
  ToolBench APIs), UltraTool ↔ Seal-Tools. Beside them the untrained baselines of the target.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import pathlib
import time
from typing import Any

from hyset_jax.config import shared_data

# Data sets with a training split: name -> (preset, test splits scored).
NATIVE = {"toollens": ("toollens", ("test",)),
          "bfcl": ("bfcl", ("test",)),
          "ultratool": ("ultratool", ("test",)),
          "seal_tools": ("seal_tools", ("test", "test_out"))}
TOOLBENCH_SPLITS = ("G1_instruction", "G1_category", "G1_tool", "G2_instruction",
                    "G2_category", "G3_instruction")
# Evaluation-only data sets (no training split): name -> (spec, splits).
EVAL_ONLY = {"toolbench": ("toolbench:" + shared_data("stabletoolbench"), TOOLBENCH_SPLITS)}
# Carried models: (trained on, scored on).
CARRIED = (("toollens", "toolbench"), ("ultratool", "seal_tools"), ("seal_tools", "ultratool"))

UNTRAINED = ("bm25", "dense", "fusion")
HEADS = ("linear-head", "mlp-head")
TRAINED = (*HEADS, "set-classifier", "cardinality", "mmr", "facility-location", "deepsets",
           "set-transformer")
BASELINES = (*UNTRAINED, *TRAINED)
# Table 2 (paper §3.3): HYSET variants, as config overrides on the preset. The presets train
# without an execution reward (rewards.provider = none, η = 0: there is no agent to run here),
# so "no execution reward" is the preset itself and the row that differs is the one that adds
# the coverage proxy ρ = |Ê ∩ E*| / |E*| (hyset_jax.training.rewards) as the reward.
ABLATIONS = {"hyset-noset": ["model.interaction=none"],
             "hyset-shared": ["model.interaction=shared"],
             "hyset-identity": ["model.interaction=identity"],
             "hyset-reward": ["train.eta=0.1", "rewards.provider=proxy",
                              "rewards.refresh_every=250", "rewards.refresh_size=2000"]}
HYSET_METHODS = ("hyset", *ABLATIONS)
METHODS = (*HYSET_METHODS, *BASELINES)
LABELS = {"hyset": "HYSET (preset)", "hyset-noset": "HYSET, no F_set",
          "hyset-shared": "HYSET, one shared M", "hyset-identity": "HYSET, identity M",
          "hyset-reward": "HYSET + execution reward (coverage proxy, η = 0.1)",
          "bm25": "BM25", "dense": "dense (frozen MiniLM)", "fusion": "BM25+dense RRF",
          "linear-head": "per-tool linear head", "mlp-head": "per-tool MLP head",
          "set-classifier": "set classifier", "cardinality": "cardinality prediction",
          "mmr": "MMR", "facility-location": "facility location", "deepsets": "DeepSets",
          "set-transformer": "Set Transformer",
          # Table 3 (benchmarks/paper_table3.py): a CD pair's target model, the reference;
          # a distractor library's own model (the distractors its negatives).
          "hyset-in-domain": "HYSET trained on the target (in-domain)",
          "hyset-padded": "HYSET trained on the padded library"}
DEPTH = 5  # rankings are read to the deepest reported cut-off (COMP@5, NDCG@5)


@dataclasses.dataclass(frozen=True)
class Cell:
  """One run: ``method`` scored on ``data`` (a NATIVE or EVAL_ONLY name) with ``seed`` (None
  for a method without one); ``source``: the data set a carried HYSET model was trained on."""
  data: str
  method: str
  seed: int | None
  source: str | None = None

  @property
  def name(self) -> str:
    method = self.method + (f"_from_{self.source}" if self.source else "")
    return f"{self.data}/{method}" + ("" if self.seed is None else f"/s{self.seed}")

  @property
  def trains_hyset(self) -> bool:
    return self.method in HYSET_METHODS


def seeded(method: str) -> bool:
  return method in HYSET_METHODS or method in TRAINED


def build_plan(datasets: list[str], methods: list[str], seeds: list[int],
               carried: bool) -> list[Cell]:
  """Every cell, in run order: per data set HYSET's seeds first, then the baselines, then the
  ablations (seed 0 only: Table 2 is one seed in the paper), then the carried cells whose both
  ends were asked for (``carried``) with the target's untrained baselines."""
  cells: list[Cell] = []
  for data in datasets:
    if data not in NATIVE:
      continue
    for method in methods:
      if method in ABLATIONS:
        continue
      for seed in (seeds if seeded(method) else [None]):
        cells.append(Cell(data, method, seed))
    cells += [Cell(data, m, seeds[0]) for m in methods if m in ABLATIONS]
  if carried and "hyset" in methods:
    for source, target in CARRIED:
      if source in datasets and target in datasets:
        cells += [Cell(target, "hyset", s, source) for s in seeds]
        if target in EVAL_ONLY:
          cells += [Cell(target, m, None) for m in UNTRAINED if m in methods]
  return cells


def splits_of(data: str) -> tuple[str, ...]:
  return NATIVE[data][1] if data in NATIVE else EVAL_ONLY[data][1]


def cell_spec(cell: Cell, overrides: list[str]) -> dict:
  """What a cell's result must match to count as finished: the config, its overrides and the
  seed (a --quick result is not a full run's)."""
  home = cell.source or cell.data
  return {"data": cell.data, "method": cell.method, "seed": cell.seed, "source": cell.source,
          "config": NATIVE[home][0] if home in NATIVE else None,
          "overrides": list(overrides) + ABLATIONS.get(cell.method, [])}


def finished(out: pathlib.Path, cell: Cell, spec: dict,
             splits: tuple[str, ...] | None = None) -> bool:
  """Whether ``cell``'s result under ``out`` is complete and was made for ``spec``, with a
  prediction file per split (``splits``; default: the data set's scored splits)."""
  folder = out / "cells" / cell.name
  try:
    result = json.loads((folder / "result.json").read_text(encoding="utf-8"))
  except (OSError, ValueError):
    return False
  if not isinstance(result, dict) or result.get("complete") is not True:
    return False
  if result.get("spec") != spec:
    return False
  for split, metrics in result.get("splits", {}).items():
    try:
      lines = (folder / f"pred.{split}.jsonl").read_text(encoding="utf-8").splitlines()
    except OSError:
      return False
    if len(lines) != metrics.get("n_queries"):
      return False
  return set(result.get("splits", {})) == set(splits or splits_of(cell.data))


@functools.lru_cache(maxsize=None)
def _encoder():
  from hyset_jax.encoder import load_encoder
  return load_encoder(None)


def load_splits(data: str, overrides: tuple[str, ...]) -> tuple[Any, dict[str, list]]:
  """The data set ``data`` (its preset's spec and limits, ``overrides`` applied) with its
  validation carve, and its scored splits: (dataset, {split: queries})."""
  from hyset_jax import config as config_lib
  from hyset_jax.data.specs import load_dataset
  from hyset_jax.training.train_data import load_config_dataset
  if data in EVAL_ONLY:
    spec, names = EVAL_ONLY[data]
    dataset = load_dataset(spec)
    return dataset, {n: list(dataset.split(n)) for n in names}
  config = config_lib.resolve(NATIVE[data][0], list(overrides))
  dataset = load_config_dataset(config.data, config.model.max_set_size)
  limit = config.data.max_eval_queries
  return dataset, {n: list(dataset.split(n))[:limit or None] for n in NATIVE[data][1]}


def _train_queries(data: str, dataset: Any, overrides: tuple[str, ...]) -> tuple[list, list]:
  """(train, validation) queries of a native data set, with the preset's limits: what a trained
  baseline is fit on (the same split HYSET trains on) and chooses its settings on."""
  from hyset_jax import config as config_lib
  c = config_lib.resolve(NATIVE[data][0], list(overrides)).data
  train = list(dataset.split(c.train_split))[:c.max_train_queries or None]
  return train, list(dataset.split(c.val_split))[:c.max_eval_queries or None]


def train_hyset(cell: Cell, out: pathlib.Path, overrides: list[str]) -> dict:
  """Trains (or resumes, or reuses) the HYSET run a cell reads; returns train_and_evaluate's
  summary with the run's workdir."""
  from benchmarks import retrieval_quality
  data = cell.source or cell.data
  o = list(overrides) + ABLATIONS.get(cell.method, [])
  # One folder per --set list: a workdir refuses a config other than the one it was made with.
  digest = hashlib.sha256(json.dumps(list(overrides)).encode()).hexdigest()[:10]
  runs = out / "train" / ("preset" if not overrides else f"set-{digest}")
  return retrieval_quality.run_hyset(NATIVE[data][0], cell.method, o, cell.seed, runs, data)


def build_retriever(cell: Cell, out: pathlib.Path, overrides: list[str], dataset: Any
                    ) -> tuple[Any, dict]:
  """The retriever a cell scores, fit or trained first where the method needs it; returns it
  with what the cell's result records about the training (steps, ranking, wall time)."""
  from hyset_jax.commands.eval import build_retriever as eval_retriever
  from hyset_jax.retrievers.trained import fit_baseline
  if cell.trains_hyset:
    summary = train_hyset(cell, out, overrides)
    best = str(pathlib.Path(summary["workdir"]) / "best")
    retriever = eval_retriever("hyset", dataset.tools, model=best, data=cell.data)
    keep = ("steps", "best_step", "ranking", "wall_s", "workdir")
    return retriever, {k: summary.get(k) for k in keep}
  if cell.method in TRAINED:
    train, validation = _train_queries(cell.data, dataset, tuple(overrides))
    # A head's set is the validation-chosen threshold's (top 5 would make exact match moot).
    rule = "threshold" if cell.method in HEADS else "top5"
    return fit_baseline(cell.method, dataset.tools, _encoder(), train, seed=cell.seed,
                        validation=validation, set_rule=rule), {}
  return eval_retriever(cell.method, dataset.tools), {}


def run_cell(cell: Cell, out: pathlib.Path, overrides: list[str]) -> dict:
  """Runs one cell from the start and writes its predictions, then its result.json."""
  from hyset_jax import io_utils
  from hyset_jax.evaluation.metrics import RANK_ONLY_SET_SIZE, evaluate
  folder = io_utils.ensure_writable_dir(out / "cells" / cell.name, "cell folder")
  (folder / "result.json").unlink(missing_ok=True)  # a partial cell is redone whole
  t0 = time.time()
  dataset, splits = load_splits(cell.data, tuple(overrides) if cell.data in NATIVE else ())
  retriever, training = build_retriever(cell, out, overrides, dataset)
  result = {"spec": cell_spec(cell, overrides), "training": training, "splits": {}}
  for split, queries in splits.items():
    got = retriever.retrieve([q.text for q in queries], depth=DEPTH)
    sets = got.sets or [r[:RANK_ONLY_SET_SIZE] for r in got.rankings]
    with io_utils.atomic_write(folder / f"pred.{split}.jsonl") as f:
      for q, ranking, chosen in zip(queries, got.rankings, sets):
        f.write(json.dumps({"query_id": q.id, "ranking": list(ranking),
                            "set": list(chosen)}) + "\n")
    result["splits"][split] = evaluate(got.rankings, [q.gold for q in queries], sets)
  result["wall_s"] = round(time.time() - t0, 1)
  result["complete"] = True
  with io_utils.atomic_write(folder / "result.json") as f:
    f.write(json.dumps(result, indent=1) + "\n")
  return result
