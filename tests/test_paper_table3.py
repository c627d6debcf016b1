"""benchmarks/paper_table3.py (``paper_tables --table 3``): the plan, which model each setting
scores, resuming, and the one table with the derived ratios, the paper's figures and the
significance columns, on real splits of ToolLens and prediction files of its first test queries
(HYSET's training is stood in for: no training in a unit test)."""
from __future__ import annotations

import functools
import json
import pathlib

import numpy as np
import pytest

from benchmarks import paper_table3 as t3
from benchmarks import paper_tables
from hyset_jax.commands import eval as eval_command
from hyset_jax.data.specs import load_dataset
from hyset_jax.retrievers import BM25Retriever
from hyset_jax.retrievers.base import Retrieval


class _Oracle:
  """A stand-in for a trained HYSET: the gold set first on every ``every``-th ToolLens query
  (every other for a trained model, every third for a k-shot adapted one, so settings differ),
  BM25 elsewhere; its set is the gold set's size of its ranking."""

  def __init__(self, tools, every, gold):
    self.bm25, self.every, self.gold = _bm25(tools), every, gold

  def retrieve(self, queries, depth):
    got = self.bm25.retrieve(queries, depth)
    rankings, sets = [], []
    for i, (text, r) in enumerate(zip(queries, got.rankings)):
      first = list(self.gold.get(text, ())) if i % self.every == 0 else []
      rankings.append((first + [t for t in r if t not in first])[:depth])
      sets.append(rankings[-1][:max(2, len(first))])
    return Retrieval(rankings, sets)


_INDEXES: dict[int, tuple] = {}


def _bm25(tools):
  """One index per library object (the settings' libraries are cached, so they repeat)."""
  if id(tools) not in _INDEXES:
    _INDEXES[id(tools)] = (tools, BM25Retriever(tools))  # the library kept: its id stays its
  return _INDEXES[id(tools)][1]


@functools.lru_cache(maxsize=1)
def _toollens_gold(root: pathlib.Path) -> dict[str, tuple[str, ...]]:
  data = load_dataset(f"beir:{root / 'toollens'}")
  return {q.text: q.gold for qs in data.splits.values() for q in qs}


@pytest.fixture
def stand_in(tmp_path, monkeypatch, shared_data):
  trained: list[tuple[str, str | None, bool]] = []
  real_eval = eval_command.build_retriever

  def train(out, args, preset, spec, seed, tag, init=None, last=False):
    wd = out / "train" / f"{tag}_s{seed}"
    (wd / "best").mkdir(parents=True, exist_ok=True)
    (wd / "config.json").write_text(json.dumps({"model": {"max_set_size": 5}}))
    trained.append((tag, init and str(init.relative_to(out)), last))
    return wd, {"tag": tag, "preset": preset, "kind": "adapt" if init else "full", "steps": 0,
                "wall_s": None, "workdir": str(wd)}

  def build(method, tools, *, model=None, **kw):
    if method == "hyset":
      return _Oracle(tools, 3 if "-shot_" in model else 2, _toollens_gold(shared_data))
    return real_eval(method, tools, model=model, **kw)

  monkeypatch.setattr(t3, "train", train)
  monkeypatch.setattr(eval_command, "build_retriever", build)
  (tmp_path / "res").mkdir()
  argv = ["--table", "3", "--settings", "UT", "UC-0", "UC-5", "UC-full", "sets", "CD",
          "CD+target", "dist-base", "dist-1000", "--datasets", "toollens", "--pairs",
          "toollens:toolbench", "--methods", "hyset", "hyset-in-domain", "hyset-padded", "bm25",
          "--seeds", "0",
          "--max-queries", "60", "--out", str(tmp_path / "out"), "--results",
          str(tmp_path / "res"), "--tag", "t", "--resamples", "200"]
  return argv, trained, tmp_path


