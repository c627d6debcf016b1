"""Fuzzing with Hypothesis: generated files, overrides and requests, bounded for ``make test``.

Targets: the data readers ``beir:``, ``toolbench:``, ``bfcl:PATH``, ``mcp:``, ``openai:`` and
``toolret:`` (well-formed and broken files in a temporary folder: JSON that is not an object,
wrong types, missing fields, bad UTF-8, empty files, 5000-digit integers, deep nesting, lone
surrogates, duplicated ids, truncation), the ``--set KEY=VALUE`` parser, the HTTP request
bodies of ``hyset serve`` (its FastAPI app on a tiny synthetic model), MCP JSON-RPC messages
(the MCP server's streamable-HTTP app, in process), model files (valid model directories and
npz exports of every term, mutated: manifest fields, tensors, the safetensors header, lexical.json,
the bytes) and ``torch.save`` checkpoints of the peer format (valid ones, mutated: zip entries,
pickle opcodes, callables spliced in, storages). The property everywhere: a clean result or
the project's clear error (:class:`~hyset_jax.errors.UserError`, a 4xx JSON body, a JSON-RPC
error) — never another exception, a hang or a 5xx; a model read must predict, and nothing a
checkpoint names may run.

Each target is a strategy plus a ``check`` function in :data:`TARGETS`, so the long run
(``python -m benchmarks.fuzz --minutes N``) drives the same code. The bounded run here is
derandomized (the same cases every run) and takes ~45 s on one core (half of it the model
target, which predicts with each model it reads). Every bug the fuzzer found has its example
in :data:`REGRESSIONS` (run as plain parametrized tests).
"""
from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import functools
import hashlib
import io
import json
import math
import os
import pathlib
import pickletools
import struct
import tempfile
import warnings
import zipfile
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyset_jax import config as config_lib
from hyset_jax.data.specs import load_dataset
from hyset_jax.errors import UserError

# --------------------------------------------------------------------------- file strategies

MISSING = object()  # a field left out of a generated object


def _json_values(max_leaves: int = 6) -> st.SearchStrategy:
  leaves = (st.none() | st.booleans() | st.integers(-2**70, 2**70)
            | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12))
  return st.recursive(leaves, lambda c: st.lists(c, max_size=3)
                      | st.dictionaries(st.text(max_size=6), c, max_size=3),
                      max_leaves=max_leaves)


ANY = _json_values()
TEXT = st.text(min_size=0, max_size=20)
NAME = st.sampled_from(["get_weather", "send_email", "book", "t1", "x"]) | st.text(max_size=8)


def field(good: st.SearchStrategy) -> st.SearchStrategy:
  """Mostly a well-formed value, sometimes any JSON value, sometimes missing."""
  return st.one_of(good, good, good, ANY, st.just(MISSING))


def obj(**fields: st.SearchStrategy) -> st.SearchStrategy:
  """A JSON object whose fields are drawn independently; MISSING ones are left out."""
  return st.fixed_dictionaries(fields).map(
      lambda d: {k: v for k, v in d.items() if v is not MISSING})


def maybe(entry: st.SearchStrategy) -> st.SearchStrategy:
  """An entry, or now and then any JSON value in its place (a list where an object goes)."""
  return st.one_of(entry, entry, entry, ANY)


SCHEMA = st.one_of(st.just({"type": "object", "properties": {"x": {"type": "integer"}}}),
                   st.just({}), st.none(), ANY)

# File-level damage, applied to the serialised text: (name, text, position) -> bytes.
_BAD_UTF8 = b"\xff\xfe\xc3"


def _mutate(kind: str, text: str, pos: int) -> bytes:
  data = text.encode("utf-8", "surrogatepass")
  cut = pos % (len(data) + 1)
  if kind == "none":
    return data
  if kind == "truncate":
    return data[:cut]
  if kind == "empty":
    return b""
  if kind == "bad_utf8":
    return data[:cut] + _BAD_UTF8 + data[cut:]
  if kind == "bom":
    return b"\xef\xbb\xbf" + data
  if kind == "huge_int":  # over Python's 4300-digit int limit: json raises ValueError
    i = data.find(b"[")
    return data[:i + 1] + b"1" * 5000 + b"," + data[i + 1:] if i >= 0 else b"1" * 5000
  if kind == "deep":  # deeper than the json module's recursion limit
    return b"[" * 100_000 + b"]" * 100_000
  if kind == "surrogate":  # valid JSON, not valid text
    i = data.find(b'"')
    return data[:i + 1] + b"\\ud800" + data[i + 1:] if i >= 0 else b'"\\udc00"'
  if kind == "nan":
    return data.replace(b"0", b"NaN", 1)
  if kind == "crlf":
    return data.replace(b"\n", b"\r\n")
  raise ValueError(kind)


MUTATION = st.sampled_from(["none", "none", "none", "truncate", "empty", "bad_utf8", "bom",
                            "huge_int", "deep", "surrogate", "nan", "crlf"])
FILE_DAMAGE = st.tuples(MUTATION, st.integers(0, 10_000))


def _jsonl(rows: list[Any]) -> str:
  return "".join(json.dumps(r) + "\n" for r in rows)


def _write(root: pathlib.Path, name: str, text: str, damage: tuple[str, int]) -> None:
  path = root / name
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_bytes(_mutate(damage[0], text, damage[1]))


# beir: corpus.jsonl, queries.jsonl, qrels/<split>.tsv
IDS = st.sampled_from(["t0", "t1", "t2", "q0", "q1", 0, 7]) | st.text(max_size=4)
BEIR = st.fixed_dictionaries({
    "corpus": st.lists(maybe(obj(_id=field(IDS), title=field(TEXT), text=field(TEXT),
                                 metadata=field(st.just({"source": "s"})))), max_size=4),
    "queries": st.lists(maybe(obj(_id=field(IDS), text=field(TEXT),
                                  metadata=field(st.just({"source": "s"})))), max_size=4),
    "qrels": st.lists(st.tuples(IDS.map(str), IDS.map(str),
                                st.sampled_from(["1", "0", "2", "x", "", "9" * 30])),
                      max_size=5),
    "header": st.sampled_from(["query-id\tcorpus-id\tscore", "q\tc\ts", ""]),
    "split": st.sampled_from(["train", "test", "validation", "odd name"]),
    "damage": st.tuples(FILE_DAMAGE, FILE_DAMAGE, FILE_DAMAGE),
})


WORDS = st.text(min_size=1, max_size=12).filter(str.strip)
NO_DAMAGE = st.just(("none", 0))


@st.composite
def _beir_good(draw) -> dict:
  """A consistent BEIR folder (every qrels id exists), so clean reads are exercised too."""
  n, q = draw(st.integers(1, 3)), draw(st.integers(1, 3))
  rows = [(f"q{i}", f"t{draw(st.integers(0, n - 1))}", "1") for i in range(q)]
  return {"corpus": [{"_id": f"t{i}", "title": "", "text": draw(WORDS)} for i in range(n)],
          "queries": [{"_id": f"q{i}", "text": draw(WORDS)} for i in range(q)],
          "qrels": rows, "header": "query-id\tcorpus-id\tscore", "split": "test",
          "damage": (("none", 0),) * 3}


BEIR = st.one_of(BEIR, _beir_good())


def _beir(root: pathlib.Path, d: dict) -> str:
  _write(root, "corpus.jsonl", _jsonl(d["corpus"]), d["damage"][0])
  _write(root, "queries.jsonl", _jsonl(d["queries"]), d["damage"][1])
  qrels = d["header"] + "\n" + "".join("\t".join(r) + "\n" for r in d["qrels"])
  _write(root, f"qrels/{d['split']}.tsv", qrels, d["damage"][2])
  return f"beir:{root}"


