"""``hyset predict`` end to end on hand-written hyset/1 model directories, good and bad."""
import json
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import save_file

from hyset_jax import cli
from hyset_jax.io import modeldir

import reference_impl as ref

N, D, M = 24, 6, 3


def write_model_dir(path, tensors=None, manifest=None, seed=0):
  """A model directory as another stack would write it: plain safetensors + JSON."""
  rng = np.random.default_rng(seed)
  z = rng.normal(size=(N, D)).astype(np.float32)
  z /= np.linalg.norm(z, axis=1, keepdims=True)
  base = {"tool_embeddings": z, "projection": rng.normal(size=(D, D)).astype(np.float32)}
  for m in range(2, M + 1):
    a = rng.normal(size=(D, D)).astype(np.float32)
    base[f"interaction_{m}"] = (a + a.T) / 2
  base.update(tensors or {})
  base = {k: v for k, v in base.items() if v is not None}
  info = {"format": "hyset/1", "tool_ids": [f"tool_{i}" for i in range(N)], "max_set_size": M,
          "k1": 4, "k_pool": 8, "query_encoder": "none"}
  info.update(manifest or {})
  path.mkdir(parents=True, exist_ok=True)
  save_file(base, str(path / "params.safetensors"))
  (path / "manifest.json").write_text(json.dumps(info))
  return base, info


def test_predict_matches_bruteforce(tmp_path):
  tensors, info = write_model_dir(tmp_path / "model")
  queries = np.random.default_rng(1).normal(size=(5, D)).astype(np.float32)
  np.save(tmp_path / "q.npy", queries)
  out = tmp_path / "pred.jsonl"
  assert cli.main(["predict", "--model", str(tmp_path / "model"), "--query-embeddings",
                   str(tmp_path / "q.npy"), "--out", str(out)]) == 0
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert [r["query_id"] for r in rows] == ["0", "1", "2", "3", "4"]
  ms = np.stack([tensors[f"interaction_{m}"] for m in range(2, M + 1)])
  for q, row in enumerate(rows):
    shortlist, best, score, greedy = ref.two_stage(
        queries[q], tensors["tool_embeddings"], tensors["projection"], ms, 4, 8, M)
    assert row["shortlist"] == [info["tool_ids"][t] for t in shortlist]
    assert sorted(row["set"]) == sorted(info["tool_ids"][t] for t in best)
    assert row["set_score"] == pytest.approx(score, abs=1e-5)
    assert row["ranking"][:M] == [info["tool_ids"][t] for t in greedy]
    assert len(row["ranking"]) == 8


def test_overrides_and_no_clobber(tmp_path):
  write_model_dir(tmp_path / "model")
  np.save(tmp_path / "q.npy", np.ones((2, D), np.float32))
  out = tmp_path / "pred.jsonl"
  args = ["predict", "--model", str(tmp_path / "model"), "--query-embeddings",
          str(tmp_path / "q.npy"), "--out", str(out), "--k1", "3", "--k-pool", "6",
          "--max-size", "2"]
  assert cli.main(args) == 0
  row = json.loads(out.read_text().splitlines()[0])
  assert len(row["shortlist"]) == 6 and len(row["set"]) <= 2
  out.write_text("keep me")
  assert cli.main(args) == 2
  assert out.read_text() == "keep me"
  assert cli.main(args + ["--force"]) == 0
  assert cli.main(args[:-2] + ["--max-size", "4"]) == 2


def asym():
  a = np.arange(D * D, dtype=np.float32).reshape(D, D)
  return a


@pytest.mark.parametrize("tensors,manifest,needle", [
    ({"interaction_3": None}, None, "missing tensor 'interaction_3'"),
    ({"projection": np.zeros((D, D + 1), np.float32)}, None, "'projection'"),
    ({"interaction_2": np.zeros((D, D + 2), np.float32)}, None, "'interaction_2'"),
    (None, {"tool_ids": [f"t{i}" for i in range(N - 1)]}, "'tool_ids' has 23 ids"),
    ({"interaction_2": asym()}, None, "'interaction_2' is not symmetric"),
    ({"tool_embeddings": np.full((N, D), np.nan, np.float32)}, None, "NaN"),
    ({"tool_embeddings": np.ones((N, D), np.float32)}, None, "unit rows"),
    (None, {"format": "hyset/0"}, "'format'"),
    (None, {"k1": 8}, "need 1 ≤ k1 < k_pool"),
    (None, {"k_pool": 30}, "the model has only 24 tools"),
    ({"interaction_4": np.zeros((D, D), np.float32)}, None, "unexpected tensor"),
])
def test_bad_model_directories(tmp_path, tensors, manifest, needle):
  write_model_dir(tmp_path / "model", tensors, manifest)
  np.save(tmp_path / "q.npy", np.ones((2, D), np.float32))
  proc = subprocess.run(
      [sys.executable, "-m", "hyset_jax.cli", "predict", "--model", str(tmp_path / "model"),
       "--query-embeddings", str(tmp_path / "q.npy"), "--out", str(tmp_path / "p.jsonl")],
      capture_output=True, text=True)
  assert proc.returncode == 2, proc.stderr
  assert needle in proc.stderr
  assert "Traceback" not in proc.stderr
  assert not (tmp_path / "p.jsonl").exists()


@pytest.mark.parametrize("array,needle", [
    (np.ones((3, D + 1), np.float32), "dimension 7"),
    (np.array([[np.nan] * D], np.float32), "row 0 contains NaN"),
    (np.ones((3,), np.float32), "expected a float array"),
])
def test_bad_query_embeddings(tmp_path, capsys, array, needle):
  write_model_dir(tmp_path / "model")
  np.save(tmp_path / "q.npy", array)
  rc = cli.main(["predict", "--model", str(tmp_path / "model"), "--query-embeddings",
                 str(tmp_path / "q.npy"), "--out", str(tmp_path / "p.jsonl")])
  assert rc == 2
  assert needle in capsys.readouterr().err


def test_save_load_roundtrip_and_refuse_overwrite(tmp_path):
  write_model_dir(tmp_path / "a")
  model = modeldir.load_model_dir(tmp_path / "a")
  modeldir.save_model_dir(tmp_path / "b", model)
  again = modeldir.load_model_dir(tmp_path / "b")
  assert again.tool_ids == model.tool_ids and again.manifest() == model.manifest()
  for x, y in zip(model.params, again.params):
    np.testing.assert_array_equal(x, y)
  with pytest.raises(Exception, match="--force"):
    modeldir.save_model_dir(tmp_path / "b", model)