def test_the_full_run_also_scores_ultratool_and_seal_tools_held_out_settings():
  on = {(c.setting, c.data) for c in t3.full_plan() if c.data == "ultratool"}
  assert on == {(s, "ultratool") for s in t3.SPLIT_SETTINGS}
  # Seal-Tools: held-out tools and categories; its official test is new combinations already.
  on = {c.setting for c in t3.full_plan() if c.data == "seal_tools"}
  assert on == {"UT", "UC-0", "UC-1", "UC-5", "UC-10", "UC-full"}
  default = t3.with_defaults(t3.make_parser().parse_args(["--settings", "sets", "UT",
                                                          "dist-base"]))
  plan = t3.build_plan(default.settings, default.datasets, default.pairs, default.methods,
                       default.seeds, default.extra)
  assert {(c.setting, c.data) for c in plan} == {("sets", "toollens"), ("sets", "ultratool"),
                                                 ("UT", "toollens"), ("UT", "ultratool"),
                                                 ("UT", "seal_tools"), ("dist-base", "toollens")}
  # Named data sets are the plan's, and --quick keeps to ToolLens.
  for argv in (["--datasets", "toollens"], ["--quick"]):
    args = t3.with_defaults(t3.make_parser().parse_args(["--settings", "sets", *argv]))
    assert args.extra == {}


def test_plan_applies_the_baselines_of_each_setting():
  plan = t3.build_plan(["UT", "sets", "CD", "dist-1000"], ["toollens"], ["ultratool:seal_tools"],
                       list(t3.METHODS), [0, 1])
  names = [c.name for c in plan]
  assert names[:2] == ["UT/toollens/hyset/s0", "UT/toollens/hyset/s1"]
  assert "UT/toollens/bm25/s1" in names                   # each seed draws its own split
  assert "sets/toollens/set-classifier/s1" in names
  assert not any(n.startswith("UT/toollens/set-classifier") for n in names)
  assert {"CD/ultratool-to-seal_tools/hyset-in-domain/s1", "CD/ultratool-to-seal_tools/bm25",
          "dist-1000/toollens/dense"} <= set(names)
  assert not any(n.startswith("CD/") and "linear-head" in n for n in names)
  assert len(names) == len(set(names))
  # The trainings each HYSET cell reads (the estimate charges each to the first cell needing it).
  of = lambda *c: t3.trainings_of(t3.Cell(*c))
  assert of("UC-5", "toollens", "hyset", 1) == ["UC-toollens-base/s1", "UC-toollens-5-shot/s1"]
  assert of("CD+target", "ultratool:seal_tools", "hyset", 0) == [
      "native-ultratool/s0", "CD-ultratool-seal_tools-adapted/s0"]
  assert of("CD", "ultratool:seal_tools", "hyset-in-domain", 0) == ["native-seal_tools/s0"]
  assert of("dist-1000", "toollens", "dense", None) == []
  assert of("dist-1000", "toollens", "hyset-padded", 2) == ["padded-toollens-1000/s2"]
  assert "dist-1000/toollens/hyset-padded/s1" in names
  assert not any("hyset-padded" in n for n in names if not n.startswith("dist-1000"))