# toolbench: a list of {"query", "query_id", "api_list", "relevant APIs"}
API = obj(category_name=field(TEXT), tool_name=field(NAME), api_name=field(NAME),
          api_description=field(TEXT),
          required_parameters=field(st.just([{"name": "q", "type": "STRING"}])),
          optional_parameters=field(st.just([])))
TOOLBENCH = st.fixed_dictionaries({
    "entries": maybe(st.lists(maybe(obj(
        query=field(TEXT), query_id=field(st.integers(0, 3) | IDS),
        api_list=field(st.lists(maybe(API), max_size=3)),
        **{"relevant APIs": field(st.lists(st.lists(NAME, min_size=0, max_size=3),
                                           max_size=3))})), max_size=4)),
    "damage": FILE_DAMAGE,
})


@st.composite
def _toolbench_good(draw) -> dict:
  apis = [{"tool_name": draw(NAME), "api_name": draw(NAME), "api_description": draw(TEXT)}
          for _ in range(draw(st.integers(1, 3)))]
  entries = [{"query": draw(WORDS), "query_id": i, "api_list": apis,
              "relevant APIs": [[a["tool_name"], a["api_name"]] for a in apis[:2]]}
             for i in range(draw(st.integers(1, 3)))]
  return {"entries": entries, "damage": ("none", 0)}


TOOLBENCH = st.one_of(TOOLBENCH, _toolbench_good())


def _toolbench(root: pathlib.Path, d: dict) -> str:
  _write(root, "G1_query.json", json.dumps(d["entries"]), d["damage"])
  return f"toolbench:{root}"


# bfcl:PATH: BFCL_v4_<category>.json (JSON lines) and possible_answer/ of the same name
FUNCTION = obj(name=field(NAME), description=field(TEXT), parameters=field(SCHEMA))
MESSAGE = obj(role=field(st.sampled_from(["user", "system"])), content=field(TEXT))
BFCL = st.fixed_dictionaries({
    "questions": st.lists(maybe(obj(
        id=field(st.sampled_from(["simple_0", "simple_1"]) | IDS),
        question=field(st.lists(st.lists(maybe(MESSAGE), max_size=2), max_size=2)),
        function=field(st.lists(maybe(FUNCTION), max_size=3)))), max_size=3),
    "answers": st.lists(maybe(obj(
        id=field(st.sampled_from(["simple_0", "simple_1"]) | IDS),
        ground_truth=field(st.lists(maybe(st.dictionaries(NAME, ANY, max_size=2)),
                                    max_size=2)))), max_size=3),
    "answered": st.booleans(),
    "damage": st.tuples(FILE_DAMAGE, FILE_DAMAGE),
})


@st.composite
def _bfcl_good(draw) -> dict:
  fns = [{"name": f"f{i}", "description": draw(TEXT), "parameters": draw(SCHEMA)}
         for i in range(draw(st.integers(1, 3)))]
  fns = [{k: v for k, v in f.items() if v is not None} for f in fns]
  q = draw(st.integers(1, 3))
  questions = [{"id": f"simple_{i}", "question": [[{"role": "user", "content": draw(WORDS)}]],
                "function": fns} for i in range(q)]
  answers = [{"id": f"simple_{i}", "ground_truth": [{fns[0]["name"]: {}}]} for i in range(q)]
  return {"questions": questions, "answers": answers, "answered": True,
          "damage": (("none", 0), ("none", 0))}


BFCL = st.one_of(BFCL, _bfcl_good())


def _bfcl(root: pathlib.Path, d: dict) -> str:
  _write(root, "BFCL_v4_simple.json", _jsonl(d["questions"]), d["damage"][0])
  if d["answered"]:
    _write(root, "possible_answer/BFCL_v4_simple.json", _jsonl(d["answers"]), d["damage"][1])
  return f"bfcl:{root}"


# mcp: / openai: one JSON document
MCP_TOOL = obj(name=field(NAME), description=field(TEXT | st.none()),
               inputSchema=field(SCHEMA))
MCP = st.fixed_dictionaries({
    "doc": st.one_of(st.lists(maybe(MCP_TOOL), max_size=4).map(lambda t: {"tools": t}),
                     st.lists(maybe(MCP_TOOL), max_size=3).map(
                         lambda t: {"jsonrpc": "2.0", "id": 1, "result": {"tools": t}}),
                     ANY),
    "damage": FILE_DAMAGE,
})
OPENAI_FN = obj(name=field(NAME), description=field(TEXT | st.none()),
                parameters=field(SCHEMA))
OPENAI_TOOL = st.one_of(
    obj(type=field(st.sampled_from(["function", "code_interpreter"])), function=field(OPENAI_FN)),
    st.tuples(st.sampled_from(["function"]), OPENAI_FN).map(lambda t: {"type": t[0], **t[1]}))
OPENAI = st.fixed_dictionaries({
    "doc": st.one_of(st.lists(maybe(OPENAI_TOOL), max_size=4),
                     st.lists(maybe(OPENAI_TOOL), max_size=3).map(lambda t: {"tools": t}), ANY),
    "damage": FILE_DAMAGE,
})


def _mcp(root: pathlib.Path, d: dict) -> str:
  _write(root, "tools.json", json.dumps(d["doc"]), d["damage"])
  return f"mcp:{root / 'tools.json'}"


def _openai(root: pathlib.Path, d: dict) -> str:
  _write(root, "tools.json", json.dumps(d["doc"]), d["damage"])
  return f"openai:{root / 'tools.json'}"


# toolret: tools.jsonl and queries.jsonl
DOC = st.one_of(
    st.just({"name": "get_weather", "description": "Weather.", "parameters": {"type": "object"}}),
    st.just({"tool_name": "T", "api_name": "A", "api_description": "d"}), TEXT, ANY,
    ANY.map(json.dumps), st.just('{"name": "n", "description": "\\ud800"}'),
    st.just("1" * 5000), st.just("[" * 5000))
LABEL = obj(id=field(IDS), relevance=field(st.integers(-1, 2) | st.floats()))
TOOLRET = st.fixed_dictionaries({
    "tools": st.lists(maybe(obj(id=field(IDS), documentation=field(DOC))), max_size=4),
    "queries": st.lists(maybe(obj(
        id=field(IDS), query=field(TEXT), instruction=field(TEXT | st.none()),
        labels=field(st.lists(maybe(LABEL), max_size=3)
                     | st.lists(LABEL, max_size=2).map(json.dumps) | TEXT))), max_size=3),
    "damage": st.tuples(FILE_DAMAGE, FILE_DAMAGE),
})


def _toolret(root: pathlib.Path, d: dict) -> str:
  _write(root, "tools.jsonl", _jsonl(d["tools"]), d["damage"][0])
  _write(root, "queries.jsonl", _jsonl(d["queries"]), d["damage"][1])
  return f"toolret:{root}"


def check_dataset(dataset) -> None:
  """What every consumer relies on from a clean read: distinct tool ids, UTF-8-encodable
  texts (the tokenizer and every output file need it), gold sets sorted and distinct."""
  tools = dataset.tools
  assert len(tools) > 0 and len(set(tools.ids)) == len(tools.ids)
  assert len(tools.texts) == len(tools.ids) == len(tools.metadata)
  for text in (*tools.ids, *tools.texts):
    assert isinstance(text, str)
    text.encode("utf-8")
  for queries in dataset.splits.values():
    for q in queries:
      q.text.encode("utf-8")
      assert q.text.strip() and list(q.gold) == sorted(set(q.gold)) and q.gold


def reader_check(write: Callable[[pathlib.Path, dict], str]) -> Callable[[dict], str]:
  """check(case): write the case's files, read them; 'ok' or 'user_error', else raises."""
  def check(case: dict) -> str:
    with tempfile.TemporaryDirectory(prefix="hyset-fuzz-") as tmp:
      spec = write(pathlib.Path(tmp), case)
      try:
        dataset = load_dataset(spec)
      except UserError as e:
        assert str(e).strip()
        return "user_error"
      check_dataset(dataset)
      return "ok"
  return check


