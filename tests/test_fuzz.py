"""Fuzzing with Hypothesis: generated files, overrides and requests, bounded for ``make test``.

Targets: the data readers ``beir:``, ``toolbench:``, ``bfcl:PATH``, ``mcp:``, ``openai:`` and
``toolret:`` (well-formed and broken files in a temporary folder: JSON that is not an object,
wrong types, missing fields, bad UTF-8, empty files, 5000-digit integers, deep nesting, lone
surrogates, duplicated ids, truncation), the ``--set KEY=VALUE`` parser, the HTTP request
bodies of ``hyset serve`` (its FastAPI app on a tiny synthetic model) and MCP JSON-RPC messages
(the MCP server's streamable-HTTP app, in process). The property everywhere: a clean result or
the project's clear error (:class:`~hyset_jax.errors.UserError`, a 4xx JSON body, a JSON-RPC
error) — never another exception, a hang or a 5xx.

Each target is a strategy plus a ``check`` function in :data:`TARGETS`, so the long run
(``python -m benchmarks.fuzz --minutes N``) drives the same code. The bounded run here is
derandomized (the same cases every run) and takes ~30 s on one core. Every bug the fuzzer found
has its example in :data:`REGRESSIONS` (run as plain parametrized tests).
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import pathlib
import tempfile
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
}

# Examples per target in the bounded run (the whole file ~30 s on one core).
BOUNDED = {"beir": 150, "toolbench": 150, "bfcl": 150, "mcp": 150, "openai": 150,
           "toolret": 150, "overrides": 300, "http": 120, "mcp_jsonrpc": 120}


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
                                  "overrides"])
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
]


@pytest.mark.parametrize("name,case,expected", REGRESSIONS,
                         ids=[f"{r[0]}-{i}" for i, r in enumerate(REGRESSIONS)])
def test_regression(name, case, expected, http_target):
  target = TARGETS[name]
  check = http_target.check if name == "http" else target.check
  assert check(case) == expected
