"""``hyset compare`` and :mod:`hyset_jax.evaluation.significance`: the statistics against hand-computed
cases and scipy, and the command end to end on small files."""
from __future__ import annotations

import json
import math
import pathlib

import numpy as np
import pytest
from scipy import stats

from hyset_jax import cli
from hyset_jax.evaluation import metrics, significance
from hyset_jax.data import splits
from hyset_jax.data.specs import load_dataset


# ----------------------------------------------------------------------------- McNemar


def _binary(a_only: int, b_only: int, both: int = 4, neither: int = 3):
  a = [1] * a_only + [0] * b_only + [1] * both + [0] * neither
  b = [0] * a_only + [1] * b_only + [1] * both + [0] * neither
  return np.array(a, float), np.array(b, float)


def test_mcnemar_hand_computed():
  # 10 vs 2 discordant: p = 2 (C(12,0) + C(12,1) + C(12,2)) / 2^12 = 158 / 4096.
  r = significance.mcnemar_exact(*_binary(10, 2))
  assert (r.a_only, r.b_only) == (10, 2)
  assert math.isclose(r.p_value, 158 / 4096, rel_tol=1e-12)
  # 1 vs 0: a single discordant query can never be significant.
  assert significance.mcnemar_exact(*_binary(1, 0)).p_value == 1.0
  assert significance.mcnemar_exact(*_binary(0, 0)).p_value == 1.0


@pytest.mark.parametrize("a_only,b_only", [(3, 0), (10, 2), (7, 7), (0, 5), (25, 40), (6, 5),
                                           (1, 19), (120, 80)])
def test_mcnemar_matches_scipy_binomtest(a_only, b_only):
  r = significance.mcnemar_exact(*_binary(a_only, b_only))
  want = stats.binomtest(min(a_only, b_only), a_only + b_only, 0.5).pvalue
  assert math.isclose(r.p_value, want, rel_tol=1e-9, abs_tol=1e-15)
  # Swapping A and B swaps the counts, not the p-value.
  s = significance.mcnemar_exact(*reversed(_binary(a_only, b_only)))
  assert (s.a_only, s.b_only, s.p_value) == (b_only, a_only, r.p_value)


def test_mcnemar_rejects_non_binary_and_unpaired():
  with pytest.raises(ValueError, match="binary"):
    significance.mcnemar_exact([0.5, 1.0], [1.0, 1.0])
  with pytest.raises(ValueError, match="same shape"):
    significance.mcnemar_exact([1.0, 0.0], [1.0])


# ----------------------------------------------------------------------------- bootstrap


def test_bootstrap_identical_inputs_give_a_zero_width_interval():
  a = np.random.default_rng(0).random(300)
  r = significance.paired_bootstrap(a, a.copy())
  assert (r.diff, r.low, r.high) == (0.0, 0.0, 0.0)


def test_bootstrap_constant_shift_is_exact():
  a = np.random.default_rng(1).random(200)
  r = significance.paired_bootstrap(a, a + 0.25, resamples=500)
  assert math.isclose(r.diff, 0.25) and math.isclose(r.low, 0.25) and math.isclose(r.high, 0.25)


def test_bootstrap_matches_a_plain_loop():
  """The count-matrix product is the mean of d over the drawn indices, nothing else."""
  rng = np.random.default_rng(2)
  a, b = rng.random(40), rng.random(40)
  r = significance.paired_bootstrap(a, b, resamples=300, seed=7)
  idx = np.random.default_rng(7).integers(0, 40, size=(300, 40))
  means = np.array([(b - a)[row].mean() for row in idx])
  low, high = np.quantile(means, [0.025, 0.975])
  assert math.isclose(r.low, low, abs_tol=1e-12) and math.isclose(r.high, high, abs_tol=1e-12)
  assert math.isclose(r.diff, float((b - a).mean()))