# --------------------------------------------------------------------------- --set overrides

def _config_keys() -> list[str]:
  """Every settable key: ``name`` and ``section.field`` for each section's fields."""
  out = []
  for name, value in vars(config_lib.Config()).items():
    if dataclasses.is_dataclass(value):
      out.extend(f"{name}.{f.name}" for f in dataclasses.fields(value))
    else:
      out.append(name)
  return out


KEYS = _config_keys()
VALUES = st.one_of(st.sampled_from(["1", "0", "-1", "true", "False", "nan", "inf", "-inf",
                                    "1e400", "0.5", "1_000", "(0.5,0.3,0.2)", "0.5,0.5",
                                    "greedy", "auto", "", "9" * 5000, " 7 ", "\x00"]),
                   st.integers().map(str), st.floats().map(str), st.text(max_size=10))
OVERRIDE = st.one_of(
    st.tuples(st.sampled_from(KEYS), VALUES).map("=".join),
    st.tuples(st.sampled_from(KEYS + ["train", "model.x", "train..seed", "", ".", "a.b.c"])
              | st.text(max_size=12), VALUES).map("=".join),
    st.text(max_size=20))
OVERRIDES = st.lists(OVERRIDE, min_size=1, max_size=3)


def check_overrides(items: list[str]) -> str:
  """apply_overrides then validate: a Config holding what was asked, or a UserError."""
  try:
    config = config_lib.validate(config_lib.apply_overrides(config_lib.Config(), items))
  except UserError as e:
    assert str(e).strip()
    return "user_error"
  assert isinstance(config, config_lib.Config)
  # No wrong answer: the last value given for each key is the one held, and numbers are finite.
  for item in items:
    key, _, text = item.partition("=")
    section, _, name = key.strip().partition(".")
    if not name:
      continue  # the config's own name: a string
    value = getattr(getattr(config, section), name)
    if isinstance(value, bool):
      assert value == (text.strip().lower() in ("true", "1")) or _later(items, key)
    elif isinstance(value, int):
      assert value == int(text) or _later(items, key)
    elif isinstance(value, float):
      assert math.isfinite(value) and (value == float(text) or _later(items, key))
  for value in config.train.negative_mix:
    assert math.isfinite(value)
  return "ok"


def _later(items: list[str], key: str) -> bool:
  keys = [i.partition("=")[0].strip() for i in items]
  return keys.count(key.strip()) > 1


# --------------------------------------------------------------------------- the server

def tiny_retriever(max_batch: int = 1):
  """A 40-tool model (M = 3, K1 = 4, K_pool = 8) with random θ and a hashing stand-in for the
  encoder: the server's whole request path in seconds, without an encoder to load. One device
  batch size (max_batch 1) so that few programs compile."""
  from hyset_jax.model import parameters as model_lib
  from hyset_jax.io import modeldir
  from hyset_jax.data.tooltext import definition
  from hyset_jax.serve.retriever import Retriever
  rng = np.random.default_rng(0)
  n, d, m = 40, 16, 3
  params = model_lib.host_params(model_lib.init_params(
      rng.normal(size=(n, d)).astype(np.float32), d, m))
  a = rng.normal(size=(m - 1, d, d)).astype(np.float32) * 0.1
  params = params._replace(interactions=(a + a.transpose(0, 2, 1)) / 2)
  model = modeldir.ModelDir(params, tuple(f"t{i}" for i in range(n)), m, 4, 8, "hashing")

  def encode(texts):
    rows = [np.random.default_rng(int.from_bytes(
        hashlib.sha256(t.encode("utf-8")).digest()[:8], "big")).normal(size=d) for t in texts]
    return np.asarray(rows, np.float32).reshape(len(texts), d)

  defs = [definition(t, None, {"name": t, "description": f"Tool {t}.",
                               "parameters": {"type": "object"}}) for t in model.tool_ids]
  return Retriever(model, encode, defs, max_batch=max_batch)


# Valid option values are few (each (max_size, k_pool) pair compiles once); invalid ones many.
QUERY_TEXT = st.one_of(st.text(max_size=30), st.sampled_from(
    ["book a flight", " ", "", "\x00", "\ud800", "{__import__('os').system('x')}", "${HOME}"]))
OPTION = {"max_size": st.sampled_from([2, 3]) | ANY, "k_pool": st.sampled_from([8, 40]) | ANY,
          "ranking": st.sampled_from(["greedy", "logit", "set-first"]) | ANY}
BODY = st.one_of(
    obj(query=field(QUERY_TEXT), max_size=st.just(MISSING) | OPTION["max_size"],
        k_pool=st.just(MISSING) | OPTION["k_pool"], ranking=st.just(MISSING) | OPTION["ranking"]),
    obj(queries=field(st.lists(QUERY_TEXT | ANY, max_size=6)),
        max_size=st.just(MISSING) | OPTION["max_size"]),
    st.dictionaries(st.text(max_size=8), ANY, max_size=3),
    ANY)
RAW = st.one_of(st.binary(max_size=60), st.just(b'{"query": "\\ud800"}'),
                st.just(b'{"\\udc00": 1}'), st.just(b"[" * 5000),
                st.just(b'{"query": 1' + b"0" * 5000 + b"}"),
                st.just(b'{"query": "a", "query": 3}'), st.just(b"\xff"))
HTTP_CASE = st.one_of(
    st.tuples(st.just("POST /v1/retrieve"), BODY.map(lambda b: json.dumps(b).encode())),
    st.tuples(st.just("POST /v1/retrieve"), RAW),
    st.tuples(st.sampled_from(["GET /v1/tools", "GET /healthz", "GET /v1/retrieve",
                               "POST /v1/tools", "POST /healthz", "GET /nowhere",
                               "DELETE /v1/retrieve"]), st.binary(max_size=20)))
MAX_QUERIES = 4


class HttpTarget:
  """The FastAPI app of ``hyset serve`` on :func:`tiny_retriever`, behind a TestClient."""

  def __init__(self):
    from starlette.testclient import TestClient

    from hyset_jax.serve.app import create_app
    self.retriever = tiny_retriever()
    app = create_app(self.retriever, max_batch=1, max_wait_ms=0, max_body_bytes=4096,
                     max_queries=MAX_QUERIES, request_timeout_s=60)
    self._stack = contextlib.ExitStack()
    self.client = self._stack.enter_context(TestClient(app, raise_server_exceptions=False))

  def close(self):
    self._stack.close()

  def check(self, case: tuple[str, bytes]) -> str:
    route, body = case
    method, path = route.split()
    r = self.client.request(method, path, content=body,
                            headers={"Content-Type": "application/json"})
    assert r.status_code < 500, (r.status_code, r.text[:500])
    payload = r.json()  # every answer is JSON, errors included
    if r.status_code >= 400:
      err = payload["error"]
      assert isinstance(err["message"], str) and err["message"]
      assert "Traceback" not in r.text and "hyset_jax" not in r.text and "/tmp" not in r.text
      return f"http_{r.status_code}"
    if path == "/v1/retrieve":
      sent = json.loads(body)
      texts = [sent["query"]] if "query" in sent else sent["queries"]
      rows = payload["results"]
      assert len(rows) == len(texts) <= MAX_QUERIES
      for row in rows:  # no wrong answer: a set of shortlist tools, within the asked size
        assert set(row["set"]) <= set(row["shortlist"]) and row["set"]
        assert len(row["set"]) <= (sent.get("max_size") or 3)  # null: the model's
        assert len(row["shortlist"]) == (sent.get("k_pool") or 8)
    return "ok"


RPC_ID = st.integers(-5, 10**30) | st.text(max_size=5) | st.none() | ANY
RPC_PARAMS = st.one_of(
    st.fixed_dictionaries({"name": st.sampled_from(["search_tools", "nope"]) | TEXT,
                           "arguments": st.one_of(
                               obj(query=field(QUERY_TEXT), max_size=field(
                                   st.sampled_from([2, 3, 9, 1]) | ANY)), ANY)}),
    ANY)