def test_table3_models_resume_and_derived_figures(stand_in, capsys):
  argv, trained, tmp = stand_in
  assert paper_tables.main(argv) == 0
  # Which model each setting scores: k-shot and CD+target adapt from their base models.
  # k-shot keeps its last step (its validation holds no held-out category); CD+target its best.
  assert ("UC-toollens-5-shot", "train/UC-toollens-base_s0/best", True) in trained
  assert ("CD-toollens-toolbench-adapted", "train/native-toollens_s0/best", False) in trained
  assert {"UT-toollens", "UC-toollens-full", "sets-toollens", "native-toolbench"} <= {
      t for t, *_ in trained}
  out = tmp / "out" / "cells"
  assert json.loads((out / "dist-1000/toollens/bm25/result.json").read_text())["tools"] == 1000
  # The padded model trains on the native model's queries over the library the setting scores.
  assert ("padded-toollens-1000", None, False) in trained
  padded = load_dataset(f"beir:{tmp / 'out' / 'cd_data' / 'data_toollens_m3_padded1000'}")
  native = load_dataset(f"beir:{tmp / 'out' / 'cd_data' / 'data_toollens_m3'}")
  assert len(padded.tools) == 1000 and padded.tools.ids[:len(native.tools)] == native.tools.ids
  assert padded.split("train") == native.split("train")
  doc = json.loads((tmp / "res" / "t.json").read_text())
  assert doc["provenance"]["command"].startswith("python -m benchmarks.paper_tables --table 3")
  by = {(d["setting"], d["data"]): d for d in doc["tables"]}
  comp = lambda s, d="toollens", r="hyset": by[(s, d)]["rows"][r]["metrics"]["comp@5"]["mean"]
  assert by[("UC-5", "toollens")]["derived"]["hyset"]["value"] == pytest.approx(
      comp("UC-5") / comp("UC-full"))
  # One seed: the share over the pooled queries is the share of the means.
  uc5 = by[("UC-5", "toollens")]["derived"]["hyset"]
  assert uc5["pooled"] == pytest.approx(uc5["value"]) and "pooled per query" in uc5["text"]
  cd = ("CD", "toollens:toolbench")
  assert by[cd]["derived"]["hyset"]["value"] == pytest.approx(
      comp(*cd) / comp(*cd, "hyset-in-domain"))
  assert by[cd]["derived"]["hyset-in-domain"]["value"] == pytest.approx(
      comp(*cd, "hyset-in-domain") / comp(*cd, "bm25"))
  dist = by[("dist-1000", "toollens")]["derived"]
  assert dist["hyset-padded"]["value"] == pytest.approx(
      100 * (comp("dist-1000", r="hyset-padded") - comp("dist-base")))
  assert "hyset" in dist
  sets = by[("sets", "toollens")]
  assert sets["vs_best"]["comp@5"]["best"] == "bm25"
  assert comp("sets", r="bm25") == 0 and sets["derived"]["hyset"] == {"text": "n/a",
                                                                      "value": None}
  assert by[("UC-5", "toollens")]["rows"]["hyset"]["metrics"] != by[("UC-0", "toollens")][
      "rows"]["hyset"]["metrics"]                          # the adapted model was scored
  # Where the labels reach: the shots name some held-out tools, the base none, full all; the
  # two parts of COMP@5 add up to the row's, and the ceiling is against UC-full's HYSET.
  # (The first 60 test queries' tools are all held out; the shots name none of them:
  # test_labels below has both kinds.)
  lab = {s: by[(s, "toollens")]["labels"]["tools"] for s in ("UC-0", "UC-5", "UC-full")}
  assert lab["UC-0"]["labelled"] == 0 and lab["UC-full"]["labelled"] == 1
  assert lab["UC-5"]["rows"]["hyset"]["unlabelled"] == pytest.approx(comp("UC-5"))
  assert lab["UC-0"]["rows"]["bm25"]["labelled"] is None
  top = lab["UC-0"]["ceiling"]
  assert top["share"] == pytest.approx(max(lab["UC-0"]["rows"][k]["unlabelled"]
                                           for k in ("hyset", "bm25")) / comp("UC-full"))
  assert "ceiling" not in lab["UC-full"] and 0 < lab["UC-5"]["ceiling"]["share"]
  # A set no shot has is new to the k-shot model too: never more seen sets than named tools.
  sets = {s: by[(s, "toollens")]["labels"]["sets"] for s in ("UC-0", "UC-5", "UC-full")}
  assert sets["UC-0"]["labelled"] == 0 and sets["UC-5"]["labelled"] <= lab["UC-5"]["labelled"]
  assert "ceiling" in sets["UC-5"] and "ceiling" not in sets["UC-full"]
  assert sets["UC-5"]["seeds"] == [0] and sets["UC-5"]["queries"] == lab["UC-5"]["queries"]
  md = (tmp / "res" / "t.md").read_text()
  assert "## Held-out categories: what the labels reach" in md
  assert "; CD pairs toollens:toolbench; seeds" in md
  for figure in ("recovers 93.2%", "retains 79.9%", "+13.1% COMP@5", "stable (no figure"):
    assert figure in md
  # Cells of cut test splits (--max-queries) do not stand for the full run's: the estimate is
  # the one from the earlier measurements alone.
  assert "Estimated the full Table 3" in md and doc["estimate"]["measured_trainings"] == []
  assert doc["estimate"]["total_s"] == t3.estimate(tmp / "nothing")["total_s"]
  assert doc["estimate"]["total_s"] > 3 * t3.REF_TRAIN_S["toollens"]
  assert (tmp / "res" / "t.png").stat().st_size > 0

  # A rerun skips every finished cell; a cut prediction file makes its cell run again.
  pred = out / "sets/toollens/bm25/s0/pred.test.jsonl"
  pred.write_text("".join(pred.read_text().splitlines(keepends=True)[:-1]))
  capsys.readouterr()
  assert paper_tables.main(argv + ["--force"]) == 0
  log = capsys.readouterr().out
  assert "1 to run" in log and "UT/toollens/hyset/s0: finished before, skipped" in log
  assert len(pred.read_text().splitlines()) == 60

  # --report-only: the tables of the finished cells; the selected ones not run (seed 1 here)
  # are named, and nothing runs or trains.
  before = len(trained)
  assert paper_tables.main(argv + ["--force", "--report-only", "--seeds", "0", "1"]) == 0
  assert len(trained) == before and not (out / "UT/toollens/hyset/s1").exists()
  doc = json.loads((tmp / "res" / "t.json").read_text())
  assert "UT/toollens/hyset/s1" in doc["not_run"] and doc["ran_s"] == {}
  assert {(d["setting"], d["data"]) for d in doc["tables"]} == set(by)
  assert "Not run yet, so not in the tables" in (tmp / "res" / "t.md").read_text()
  # A report without a CD setting names no CD pairs.
  assert paper_tables.main(argv + ["--force", "--report-only", "--settings", "UT"]) == 0
  assert "; CD pairs" not in (tmp / "res" / "t.md").read_text()
  capsys.readouterr()
  assert paper_tables.main(argv + ["--force", "--report-only", "--out", str(tmp / "none")]) == 2
  assert "none of the" in capsys.readouterr().err


