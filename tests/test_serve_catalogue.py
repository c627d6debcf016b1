"""A catalogue that changes while serving (``POST /v1/tools``, MCP ``update_tools``): added tools
are retrieved, removed ones never again, updates change definitions, the version counts, bad
updates change nothing, ``--persist`` writes what ``hyset tools add`` writes — and, against a
real server process, 24 updates under 4 concurrent clients lose and fail no request, and no
answer names a tool its catalogue version did not have."""
from __future__ import annotations

import asyncio
import hashlib
import json
import random
import threading
import time

import jax
import numpy as np
import pytest
from starlette.testclient import TestClient

from hyset_jax import cli
from hyset_jax.io import modeldir
from hyset_jax.serve.app import create_app
from hyset_jax.serve.batching import MicroBatcher

import serving
from serving import library, model_dir, retriever  # noqa: F401 (fixtures)

FLIGHT = {"id": "book_flight", "name": "book_flight",
          "description": "Book a flight between two airports.",
          "parameters": {"type": "object", "properties": {"from": {"type": "string"}}}}
FLIGHT_QUERY = "Book a flight between two airports."


def make_client(retriever, **kwargs):
  """A fresh app (catalogue version 1, the start-up library) over the shared retriever: an
  update builds a new Retriever and never changes the one it started from."""
  app = create_app(retriever, max_batch=8, max_wait_ms=2, max_body_bytes=1 << 16,
                   max_queries=16, **kwargs)
  return TestClient(app, raise_server_exceptions=False)


def retrieve(client, query):
  r = client.post("/v1/retrieve", json={"query": query})
  assert r.status_code == 200, r.text
  return r.json()


def named(row) -> set[str]:
  """Every tool id an answer row names."""
  return (set(row["set"]) | set(row["ranking"]) | set(row["shortlist"])
          | {t["id"] for t in row["tools"]})


def test_add_update_remove_while_serving(retriever):
  from hyset_jax.io.carry import tool_encoder
  from hyset_jax.data.tooltext import render_tool
  with make_client(retriever) as client:
    start = client.get("/v1/tools").json()
    assert start["version"] == 1 and start["count"] == 40
    r = client.post("/v1/tools", json={"add": [FLIGHT]})
    assert r.status_code == 200, r.text
    assert r.json() == {"version": 2, "count": 41, "previous_count": 40, "added": 1,
                        "updated": 0, "removed": 0,
                        "ids": {"added": ["book_flight"], "updated": [], "removed": []}}
    # The new row is the embedding `hyset tools add` computes (carry.tool_encoder), normalised.
    served = client.app.state.catalogue.current.retriever
    text = render_tool(FLIGHT["name"], FLIGHT["description"], FLIGHT["parameters"])
    expected = tool_encoder(served.model)([text])[0]
    np.testing.assert_allclose(served.model.params.tool_embeddings[-1],
                               expected / np.linalg.norm(expected), atol=1e-6)
    assert served.prepared_sizes == (3,)  # prepared before it was served
    answer = retrieve(client, FLIGHT_QUERY)
    row, = answer["results"]
    assert answer["catalogue_version"] == 2
    assert row["shortlist"][0] == "book_flight" and "book_flight" in row["set"]
    assert {"id": "book_flight", "name": "book_flight", "description": FLIGHT["description"],
            "parameters": FLIGHT["parameters"]} in row["tools"]

    # An added id that exists is an update: a new definition (and embedding), same size.
    changed = {**FLIGHT, "description": "Book a flight between two airports, economy class."}
    r = client.post("/v1/tools", json={"add": [changed]})
    assert r.json()["version"] == 3 and r.json()["updated"] == 1 and r.json()["count"] == 41
    listed = client.get("/v1/tools").json()
    assert listed["version"] == 3 and listed["count"] == 41
    assert [t for t in listed["tools"] if t["id"] == "book_flight"][0]["description"] == (
        changed["description"])
    row, = retrieve(client, changed["description"])["results"]
    assert row["shortlist"][0] == "book_flight"
    assert [t["description"] for t in row["tools"] if t["id"] == "book_flight"] == [
        changed["description"]]

    r = client.post("/v1/tools", json={"remove": ["book_flight", "t3"]})
    assert r.status_code == 200 and r.json()["version"] == 4 and r.json()["count"] == 39
    for query in [FLIGHT_QUERY, changed["description"], "Tool number 3.", *serving.QUERIES]:
      answer = retrieve(client, query)
      assert answer["catalogue_version"] == 4
      assert not named(answer["results"][0]) & {"book_flight", "t3"}
    assert client.get("/healthz").json()["catalogue_version"] == 4
    assert client.get("/healthz").json()["tools"] == 39