RPC = st.one_of(
    obj(jsonrpc=field(st.just("2.0")), id=field(RPC_ID),
        method=field(st.sampled_from(["tools/call", "tools/list", "initialize", "ping",
                                      "resources/list", "nope"]) | TEXT),
        params=field(RPC_PARAMS)),
    st.lists(ANY, max_size=2), ANY)
MCP_CASE = st.one_of(RPC.map(lambda m: json.dumps(m).encode()), RAW)


class McpTarget:
  """The MCP server's streamable-HTTP app (stateless, JSON answers), in process."""
  HEADERS = {"Accept": "application/json, text/event-stream",
             "Content-Type": "application/json"}

  def __init__(self):
    from starlette.testclient import TestClient

    from hyset_jax.serve.mcp_server import build_server
    self.retriever = tiny_retriever()
    server = build_server(self.retriever, max_batch=1, max_wait_ms=0, request_timeout_s=60)
    app = server.streamable_http_app(stateless_http=True, json_response=True)
    self._stack = contextlib.ExitStack()
    # The SDK refuses Host headers other than the loopback it listens on (DNS rebinding).
    self.client = self._stack.enter_context(TestClient(
        app, raise_server_exceptions=False, base_url="http://127.0.0.1:8080"))

  def close(self):
    self._stack.close()

  def check(self, body: bytes) -> str:
    r = self.client.post("/mcp", content=body, headers=self.HEADERS)
    assert r.status_code < 500, (r.status_code, r.text[:500])
    if not r.content:  # a notification (no id) is answered 202 with no body
      return f"http_{r.status_code}"
    payload = r.json()
    assert "Traceback" not in r.text and "hyset_jax" not in r.text
    if isinstance(payload, dict) and "error" in payload:
      return "rpc_error"
    result = payload.get("result", {}) if isinstance(payload, dict) else {}
    if result.get("isError"):
      text = result["content"][0]["text"]
      assert "internal error" not in text, text  # a bad argument is named, not a crash
      return "tool_error"
    return "ok"


# --------------------------------------------------------------------------- model files

# Valid models built as tests/test_terms.py builds them (one per term, none and all) and saved by
# save_model_dir, once per process; each case mutates a decoded copy and writes it again, as a
# model directory or as export.write_npz lays out an npz export.
MODEL_VARIANTS = ["none", "tower", "conditioned", "prior", "lexical", "set_weight", "abstain",
                  "all"]
MODEL_FILES = ("manifest.json", "params.safetensors", "lexical.json", "model.npz")


@functools.cache
def _valid_model(variant: str) -> dict:
  """manifest (dict), tensors (name -> array, header order), lexical (dict or None) and the
  query texts: the decoded pieces a case starts from."""
  import test_terms
  from hyset_jax.io import modeldir
  md = test_terms.build(variant)
  with tempfile.TemporaryDirectory(prefix="hyset-fuzz-") as tmp:
    path = modeldir.save_model_dir(pathlib.Path(tmp) / "m", md)
    manifest = json.loads((path / "manifest.json").read_text())
    lexical = (json.loads((path / "lexical.json").read_text())
               if (path / "lexical.json").is_file() else None)
  return {"manifest": manifest, "tensors": modeldir.tensors(md.params, md.max_set_size),
          "lexical": lexical, "texts": list(test_terms.QUERY_TEXTS)}


_ST_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64",
              np.dtype(np.float16): "F16", np.dtype(np.int32): "I32", np.dtype(np.int64): "I64",
              np.dtype(np.int8): "I8", np.dtype(np.uint8): "U8", np.dtype(np.bool_): "BOOL"}


def _safetensors(tensors: dict, edits: list) -> bytes:
  """A safetensors file written here (not by the library) so that its header can be wrong:
  ``edits`` are (tensor index, header field, value) applied to the header after layout."""
  header, chunks, at = {}, [], 0
  for name, a in tensors.items():
    raw = np.ascontiguousarray(a).tobytes()
    header[name] = {"dtype": _ST_DTYPES.get(a.dtype, str(a.dtype)), "shape": list(a.shape),
                    "data_offsets": [at, at + len(raw)]}
    chunks.append(raw)
    at += len(raw)
  names = list(header)
  for i, key, value in edits:
    if names:
      entry = header[names[i % len(names)]]
      if value is MISSING:
        entry.pop(key, None)
      else:
        entry[key] = value
  text = json.dumps(header).encode()
  return len(text).to_bytes(8, "little") + text + b"".join(chunks)


NAMES = st.integers(0, 40)  # an index into whatever list it picks from
MANIFEST_VALUES = st.one_of(
    st.sampled_from([0, 1, 2, 3, 4, 8, 14, 15, -1, 2**63, 1.5, True, None, "", "greedy",
                     "set-mean", "logit", "set-first", "hyset/1", "hyset/2", "hyset/3",
                     "hyset/4", "hyset/5", "hyset/6", [], ["t0"], ["t0"] * 14,
                     [f"t{i}" for i in range(13)] + ["t0"], ["lexical"], ["prior", "prior"],
                     ["tower", "conditioned", "prior", "lexical", "set_weight", "abstain"],
                     ["nope"]]), ANY)
MANIFEST_KEYS = st.sampled_from(["format", "terms", "tool_ids", "max_set_size", "k1", "k_pool",
                                 "query_encoder", "ranking", "fits", "other"])
TERM_NAMES = st.sampled_from(["tower", "conditioned", "prior", "lexical", "set_weight", "abstain",
                              "nope", ""])
TENSOR_NAMES = st.sampled_from(
    ["tool_embeddings", "projection", "interaction_2", "interaction_3", "interaction_4",
     "tower_w_in", "tower_b_out", "conditioned_u", "conditioned_b", "prior_members", "prior_w",
     "prior_b", "prior_weight", "prior_floor", "lexical_weight", "set_weight", "abstain_w",
     "abstain_b", "abstain_threshold", "junk"]) | NAMES
HEADER_VALUES = st.one_of(
    st.sampled_from(["F32", "F64", "F16", "BF16", "I32", "I64", "U8", "BOOL", "F8_E4M3", "f32",
                     "", None, MISSING, [], [0], [0, 1], [0, 10**6], [-4, 8], [8, 4], [0, 0],
                     [1, 2, 3], [2**63, 2**64], [14, 6], [6, 14], [0, 6], [-1, 6], [10**12],
                     "[14, 6]", {"a": 1}]), ANY)
