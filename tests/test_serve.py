"""``hyset serve`` over HTTP: same answers as ``hyset predict``, field-named errors, batching,
and a clean SIGTERM with requests in flight — on a small model trained in the fixture."""
import asyncio
import json
import signal
import sys
import threading
import time

import pytest
from starlette.testclient import TestClient

from hyset_jax import cli
from hyset_jax.serve.app import create_app
from hyset_jax.serve.batching import MicroBatcher
from hyset_jax.serve.retriever import RANKINGS, Retriever, load_retriever

import serving
from serving import library, model_dir, retriever  # noqa: F401 (fixtures)


@pytest.fixture(scope="module")
def client(retriever):
  app = create_app(retriever, max_batch=8, max_wait_ms=2, max_body_bytes=4096, max_queries=16)
  with TestClient(app, raise_server_exceptions=False) as c:  # a 500 is asserted, not raised
    yield c


def assert_same(served, predicted):
  assert len(served) == len(predicted)
  for s, p in zip(served, predicted):
    assert s["set"] == p["set"]
    assert s["ranking"] == p["ranking"]
    assert s["shortlist"] == p["shortlist"]
    assert s["set_score"] == pytest.approx(p["set_score"], abs=1e-5)


def test_retrieve_gives_the_values_of_predict(tmp_path, client, model_dir):
  r = client.post("/v1/retrieve", json={"queries": serving.QUERIES})
  assert r.status_code == 200, r.text
  served = r.json()["results"]
  assert_same(served, serving.predict_rows(tmp_path, model_dir, serving.QUERIES))
  # The model really is trained: its interaction matrices are not the zero start.
  assert any(len(row["set"]) > 1 for row in served)
  # Each set member comes with its definition from the library.
  for row in served:
    assert [t["id"] for t in row["tools"]] == row["set"]
    for t in row["tools"]:
      assert t["name"] == t["id"] and t["description"] == f"Tool number {t['id'][1:]}."
      assert t["parameters"]["required"] == ["x"]
  one = client.post("/v1/retrieve", json={"query": serving.QUERIES[2]}).json()["results"]
  assert_same(one, served[2:3])


def test_per_request_options_match_predict_flags(tmp_path, client, model_dir):
  r = client.post("/v1/retrieve", json={"queries": serving.QUERIES, "max_size": 2,
                                        "k_pool": 6, "ranking": RANKINGS[0]})
  assert r.status_code == 200, r.text
  served = r.json()["results"]
  assert all(len(row["set"]) <= 2 and len(row["shortlist"]) == 6 for row in served)
  assert_same(served, serving.predict_rows(tmp_path, model_dir, serving.QUERIES, "--max-size",
                                           "2", "--k-pool", "6", "--ranking", RANKINGS[0]))


@pytest.mark.parametrize("body,status,field", [
    ({"query": ""}, 422, "query"),
    ({"query": "   "}, 422, "query"),
    ({}, 422, "query"),
    ({"query": "a", "queries": ["b"]}, 422, "query"),
    ({"queries": []}, 422, "queries"),
    ({"queries": ["ok", " "]}, 422, "queries[1]"),
    ({"queries": ["ok", 7]}, 422, "queries[1]"),
    ({"queries": ["q"] * 17}, 422, "queries"),
    ({"query": 3}, 422, "query"),
    ({"query": "a", "max_size": 4}, 422, "max_size"),
    ({"query": "a", "max_size": 1}, 422, "max_size"),
    ({"query": "a", "max_size": "2"}, 422, "max_size"),
    ({"query": "a", "max_size": True}, 422, "max_size"),
    ({"query": "a", "k_pool": 4}, 422, "k_pool"),
    ({"query": "a", "k_pool": 41}, 422, "k_pool"),
    ({"query": "a", "ranking": "best"}, 422, "ranking"),
    ({"query": "a", "limit": 3}, 422, "limit"),
    (b"{not json", 400, "body"),
    (b"[1, 2]", 422, "body"),
    ({"query": "x" * 5000}, 413, "body"),
])
def test_bad_requests_name_the_field(client, body, status, field):
  if isinstance(body, bytes):
    r = client.post("/v1/retrieve", content=body, headers={"Content-Type": "application/json"})
  else:
    r = client.post("/v1/retrieve", json=body)
  assert r.status_code == status, r.text
  err = r.json()["error"]
  assert err["field"] == field and err["message"]
  # The server is still fine.
  assert client.post("/v1/retrieve", json={"query": "hello"}).status_code == 200


