"""``--precision`` on ``hyset eval`` and ``hyset serve`` (``hyset predict``'s is in
tests/test_precision.py): eval scores the dtype it is given and records it; the server answers
as ``hyset predict --precision bf16`` does, reports its precision, and keeps it across a live
catalogue update; an option that does not apply is refused naming it. On the small model
trained once per test process for the serving tests (tests/serving.py) and real ToolLens
queries."""
from __future__ import annotations

import json

import jax.numpy as jnp
import pytest
from starlette.testclient import TestClient

from hyset_jax import cli
from hyset_jax.evaluation import metrics

import serving
from serving import library, model_dir  # noqa: F401 (fixtures)

FLIGHT = {"id": "book_flight", "name": "book_flight",
          "description": "Book a flight between two airports.",
          "parameters": {"type": "object", "properties": {"from": {"type": "string"}}}}


def assert_same(served, predicted):
  """The same sets, rankings and shortlists; scores to bf16's rounding. The server encodes in
  8-row batches, predict in its own: embeddings that differ in the last f32 bits can round to
  a neighbouring bf16 value in a few entries of the query tower's output (one bf16 step is
  2⁻⁸ relative), which moves F by ~1e-5 relative (measured: 3e-5 on 3.45)."""
  assert [(s["set"], s["ranking"], s["shortlist"]) for s in served] == [
      (p["set"], p["ranking"], p["shortlist"]) for p in predicted]
  for s, p in zip(served, predicted):
    assert s["set_score"] == pytest.approx(p["set_score"], rel=1e-3)


def test_serve_bf16_answers_as_predict_bf16_and_keeps_it_across_an_update(
    tmp_path, model_dir, library, monkeypatch):
  """``hyset serve --precision bf16`` through the CLI, uvicorn's loop replaced by a test client
  on the app it was handed: the whole start-up path runs, no socket is opened."""
  import uvicorn
  seen = {}

  def run(server):
    with TestClient(server.config.app, raise_server_exceptions=False) as client:
      seen["health"] = client.get("/healthz").json()
      r = client.post("/v1/retrieve", json={"queries": serving.QUERIES})
      assert r.status_code == 200, r.text
      seen["before"] = r.json()["results"]
      assert client.post("/v1/tools", json={"add": [FLIGHT]}).status_code == 200
      seen["health_after"] = client.get("/healthz").json()
      r = client.post("/v1/retrieve", json={"queries": serving.QUERIES})
      assert r.status_code == 200 and r.json()["catalogue_version"] == 2, r.text
      seen["after"] = r.json()["results"]
      successor = client.app.state.catalogue.current.retriever
      seen["dtypes"] = {str(successor.prepared(m).keyed.dtype) for m in successor.prepared_sizes}

  monkeypatch.setattr(uvicorn.Server, "run", run)
  live = tmp_path / "live"
  assert cli.main(["serve", "--model", str(model_dir), "--tools", f"mcp:{library}",
                   "--precision", "bf16", "--no-warm-up", "--max-batch", "8",
                   "--port", str(serving.free_port()), "--persist", str(live)]) == 0
  assert seen["health"]["precision"] == seen["health_after"]["precision"] == "bf16"
  assert seen["health_after"]["tools"] == 41
  assert seen["dtypes"] == {str(jnp.dtype(jnp.bfloat16))}
  assert any(len(row["set"]) > 1 for row in seen["before"])  # trained: sets, not single tools
  assert_same(seen["before"], serving.predict_rows(tmp_path, model_dir, serving.QUERIES,
                                                   "--precision", "bf16"))
  # After the update: the answers of `hyset predict --precision bf16` on the edited model the
  # server wrote (--persist), i.e. the update was prepared in bf16 too.
  assert_same(seen["after"], serving.predict_rows(tmp_path, live, serving.QUERIES,
                                                  "--precision", "bf16"))


def test_eval_bf16_scores_close_to_f32_and_records_it(tmp_path, model_dir, shared_data):
  # Real ToolLens test queries over its 464-tool library: the model is carried onto it (every
  # tool embedded by the manifest's encoder), so stage 1 ranks 464 tools in either dtype.
  base = ["eval", "--data", f"beir:{shared_data / 'toollens'}", "--split", "test",
          "--limit", "200", "--method", "hyset", "--model", str(model_dir)]
  results = {}
  for name, extra in (("default", []), ("bf16", ["--precision", "bf16"])):
    out = tmp_path / f"{name}.json"
    assert cli.main(base + [*extra, "--out", str(out)]) == 0
    results[name] = json.loads(out.read_text())
  # The default record is the metric keys alone (docs/contracts.md); a given precision is kept.
  assert tuple(results["default"]) == metrics.METRIC_KEYS
  assert results["bf16"].pop("precision") == "bf16"
  assert tuple(results["bf16"]) == metrics.METRIC_KEYS
  for key in metrics.METRIC_KEYS:
    assert results["bf16"][key] == pytest.approx(results["default"][key], abs=0.02), key


def test_options_that_do_not_apply_are_refused(tmp_path, shared_data, capsys):
  out = str(tmp_path / "m.json")
  assert cli.main(["eval", "--data", f"beir:{shared_data / 'toollens'}", "--split", "test",
                   "--method", "bm25", "--precision", "bf16", "--out", out]) == 2
  assert "--precision is only used with --method hyset" in capsys.readouterr().err
  for argv in (["serve", "--model", "m"], ["eval", "--data", "bfcl", "--split", "test",
                                          "--method", "hyset", "--out", out]):
    with pytest.raises(SystemExit) as e:
      cli.main([*argv, "--precision", "fp16"])
    assert e.value.code == 2 and "--precision" in capsys.readouterr().err