MODEL_MUTATION = st.one_of(
    st.tuples(st.just("manifest_del"), MANIFEST_KEYS),
    st.tuples(st.just("manifest_set"), MANIFEST_KEYS, MANIFEST_VALUES),
    st.tuples(st.just("terms"), st.sampled_from(["add", "drop", "twice"]), TERM_NAMES),
    st.tuples(st.just("format"), st.sampled_from([1, 2, 3, 4, 5]), st.booleans()),
    st.tuples(st.just("tensor_del"), TENSOR_NAMES),
    st.tuples(st.just("tensor_add"), TENSOR_NAMES, st.sampled_from([(), (3,), (14, 6), (6, 6)])),
    st.tuples(st.just("tensor_value"), TENSOR_NAMES, st.integers(0, 10**6),
              st.sampled_from([math.nan, math.inf, -math.inf, 0.0, 2.0, -1.0, 14.0, 1e30, 3.0])),
    st.tuples(st.just("tensor_dtype"), TENSOR_NAMES,
              st.sampled_from(["float64", "float16", "int32", "int64", "uint8", "bool"])),
    st.tuples(st.just("tensor_shape"), TENSOR_NAMES,
              st.sampled_from(["drop_row", "add_row", "transpose", "flatten", "scalar",
                               "add_axis", "empty"])),
    st.tuples(st.just("unit"), st.integers(0, 13), st.sampled_from([2.0, 0.5, 0.0, 1.001])),
    st.tuples(st.just("asymmetric"), st.integers(2, 4), st.floats(1e-6, 10)),
    st.tuples(st.just("prior_member"), st.integers(0, 11), st.integers(0, 2),
              st.sampled_from([-1, -2, 14, 15, 2**31 - 1, 0, 1, "dup_row", "dup_member"])),
    st.tuples(st.just("header"), NAMES, st.sampled_from(["dtype", "shape", "data_offsets"]),
              HEADER_VALUES),
    st.tuples(st.just("lexical"), st.sampled_from(["tokenizer", "k1", "b", "tool_texts",
                                                   "other"]), MANIFEST_VALUES | st.just(MISSING)),
    st.tuples(st.just("lexical_text"), st.sampled_from(["drop", "add", "empty", "surrogate",
                                                        "not_str"])),
    st.tuples(st.just("file"), st.sampled_from(MODEL_FILES[:3]), MUTATION, st.integers(0, 10**5)),
    st.tuples(st.just("file_bytes"), st.sampled_from(MODEL_FILES[:2]),
              st.sampled_from(["flip", "truncate", "zero", "delete"]), st.integers(0, 10**5),
              st.integers(1, 255)),
    st.deferred(lambda: ZIP_FIELD),  # the npz export only
)


def _tensor_name(tensors: dict, pick) -> str:
  names = list(tensors) or ["tool_embeddings"]
  return names[pick % len(names)] if isinstance(pick, int) else pick


def _reshape(a: np.ndarray, how: str) -> np.ndarray:
  if how == "drop_row":
    return a[:-1] if a.ndim else a
  if how == "add_row":
    return np.concatenate([a, a[:1]]) if a.ndim else a
  if how == "transpose":
    return a.T.copy()
  if how == "flatten":
    return a.reshape(-1)
  if how == "scalar":
    return a.reshape(-1)[:1].reshape(()) if a.size else np.zeros((), a.dtype)
  if how == "add_axis":
    return a[None]
  return a.reshape(-1)[:0] if a.ndim == 0 else a[:0]  # empty


def _apply_model(pieces: dict, op: tuple, files: dict) -> None:
  """One mutation on the decoded model (manifest, tensors, lexical, header edits) or, for
  file/file_bytes, on the serialised files (applied after the rest, by _model_files)."""
  manifest, tensors, lexical = pieces["manifest"], pieces["tensors"], pieces["lexical"]
  kind = op[0]
  if kind == "manifest_del":
    manifest.pop(op[1], None)
  elif kind == "manifest_set":
    manifest[op[1]] = op[2]
  elif kind == "terms":
    listed = manifest.get("terms")
    listed = list(listed) if isinstance(listed, list) else []
    if op[1] == "add":
      listed.append(op[2])
    elif op[1] == "drop" and listed:
      listed.pop(0)
    elif listed:
      listed.append(listed[0])
    manifest["terms"] = listed
  elif kind == "format":  # an older version: its own field rules (no terms, maybe no ranking)
    manifest["format"] = f"hyset/{op[1]}"
    if op[2] and op[1] < 5:
      manifest.pop("terms", None)
      if op[1] == 1:
        manifest.pop("ranking", None)
  elif kind == "tensor_del":
    tensors.pop(_tensor_name(tensors, op[1]), None)
  elif kind == "tensor_add":
    tensors[_tensor_name(tensors, op[1])] = np.ones(op[2], np.float32)
  elif kind == "tensor_value":
    name = _tensor_name(tensors, op[1])
    if name in tensors and tensors[name].size:
      a = tensors[name].copy()
      flat = a.reshape(-1)
      value = op[3] if a.dtype.kind == "f" else int(op[3]) if math.isfinite(op[3]) else -7
      if a.dtype.kind != "f" and not np.can_cast(np.min_scalar_type(value), a.dtype):
        value = 0  # the generator must be able to write it (uint8 cannot hold -7)
      with np.errstate(invalid="ignore", over="ignore"):
        flat[op[2] % flat.size] = value
      tensors[name] = a
  elif kind == "tensor_dtype":
    name = _tensor_name(tensors, op[1])
    if name in tensors:
      with np.errstate(invalid="ignore", over="ignore"):
        tensors[name] = tensors[name].astype(op[2])
  elif kind == "tensor_shape":
    name = _tensor_name(tensors, op[1])
    if name in tensors:
      tensors[name] = _reshape(tensors[name], op[2])
  elif kind == "unit":  # a Z row off the unit sphere
    z = tensors.get("tool_embeddings")
    if z is not None and z.ndim == 2 and z.shape[0]:
      z = z.astype(np.float64) if z.dtype.kind != "f" else z.copy()  # another mutation's dtype
      z[op[1] % z.shape[0]] *= np.float32(op[2])
      tensors["tool_embeddings"] = z
  elif kind == "asymmetric":
    a = tensors.get(f"interaction_{op[1]}")
    if a is not None and a.ndim == 2 and a.shape[0] > 1:
      a = a.copy()
      a[0, 1] += np.float32(op[2])
      tensors[f"interaction_{op[1]}"] = a
  elif kind == "prior_member":
    a = tensors.get("prior_members")
    if a is not None and a.ndim == 2 and a.shape[0] > 1 and a.shape[1] > 1:
      a, i, j = a.copy(), op[1] % a.shape[0], op[2] % a.shape[1]
      if op[3] == "dup_row":
        a[i] = a[(i + 1) % a.shape[0]]
      elif op[3] == "dup_member":
        a[i, j] = a[i, (j + 1) % a.shape[1]]
      else:
        a[i, j] = op[3]
      tensors["prior_members"] = a
  elif kind == "header":
    pieces["header"].append(op[1:])
  elif kind == "lexical":
    if lexical is not None:
      if op[2] is MISSING:
        lexical.pop(op[1], None)
      else:
        lexical[op[1]] = op[2]
  elif kind == "lexical_text":
    texts = None if lexical is None else lexical.get("tool_texts")
    if isinstance(texts, list):
      if op[1] == "drop" and texts:
        texts.pop()
      elif op[1] == "add":
        texts.append("one more tool")
      elif op[1] == "empty" and texts:
        texts[0] = ""
      elif op[1] == "surrogate" and texts:
        texts[0] = "\ud800 tool"
      elif texts:
        texts[0] = 7
  else:
    files.append(op)


MODEL_CASE = st.fixed_dictionaries({
    "variant": st.sampled_from(MODEL_VARIANTS),
    "container": st.sampled_from(["dir", "dir", "npz"]),
    "mutations": st.lists(MODEL_MUTATION, max_size=3),
})


def _zip_field(data: bytes, offset: int, value: int) -> bytes:
  """A zip archive with the 2-byte field at ``offset`` of each central directory entry (and
  its place in each local header) set to ``value``: 8 the flags, 10 the compression method."""
  patched = bytearray(data)
  for sig, off in ((b"PK\x01\x02", offset), (b"PK\x03\x04", offset - 2)):
    at = patched.find(sig)
    while 0 <= at <= len(patched) - off - 2:
      struct.pack_into("<H", patched, at + off, value)
      at = patched.find(sig, at + 4)
  return bytes(patched)


ZIP_FIELD = st.tuples(st.just("zip_field"), st.sampled_from([8, 10]),
                      st.sampled_from([1, 8, 12, 14, 99, 0x41, 0x800]))


