"""``hyset export --format onnx``: onnxruntime on stage1.onnx -> stage2.onnx gives what
``hyset predict`` writes, on the same queries."""
import json

import numpy as np
import onnxruntime as ort
import pytest

from hyset_jax import cli

from test_predict_cli import M, D, N, write_model_dir


def extended_tensors(seed: int, depth: int = 1, hidden: int = 5, rank: int = 3) -> dict:
  """hyset/2's optional groups: a query tower and the query-conditioned set term."""
  rng = np.random.default_rng(seed)
  f = lambda *s: (0.5 * rng.normal(size=s)).astype(np.float32)  # noqa: E731
  return {"tower_w_in": f(depth, D, hidden), "tower_b_in": f(depth, hidden),
          "tower_w_out": f(depth, hidden, D), "tower_b_out": f(depth, D),
          "conditioned_u": f(M - 1, D, rank), "conditioned_w": f(M - 1, D, rank),
          "conditioned_v": f(M - 1, D), "conditioned_b": f(M - 1)}


def prior_tensors(seed: int, sets: int = 60, weight: float = 20.0) -> dict:
  """hyset/3's seen-set prior over random sets of 1..M of the N tools, a bonus large enough to
  change the best set of some queries."""
  rng = np.random.default_rng(seed)
  rows = set()
  while len(rows) < sets:  # distinct, as the training gold sets are
    rows.add(tuple(np.sort(rng.choice(N, 1 + len(rows) % M, replace=False)).tolist()))
  members = np.full((sets, M), -1, np.int32)
  for s, row in enumerate(sorted(rows)):
    members[s, :len(row)] = row
  return {"prior_members": members,
          "prior_w": (3 * rng.normal(size=(sets, D))).astype(np.float32),
          "prior_b": np.zeros(sets, np.float32), "prior_weight": np.array(weight, np.float32),
          "prior_floor": np.array(np.log(0.01), np.float32)}


# The paper's model (hyset/1, greedy), hyset/2 models with the tower and the conditioned term
# ranked set-first and set-mean, and hyset/3 (the seen-set prior as well): every tensor group
# and ranking go through the ONNX graphs.
@pytest.mark.heavy
@pytest.mark.parametrize("batch,ranking,prior", [
    (4, None, False), (4, "set-first", False), (3, "set-mean", False), (4, "set-max", False),
    (4, "set-mean", True), (3, "set-max", True)])
def test_onnx_matches_predict(tmp_path, batch, ranking, prior):
  tensors, manifest = None, None
  if ranking:
    tensors, manifest = extended_tensors(5), {"format": "hyset/2", "ranking": ranking}
  if prior:
    tensors.update(prior_tensors(6))
    manifest["format"] = "hyset/3"
  _, info = write_model_dir(tmp_path / "model", tensors=tensors, manifest=manifest, seed=3)
  out = tmp_path / "onnx"
  assert cli.main(["export", "--workdir", str(tmp_path / "model"), "--out", str(out),
                   "--format", "onnx", "--onnx-batch", str(batch)]) == 0
  signature = json.loads((out / "signature.json").read_text())
  assert signature["batch"] == batch and signature["tool_ids"] == info["tool_ids"]
  assert [i["name"] for i in signature["models"]["stage1"]["inputs"]] == ["query_embeddings"]
  assert [o["name"] for o in signature["models"]["stage2"]["outputs"]] == [
      "set_tools", "set_size", "set_score", "ranking"]

  queries = np.random.default_rng(7).normal(size=(6, D)).astype(np.float32)
  np.save(tmp_path / "q.npy", queries)
  assert cli.main(["predict", "--model", str(tmp_path / "model"), "--query-embeddings",
                   str(tmp_path / "q.npy"), "--out", str(tmp_path / "p.jsonl")]) == 0
  expected = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]

  s1 = ort.InferenceSession(str(out / "stage1.onnx"), providers=["CPUExecutionProvider"])
  s2 = ort.InferenceSession(str(out / "stage2.onnx"), providers=["CPUExecutionProvider"])
  ids = info["tool_ids"]
  got = []
  for start in range(0, len(queries), batch):
    chunk = queries[start:start + batch]
    n = len(chunk)
    padded = np.concatenate([chunk, np.zeros((batch - n, D), np.float32)])
    shortlist, logits = s1.run(None, {"query_embeddings": padded})
    set_tools, set_size, set_score, ranking = s2.run(
        None, {"query_embeddings": padded, "shortlist": shortlist, "shortlist_logits": logits})
    for q in range(n):
      got.append({"set": [ids[t] for t in set_tools[q] if t >= 0],
                  "set_size": int(set_size[q]), "set_score": float(set_score[q]),
                  "ranking": [ids[t] for t in ranking[q]],
                  "shortlist": [ids[t] for t in shortlist[q]]})
  if prior:  # the prior changes some best sets, so the graphs above had it to get right
    without = {k: v for k, v in tensors.items() if not k.startswith("prior_")}
    write_model_dir(tmp_path / "plain", tensors=without, manifest=dict(manifest, format="hyset/2"),
                    seed=3)
    assert cli.main(["predict", "--model", str(tmp_path / "plain"), "--query-embeddings",
                     str(tmp_path / "q.npy"), "--out", str(tmp_path / "plain.jsonl")]) == 0
    plain = [json.loads(line) for line in (tmp_path / "plain.jsonl").read_text().splitlines()]
    assert any(p["set"] != e["set"] for p, e in zip(plain, expected))
  for g, e in zip(got, expected, strict=True):
    assert g["shortlist"] == e["shortlist"]
    assert g["set"] == e["set"] and g["set_size"] == len(e["set"]) <= M
    assert g["ranking"] == e["ranking"]
    assert g["set_score"] == pytest.approx(e["set_score"], abs=1e-4)


def test_onnx_bad_batch(tmp_path, capsys):
  write_model_dir(tmp_path / "model")
  assert cli.main(["export", "--workdir", str(tmp_path / "model"), "--out",
                   str(tmp_path / "o"), "--format", "onnx", "--onnx-batch", "0"]) == 2
  assert "--onnx-batch must be ≥ 1" in capsys.readouterr().err
  assert not (tmp_path / "o").exists()