def test_labels_split_comp_at_5_by_what_training_names(tmp_path):
  from hyset_jax.data.types import Query
  train = [Query("a", "x", ("t1", "t2")), Query("b", "y", ("t3",))]
  test = (Query("c", "u", ("t1", "t3")), Query("d", "v", ("t1", "t9")), Query("e", "w", ("t2",)))
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(t3, "fit_data", lambda spec: (tuple(train), ()))
    masks = t3.labelled("beir:x", test)
  named = masks["tools"]
  assert named.tolist() == [True, False, True]
  # Only query 2's set ({t2}) is one training has; query 0's tools are named, its set is new.
  assert masks["sets"].tolist() == [False, False, False] and set(masks) == set(t3.LABEL_KINDS)
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(t3, "fit_data", lambda spec: (tuple(train) + (Query("f", "z", ("t2",)),), ()))
    assert t3.labelled("beir:x", test)["sets"].tolist() == [False, False, True]
  rows = {"hyset": np.array([1.0, 0.0, 0.0]), "bm25": np.array([0.0, 1.0, 1.0])}
  got = t3.labels(rows, named)
  assert got["labelled"] == pytest.approx(2 / 3) and got["queries"] == 3
  assert got["rows"]["hyset"] == {"labelled": 0.5, "unlabelled": 0.0}
  assert got["rows"]["bm25"] == {"labelled": 0.5, "unlabelled": 1.0}
  # Full supervision answers queries 0 and 2 (its labelled ones: 2) and not 1; BM25 answers
  # the unlabelled one: (2 + 1) / 2.
  full = np.array([1.0, 0.0, 1.0])
  top = t3.ceiling(named, rows, full)
  assert top == {"share": 1.5, "best_unlabelled": "bm25"}
  assert t3.ceiling(named, {}, np.zeros(3)) is None