def _model_files(case: dict, root: pathlib.Path) -> pathlib.Path:
  """Write the case: a model directory or an npz export under ``root``; returns its path."""
  base = _valid_model(case["variant"])
  pieces = {"manifest": copy.deepcopy(base["manifest"]), "tensors": dict(base["tensors"]),
            "lexical": copy.deepcopy(base["lexical"]), "header": []}
  file_ops: list = []
  for op in case["mutations"]:
    _apply_model(pieces, op, file_ops)
  if case["container"] == "npz":
    arrays = dict(pieces["tensors"])
    fields = dict(pieces["manifest"])
    if pieces["lexical"] is not None:
      fields.update({f"lexical_{k}": v for k, v in pieces["lexical"].items()})
    for k, v in fields.items():
      if v is None:  # write_npz leaves a null field out
        continue
      try:
        a = np.asarray(v)
      except (ValueError, TypeError, OverflowError):
        a = np.asarray(repr(v))
      arrays[k] = np.asarray(repr(v)) if a.dtype == object else a
    path = root / "model.npz"
    try:
      np.savez(path, **arrays)
    except (ValueError, TypeError):  # e.g. a name savez cannot take: the unmutated arrays
      np.savez(path, **base["tensors"])
    data = path.read_bytes()
    for op in file_ops:  # the npz's bytes stand in for the file mutated
      if op[0] == "file" and op[2] in ("truncate", "empty"):  # the text damage that fits
        data = data[:op[3] % (len(data) + 1)] if op[2] == "truncate" else b""
      elif op[0] == "zip_field":
        data = _zip_field(data, op[1], op[2])
      elif op[0] == "file_bytes" and data:
        i = op[3] % len(data)
        data = (data[:i] + bytes([data[i] ^ op[4]]) + data[i + 1:] if op[2] == "flip"
                else data[:i])
    path.write_bytes(data)
    return path
  path = root / "model"
  path.mkdir()
  texts = {"manifest.json": json.dumps(pieces["manifest"]).encode(),
           "params.safetensors": _safetensors(pieces["tensors"], pieces["header"])}
  if pieces["lexical"] is not None:
    texts["lexical.json"] = json.dumps(pieces["lexical"]).encode()
  for op in file_ops:
    data = texts.get(op[1])
    if data is None:
      continue
    if op[0] == "file":  # the readers' text damage (in params.safetensors: its bytes changed)
      texts[op[1]] = _mutate(op[2], data.decode("latin-1"), op[3])
    elif op[2] == "delete":
      del texts[op[1]]
    elif data:
      i = op[3] % len(data)
      texts[op[1]] = {"flip": data[:i] + bytes([data[i] ^ op[4]]) + data[i + 1:],
                      "truncate": data[:i],
                      "zero": data[:i] + bytes(min(op[4], len(data) - i)) + data[i + op[4]:]
                      }[op[2]]
  for name, data in texts.items():
    (path / name).write_bytes(data)
  return path


def _names_a_file(message: str, path: pathlib.Path) -> bool:
  return str(path) in message and (path.suffix == ".npz" or any(f in message for f in MODEL_FILES))


def check_model(case: dict) -> str:
  """load_model_dir (a directory) and the reference's load_model (both containers): a model
  that predicts, or the error naming the file at fault."""
  from hyset_jax.inference import pipeline
  from hyset_jax.io import modeldir, reference
  with tempfile.TemporaryDirectory(prefix="hyset-fuzz-") as tmp:
    path = _model_files(case, pathlib.Path(tmp))
    try:
      ref = reference.load_model(path)
    except reference.ModelError as e:
      assert _names_a_file(str(e), path), str(e)
      ref = None
    if case["container"] == "npz":
      if ref is None:
        return "user_error"
      md = modeldir.from_model(ref, path)
    else:
      try:
        md = modeldir.load_model_dir(path)
      except UserError as e:
        assert _names_a_file(str(e), path), str(e)
        assert ref is None, f"the reference read what load_model_dir refused: {e}"
        return "user_error"
      assert ref is not None, "load_model_dir read what the reference refused"
  d_r = md.params.projection.shape[0]
  queries = np.random.default_rng(3).normal(size=(4, d_r)).astype(np.float32)
  texts = _valid_model(case["variant"])["texts"]
  pred = pipeline.predict_batched(md.params, md.query_inputs(queries, texts), k1=md.k1,
                                  k_pool=md.k_pool, max_size=md.max_set_size,
                                  ranking=md.default_ranking, batch_size=4)
  sets, shortlist = np.asarray(pred.set_tools), np.asarray(pred.shortlist)
  assert ((sets >= -1) & (sets < len(md.tool_ids))).all()
  assert ((shortlist >= 0) & (shortlist < len(md.tool_ids))).all()
  return "ok"


# --------------------------------------------------------------------------- torch.save files

# Where a payload that ran would leave its mark: any file here means code from a file ran.
SENTINEL = pathlib.Path(tempfile.gettempdir()) / f"hyset-fuzz-sentinel-{os.getpid()}"


def _evil(kind: str) -> bytes:
  """Opcodes that call something when unpickled, stack-neutral (they POP their result) so that
  one spliced between two opcodes of a valid pickle leaves it otherwise valid."""
  cmd = f"touch {SENTINEL}"
  expr = f"open({str(SENTINEL)!r}, 'w')"
  return {
      "os.system": b"cos\nsystem\n(V" + cmd.encode() + b"\ntR0",
      "posix.system": b"cposix\nsystem\n(V" + cmd.encode() + b"\ntR0",
      "eval": b"cbuiltins\neval\n(V" + expr.encode() + b"\ntR0",
      "exec": b"c__builtin__\nexec\n(V" + expr.encode() + b"\ntR0",
      "stack_global": b"Vsubprocess\nVcall\n\x93((Vtouch\nV" + str(SENTINEL).encode()
                      + b"\nltR0",
      # BUILD on an allowed global: may only fail, never retarget the class or the closure.
      "build": b"ccollections\nOrderedDict\n(NVfromkeys\ncbuiltins\neval\nd\x86b0",
      "build_storage": b"ctorch\nFloatStorage\n(N}Vcode\nVf8\nsbb0",
      "rebuild": b"ctorch._utils\n_rebuild_tensor_v2\n(Vx\nK\x00)ttR0",
      "inst": b"(V" + cmd.encode() + b"\nios\nsystem\n0",
  }[kind]


EVIL = ["os.system", "posix.system", "eval", "exec", "stack_global", "build", "build_storage",
        "rebuild", "inst"]


def _torch_payload(n: int, d: int, m_max: int, dtype: str) -> dict:
  """A checkpoint's payload as tests/test_peer.py writes one (the authors' layout)."""
  rng = np.random.default_rng(n * 100 + d)
  state = collections.OrderedDict(
      [("Z.weight", rng.standard_normal((n, d)).astype(dtype)),
       ("P.weight", rng.standard_normal((d, d)).astype(dtype))])
  for m in range(2, m_max + 1):
    state[f"interactions.{m}"] = rng.standard_normal((d, d)).astype(dtype)
  return {"format_version": 2, "scorer_state": state,
          "func_names": [f"tool_{i}" for i in range(n)], "d_z": d, "d_r": d, "m_max": m_max,
          "encoder_type": "bert", "extra": [1, 2.5, None, True, "x", (3, 4)]}


TORCH_MUTATION = st.one_of(
    st.tuples(st.just("tensor"), st.sampled_from(["Z.weight", "P.weight", "interactions.2"]),
              st.sampled_from(["float16", "float64", "int64", "bool", "uint8", "empty",
                               "scalar", "3d", "list", "none", "fortran"])),
    st.tuples(st.just("member"), st.integers(0, 20),
              st.sampled_from(["truncate", "flip", "drop", "empty", "dup", "rename", "junk"]),
              st.integers(0, 10**5), st.integers(1, 255)),
    st.tuples(st.just("raw"), st.sampled_from(["truncate", "flip", "insert"]),
              st.integers(0, 10**6), st.integers(1, 255)),
    st.tuples(st.just("opcode"), st.sampled_from(["flip", "delete", "insert", "replace"]),
              st.integers(0, 10**4), st.integers(0, 255)),
    st.tuples(st.just("evil"), st.sampled_from(EVIL), st.integers(0, 10**4)),
    st.tuples(st.just("byteorder"), st.sampled_from([b"big", b"", b"\xff", b"middle"])),
    # A zip header field of every entry (central and local): the flags (encryption) and the
    # compression method of stored data (deflate, bzip2, lzma, unknown).
    ZIP_FIELD,
    st.tuples(st.just("storage"), st.integers(0, 10),
              st.sampled_from(["short", "long", "odd", "drop"])),
)
TORCH_CASE = st.fixed_dictionaries({
    "shape": st.tuples(st.integers(1, 6), st.integers(1, 4), st.integers(2, 3)),
    "dtype": st.sampled_from(["float32", "float32", "float16", "float64"]),
    "folder": st.sampled_from(["archive", "best", "a b"]),
    "mutations": st.lists(TORCH_MUTATION, max_size=3),
})


