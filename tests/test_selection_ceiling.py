"""benchmarks/selection_ceiling.py: every post-θ candidate of a finished run on validation and
test, and the three picks."""
import json

import pytest

from benchmarks import selection_ceiling
from hyset_jax import config as config_lib
from hyset_jax.model.lexical import WEIGHTS
from hyset_jax.model.terms.row_blend import ALPHAS
from hyset_jax.training import train


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("ceiling") / "run"
  config = config_lib.resolve("tiny", ["train.num_steps=20", "model.row_blend=true",
                                       "model.lexical=true"])
  train.train_and_evaluate(config, workdir, progress=False, num_devices=1)
  return workdir


def test_every_candidate_scored_and_the_picks_are_their_maxima(finished, tmp_path):
  out = tmp_path / "ceiling.json"
  assert selection_ceiling.main(["--workdir", str(finished), "--out", str(out)]) == 0
  doc = json.loads(out.read_text())
  assert doc["provenance"]["command"].startswith("python -m benchmarks.selection_ceiling")
  (run,) = doc["runs"]
  rows = run["candidates"]
  # α ∈ {1} ∪ ALPHAS, β ∈ {0} ∪ WEIGHTS, and each with every ranking it allows.
  grids = {" ".join(k.split()[:2]) for k in rows}
  assert len(grids) == (1 + len(ALPHAS)) * (1 + len(WEIGHTS))
  assert {k.split()[2] for k in rows} >= {"greedy", "logit"}
  v, t, b = run["validation pick"], run["test pick"], run["best test comp@5"]
  assert rows[v]["validation"] == max(r["validation"] for r in rows.values())
  assert rows[t]["test"] == max(r["test"] for r in rows.values())
  assert rows[b]["test comp@5"] >= max(rows[v]["test comp@5"], rows[t]["test comp@5"])
  assert all(0 <= r[k] <= 1 for r in rows.values() for k in r)
  md = out.with_suffix(".md").read_text()
  assert f"| run | {v} |" in md.replace(finished.name, "run")
  # An existing result is not replaced without --force; a non-.json name is refused.
  assert selection_ceiling.main(["--workdir", str(finished), "--out", str(out)]) != 0
  assert selection_ceiling.main(["--workdir", str(finished), "--out", str(tmp_path / "x.md")]) != 0


def test_a_workdir_that_is_not_a_finished_run_is_named(tmp_path, capsys):
  (tmp_path / "empty").mkdir()
  assert selection_ceiling.main(["--workdir", str(tmp_path / "empty"),
                                 "--out", str(tmp_path / "c.json")]) != 0
  err = capsys.readouterr().err
  assert "empty: no config.json" in err and "Traceback" not in err
  assert not (tmp_path / "c.json").exists()
