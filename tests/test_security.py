"""No code runs from a file the project loads, and tool text is data, never code.

(a) A malicious pickle — one whose ``__reduce__`` would create a marker file — placed where the
    project reads arrays (``hyset predict --query-embeddings`` as an object-dtype .npy, an .npz,
    a bare pickle; the neighbour-table cache beside a model) or a library (``mcp:``) makes the
    command fail with a clear error, or the cache be rebuilt; the marker never appears.
(b) Tool texts built to look like code (``{__import__('os').system(...)}``, ``${...}``,
    ``{{...}}``, ``$(...)``, NUL bytes, 100,000 characters) pass through the readers, the
    encoder and its cache, ``hyset predict``'s output and the server as plain data.
Plus the server's defaults: no CORS headers, the loopback warning.
"""
from __future__ import annotations

import json
import os
import pathlib
import pickle
import time

import numpy as np
import pytest

from hyset_jax import cli
from hyset_jax.data.specs import load_dataset
from hyset_jax.data.tooltext import render_tool

import test_fuzz
from test_predict_cli import D, N, write_model_dir


class Payload:
  """Unpickling calls ``pathlib.Path(marker).touch()``: the marker's existence proves code ran."""

  def __init__(self, marker: pathlib.Path):
    self.marker = marker

  def __reduce__(self):
    return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def _live(tmp_path: pathlib.Path) -> None:
  """The payload is live: plain ``pickle.loads`` does create a marker."""
  probe = tmp_path / "probe-marker"
  pickle.loads(pickle.dumps(Payload(probe)))
  assert probe.exists()


def _evil_files(root: pathlib.Path, marker: pathlib.Path) -> dict[str, pathlib.Path]:
  root.mkdir(parents=True, exist_ok=True)
  objects = np.empty((2, D), dtype=object)
  objects[:] = Payload(marker)
  files = {"object .npy": root / "obj.npy", "object .npz": root / "obj.npz",
           "bare pickle as .npy": root / "bare.npy"}
  np.save(files["object .npy"], objects, allow_pickle=True)
  np.savez(files["object .npz"], x=objects)
  files["bare pickle as .npy"].write_bytes(pickle.dumps(Payload(marker)))
  return files


@pytest.mark.parametrize("kind", ["object .npy", "object .npz", "bare pickle as .npy"])
def test_a_pickle_as_query_embeddings_is_refused(tmp_path, capsys, kind):
  _live(tmp_path)
  marker = tmp_path / "marker"
  write_model_dir(tmp_path / "model")
  evil = _evil_files(tmp_path / "in", marker)[kind]
  assert cli.main(["predict", "--model", str(tmp_path / "model"), "--query-embeddings",
                   str(evil), "--out", str(tmp_path / "pred.jsonl")]) == 2
  err = capsys.readouterr().err
  assert str(evil) in err and "Traceback" not in err
  assert not marker.exists() and not (tmp_path / "pred.jsonl").exists()


def test_a_pickle_in_the_neighbour_cache_is_rebuilt_not_run(tmp_path, monkeypatch):
  """The table cached beside a model is read with allow_pickle=False: a file replaced by a
  pickle (or an object array) is a cache miss, rebuilt, and the answers do not change."""
  monkeypatch.setenv("HYSET_CACHE", str(tmp_path / "cache"))
  marker = tmp_path / "marker"
  write_model_dir(tmp_path / "model")
  np.save(tmp_path / "q.npy", np.random.default_rng(1).normal(size=(3, D)).astype(np.float32))

  def predict(out: str) -> list[dict]:
    assert cli.main(["predict", "--model", str(tmp_path / "model"), "--query-embeddings",
                     str(tmp_path / "q.npy"), "--out", str(tmp_path / out)]) == 0
    return [json.loads(line) for line in (tmp_path / out).read_text().splitlines()]

  first = predict("p1.jsonl")
  cached = sorted(tmp_path.rglob("neighbors-*.npz"))
  assert cached, "hyset predict wrote no neighbour table to replace"
  objects = np.empty((N, 2), dtype=object)
  objects[:] = Payload(marker)
  for i, path in enumerate(cached):
    if i % 2:
      path.write_bytes(pickle.dumps(Payload(marker)))
    else:
      with open(path, "wb") as f:
        np.savez(f, key=np.array("x"), ids=objects, scores=objects)
  assert predict("p2.jsonl") == first
  assert not marker.exists()