def test_bootstrap_contains_the_true_difference():
  rng = np.random.default_rng(3)
  a = (rng.random(2000) < 0.5).astype(float)
  b = (rng.random(2000) < 0.6).astype(float)
  r = significance.paired_bootstrap(a, b, seed=0)
  assert r.low < 0.1 < r.high and r.low < r.diff < r.high
  assert 0.04 < r.high - r.low < 0.08  # about 2 · 1.96 · sqrt(0.49 / 2000)


def test_bootstrap_coverage_is_near_nominal():
  """Over many data sets drawn with a known difference, the 95% interval holds it ~95%."""
  rng = np.random.default_rng(4)
  hits = 0
  for trial in range(200):
    a = rng.normal(0.0, 1.0, 150)
    b = a + 0.3 + rng.normal(0.0, 1.0, 150)  # paired: a true difference of 0.3
    r = significance.paired_bootstrap(a, b, resamples=1000, seed=trial)
    hits += r.low <= 0.3 <= r.high
  assert 0.90 <= hits / 200 <= 0.99


def test_bootstrap_is_seeded_and_shares_resamples_across_columns():
  rng = np.random.default_rng(5)
  a, b = rng.random((100, 3)), rng.random((100, 3))
  r = significance.paired_bootstrap(a, b, resamples=400, seed=11)
  again = significance.paired_bootstrap(a, b, resamples=400, seed=11)
  other = significance.paired_bootstrap(a, b, resamples=400, seed=12)
  assert np.array_equal(r.low, again.low) and not np.array_equal(r.low, other.low)
  for j in range(3):
    col = significance.paired_bootstrap(a[:, j], b[:, j], resamples=400, seed=11)
    assert math.isclose(col.low, r.low[j]) and math.isclose(col.high, r.high[j])


def test_bootstrap_argument_checks():
  with pytest.raises(ValueError, match="no queries"):
    significance.paired_bootstrap([], [])
  with pytest.raises(ValueError, match="resamples"):
    significance.paired_bootstrap([1.0], [0.0], resamples=0)
  with pytest.raises(ValueError, match="finite"):
    significance.paired_bootstrap([np.nan], [0.0])


def test_per_query_metrics_average_to_evaluate():
  rankings = [["a", "b", "c", "d", "e"], ["x", "a", "y", "b", "z"], ["c"]]
  gold = [{"a", "b"}, {"a", "b", "c"}, {"c"}]
  sets = [["a", "b"], ["a"], ["c", "d"]]
  per_query = significance.per_query_metrics(rankings, gold, sets)
  want = metrics.evaluate(rankings, gold, sets)
  assert list(per_query) == [k for k in metrics.METRIC_KEYS if k != "n_queries"]
  for key, values in per_query.items():
    assert values.shape == (3,) and math.isclose(values.mean(), want[key]), key


# ----------------------------------------------------------------------------- the command


def write_beir(root: pathlib.Path) -> pathlib.Path:
  """10 tools; 40 queries, q<i> needs tool_<i % 10> and tool_<(i + 1) % 10>; 30 train, 10 test."""
  (root / "qrels").mkdir(parents=True)
  (root / "corpus.jsonl").write_text("".join(
      json.dumps({"_id": f"tool_{i}", "title": "", "text": f"tool {i}"}) + "\n"
      for i in range(10)))
  (root / "queries.jsonl").write_text("".join(
      json.dumps({"_id": f"q{i}", "text": f"do {i}"}) + "\n" for i in range(40)))
  for split, rows in (("train", range(30)), ("test", range(30, 40))):
    (root / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"q{i}\ttool_{i % 10}\t1\nq{i}\ttool_{(i + 1) % 10}\t1\n" for i in rows))
  return root


def gold_of(i: int) -> list[str]:
  return sorted({f"tool_{i % 10}", f"tool_{(i + 1) % 10}"})


def write_predictions(path: pathlib.Path, right: set[int], ids=range(30, 40)) -> pathlib.Path:
  """Predictions: the gold set (and it ranked first) for queries in ``right``, else a miss."""
  lines = []
  for i in ids:
    if i in right:
      ranking, chosen = gold_of(i) + ["tool_9", "tool_8"], gold_of(i)
    else:
      ranking, chosen = [f"tool_{(i + 5) % 10}", f"tool_{(i + 6) % 10}"], [f"tool_{(i + 5) % 10}"]
    lines.append(json.dumps({"query_id": f"q{i}", "set": chosen, "set_score": 1.0,
                             "ranking": ranking, "shortlist": ranking}))
  path.write_text("\n".join(lines) + "\n")
  return path


