"""`hyset bench enumerate` smoke test: it runs and its numbers are consistent."""
import json
import math

from hyset_jax import cli, enumeration
from hyset_jax.benchmarking import references, workload


def test_bench_enumerate_json_is_consistent(tmp_path, capsys):
  out = tmp_path / "bench.json"
  assert cli.main(["bench", "enumerate", "--batch", "8", "--repeats", "2", "--check",
                   "--json", str(out)]) == 0
  r = json.loads(out.read_text())
  assert r["status"] == "ok" and r["impl"] == "jax" and r["method"] == enumeration.DEFAULT_METHOD
  assert (r["k_pool"], r["max_size"], r["batch"], r["dim"]) == (20, 5, 8, 0)
  assert r["n_subsets"] == 21699 == enumeration.count_subsets(20, 5)
  assert r["queries_per_s"] > 0 and r["subsets_per_s"] > 0
  assert math.isclose(r["queries_per_s"] * r["time_s"], 8, rel_tol=1e-9)
  assert math.isclose(r["subsets_per_s"], r["queries_per_s"] * 21699, rel_tol=1e-9)
  assert r["max_abs_diff_vs_numpy"] < 1e-4
  assert r["compile_s"] > 0 and r["peak_bytes"] > 0
  assert "queries/s" in capsys.readouterr().out


def test_references_agree_with_each_other():
  w = workload.make_workload(6, 3, batch=3, dim=4, seed=1)
  want = references.numpy_gather(w)
  for got in (references.numpy_matmul(w), references.naive(w)):
    assert abs(got - want).max() < 1e-5
  assert workload.min_flops_per_query(20, 5) == 187302


def test_predict_method_flag_mirrors_the_scorers():
  from hyset_jax.commands import predict
  assert set(predict.METHODS) == set(enumeration.SCORERS)
  parser = cli.build_parser()
  args = parser.parse_args(["predict", "--model", "m", "--query-embeddings", "q.npy",
                            "--out", "o.jsonl"])
  assert args.method == enumeration.DEFAULT_METHOD