def test_a_catalogue_with_none_of_the_models_tools_left_is_scored_as_a_new_library(retriever):
  """Once updates have removed or redefined every tool the model came with, the served model is
  the one ``hyset predict --tools`` would score on such a library (carry.foreign: logit, the
  foreign-library β); while one is left, nothing of that changes."""
  import dataclasses
  from hyset_jax.model.lexical import LexicalIndex
  base = dataclasses.replace(retriever.model, ranking="set-first")
  texts = tuple(d["description"] for d in retriever.definitions)
  start = retriever.with_library(dataclasses.replace(
      base, params=base.params._replace(lexical_weight=np.float32(1)), lexical=LexicalIndex(texts),
      foreign={"lexical_weight": 8.0}), retriever.definitions)
  new = [{"id": f"n{i}", "description": f"New tool number {i}."} for i in range(40)]
  for keep in (1, 0):
    with make_client(start) as client:
      r = client.post("/v1/tools", json={"add": new[:39], "remove": [f"t{i}" for i in range(39)]})
      assert r.status_code == 200, r.text
      if not keep:   # the last own tool redefined: an encoder row like the others
        assert client.post("/v1/tools", json={"add": [{"id": "t39"}]}).status_code == 200
      served = client.app.state.catalogue.current.retriever.model
      assert served.default_ranking == ("logit" if not keep else base.default_ranking)
      assert float(served.params.lexical_weight) == (8.0 if not keep else 1.0)
      assert retrieve(client, "New tool number 7.")["results"][0]["shortlist"][0] == "n7"


BAD_UPDATES = [
    ({}, "body"),
    ({"add": [], "remove": []}, "body"),
    ({"bogus": 1}, "bogus"),
    ({"add": [{"id": "x", "colour": "red"}]}, "add[0].colour"),
    ({"add": [{"id": 3}]}, "add[0].id"),
    ({"add": [{"name": "no id"}]}, "add[0].id"),
    ({"add": [{"id": "  "}]}, "add[0].id"),
    ({"add": [{"id": "x", "parameters": "none"}]}, "add[0].parameters"),
    ({"add": [{"id": "x", "description": "\ud800"}]}, "add[0].description"),
    ({"add": [{"id": "a"}, {"id": "a"}]}, "add[1].id"),
    ({"add": [{"id": "t1"}], "remove": ["t1"]}, "remove[0]"),
    ({"remove": "t0"}, "remove"),
    ({"remove": ["ghost"]}, "remove[0]"),
    ({"add": [{"id": "new"}], "remove": ["t0", "ghost"]}, "remove[1]"),
    ({"remove": ["t0", "t0"]}, "remove[1]"),
    ({"remove": [f"t{i}" for i in range(33)]}, "remove"),
]