def test_streamed_body_over_the_limit(client):
  def chunks():
    for _ in range(10):
      yield b" " * 1000
  r = client.post("/v1/retrieve", content=chunks(), headers={"Content-Type": "application/json"})
  assert r.status_code == 413 and r.json()["error"]["field"] == "body"


def test_internal_error_is_500_and_the_server_lives(client, retriever, monkeypatch):
  def broken(texts):
    raise RuntimeError("encoder down")
  with monkeypatch.context() as m:
    m.setattr(retriever, "encode", broken)
    r = client.post("/v1/retrieve", json={"query": "hello"})
  # The exception's text stays in the server's log; the body says only "internal error" and
  # the request id the log names.
  err = r.json()["error"]
  assert r.status_code == 500 and "encoder down" not in r.text and "RuntimeError" not in r.text
  assert err["message"].startswith("internal error") and err["request_id"] in err["message"]
  assert client.post("/v1/retrieve", json={"query": "hello"}).status_code == 200


def test_tools_health_and_docs(client):
  tools = client.get("/v1/tools").json()
  assert tools["count"] == 40 and [t["id"] for t in tools["tools"]] == [f"t{i}" for i in range(40)]
  health = client.get("/healthz").json()
  assert health["status"] == "ok" and health["tools"] == 40 and health["max_set_size"] == 3
  assert list(health["rankings"]) == list(RANKINGS)
  assert client.get("/docs").status_code == 200
  spec = client.get("/openapi.json").json()
  assert "/v1/retrieve" in spec["paths"] and "/v1/tools" in spec["paths"]
  assert client.get("/nowhere").json()["error"]["message"]