def _rezip(members: list[tuple[str, bytes]]) -> bytes:
  buf = io.BytesIO()
  with warnings.catch_warnings(), zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
    warnings.simplefilter("ignore")  # a duplicated member is one of the cases
    for name, data in members:
      z.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)
  return buf.getvalue()


def _pickle_edit(data: bytes, op: tuple) -> bytes:
  """An edit at an opcode boundary of data.pkl (found with pickletools)."""
  try:
    starts = [pos for _, _, pos in pickletools.genops(data)]
  except Exception:  # noqa: BLE001 - an already damaged pickle: edit at any byte
    starts = list(range(len(data)))
  if not starts:
    return data
  at = starts[op[2] % len(starts)]
  if op[0] == "evil":
    return data[:at] + _evil(op[1]) + data[at:]
  if op[1] == "flip":
    return data[:at] + bytes([data[at] ^ (op[3] or 1)]) + data[at + 1:]
  if op[1] == "delete":
    end = next((s for s in starts if s > at), len(data))
    return data[:at] + data[end:]
  if op[1] == "insert":
    return data[:at] + bytes([op[3]]) + data[at:]
  return data[:at] + bytes([op[3]]) + data[at + 1:]


def _torch_file(case: dict) -> tuple[bytes, dict]:
  """The checkpoint's bytes and the payload it was written from."""
  from hyset_jax.io.peer import torch_format
  n, d, m_max = case["shape"]
  doc = _torch_payload(n, d, m_max, case["dtype"])
  state = doc["scorer_state"]
  for op in case["mutations"]:
    if op[0] == "tensor":
      a = state.get(op[1])
      a = a if isinstance(a, np.ndarray) else np.zeros((2, 2), np.float32)
      state[op[1]] = {"empty": lambda: a[:0] if a.ndim else a.reshape(-1)[:0],
                      "scalar": lambda: a.reshape(-1)[:1].reshape(()) if a.size else a.sum(),
                      "3d": lambda: a[None], "list": lambda: a.tolist(), "none": lambda: None,
                      "fortran": lambda: np.asfortranarray(a.T)}.get(
                          op[2], lambda: a.astype(op[2]))()
  members = []
  with zipfile.ZipFile(io.BytesIO(torch_format.checkpoint_bytes(doc, case["folder"]))) as z:
    members = [(i.filename, z.read(i.filename)) for i in z.infolist()]
  raw_ops = []
  for op in case["mutations"]:
    names = [m[0] for m in members]
    pkl = next((i for i, m in enumerate(members) if m[0].endswith("/data.pkl")), None)
    if op[0] in ("opcode", "evil") and pkl is not None:
      members[pkl] = (members[pkl][0], _pickle_edit(members[pkl][1], op))
    elif op[0] == "member" and members:
      i = op[1] % len(members)
      name, data = members[i]
      at = op[3] % (len(data) + 1)
      if op[2] == "truncate":
        members[i] = (name, data[:at])
      elif op[2] == "flip" and data:
        at %= len(data)
        members[i] = (name, data[:at] + bytes([data[at] ^ op[4]]) + data[at + 1:])
      elif op[2] == "drop":
        del members[i]
      elif op[2] == "empty":
        members[i] = (name, b"")
      elif op[2] == "dup":
        members.append((name + "/data.pkl" if op[4] % 2 else name, data))
      elif op[2] == "rename":
        members[i] = (name.replace("/", "/x/", 1) if op[4] % 2 else name + "~", data)
      else:
        members.append((f"{names[0].split('/')[0]}/data/{op[4]}", data[:at]))
    elif op[0] == "byteorder":
      members = [(m, op[1] if m.endswith("/byteorder") else v) for m, v in members]
    elif op[0] == "storage":
      keys = [i for i, m in enumerate(members) if "/data/" in m[0]]
      if keys:
        i = keys[op[1] % len(keys)]
        name, data = members[i]
        if op[2] == "drop":
          del members[i]
        else:
          members[i] = (name, {"short": data[:len(data) // 2], "long": data + data,
                               "odd": data[:-1]}[op[2]])
    elif op[0] in ("raw", "zip_field"):
      raw_ops.append(op)
  data = _rezip(members) if case["mutations"] else torch_format.checkpoint_bytes(
      _torch_payload(*case["shape"], case["dtype"]), case["folder"])
  for op in raw_ops:
    if op[0] == "zip_field":
      data = _zip_field(data, op[1], op[2])
      continue
    at = op[2] % (len(data) + 1)
    data = {"truncate": data[:at], "insert": data[:at] + bytes([op[3]]) + data[at:],
            "flip": data[:at] + bytes([data[at] ^ op[3]]) + data[at + 1:] if at < len(data)
            else data}[op[1]]
  return data, doc


def _same(a: Any, b: Any) -> bool:
  if isinstance(b, np.ndarray):
    return (isinstance(a, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
            and a.tobytes() == np.ascontiguousarray(b).tobytes())
  if isinstance(b, dict):
    return (isinstance(a, dict) and list(a) == list(b)
            and all(_same(a[k], b[k]) for k in b))
  if isinstance(b, (list, tuple)):
    return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
  return type(a) is type(b) and a == b


def check_torch(case: dict) -> str:
  """read_checkpoint: the payload written (untouched files), any payload (damaged ones), or a
  UserError naming the file — and nothing a file names is ever run."""
  from hyset_jax.io.peer import torch_format
  before = set(vars(collections.OrderedDict))
  with tempfile.TemporaryDirectory(prefix="hyset-fuzz-") as tmp:
    path = pathlib.Path(tmp) / "best.pt"
    data, doc = _torch_file(case)
    path.write_bytes(data)
    try:
      got = torch_format.read_checkpoint(path)
      outcome = "ok"
    except UserError as e:
      assert str(path) in str(e), str(e)
      outcome = "user_error"
  assert not SENTINEL.exists(), "a checkpoint ran code"
  assert set(vars(collections.OrderedDict)) == before, "a checkpoint changed OrderedDict"
  if outcome == "ok" and not case["mutations"]:
    assert _same(got, doc), "a valid checkpoint read back different"
  return outcome


# --------------------------------------------------------------------------- the targets

@dataclasses.dataclass
class Target:
  strategy: st.SearchStrategy
  check: Callable[[Any], str] | None = None        # a plain function ...
  fixture: type | None = None                       # ... or a class with check() and close()


TARGETS: dict[str, Target] = {
    "beir": Target(BEIR, reader_check(_beir)),
    "toolbench": Target(TOOLBENCH, reader_check(_toolbench)),
    "bfcl": Target(BFCL, reader_check(_bfcl)),
    "mcp": Target(MCP, reader_check(_mcp)),
    "openai": Target(OPENAI, reader_check(_openai)),
    "toolret": Target(TOOLRET, reader_check(_toolret)),
    "overrides": Target(OVERRIDES, check_overrides),
    "http": Target(HTTP_CASE, fixture=HttpTarget),
    "mcp_jsonrpc": Target(MCP_CASE, fixture=McpTarget),
    "model": Target(MODEL_CASE, check_model),
    "torch": Target(TORCH_CASE, check_torch),
}

# Examples per target in the bounded run (the whole file ~45 s on one core).
BOUNDED = {"beir": 150, "toolbench": 150, "bfcl": 150, "mcp": 150, "openai": 150,
           "toolret": 150, "overrides": 300, "http": 120, "mcp_jsonrpc": 120,
           "model": 150, "torch": 300}


def bounded(name: str, max_examples: int | None = None):
  return settings(max_examples=max_examples or BOUNDED[name], deadline=None, derandomize=True,
                  database=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def http_target():
  target = HttpTarget()
  yield target
  target.close()


@pytest.fixture(scope="module")
def mcp_target():
  target = McpTarget()
  yield target
  target.close()


@pytest.mark.parametrize("name", ["beir", "toolbench", "bfcl", "mcp", "openai", "toolret",
                                  "overrides", "model", "torch"])
def test_fuzz(name):
  target = TARGETS[name]

  @bounded(name)
  @given(target.strategy)
  def run(case):
    target.check(case)
  run()


def test_fuzz_http(http_target):
  @bounded("http")
  @given(HTTP_CASE)
  def run(case):
    http_target.check(case)
  run()


def test_fuzz_mcp_jsonrpc(mcp_target):
  @bounded("mcp_jsonrpc")
  @given(MCP_CASE)
  def run(case):
    mcp_target.check(case)
  run()


# --------------------------------------------------------------------------- regressions

def _one_file(mutation: str, text: str) -> dict:
  return {"doc": json.loads(text), "damage": (mutation, 0)}


# (target, case, expected outcome): each a bug the fuzzer found, kept as an example.
REGRESSIONS = [
    # The 12-03 20:16 long run: pickle's OverflowError (FRAME / BINUNICODE lengths) and a
    # UTF-8-flagged zip name that is not UTF-8 escaped the checkpoint reader.
    ("torch", {"shape": (5, 1, 2), "dtype": "float32", "folder": "archive",
               "mutations": [("opcode", "flip", 3259, 225)]}, "user_error"),
    ("torch", {"shape": (4, 1, 2), "dtype": "float32", "folder": "archive",
               "mutations": [("opcode", "insert", 862, 141)]}, "user_error"),
    ("torch", {"shape": (2, 1, 2), "dtype": "float32", "folder": "archive",
               "mutations": [("tensor", "P.weight", "float16"), ("raw", "flip", 476133, 1),
                             ("zip_field", 8, 2048)]}, "user_error"),
    # json raised ValueError (5000-digit int) and RecursionError (deep nesting): tracebacks.
    ("mcp", {"doc": {"tools": [{"name": "a1"}]}, "damage": ("huge_int", 0)}, "user_error"),
    ("mcp", {"doc": {"tools": []}, "damage": ("deep", 0)}, "user_error"),
    ("beir", {"corpus": [{"_id": "t1", "text": "x"}], "queries": [{"_id": "q1", "text": "y"}],
              "qrels": [("q1", "t1", "1")], "header": "query-id\tcorpus-id\tscore",
              "split": "test", "damage": (("huge_int", 0), ("none", 0), ("none", 0))},
     "user_error"),
    # A lone surrogate ("\ud800", valid JSON) read as tool text broke the encoder later.
    ("mcp", {"doc": {"tools": [{"name": "a", "description": "b"}]}, "damage": ("surrogate", 0)},
     "user_error"),
    ("toolret", {"tools": [{"id": "t", "documentation": '{"name": "n", "description": '
                                                       '"\\ud800"}'}],
                 "queries": [{"id": "q", "query": "x", "labels": [{"id": "t"}]}],
                 "damage": (("none", 0), ("none", 0))}, "user_error"),
    ("toolret", {"tools": [{"id": "t", "documentation": "d"}],
                 "queries": [{"id": "q", "query": "x", "labels": "[" + "1" * 5000 + "]"}],
                 "damage": (("none", 0), ("none", 0))}, "user_error"),
    # A numeric api_description: AttributeError ('int' object has no attribute 'strip').
    ("toolbench", {"entries": [{"query": "q", "query_id": 1, "api_list": [
        {"tool_name": "T", "api_name": "A", "api_description": 5}],
        "relevant APIs": [["T", "A"]]}], "damage": ("none", 0)}, "ok"),
    # float('nan') / float('inf') were accepted: a NaN learning rate trained silently.
    ("overrides", ["train.learning_rate=nan"], "user_error"),
    ("overrides", ["mesh.memory_per_device_gb=inf"], "user_error"),
    ("overrides", ["train.negative_mix=nan,0.5,0.5"], "user_error"),
    # A lone surrogate in a query reached the tokenizer (TypeError, a 500); in a field name,
    # the error body could not be rendered as UTF-8 (a 500).
    ("http", ("POST /v1/retrieve", b'{"query": "\\ud800"}'), "http_422"),
    ("http", ("POST /v1/retrieve", b'{"queries": ["a", "\\udc00b"]}'), "http_422"),
    # Not a bug found, a guard: a lone surrogate in an unknown field's name, echoed back.
    ("http", ("POST /v1/retrieve", b'{"\\udc00": 1}'), "http_422"),
    # A hyset/2 manifest with the abstain term's tensors (a term no legacy version holds): the
    # converter's look-up of the version that brought it raised StopIteration.
    ("model", {"variant": "abstain", "container": "dir", "mutations": [("format", 2, False)]},
     "user_error"),
    # A damaged npz (not a zip; an entry's compression method or flags flipped): np.load's
    # BadZipFile / NotImplementedError / RuntimeError went through read_npz as tracebacks.
    ("model", {"variant": "tower", "container": "npz",
               "mutations": [("file_bytes", "params.safetensors", "truncate", 55038, 1)]},
     "user_error"),
    ("model", {"variant": "none", "container": "npz", "mutations": [("zip_field", 10, 99)]},
     "user_error"),
    ("model", {"variant": "none", "container": "npz", "mutations": [("zip_field", 8, 1)]},
     "user_error"),
    # A checkpoint whose byteorder entry is damaged (read outside the guarded unpickling) or
    # whose entries claim a compression method / encryption zipfile refuses: BadZipFile,
    # NotImplementedError, RuntimeError, zlib.error as tracebacks.
    ("torch", {"shape": (4, 4, 3), "dtype": "float64", "folder": "a b",
               "mutations": [("raw", "insert", 26200, 167)]}, "user_error"),
    ("torch", {"shape": (2, 2, 2), "dtype": "float32", "folder": "archive",
               "mutations": [("zip_field", 10, 99)]}, "user_error"),
    ("torch", {"shape": (2, 2, 2), "dtype": "float32", "folder": "archive",
               "mutations": [("zip_field", 10, 8)]}, "user_error"),
    ("torch", {"shape": (2, 2, 2), "dtype": "float32", "folder": "archive",
               "mutations": [("zip_field", 8, 1)]}, "user_error"),
    ("torch", {"shape": (2, 2, 2), "dtype": "float32", "folder": "archive",
               "mutations": [("zip_field", 8, 0x41)]}, "user_error"),
    # Found by the long run: a deeply nested manifest.json (RecursionError).
    ("model", {"variant": "none", "container": "dir",
               "mutations": [("file", "manifest.json", "deep", 0)]}, "user_error"),
    # Not bugs found, guards: a callable spliced into a valid pickle is refused, never run.
    *[("torch", {"shape": (3, 2, 2), "dtype": "float32", "folder": "archive",
                 "mutations": [("evil", kind, 5)]}, "user_error") for kind in EVIL],
]


@pytest.mark.parametrize("name,case,expected", REGRESSIONS,
                         ids=[f"{r[0]}-{i}" for i, r in enumerate(REGRESSIONS)])
def test_regression(name, case, expected, http_target):
  target = TARGETS[name]
  check = http_target.check if name == "http" else target.check
  assert check(case) == expected