def test_bad_updates_name_the_field_and_change_nothing(retriever):
  with make_client(retriever) as client:
    before = client.get("/v1/tools").json()
    answer = retrieve(client, serving.QUERIES[0])
    for body, field in BAD_UPDATES:
      # json.dumps escapes a lone surrogate as JSON allows ("\ud800"); httpx would not send it.
      r = client.post("/v1/tools", content=json.dumps(body).encode(),
                      headers={"Content-Type": "application/json"})
      assert r.status_code == 422, (body, r.text)
      assert r.json()["error"]["field"] == field and r.json()["error"]["message"], body
      assert client.get("/v1/tools").json() == before, body
    ghost = client.post("/v1/tools", json={"remove": ["ghost"]}).json()["error"]["message"]
    assert "'ghost' is not in the library" in ghost
    small = client.post("/v1/tools", json={"remove": [f"t{i}" for i in range(33)]})
    assert "would have 7 tools (40 now, 0 added, 33 removed)" in small.json()["error"]["message"]
    assert "k_pool 8" in small.json()["error"]["message"]
    nan = client.post("/v1/tools", content=b'{"add": [{"id": "x", "parameters": {"a": NaN}}]}',
                      headers={"Content-Type": "application/json"})
    assert nan.status_code == 422 and nan.json()["error"]["field"] == "add[0].parameters"
    assert client.post("/v1/tools", content=b"{nope",
                       headers={"Content-Type": "application/json"}).status_code == 400
    big = client.post("/v1/tools", json={"add": [{"id": "x", "description": "y" * 70000}]})
    assert big.status_code == 413 and big.json()["error"]["field"] == "body"
    assert client.get("/v1/tools").json() == before
    assert retrieve(client, serving.QUERIES[0]) == answer  # the same library answers


def test_a_model_without_encoder_can_only_remove(retriever):
  """An app built on a model that names no encoder (`hyset serve` refuses one at start) cannot
  embed new tools: a 422 naming `add`, not a 500; removing still works."""
  import dataclasses

  from hyset_jax.serve.retriever import Retriever
  model = dataclasses.replace(retriever.model, query_encoder=None)
  bare = Retriever(model, retriever.encode, retriever.definitions, max_batch=8)
  with make_client(bare, warm_up=False) as client:
    r = client.post("/v1/tools", json={"add": [FLIGHT]})
    assert r.status_code == 422 and r.json()["error"]["field"] == "add"
    assert "names no encoder" in r.json()["error"]["message"]
    assert client.get("/v1/tools").json()["version"] == 1
    r = client.post("/v1/tools", json={"remove": ["t0"]})
    assert r.status_code == 200 and r.json()["count"] == 39