def test_concurrent_requests_share_device_calls(client):
  """Requests sent together are answered by fewer device calls than requests."""
  before = client.get("/healthz").json()["batching"]
  results = [None] * 12

  def call(i):
    results[i] = client.post("/v1/retrieve", json={"query": serving.QUERIES[i % 6]})
  threads = [threading.Thread(target=call, args=(i,)) for i in range(12)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert all(r.status_code == 200 for r in results)
  after = client.get("/healthz").json()["batching"]
  assert after["requests"] - before["requests"] == 12
  assert after["batches"] - before["batches"] < 12
  assert after["largest_batch"] > 1
  assert after["waiting"] == 0  # every request answered leaves the queue-depth gauge
  # Same query, same answer, whatever batch it rode in: the same set and ranking; the score to
  # float rounding (each power-of-two bucket is its own XLA program, and on some CPUs their
  # matrix products round differently: 4.318925 vs 4.318924 seen on a 2-core AMD EPYC).
  a, b = results[0].json(), results[6].json()
  score_a, score_b = (r["results"][0].pop("set_score") for r in (a, b))
  assert a == b
  assert score_a == pytest.approx(score_b, rel=1e-5)


def test_micro_batcher_groups_and_survives_failures():
  calls = []

  def run(batch):
    calls.append([texts for texts, _ in batch])
    if any("boom" in t for texts, _ in batch for t in texts):
      raise ValueError("boom")
    return [[t.upper() for t in texts] for texts, _ in batch]

  async def main():
    b = MicroBatcher(run, max_batch=4, max_wait_s=0.05)
    await b.start()
    out = await asyncio.gather(*(b.submit([f"q{i}"], None) for i in range(6)))
    big = await b.submit(["a", "b", "c", "d", "e"], None)  # larger than max_batch: alone
    with pytest.raises(ValueError):
      await b.submit(["boom"], None)
    after = await b.submit(["z"], None)
    await b.stop()
    return out, big, after, b.stats

  out, big, after, stats = asyncio.run(main())
  assert out == [[f"Q{i}"] for i in range(6)]
  assert [len(c) for c in calls[:2]] == [4, 2]  # max_batch 4 queries per call
  assert big == ["A", "B", "C", "D", "E"] and after == ["Z"]
  assert stats.requests == 9


def test_warm_up_leaves_no_compilation_to_requests(retriever, caplog):
  """After warm_up, a request of any batch size up to max_batch compiles nothing (the encoder
  is a stand-in here: its warm-up is one call with the warm texts)."""
  import jax
  import numpy as np
  encoded = []

  def encode(texts):
    encoded.append(list(texts))
    return np.zeros((len(texts), retriever.query_dim), np.float32)
  r = Retriever(retriever.model, encode, retriever.definitions, max_batch=8,
                warm_texts=retriever.warm_texts)
  r.warm_up()
  assert encoded == [retriever.warm_texts] and list(r._prepared) == [r.model.max_set_size]
  emb = np.random.default_rng(0).normal(size=(8, r.query_dim)).astype(np.float32)
  with jax.log_compiles(), caplog.at_level("WARNING"):
    caplog.clear()
    for n in range(1, 9):
      assert len(r.predict(emb[:n], r.defaults)) == n
  assert not [m for m in caplog.messages if "ompil" in m], caplog.messages[:3]


def test_sigterm_answers_requests_in_flight(model_dir, library):
  port = serving.free_port()
  url = f"http://127.0.0.1:{port}"
  # A long batching wait holds requests in the server when SIGTERM arrives. No warm-up (tested
  # above): the held batch compiles during the shutdown grace period instead of at start.
  with serving.server_process(["--model", str(model_dir), "--tools", f"mcp:{library}",
                               "--max-batch", "8", "--max-wait-ms", "3000", "--no-warm-up"],
                              port) as proc:
    answers = [None] * 6

    def call(i):
      answers[i] = serving.post(url + "/v1/retrieve", {"query": serving.QUERIES[i]})
    threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
    for t in threads:
      t.start()
    # SIGTERM once all six are held in the batcher (not after a guessed sleep: on a loaded
    # machine a request could still be connecting), or at the latest 2 s in, while the first
    # ones still wait out the 3 s batching window.
    deadline = time.monotonic() + 2
    while (serving.get(url + "/healthz")[1]["batching"]["waiting"] < 6
           and time.monotonic() < deadline):
      time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    for t in threads:
      t.join(timeout=60)
    # uvicorn re-raises the captured SIGTERM once it has shut down cleanly, so the exit
    # status is the signal's (what a supervisor expects), not a crash.
    assert proc.wait(timeout=60) == -signal.SIGTERM
    _, stderr = proc.communicate()
  assert [a[0] for a in answers] == [200] * 6, stderr[-2000:]
  assert all(len(a[1]["results"]) == 1 for a in answers)
  assert "Finished server process" in stderr and "Traceback" not in stderr


def test_serve_refuses_a_busy_port(model_dir, capsys):
  import socket
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    assert cli.main(["serve", "--model", str(model_dir), "--port", str(port)]) == 2
  assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


# --------------------------------------------------------------------------- MCP

def check_mcp_session(client_target, retriever):
  """list_tools and call_tool through the SDK's own client; answers equal the retriever's."""
  from mcp import Client

  async def session():
    async with Client(client_target) as c:
      listed = (await c.list_tools()).tools
      good = await c.call_tool("search_tools", {"query": serving.QUERIES[1]})
      small = await c.call_tool("search_tools", {"query": serving.QUERIES[2], "max_size": 2})
      bad = await c.call_tool("search_tools", {"query": "  "})
      worse = await c.call_tool("search_tools", {"query": "x", "max_size": 9})
      again = await c.call_tool("search_tools", {"query": serving.QUERIES[1]})
      return listed, good, small, bad, worse, again

  listed, good, small, bad, worse, again = asyncio.run(session())
  assert [t.name for t in listed] == ["search_tools"]
  assert listed[0].input_schema["required"] == ["query"]
  assert "tools" in listed[0].output_schema["properties"]
  expected = retriever.retrieve_batch([([serving.QUERIES[1]], retriever.defaults)])[0][0]
  content = good.structured_content
  assert not good.is_error
  assert [t["id"] for t in content["tools"]] == expected["set"]
  assert content["ranking"] == expected["ranking"]
  assert content["set_score"] == pytest.approx(expected["set_score"], abs=1e-5)
  for t in content["tools"]:
    assert t["name"] == t["id"] and t["description"].startswith("Tool number")
    assert t["inputSchema"]["properties"] == {"x": {"type": "integer"}}
  assert json.loads(good.content[0].text) == content  # the same JSON as text
  assert len(small.structured_content["tools"]) <= 2
  assert bad.is_error and "query" in bad.content[0].text
  assert worse.is_error and "max_size" in worse.content[0].text
  assert again.structured_content == content  # the server survived the bad calls


def test_mcp_over_stdio(model_dir, library, retriever):
  from mcp import StdioServerParameters
  params = StdioServerParameters(
      command=sys.executable, cwd=str(serving.REPO), env=serving.env(),
      args=["-m", "hyset_jax.cli", "serve", "--model", str(model_dir), "--tools",
            f"mcp:{library}", "--mcp", "stdio", "--max-batch", "8", "--no-warm-up"])
  check_mcp_session(params, retriever)


def test_mcp_over_streamable_http(model_dir, library, retriever):
  port = serving.free_port()
  with serving.server_process(["--model", str(model_dir), "--tools", f"mcp:{library}",
                               "--mcp", "http", "--max-batch", "8", "--no-warm-up"], port) as proc:
    check_mcp_session(f"http://127.0.0.1:{port}/mcp", retriever)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)