@pytest.fixture
def files(tmp_path):
  beir = write_beir(tmp_path / "beir")
  a = write_predictions(tmp_path / "a.jsonl", right={30, 31, 32, 33})
  b = write_predictions(tmp_path / "b.jsonl", right={30, 31, 34, 35, 36, 37, 38})
  return {"data": f"beir:{beir}", "a": a, "b": b, "dir": tmp_path}


def run_cli(capsys, *argv) -> tuple[int, str, str]:
  rc = cli.main([str(x) for x in argv])
  captured = capsys.readouterr()
  return rc, captured.out, captured.err


def test_compare_end_to_end(files, capsys):
  out = files["dir"] / "cmp.json"
  rc, stdout, err = run_cli(capsys, "compare", files["a"], files["b"], "--data", files["data"],
                            "--split", "test", "--out", out, "--resamples", "2000", "--seed", "3")
  assert rc == 0, err
  result = json.loads(out.read_text())
  assert (result["n_queries"], result["n_split_queries"], result["resamples"],
          result["seed"]) == (10, 10, 2000, 3)
  exact = result["metrics"]["set_exact"]
  # A right on 30-33, B on 30, 31, 34-38: A only 2, B only 5; McNemar p = 2 P[X ≤ 2 | 7].
  assert (exact["a"], exact["b"], exact["a_only"], exact["b_only"]) == (0.4, 0.7, 2, 5)
  assert math.isclose(exact["diff"], 0.3)
  assert math.isclose(exact["mcnemar_p"], 2 * (1 + 7 + 21) / 128)
  assert exact["ci_low"] <= 0.3 <= exact["ci_high"]
  assert set(result["metrics"]) == {k for k in metrics.METRIC_KEYS if k != "n_queries"}
  assert "mcnemar_p" in result["metrics"]["comp@5"]
  assert "mcnemar_p" not in result["metrics"]["recall@5"]
  # The printed table: percentages, the same numbers.
  row = next(line for line in stdout.splitlines() if line.startswith("set_exact"))
  assert row.split()[:4] == ["set_exact", "40.00", "70.00", "+30.00"]
  assert row.endswith("0.4531 (2 / 5)")
  # The output rules: no overwrite without --force.
  before = out.read_bytes()
  rc, _, err = run_cli(capsys, "compare", files["a"], files["b"], "--data", files["data"],
                       "--split", "test", "--out", out)
  assert rc == 2 and "already exists; pass --force" in err and out.read_bytes() == before
  rc, _, err = run_cli(capsys, "compare", files["a"], files["b"], "--data", files["data"],
                       "--split", "test", "--out", out, "--force")
  assert rc == 0, err


def test_identical_files_have_zero_differences(files, capsys):
  rc, stdout, err = run_cli(capsys, "compare", files["a"], files["a"], "--data", files["data"],
                            "--split", "test", "--out", files["dir"] / "same.json")
  assert rc == 0, err
  for key, row in json.loads((files["dir"] / "same.json").read_text())["metrics"].items():
    assert row["diff"] == row["ci_low"] == row["ci_high"] == 0.0, key
    if "mcnemar_p" in row:
      assert (row["a_only"], row["b_only"], row["mcnemar_p"]) == (0, 0, 1.0)


def test_validation_split_is_carved_like_eval(files, capsys):
  carved = splits.with_validation(load_dataset(files["data"])).split("validation")
  ids = [int(q.id[1:]) for q in carved]
  a = write_predictions(files["dir"] / "va.jsonl", right=set(ids[:1]), ids=ids)
  b = write_predictions(files["dir"] / "vb.jsonl", right=set(ids), ids=ids)
  rc, stdout, err = run_cli(capsys, "compare", a, b, "--data", files["data"], "--split",
                            "validation")
  assert rc == 0, err
  assert f"validation: {len(ids)} queries" in stdout