def test_uc_pooled_concatenates_every_seed_in_order(monkeypatch):
  """Each seed its own split: its queries, masks and per-query COMP@5 follow one another in
  seed order; a row without a cell at every seed is left out."""
  import types
  from benchmarks import paper_report
  from hyset_jax.data.types import Query
  tests = {0: [Query("a", "x", ("t1",)), Query("b", "y", ("t2",))], 1: [Query("c", "z", ("t3",))]}
  monkeypatch.setattr(t3, "prepare", lambda out, s, d, seed, m: types.SimpleNamespace(
      test=tests[seed]))
  monkeypatch.setattr(t3, "uc_settings", lambda out, d, seed: {"5-shot": {"spec": f"s{seed}"}})
  monkeypatch.setattr(t3, "labelled", lambda spec, qs: {
      "tools": np.array([q.id != "b" for q in qs]), "sets": np.array([q.id == "c" for q in qs])})
  score = {"a": 1.0, "b": 0.0, "c": 1.0}
  monkeypatch.setattr(paper_report, "_per_query", lambda out, cell, split, qs: {
      "comp@5": np.array([score[q.id] * (cell.method == "hyset") for q in qs])})
  cells = [t3.Cell("UC-5", "ultratool", m, s) for m in ("hyset", "bm25") for s in (1, 0)][:-1]
  got = t3.uc_pooled(cells, pathlib.Path("x"), "UC-5", "ultratool", 0)
  assert got.seeds == (0, 1)
  assert got.masks["tools"].tolist() == [True, False, True]
  assert got.masks["sets"].tolist() == [False, False, True]
  assert list(got.comp5) == ["hyset"] and got.comp5["hyset"].tolist() == [1.0, 0.0, 1.0]


def test_bad_pair_is_a_user_error(stand_in, capsys):
  argv, _, _ = stand_in
  assert paper_tables.main(argv + ["--pairs", "toollens:nowhere"]) == 2
  assert "--pairs 'toollens:nowhere'" in capsys.readouterr().err


def test_estimate_takes_a_measured_cell_over_the_reference(tmp_path):
  # ToolLens' UT cells only (the full plan's UltraTool cells would take the measured scoring too).
  plan = t3.build_plan(["UT"], ["toollens"], [], list(t3.METHODS), [0, 1, 2])
  ref = t3.estimate(tmp_path, plan)["per_setting_s"]["UT"]
  cell = tmp_path / "cells" / "UT" / "toollens" / "hyset" / "s0"
  cell.mkdir(parents=True)
  result = {"complete": True, "wall_s": 230.0, "tools": 464,
            "spec": {"setting": "UT", "data": "toollens", "method": "hyset", "seed": 0,
                     "overrides": ["train.num_steps=60"], "max_queries": 0},
            "trainings": [{"tag": "UT-toollens", "preset": "toollens", "kind": "full",
                           "steps": 60, "wall_s": 200.0, "workdir": str(tmp_path / "gone")}]}
  (cell / "result.json").write_text(json.dumps(result))
  # No step rate logged (no workdir): the training counts as measured, 200 s per seed, and
  # the cell's 30 s of scoring replaces the reference's; the baselines keep theirs.
  got = t3.estimate(tmp_path, plan)["per_setting_s"]["UT"]
  ref_hyset = 3 * (t3.REF_TRAIN_S["toollens"] + t3.REF_SCORE_S)
  assert got == pytest.approx(ref - ref_hyset + 3 * (200.0 + 30.0), abs=0.2)
  result["spec"]["max_queries"] = 60          # a cut test split stands for nothing
  (cell / "result.json").write_text(json.dumps(result))
  assert t3.estimate(tmp_path, plan)["per_setting_s"]["UT"] == ref