# --------------------------------------------------------------------------- hyset tools

def test_tools_add_and_remove(tmp_path, model_dir, capsys):
  import shutil

  import numpy as np

  from hyset_jax.io import modeldir
  from hyset_jax.data.tooltext import render_tool
  from hyset_jax.encoder import load_encoder

  source = tmp_path / "model"
  shutil.copytree(model_dir, source)
  (source / "neighbours-1234.npz").write_bytes(b"a cache keyed by the old Z")
  new_tools = [{"name": "book_flight", "description": "Book a flight between two airports.",
                "inputSchema": {"type": "object", "properties": {"from": {"type": "string"}}}},
               {"name": "order_pizza", "description": "Order a pizza for delivery."}]
  lib = tmp_path / "new.json"
  lib.write_text(json.dumps({"tools": new_tools}))
  out = tmp_path / "added"
  assert cli.main(["tools", "add", "--model", str(source), "--tools", f"mcp:{lib}",
                   "--out", str(out)]) == 0
  old, new = modeldir.load_model_dir(source), modeldir.load_model_dir(out)
  assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "params.safetensors"]
  assert new.tool_ids == old.tool_ids + ("book_flight", "order_pizza")
  np.testing.assert_array_equal(new.params.tool_embeddings[:40], old.params.tool_embeddings)
  np.testing.assert_array_equal(new.params.projection, old.params.projection)
  np.testing.assert_array_equal(new.params.interactions, old.params.interactions)
  texts = [render_tool(t["name"], t["description"], t.get("inputSchema")) for t in new_tools]
  emb = load_encoder(old.query_encoder).encode(texts)
  expected = emb / np.linalg.norm(emb, axis=1, keepdims=True)
  np.testing.assert_allclose(new.params.tool_embeddings[40:], expected, atol=1e-5)
  # The added tool is retrievable: a query worded like it puts it first by ℓ.
  rows = serving.predict_rows(tmp_path, out, ["Book a flight between two airports."])
  assert rows[0]["shortlist"][0] == "book_flight" and "book_flight" in rows[0]["set"]

  capsys.readouterr()
  assert cli.main(["tools", "add", "--model", str(out), "--tools", f"mcp:{lib}",
                   "--out", str(tmp_path / "again")]) == 2
  assert "already in the model (e.g. 'book_flight')" in capsys.readouterr().err
  assert cli.main(["tools", "add", "--model", str(source), "--tools", f"mcp:{lib}",
                   "--out", str(out)]) == 2
  assert "pass --force" in capsys.readouterr().err

  removed = tmp_path / "removed"
  assert cli.main(["tools", "remove", "--model", str(out), "--tools", f"mcp:{lib}",
                   "--out", str(removed)]) == 0
  back = modeldir.load_model_dir(removed)
  assert back.tool_ids == old.tool_ids
  np.testing.assert_array_equal(back.params.tool_embeddings, old.params.tool_embeddings)
  assert cli.main(["tools", "remove", "--model", str(out), "--ids", "t0,t5", "--out",
                   str(tmp_path / "r2")]) == 0
  assert modeldir.load_model_dir(tmp_path / "r2").tool_ids == tuple(
      t for t in new.tool_ids if t not in ("t0", "t5"))
  capsys.readouterr()
  assert cli.main(["tools", "remove", "--model", str(out), "--ids", "ghost", "--out",
                   str(tmp_path / "r3")]) == 2
  assert "not in the model (e.g. 'ghost')" in capsys.readouterr().err
  keep = ",".join(f"t{i}" for i in range(36))  # 42 - 36 = 6 tools < k_pool = 8
  assert cli.main(["tools", "remove", "--model", str(out), "--ids", keep, "--out",
                   str(tmp_path / "r4")]) == 2
  assert "would have 6 tools" in capsys.readouterr().err
  assert not (tmp_path / "r3").exists() and not (tmp_path / "r4").exists()