def test_part_of_the_split_is_scored_and_said_so(files, capsys):
  a = write_predictions(files["dir"] / "pa.jsonl", right={30}, ids=range(30, 35))
  b = write_predictions(files["dir"] / "pb.jsonl", right={31}, ids=range(30, 35))
  rc, stdout, err = run_cli(capsys, "compare", a, b, "--data", files["data"], "--split", "test")
  assert rc == 0 and "cover 5 of the 10 queries" in err and "5 queries of 10" in stdout


def _edit(path: pathlib.Path, line: int, text: str | None) -> None:
  """Replace line ``line`` (1-based) of ``path``, or delete it (None)."""
  lines = path.read_text().splitlines()
  if text is None:
    del lines[line - 1]
  else:
    lines[line - 1] = text
  path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("case,needle", [
    ("missing in B", "b.jsonl: no prediction for 1 queries that {a} has, e.g. 'q32' ({a}:3)"),
    ("extra in B", "a.jsonl: no prediction for 1 queries that {b} has, e.g. 'q32' ({b}:3)"),
    ("not in split", "b.jsonl:2 (query 'q5'): not a query of split 'test' of"),
    ("malformed", "b.jsonl:4: malformed JSON"),
    ("duplicate", "duplicate prediction id 'q30': first at {b}:1 (query 'q30'), again at {b}:2"),
    ("set of numbers", "b.jsonl:1 (query 'q30'): field 'set' should be a list of tool ids"),
    ("no ranking", "b.jsonl:1 (query 'q30'): missing field 'ranking'"),
    ("no query id", "b.jsonl:1: missing field 'query_id'"),
    ("empty file", "b.jsonl: no predictions"),
    ("missing file", "b.jsonl: missing prediction file"),
])
def test_bad_prediction_files(files, capsys, case, needle):
  a, b = files["a"], files["b"]
  if case == "missing in B":
    _edit(b, 3, None)
  elif case == "extra in B":
    _edit(a, 3, None)
  elif case == "not in split":
    _edit(b, 2, json.dumps({"query_id": "q5", "set": [], "ranking": []}))
  elif case == "malformed":
    _edit(b, 4, '{"query_id": "q33", "set": [')
  elif case == "duplicate":
    _edit(b, 2, b.read_text().splitlines()[0])
  elif case == "set of numbers":
    _edit(b, 1, json.dumps({"query_id": "q30", "set": [1, 2], "ranking": []}))
  elif case == "no ranking":
    _edit(b, 1, json.dumps({"query_id": "q30", "set": []}))
  elif case == "no query id":
    _edit(b, 1, json.dumps({"set": [], "ranking": []}))
  elif case == "empty file":
    b.write_text("\n")
  elif case == "missing file":
    b.unlink()
  out = files["dir"] / "cmp.json"
  rc, stdout, err = run_cli(capsys, "compare", a, b, "--data", files["data"], "--split", "test",
                            "--out", out)
  assert rc == 2 and err.count("error:") == 1 and "Traceback" not in err, err
  assert needle.format(a=a, b=b) in err, err
  assert not out.exists()


def test_bad_arguments(files, capsys):
  args = [files["a"], files["b"], "--data", files["data"]]
  rc, _, err = run_cli(capsys, "compare", *args, "--split", "dev")
  assert rc == 2 and "has no split 'dev'" in err
  rc, _, err = run_cli(capsys, "compare", *args, "--split", "test", "--out", files["a"],
                       "--force")
  assert rc == 2 and str(files["a"]) in err and err.count("error:") == 1
  assert files["a"].read_text().count("\n") == 10  # the input survives
  rc, _, err = run_cli(capsys, "compare", *args, "--split", "test", "--out",
                       files["dir"] / "no_such_dir" / "x.json")
  assert rc == 2 and "does not exist" in err
  with pytest.raises(SystemExit) as e:
    cli.main(["compare", *map(str, args), "--split", "test", "--resamples", "0"])
  assert e.value.code == 2
