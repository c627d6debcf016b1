"""``benchmarks.soak_serve`` in brief: a few seconds of the soak (HTTP and MCP clients, bad
requests, catalogue updates) against real server processes, every request answered as expected
and every report file written; and its answer checks catch what they are there to catch."""
from __future__ import annotations

import json

from benchmarks import soak_serve

import serving
from serving import library, model_dir  # noqa: F401 (fixtures)


def test_soak_smoke(tmp_path, model_dir, library, monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "")  # the servers: one CPU device, as `hyset serve` gets
  queries = tmp_path / "queries.jsonl"
  queries.write_text("".join(json.dumps({"_id": str(i), "text": q}) + "\n"
                             for i, q in enumerate(serving.QUERIES)))
  out = tmp_path / "soak"
  assert soak_serve.main(["--quick", "--no-warm-up", "--minutes", "0.1", "--bad-share", "0.3",
                          "--model", str(model_dir), "--tools", f"mcp:{library}",
                          "--queries", str(queries), "--out", str(out)]) == 0
  doc = json.loads(out.with_suffix(".json").read_text())
  assert set(doc["provenance"]) == {"commit", "command", "date", "machine", "allocator"}
  total, kinds = doc["summary"]["total"], doc["summary"]["by_kind"]
  assert total["errors"] == 0 and total["lost"] == 0 and total["ok"] == total["sent"] > 20
  assert all(kinds[k]["sent"] > 0 for k in soak_serve.KINDS), kinds
  run = doc["run"]
  assert run["updates"] >= 2 and kinds["update_http"]["ok"] == run["updates"]
  assert run["final_versions"] == {"http": run["updates"] + 1, "mcp": run["updates"] + 1}
  assert run["persisted_matches"] and run["tools"] == 42
  assert set(doc["summary"]["memory"]) == {"http", "mcp"}
  assert doc["summary"]["buckets"] and doc["summary"]["p99_ms"] > 0
  assert "0 errors, 0 lost" in out.with_suffix(".md").read_text()
  assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_answer_checks():
  good = {"results": [{"set": ["a"]}], "catalogue_version": 3}
  assert soak_serve.check_http(200, good, 3) is None
  assert "status 500" in soak_serve.check_http(500, {"error": {}}, 1)
  assert "catalogue version 3 < 4" in soak_serve.check_http(200, good, 4)
  assert "malformed" in soak_serve.check_http(200, {"results": []}, 1)
  ok = {"result": {"structuredContent": {"tools": [], "ranking": []}}}
  assert soak_serve.check_mcp(ok) is None
  assert soak_serve.check_mcp({"result": {"isError": True, "content": []}})
  assert soak_serve.check_mcp({"error": {"code": -32602}})