def test_an_unmeasured_padded_training_scales_the_largest_measured_one(tmp_path):
  plan = [t3.Cell("dist-100000", "toollens", "hyset-padded", 0)]
  ref = t3.estimate(tmp_path, plan)["per_setting_s"]["dist-100000"]
  cell = tmp_path / "cells" / "dist-10000" / "toollens" / "hyset-padded" / "s0"
  cell.mkdir(parents=True)
  cell.joinpath("result.json").write_text(json.dumps(
      {"complete": True, "wall_s": 1400.0, "tools": 10_000,
       "spec": {"setting": "dist-10000", "data": "toollens", "method": "hyset-padded",
                "seed": 0, "overrides": [], "max_queries": 0},
       "trainings": [{"tag": "padded-toollens-10000", "preset": "toollens", "kind": "full",
                      "steps": 1000, "wall_s": 1380.0, "workdir": str(tmp_path / "gone")}]}))
  got = t3.estimate(tmp_path, plan)["per_setting_s"]["dist-100000"]
  # The training 10× the measured 1,380 s in place of the reference's.
  assert got - ref == pytest.approx(10 * 1380.0 - t3.reference_training_s(
      "padded-toollens-100000", 1000), abs=0.2)


def test_adapt_set_reaches_the_adaptations_only(tmp_path, monkeypatch):
  from benchmarks import retrieval_quality
  calls = []

  def run_hyset(preset, variant, overrides, seed, runs, tag):
    calls.append((overrides, runs))
    return {"workdir": str(runs / f"{tag}_{variant}_s{seed}")}

  monkeypatch.setattr(retrieval_quality, "run_hyset", run_hyset)
  parse = lambda *a: t3.with_defaults(t3.make_parser().parse_args(list(a)))
  args = parse("--adapt-set", "train.learning_rate=0.0003")
  base, _ = t3.train(tmp_path, args, "ultratool", "beir:b", 0, "UC-ultratool-base")
  t3.train(tmp_path, args, "ultratool", "beir:k", 0, "UC-ultratool-5-shot",
           init=base / "best", last=True)
  t3.train(tmp_path, args, "ultratool", "beir:c", 0, "CD-ultratool-seal_tools-adapted",
           init=base / "best")
  (base_sets, base_runs), (shot_sets, shot_runs), (cd_sets, cd_runs) = calls
  assert not any(o.startswith(("train.learning_rate", "train.init_model")) for o in base_sets)
  # The option comes after the recipe's own overrides, so it wins over them.
  assert shot_sets[-1] == cd_sets[-1] == "train.learning_rate=0.0003"
  assert f"train.init_model={(base / 'best').resolve()}" in shot_sets
  assert "train.keep=last" in shot_sets and "train.keep=last" not in cd_sets
  # The base is the preset's, shared with runs without the option; each recipe has a folder
  # of its own (a workdir refuses another config).
  assert base_runs == tmp_path / "train" / "preset" and len({base_runs, shot_runs, cd_runs}) == 3
  # Only the adapted HYSET cells are made stale by it (or by a new recipe): the rest of a
  # finished run is reused.
  plain = parse()
  for setting, method, stale in (("UC-5", "hyset", True), ("CD+target", "hyset", True),
                                 ("UC-5", "bm25", False), ("UC-0", "hyset", False),
                                 ("CD+target", "hyset-in-domain", False)):
    cell = t3.Cell(setting, "ultratool", method, 0)
    assert (t3.cell_spec(cell, args) != t3.cell_spec(cell, plain)) == stale, (setting, method)


def test_the_references_cover_every_baseline_and_data_set():
  # The estimate reads them directly: a baseline or data set added without one fails here.
  from benchmarks import cross_domain, paper_cells
  assert set(t3.REF_BASELINE_S) == set(paper_cells.BASELINES)
  assert set(t3.REF_TRAIN_S) == set(cross_domain.DATASETS)
  assert set(t3.REF_PADDED_S) == set(t3.DIST_SIZES)