def test_a_pickle_as_a_tool_library_is_refused(tmp_path):
  """A protocol-0 pickle is ASCII text: the JSON readers refuse it, nothing unpickles it."""
  marker = tmp_path / "marker"
  for i, protocol in enumerate((0, pickle.HIGHEST_PROTOCOL)):
    path = tmp_path / f"tools{i}.json"
    path.write_bytes(pickle.dumps(Payload(marker), protocol=protocol))
    for scheme in ("mcp", "openai"):
      with pytest.raises(test_fuzz.UserError, match=str(path)):
        load_dataset(f"{scheme}:{path}")
  assert not marker.exists()


# --------------------------------------------------------------------------- (b) tool text

def _evil_texts(marker: pathlib.Path) -> list[str]:
  return [f"{{__import__('os').system('touch {marker}')}}",
          f"${{touch {marker}}}", f"$(touch {marker})", f"`touch {marker}`",
          "{{7*7}} {% for x in y %}{{x}}{% endfor %}", "%(name)s %s {0} {name!r}",
          "<script>alert(1)</script>", "a\x00b\x00", "\u202eevil\u200b\ufeff",
          "x" * 100_000]


def _evil_library(tmp_path: pathlib.Path, marker: pathlib.Path) -> tuple[pathlib.Path, list]:
  texts = _evil_texts(marker)
  tools = [{"name": f"tool{i}:{text[:50]}", "description": text,
            "inputSchema": {"type": "object", "properties": {text[:20]: {"default": text}}}}
           for i, text in enumerate(texts)]
  path = tmp_path / "evil.json"
  path.write_text(json.dumps({"tools": tools}), encoding="utf-8")
  return path, tools


def test_tool_text_that_looks_like_code_is_read_as_data(tmp_path):
  marker = tmp_path / "marker"
  path, tools = _evil_library(tmp_path, marker)
  library = load_dataset(f"mcp:{path}").tools
  assert list(library.ids) == [t["name"] for t in tools]
  for i, tool in enumerate(tools):
    assert library.texts[i] == render_tool(tool["name"], tool["description"],
                                           tool["inputSchema"])
    assert library.metadata[i]["description"] == tool["description"].strip()
    assert library.metadata[i]["parameters"] == tool["inputSchema"]
  assert not marker.exists()


def test_tool_text_through_the_encoder_and_its_cache(tmp_path):
  """The real encoder and its on-disk cache (keyed by the text's hash): the same vectors from
  the cache as computed, one per distinct text, whatever the text holds."""
  from hyset_jax.encoder import DEFAULT_MODEL_NAME, encode_cached, load_encoder
  marker = tmp_path / "marker"
  texts = _evil_texts(marker)
  encoder = load_encoder(DEFAULT_MODEL_NAME)
  fresh = encode_cached(encoder, texts, cache_dir=tmp_path / "cache", progress=False)
  again = encode_cached(encoder, texts, cache_dir=tmp_path / "cache", progress=False)
  np.testing.assert_array_equal(fresh, again)
  assert fresh.shape == (len(texts), encoder.dim) and np.isfinite(fresh).all()
  assert len({row.tobytes() for row in fresh}) == len(texts)
  assert not marker.exists()


def test_tool_ids_that_look_like_code_in_predict_output(tmp_path):
  marker = tmp_path / "marker"
  texts = _evil_texts(marker)
  ids = [f"{i}:{t}" for i, t in enumerate(texts)] + [f"t{i}" for i in range(len(texts), N)]
  write_model_dir(tmp_path / "model", manifest={"tool_ids": ids})
  np.save(tmp_path / "q.npy", np.random.default_rng(2).normal(size=(4, D)).astype(np.float32))
  out = tmp_path / "pred.jsonl"
  assert cli.main(["predict", "--model", str(tmp_path / "model"), "--query-embeddings",
                   str(tmp_path / "q.npy"), "--out", str(out)]) == 0
  rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
  assert len(rows) == 4 and all(set(r["shortlist"]) <= set(ids) for r in rows)
  assert not marker.exists()