def test_a_model_without_encoder_is_refused(tmp_path, capsys):
  from test_predict_cli import write_model_dir
  write_model_dir(tmp_path / "m", manifest={"format": "hyset/2", "query_encoder": None})
  lib = serving.write_library(tmp_path / "lib.json", n=2)
  assert cli.main(["tools", "add", "--model", str(tmp_path / "m"), "--tools", f"mcp:{lib}",
                   "--out", str(tmp_path / "o")]) == 2
  assert "names no encoder" in capsys.readouterr().err
  assert cli.main(["serve", "--model", str(tmp_path / "m"), "--port",
                   str(serving.free_port())]) == 2
  assert "names no query encoder" in capsys.readouterr().err
  assert cli.main(["serve", "--model", str(tmp_path / "m"), "--port", "70000"]) == 2
  assert "cannot listen on 127.0.0.1:70000" in capsys.readouterr().err


def test_a_model_with_a_seen_set_prior_serves_what_predict_writes(tmp_path, model_dir, library,
                                                                  retriever):
  """hyset/3: the prior changes served sets exactly as it changes predict's, and the greedy
  ranking (which does not know the prior) is refused by field."""
  import numpy as np
  from hyset_jax.io import modeldir
  from hyset_jax.model import set_prior
  from hyset_jax.errors import FieldError
  md = modeldir.load_model_dir(model_dir)
  emb = retriever.encode(serving.QUERIES)
  plain = retriever.predict(emb, retriever.defaults)
  index = {t: i for i, t in enumerate(md.tool_ids)}
  # A prior whose sets are each query's 2nd and 3rd shortlist tools: not what F names.
  gold = [tuple(sorted(index[t] for t in row["shortlist"][1:3])) for row in plain]
  prior = set_prior.with_weight(set_prior.fit(emb, gold, md.max_set_size), 20.0, 0.5)
  with_prior = modeldir.ModelDir(md.params._replace(prior=prior), md.tool_ids, md.max_set_size,
                                 md.k1, md.k_pool, md.query_encoder, ranking="set-first")
  modeldir.save_model_dir(tmp_path / "prior", with_prior)
  served = load_retriever(str(tmp_path / "prior"), [f"mcp:{library}"], max_batch=8,
                          log=lambda _: None)
  assert "greedy" not in served.rankings
  with pytest.raises(FieldError, match="must be one of logit, set-first, set-mean, set-max"):
    served.options(ranking="greedy")
  rows = served.predict(emb, served.defaults)
  assert_same(rows, serving.predict_rows(tmp_path, tmp_path / "prior", serving.QUERIES))
  assert sum(r["set"] != p["set"] for r, p in zip(rows, plain)) >= len(rows) // 2
  assert np.mean([sorted(r["set"]) == sorted(p["shortlist"][1:3])
                  for r, p in zip(rows, plain)]) > 0.5
