"""benchmarks/paper_tables.py: the plan, resuming (a finished cell skipped, a partial one
redone, a changed setting rerun) and the tables with their significance columns, on real
prediction files of a small plan over ToolLens' first test queries."""
from __future__ import annotations

import json

import pytest

from benchmarks import paper_cells as pc
from benchmarks import paper_report, paper_tables
from hyset_jax.retrievers import BM25Retriever
from hyset_jax.retrievers.base import Retrieval


class _Shifted:
  """A stand-in for a trained HYSET (no training in a unit test): BM25's ranking, shifted by one
  on every other query, and a two-tool set — real predictions that differ from BM25's."""

  def __init__(self, tools):
    self.bm25 = BM25Retriever(tools)

  def retrieve(self, queries, depth):
    got = self.bm25.retrieve(queries, depth + 1)
    rankings = [r[1:depth + 1] if i % 2 else r[:depth] for i, r in enumerate(got.rankings)]
    return Retrieval(rankings, [r[:2] for r in rankings])


@pytest.fixture
def small(tmp_path, monkeypatch, shared_data):
  real = pc.build_retriever
  runs: list[str] = []

  def build(cell, out, overrides, dataset):
    runs.append(cell.name)
    if cell.trains_hyset:
      return _Shifted(dataset.tools), {"steps": 0}
    return real(cell, out, overrides, dataset)

  monkeypatch.setattr(pc, "build_retriever", build)
  (tmp_path / "res").mkdir()
  argv = ["--datasets", "toollens", "--methods", "hyset", "bm25", "--seeds", "0",
          "--set", "data.max_eval_queries=200", "--out", str(tmp_path / "out"),
          "--results", str(tmp_path / "res"), "--tag", "t", "--resamples", "500"]
  return argv, runs, tmp_path


def test_plan_orders_seeds_ablations_and_carried_cells():
  plan = pc.build_plan(["toollens", "ultratool", "seal_tools", "toolbench"],
                       ["hyset", "hyset-noset", "bm25", "linear-head"], [0, 1, 2], True)
  names = [c.name for c in plan]
  assert names[:6] == ["toollens/hyset/s0", "toollens/hyset/s1", "toollens/hyset/s2",
                       "toollens/bm25", "toollens/linear-head/s0", "toollens/linear-head/s1"]
  assert "toollens/hyset-noset/s0" in names and "toollens/hyset-noset/s1" not in names
  assert {"toolbench/hyset_from_toollens/s2", "toolbench/bm25",
          "seal_tools/hyset_from_ultratool/s0", "ultratool/hyset_from_seal_tools/s1"} <= set(names)
  assert not any(n.startswith("toolbench/linear-head") for n in names)  # no training split
  assert len(names) == len(set(names))
  assert not any(c.source for c in pc.build_plan(["toollens", "toolbench"], ["hyset"], [0],
                                                 False))


def test_tables_resume_and_significance(small, capsys):
  argv, runs, tmp = small
  assert paper_tables.main(argv) == 0
  assert runs == ["toollens/hyset/s0", "toollens/bm25"]
  md = (tmp / "res" / "t.md").read_text()
  assert paper_report.SIG_COLUMN in md and paper_report.MCNEMAR_COLUMN in md
  assert "HYSET vs the best baseline on comp@5: BM25" in md
  assert (tmp / "res" / "t.png").stat().st_size > 0
  doc = json.loads((tmp / "res" / "t.json").read_text())
  assert doc["provenance"]["command"].startswith("python -m benchmarks.paper_tables")
  (table,) = doc["tables"]["table1"]
  bm25 = table["rows"]["bm25"]
  assert bm25["metrics"]["comp@5"]["std"] is None and bm25["seeds"] == [None]

  # The table's significance is `hyset compare`'s on the same two prediction files.
  from hyset_jax import cli
  cells = tmp / "out" / "cells" / "toollens"
  out = tmp / "compare.json"
  assert cli.main(["compare", str(cells / "bm25" / "pred.test.jsonl"),
                   str(cells / "hyset" / "s0" / "pred.test.jsonl"), "--data",
                   f"beir:{pc.shared_data('toollens')}", "--split", "test", "--resamples",
                   "500", "--out", str(out)]) == 0
  ref = json.loads(out.read_text())["metrics"]
  assert ref["comp@5"]["a"] == pytest.approx(bm25["metrics"]["comp@5"]["mean"])
  for key in ("diff", "ci_low", "ci_high", "mcnemar_p"):
    assert bm25["vs_hyset"]["comp@5"][key] == pytest.approx(ref["comp@5"][key])
  assert bm25["vs_hyset"]["set_exact"]["mcnemar_p"] == pytest.approx(
      ref["set_exact"]["mcnemar_p"])

  # Rerun: the finished HYSET cell is skipped; a partial BM25 cell (a prediction file cut
  # short) is redone; the tables need --force.
  pred = cells / "bm25" / "pred.test.jsonl"
  pred.write_text("".join(pred.read_text().splitlines(keepends=True)[:-1]))
  runs.clear()
  assert paper_tables.main(argv) == 2                      # t.md exists
  assert paper_tables.main(argv + ["--force"]) == 0
  assert runs == ["toollens/bm25"]
  assert "toollens/hyset/s0: finished before, skipped" in capsys.readouterr().out
  assert len(pred.read_text().splitlines()) == 200

  # A cell whose result.json never got written (killed before the end) is redone too, and a
  # changed setting makes every cell stale.
  (cells / "hyset" / "s0" / "result.json").unlink()
  runs.clear()
  assert paper_tables.main(argv + ["--force"]) == 0
  assert runs == ["toollens/hyset/s0"]
  runs.clear()
  assert paper_tables.main(argv + ["--force", "--set", "train.num_steps=7"]) == 0
  assert runs == ["toollens/hyset/s0", "toollens/bm25"]


def test_bad_selection_is_a_user_error(small, capsys):
  argv, _, _ = small
  assert paper_tables.main(["--datasets", "toolbench", "--methods", "linear-head"]
                           + argv[5:]) == 2
  assert "no cell to run" in capsys.readouterr().err