@pytest.fixture(scope="module")
def evil_client(tmp_path_factory):
  """The HTTP app on the fuzzer's tiny model, its 40 tools renamed and described with the
  malicious texts."""
  import dataclasses

  from starlette.testclient import TestClient

  from hyset_jax.data.tooltext import definition
  from hyset_jax.serve.app import create_app
  tmp = tmp_path_factory.mktemp("evil")
  marker = tmp / "marker"
  texts = _evil_texts(marker)
  base = test_fuzz.tiny_retriever()
  ids = tuple(f"{i}:{texts[i % len(texts)][:200]}" for i in range(base.num_tools))
  model = dataclasses.replace(base.model, tool_ids=ids)
  defs = [definition(t, None, {"name": t, "description": texts[i % len(texts)],
                               "parameters": {"type": "object"}}) for i, t in enumerate(ids)]
  retriever = type(base)(model, base.encode, defs, max_batch=1)
  app = create_app(retriever, max_batch=1, max_wait_ms=0, max_body_bytes=1 << 20)
  with TestClient(app, raise_server_exceptions=False) as client:
    yield client, ids, texts, marker


def test_tool_text_that_looks_like_code_through_the_server(evil_client):
  client, ids, texts, marker = evil_client
  listed = client.get("/v1/tools").json()["tools"]
  assert [t["id"] for t in listed] == list(ids)
  assert [t["description"] for t in listed] == [texts[i % len(texts)] for i in range(len(ids))]
  r = client.post("/v1/retrieve", json={"queries": texts})
  assert r.status_code == 200, r.text
  for row in r.json()["results"]:
    assert set(row["set"]) <= set(ids)
    for tool in row["tools"]:
      assert tool["description"] == texts[ids.index(tool["id"]) % len(texts)]
  assert not marker.exists()


# --------------------------------------------------------------------------- server defaults

def test_no_cors_headers(evil_client):
  client = evil_client[0]
  origin = {"Origin": "https://evil.example"}
  for r in (client.get("/healthz", headers=origin),
            client.post("/v1/retrieve", json={"query": "x"}, headers=origin),
            client.options("/v1/retrieve", headers={
                **origin, "Access-Control-Request-Method": "POST"})):
    assert not [h for h in r.headers if h.lower().startswith("access-control-")], r.headers


def test_limits_answer_json_errors(tmp_path):
  """413 for the body, 422 for the batch, 503 for the time limit (a device that stalls)."""
  import threading

  from starlette.testclient import TestClient

  from hyset_jax.serve.app import create_app
  retriever = test_fuzz.tiny_retriever()
  stall, release = threading.Event(), threading.Event()
  slow = retriever.retrieve_batch

  def stalled(requests):
    if stall.is_set():
      release.wait(10)
    return slow(requests)
  retriever.retrieve_batch = stalled
  app = create_app(retriever, max_batch=1, max_wait_ms=0, max_body_bytes=200, max_queries=2,
                   request_timeout_s=0.3)
  with TestClient(app, raise_server_exceptions=False) as client:
    # The first request compiles the prediction, which can take longer than the time limit on
    # a loaded machine (a 503 then, while the compilation finishes): warm up before stalling,
    # so the last request below is answered in time.
    for _ in range(100):
      if client.post("/v1/retrieve", json={"query": "a"}).status_code == 200:
        break
      time.sleep(0.2)
    stall.set()
    big = client.post("/v1/retrieve", json={"query": "x" * 300})
    many = client.post("/v1/retrieve", json={"queries": ["a", "b", "c"]})
    late = client.post("/v1/retrieve", json={"query": "a"})
    stall.clear()
    release.set()
    assert (big.status_code, big.json()["error"]["field"]) == (413, "body")
    assert (many.status_code, many.json()["error"]["field"]) == (422, "queries")
    assert late.status_code == 503 and "--request-timeout" in late.json()["error"]["message"]
    assert client.post("/v1/retrieve", json={"query": "a"}).status_code == 200


@pytest.mark.parametrize("host,warned", [("127.0.0.1", False), ("localhost", False),
                                         ("::1", False), ("127.0.0.2", False),
                                         ("0.0.0.0", True), ("::", True),
                                         ("192.168.1.5", True), ("example.org", True)])
def test_a_warning_when_listening_beyond_loopback(capsys, host, warned):
  from hyset_jax.commands.serve import warn_if_exposed
  warn_if_exposed(host)
  err = capsys.readouterr().err
  assert ("warning: listening on" in err) == warned
  assert not warned or "no authentication" in err


def test_the_default_host_is_loopback():
  import argparse

  from hyset_jax.commands import serve
  parser = argparse.ArgumentParser()
  serve.add_parser(parser.add_subparsers())
  args = parser.parse_args(["serve", "--model", "m"])
  assert args.host == "127.0.0.1" and args.request_timeout == 30.0
  assert args.max_body_bytes == 1 << 20 and args.max_queries == 256