def test_persist_writes_what_hyset_tools_add_writes(tmp_path, model_dir, retriever):
  def digest(path):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in path.iterdir()}
  source = digest(model_dir)
  live = tmp_path / "live"
  with make_client(retriever, persist=live) as client:
    assert client.post("/v1/tools", json={"add": [FLIGHT]}).status_code == 200
    lib = tmp_path / "flight.json"
    lib.write_text(json.dumps({"tools": [{"name": FLIGHT["name"], "description":
                                          FLIGHT["description"],
                                          "inputSchema": FLIGHT["parameters"]}]}))
    offline = tmp_path / "offline"
    assert cli.main(["tools", "add", "--model", str(model_dir), "--tools", f"mcp:{lib}",
                     "--out", str(offline)]) == 0
    persisted, reference = modeldir.load_model_dir(live), modeldir.load_model_dir(offline)
    assert persisted.tool_ids == reference.tool_ids
    assert jax.tree.structure(persisted.params) == jax.tree.structure(reference.params)
    for a, b in zip(jax.tree.leaves(persisted.params), jax.tree.leaves(reference.params)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
    assert persisted.manifest() == reference.manifest()
    assert client.post("/v1/tools", json={"remove": ["t0"]}).status_code == 200
    assert modeldir.load_model_dir(live).tool_ids == reference.tool_ids[1:]
    bad = client.post("/v1/tools", json={"remove": ["ghost"]})
    assert bad.status_code == 422 and modeldir.load_model_dir(live).tool_ids[0] == "t1"
  assert digest(model_dir) == source  # the served model directory is left as it was


def test_persist_is_checked_at_start_up(tmp_path, model_dir, capsys):
  other = tmp_path / "notes"
  other.mkdir()
  (other / "todo.txt").write_text("mine")
  port = str(serving.free_port())
  assert cli.main(["serve", "--model", str(model_dir), "--persist", str(other),
                   "--port", port]) == 2
  assert "not a model directory" in capsys.readouterr().err
  assert (other / "todo.txt").read_text() == "mine"
  assert cli.main(["serve", "--model", str(model_dir), "--persist", str(model_dir),
                   "--port", port]) == 2
  assert "one of this command's inputs" in capsys.readouterr().err
  assert cli.main(["serve", "--model", str(model_dir), "--mcp-update-tools",
                   "--port", port]) == 2
  assert "needs --mcp" in capsys.readouterr().err


def test_mcp_update_tools(retriever):
  from mcp import Client

  from hyset_jax.serve.mcp_server import build_server

  async def session(server):
    async with Client(server) as c:
      listed = [t.name for t in (await c.list_tools()).tools]
      if "update_tools" not in listed:
        return listed, None
      added = await c.call_tool("update_tools", {"add": [FLIGHT]})
      found = await c.call_tool("search_tools", {"query": FLIGHT_QUERY})
      bad = await c.call_tool("update_tools", {"remove": ["ghost"]})
      gone = await c.call_tool("update_tools", {"remove": ["book_flight"]})
      after = await c.call_tool("search_tools", {"query": FLIGHT_QUERY})
      return listed, (added, found, bad, gone, after)

  listed, _ = asyncio.run(session(build_server(retriever, max_batch=8)))
  assert listed == ["search_tools"]  # off by default
  listed, (added, found, bad, gone, after) = asyncio.run(
      session(build_server(retriever, max_batch=8, update_tool=True)))
  assert listed == ["search_tools", "update_tools"]
  assert not added.is_error and added.structured_content["version"] == 2
  assert "book_flight" in [t["id"] for t in found.structured_content["tools"]]
  assert bad.is_error and "remove[0]" in bad.content[0].text
  assert gone.structured_content["version"] == 3 and gone.structured_content["count"] == 40
  assert "book_flight" not in after.structured_content["ranking"]


def test_batches_never_mix_keys():
  batches = []

  def run(batch):
    batches.append([options for _, options in batch])
    return [None for _ in batch]

  async def main():
    b = MicroBatcher(run, max_batch=8, max_wait_s=0.05, key=lambda options: options[0])
    await b.start()
    old, new = object(), object()
    await asyncio.gather(*(b.submit(["q"], (lib, i))
                           for i, lib in enumerate([old, old, new, new, old])))
    await b.stop()
    return old, new

  old, new = asyncio.run(main())
  assert [[i for _, i in batch] for batch in batches] == [[0, 1], [2, 3], [4]]
  assert all(len({id(lib) for lib, _ in batch}) == 1 for batch in batches)


# --------------------------------------------------------------------------- under load

# Enough to overlap updates with requests in flight on every client (a few hundred requests);
# each update re-indexes the library, so more of them only repeat the same path for longer.
CLIENTS = 4
UPDATES = 12
LOAD_DEADLINE_S = 150  # a hard stop: the clients and the updates end by themselves before it


def variant(u: int) -> str:
  """The description of a tool added by update ``u``: worded like a query the clients send, so
  that answers name the added tools (and would name them after removal if that leaked)."""
  return f"{serving.QUERIES[u % len(serving.QUERIES)]} (service {u})"


def update_body(u: int) -> dict:
  """Update ``u``: add two tools, remove the two update ``u - 1`` added, and every fifth time
  redefine one of the start-up tools (an update in place). The library stays at 42 tools after
  the first update, so the new libraries' shapes compile once."""
  add = [{"id": f"new{u}_{j}", "name": f"new{u}_{j}", "description": variant(u),
          "parameters": {"type": "object", "properties": {"arg": {"type": "string"}}}}
         for j in range(2)]
  if u % 5 == 0:
    add.append({"id": f"t{u % 40}", "name": f"t{u % 40}",
                "description": f"Tool number {u % 40}, revision {u}."})
  body: dict = {"add": add}
  if u:
    body["remove"] = [f"new{u - 1}_{j}" for j in range(2)]
  return body


def run_load(url: str, deadline: float):
  """CLIENTS threads retrieving while UPDATES updates are applied one after another; returns the
  requests (send time, answer time, status, body or exception) and the updates (send time,
  answer time, status, body)."""
  requests: list[tuple] = []
  updates: list[tuple] = []
  done = threading.Event()
  queries = serving.QUERIES + [variant(u) for u in range(len(serving.QUERIES))]

  def client(seed: int):
    rng = random.Random(seed)
    while not done.is_set() and time.monotonic() < deadline:
      t0 = time.monotonic()
      try:
        status, body = serving.post(url + "/v1/retrieve", {"query": rng.choice(queries)},
                                    timeout=30)
      except Exception as e:  # noqa: BLE001 - a lost request is counted, not raised here
        status, body = None, repr(e)
      requests.append((t0, time.monotonic(), status, body))

  threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
  for t in threads:
    t.start()
  try:
    for u in range(UPDATES):
      if time.monotonic() > deadline:
        break
      t0 = time.monotonic()
      status, body = serving.post(url + "/v1/tools", update_body(u), timeout=60)
      updates.append((t0, time.monotonic(), status, body))
  finally:
    done.set()
    for t in threads:
      t.join(timeout=60)
  return requests, updates


def libraries(start: dict) -> dict[int, dict[str, dict]]:
  """Each catalogue version's definitions by id, replaying the updates (version 1: start)."""
  out = {1: {t["id"]: t for t in start["tools"]}}
  for u in range(UPDATES):
    lib = dict(out[u + 1])
    body = update_body(u)
    for tool_id in body.get("remove", ()):
      del lib[tool_id]
    for t in body["add"]:
      lib[t["id"]] = {**t, "parameters": t.get("parameters", {})}
    out[u + 2] = lib
  return out


@pytest.mark.heavy
def test_updates_under_concurrent_load(model_dir, library):
  port = serving.free_port()
  url = f"http://127.0.0.1:{port}"
  with serving.server_process(["--model", str(model_dir), "--tools", f"mcp:{library}",
                               "--max-batch", "8", "--max-wait-ms", "2"], port):
    start = serving.get(url + "/v1/tools")[1]
    began = time.monotonic()
    requests, updates = run_load(url, began + LOAD_DEADLINE_S)
    elapsed = time.monotonic() - began
    final = serving.get(url + "/v1/tools")[1]
  assert [u[2] for u in updates] == [200] * UPDATES, [u[3] for u in updates if u[2] != 200][:3]
  assert [u[3]["version"] for u in updates] == list(range(2, UPDATES + 2))
  libs = libraries(start)
  assert final["version"] == UPDATES + 1
  assert {t["id"]: t for t in final["tools"]} == libs[UPDATES + 1]
  lost = [r for r in requests if r[2] is None]
  errors = [r for r in requests if r[2] not in (None, 200)]
  assert not lost and not errors, (lost + errors)[:3]
  stale, new_named = 0, 0
  for t0, t1, _, body in requests:
    version = body["catalogue_version"]
    # The version answering was current at some moment while the request was in flight: not
    # older than an update answered before it was sent, not newer than one sent after its answer.
    low = max([1] + [u[3]["version"] for u in updates if u[1] < t0])
    high = max([1] + [u[3]["version"] for u in updates if u[0] < t1])
    assert low <= version <= high, (low, version, high)
    # Finished on a library that an update had replaced by the time of its answer.
    stale += version < max([1] + [u[3]["version"] for u in updates if u[1] < t1])
    row, = body["results"]
    lib = libs[version]
    assert row["set"] and len(row["shortlist"]) == 8 and [t["id"] for t in row["tools"]] == (
        row["set"])
    assert named(row) <= set(lib), (version, named(row) - set(lib))
    assert all(t == lib[t["id"]] for t in row["tools"])
    new_named += any(t.startswith("new") for t in row["set"])
  # The check had teeth: answers did name the tools that later updates removed. Counted over
  # the answers from a library that had added tools (version 2 on), not over all of them: how
  # many come before the first update answers (its new shapes compile) is not what is checked.
  # About one query in six is worded like the added tools (see variant); 1 in 20 leaves room.
  added = sum(body["catalogue_version"] > 1 for *_, body in requests)
  assert new_named > added // 20, (new_named, added)
  print(f"\nload: {len(requests)} requests from {CLIENTS} clients, {len(updates)} updates in "
        f"{elapsed:.1f} s ({len(requests) / elapsed:.1f} q/s); 0 errors, 0 lost; "
        f"{stale} finished on a library replaced while they were in flight; {new_named} of "
        f"the {added} answers from version 2 on named an added tool")


# --------------------------------------------------------------------------- memory (#37)

def test_updates_of_new_sizes_keep_only_the_served_programs():
  """A library whose size changes at every update: before, each size compiled programs that
  the module-level jit kept for the life of the process (RSS grew ~14 MiB per size, without
  bound); now a library's prediction programs go with it, a swap drops the programs that
  prepared it, and the answers stay those of pipeline.predict_batched. An update that keeps
  the shapes shares the programs and compiles nothing."""
  import gc
  import weakref

  from test_fuzz import tiny_retriever
  from hyset_jax.inference import neighbors, pipeline
  from hyset_jax.serve.catalogue import Catalogue, ToolIn, build_successor, plan_update

  first = tiny_retriever(max_batch=1)  # 40 tools, one batch bucket: one program per library
  first.warm_up(encoder=False)
  catalogue = Catalogue(first)
  # JAX's own count of the module-level programs (a private method): the server adds none.
  module_programs = pipeline.predict_prepared_rankings._cache_size()
  gone = [weakref.ref(first.programs)]
  del first

  async def updates():
    for count in (1, 2, 3, 1):  # 40 -> 39 -> 37 -> 34 -> 33 tools: a new size each time
      ids = list(catalogue.current.retriever.model.tool_ids[:count])
      await catalogue.update(None, ids, batcher=None)  # removals embed nothing
      served = catalogue.current.retriever
      gone.append(weakref.ref(served.programs))
      gc.collect()
      assert [ref() is None for ref in gone] == [True] * (len(gone) - 1) + [False]
      assert served.programs.traces == 1  # its warm-up's, for its own size
      assert pipeline._products._cache_size() == neighbors._block._cache_size() == 0

  try:
    asyncio.run(updates())
  finally:
    catalogue.close()
  assert pipeline.predict_prepared_rankings._cache_size() == module_programs

  served = catalogue.current.retriever
  m = served.model
  emb = np.random.default_rng(5).normal(size=(3, served.query_dim)).astype(np.float32)
  want = pipeline.predict_batched(m.params, emb, k1=m.k1, k_pool=m.k_pool,
                                  max_size=m.max_set_size, ranking=served.default_ranking)
  for q in range(3):
    row = served.predict(emb[q:q + 1], served.defaults)[0]
    assert row["set"] == [m.tool_ids[t] for t in want.set_tools[q] if t >= 0]
    assert row["shortlist"] == [m.tool_ids[t] for t in want.shortlist[q]]
    assert row["ranking"] == [m.tool_ids[t] for t in want.ranking[q]]
    assert row["set_score"] == pytest.approx(float(want.set_score[q]), abs=1e-5)

  # One tool in, one out: the same shapes, so the successor runs on the same programs.
  plan = plan_update(served, [ToolIn(id="same_size", description="Book a table.")],
                     [m.tool_ids[0]])
  vector = np.random.default_rng(6).normal(size=m.params.tool_embeddings.shape[1])
  successor = build_successor(served, plan, {"same_size": vector.astype(np.float32)})
  assert successor.num_tools == served.num_tools
  assert successor.programs is served.programs and successor.programs.traces == 1
