"""Tool filters applied before the shortlist (issue 36, item 1): exact against brute force over
the allowed tools (allow lists larger and smaller than K_pool, of one tool, and empty), through
``pipeline.predict``, ``predict_batched`` (native backend included), the NumPy reference,
``hyset predict --allow/--deny``, the HTTP API and the MCP server with API-key policies."""
import asyncio
import hashlib
import itertools
import json

import numpy as np
import pytest

from hyset_jax import cli
from hyset_jax.errors import FieldError
from hyset_jax.inference import filters, pipeline
from hyset_jax.io import modeldir, reference
from hyset_jax.model.query_inputs import QueryInputs
from hyset_jax.model.scoring import SetPrior

from test_model_extensions import brute_score, random_params

N, D, M, K1, K = 20, 6, 3, 3, 6
RANKINGS = ("greedy", "logit", "set-first", "set-mean", "set-max")


def masks(rng, q: int, size: int) -> np.ndarray:
  out = np.zeros((q, N), bool)
  for i in range(q):
    out[i, rng.choice(N, size, replace=False)] = True
  return out


def brute_shortlist(params, r, ok) -> list[int]:
  """The shortlist of the library restricted to ``ok``, from the definitions (float64)."""
  rows = [t for t in range(N) if ok[t]]
  ell = {t: brute_score(params, r, [t]) for t in rows}
  s0 = sorted(rows, key=lambda t: (-ell[t], t))[:K1]
  z = np.asarray(params.tool_embeddings, np.float64)
  mm = np.asarray(params.interactions[M - 2], np.float64)
  g = {t: max(z[t] @ mm @ z[i] for i in s0) for t in rows if t not in s0}
  return s0 + sorted(g, key=lambda t: (-g[t], -ell[t], t))[:K - K1]


def brute_best(params, r, shortlist):
  scores = {s: brute_score(params, r, list(s)) for m in range(1, M + 1)
            for s in itertools.combinations(sorted(shortlist), m)}
  best = max(scores, key=scores.get)
  return best, scores[best]


@pytest.mark.parametrize("size", [12, 4, 1])
def test_exact_against_brute_force_over_the_allowed_tools(size):
  rng = np.random.default_rng(size)
  params = random_params(rng, n=N, d=D, max_size=M)
  r = rng.normal(size=(6, D)).astype(np.float32)
  allowed = masks(rng, 6, size)
  x = QueryInputs(r, None, allowed)
  full = pipeline.predict(params, x, k1=K1, k_pool=K, max_size=M, method="gather",
                           ranking="set-first")
  for q in range(6):
    short = brute_shortlist(params, r[q].astype(np.float64), allowed[q])
    got = np.asarray(full.shortlist[q])
    assert got[:len(short)].tolist() == short and (got[len(short):] == -1).all()
    best, score = brute_best(params, r[q].astype(np.float64), short)
    assert tuple(sorted(int(t) for t in full.set_tools[q] if t >= 0)) == best
    assert float(full.set_score[q]) == pytest.approx(score, rel=1e-4, abs=1e-4)
    ranked = np.asarray(full.ranking[q])
    assert sorted(ranked[ranked >= 0].tolist()) == sorted(short)
  # The prepared path (neighbour table built, so a mask must bypass it) and the native
  # backend (its expansion kernel unused, its stage 2 and greedy kernels on penalised
  # inputs) give the same answers; every ranking is compared with the reference below.
  prep = pipeline.prepare(params, max_size=M, k_pool=K, neighbor_table=True)
  both = ("set-first", "greedy")
  gather = pipeline.predict_batched(prep, x, k1=K1, k_pool=K, max_size=M, batch_size=4,
                                     method="gather", rankings=both)
  native = pipeline.predict_batched(prep, x, k1=K1, k_pool=K, max_size=M, batch_size=4,
                                     method="native", rankings=both)
  for want, got in zip(gather, native):
    for field in ("shortlist", "set_tools", "set_size", "ranking"):
      np.testing.assert_array_equal(getattr(got, field), getattr(want, field), err_msg=field)
    np.testing.assert_allclose(got.set_score, want.set_score, rtol=1e-5, atol=1e-5)
  for field in ("shortlist", "set_tools", "ranking"):
    np.testing.assert_array_equal(getattr(gather[0], field), np.asarray(getattr(full, field)))
  # No mask: the answers of before (the mask-free program is untouched).
  plain = pipeline.predict_batched(prep, r, k1=K1, k_pool=K, max_size=M, batch_size=4,
                                    method="native", rankings=both)
  every = pipeline.predict_batched(prep, QueryInputs(r, None, np.ones((6, N), bool)), k1=K1,
                                    k_pool=K, max_size=M, batch_size=4, method="native",
                                    rankings=both)
  for a, b in zip(plain, every):
    for field in ("shortlist", "set_tools", "ranking"):
      np.testing.assert_array_equal(getattr(a, field), getattr(b, field))


def test_an_empty_filter_is_a_clear_error():
  rng = np.random.default_rng(0)
  params = random_params(rng, n=N, d=D, max_size=M)
  allowed = np.ones((3, N), bool)
  allowed[1] = False
  with pytest.raises(ValueError, match="query 1 may use no tool"):
    pipeline.predict_batched(params, QueryInputs(rng.normal(size=(3, D)).astype(np.float32),
                                                  None, allowed), k1=K1, k_pool=K, max_size=M)
  index = filters.FilterIndex([f"t{i}" for i in range(N)])
  with pytest.raises(FieldError, match="allows none"):
    index.mask(filters.ToolFilter(allow=()))


def save(tmp_path, params, name="m"):
  ranking = None if params.prior is None else "set-mean"
  md = modeldir.ModelDir(params, tuple(f"t{i}" for i in range(N)), M, K1, K, None,
                         ranking=ranking)
  return modeldir.save_model_dir(tmp_path / name, md)


def with_prior(params, rng):
  members = np.full((8, M), -1, np.int32)
  for s in range(8):
    size = 1 + s % M
    members[s, :size] = np.sort(rng.choice(N, size, replace=False))
  return params._replace(prior=SetPrior(members, (3 * rng.normal(size=(8, D))).astype(np.float32),
                                        np.zeros(8, np.float32), np.float32(20.0),
                                        np.float32(np.log(0.02))))


@pytest.mark.parametrize("prior", [False, True])
def test_the_reference_gives_the_same_answers(tmp_path, prior):
  rng = np.random.default_rng(7)
  params = random_params(rng, n=N, d=D, max_size=M)
  if prior:
    params = with_prior(params, rng)
  model = reference.load_model(save(tmp_path, params))
  r = rng.normal(size=(8, D)).astype(np.float32)
  allowed = np.concatenate([masks(rng, 3, 12), masks(rng, 3, 4), masks(rng, 2, 1)])
  names = RANKINGS[1:] if prior else RANKINGS  # the prior rules greedy out
  preds = pipeline.predict_batched(params, QueryInputs(r, None, allowed), k1=K1, k_pool=K,
                                    max_size=M, rankings=names, method="native")
  for ranking, got in zip(names, preds):
    want = reference.predict(model, r, ranking=ranking, allowed=allowed)
    ids = model.tool_ids
    for q, row in enumerate(want):
      assert row["set"] == [ids[t] for t in got.set_tools[q] if t >= 0], (ranking, q)
      assert row["ranking"] == [ids[t] for t in got.ranking[q] if t >= 0], (ranking, q)
      assert row["shortlist"] == [ids[t] for t in got.shortlist[q] if t >= 0]
      assert row["set_score"] == pytest.approx(float(got.set_score[q]), rel=1e-4, abs=1e-4)
      assert all(ids.index(t) in np.flatnonzero(allowed[q]) for t in row["ranking"])


def test_hyset_predict_and_the_reference_cli_allow_and_deny(tmp_path, capsys):
  rng = np.random.default_rng(3)
  params = random_params(rng, n=N, d=D, max_size=M)._replace(conditioned=None)
  path = save(tmp_path, params)
  np.save(tmp_path / "q.npy", rng.normal(size=(5, D)).astype(np.float32))
  (tmp_path / "allow.txt").write_text("# tools 1x and 2, 3, 4\nt1*\nt2\n\n t3 \nt4\n")
  (tmp_path / "deny.txt").write_text("t10\nt3\n")
  allowed = np.zeros(N, bool)
  allowed[[1, 11, 12, 13, 14, 15, 16, 17, 18, 19, 2, 4]] = True     # t1* minus t10, t3
  common = ["--model", str(path), "--query-embeddings", str(tmp_path / "q.npy"),
            "--allow", str(tmp_path / "allow.txt"), "--deny", str(tmp_path / "deny.txt")]
  assert cli.main(["predict", *common, "--out", str(tmp_path / "p.jsonl")]) == 0
  assert reference.main([*common, "--out", str(tmp_path / "r.jsonl")]) == 0
  rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
  ref = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
  ok = {f"t{i}" for i in np.flatnonzero(allowed)}
  for a, b in zip(rows, ref):
    assert a["set"] == b["set"] and a["ranking"] == b["ranking"]
    assert a["shortlist"] == b["shortlist"]
    assert set(a["shortlist"]) <= ok and len(a["shortlist"]) == K
  # Fewer allowed than K_pool: only the allowed ones are listed, and the set is exact.
  (tmp_path / "few.txt").write_text("t5\nt7\n")
  few = ["--model", str(path), "--query-embeddings", str(tmp_path / "q.npy"),
         "--allow", str(tmp_path / "few.txt")]
  assert cli.main(["predict", *few, "--out", str(tmp_path / "f.jsonl")]) == 0
  for row in map(json.loads, (tmp_path / "f.jsonl").read_text().splitlines()):
    assert sorted(row["shortlist"]) == ["t5", "t7"] and set(row["set"]) <= {"t5", "t7"}
  # An unknown id, and lists that allow nothing: exit 2 naming the fault.
  (tmp_path / "bad.txt").write_text("t1\nnope\n")
  (tmp_path / "all.txt").write_text("t*\n")
  capsys.readouterr()
  for flags, message in ((["--allow", str(tmp_path / "bad.txt")], "'nope'"),
                         (["--deny", str(tmp_path / "all.txt")], "allow none")):
    base = ["--model", str(path), "--query-embeddings", str(tmp_path / "q.npy"), *flags]
    assert cli.main(["predict", *base, "--out", str(tmp_path / "x.jsonl")]) == 2
    assert message in capsys.readouterr().err
    assert reference.main([*base, "--out", str(tmp_path / "y.jsonl")]) == 2


def test_filter_masks_prefixes_tags_and_errors():
  ids = ["gh.issue", "gh.pr", "mail.send", "mail.read", "calc"]
  tags = [{"github"}, {"github"}, {"mail"}, {"mail"}, set()]
  index = filters.FilterIndex(ids, tags)
  m = lambda **kw: index.mask(filters.ToolFilter(**kw)).tolist()
  assert index.mask(filters.ToolFilter()) is None
  assert m(allow=("gh.*",)) == [True, True, False, False, False]
  assert m(allow=("gh.*", "calc"), deny=("gh.pr",)) == [True, False, False, False, True]
  assert m(tags=("mail",)) == [False, False, True, True, False]
  assert m(allow=("nothing.*", "calc")) == [False, False, False, False, True]
  with pytest.raises(FieldError) as e:
    m(deny=("gh.issue", "nope"))
  assert e.value.field == "tools.deny[1]"
  with pytest.raises(FieldError, match="tag 'chat'"):
    m(tags=("chat",))
  assert filters.tags_of({"category": "Finance"}) == {"Finance"}
  assert filters.tags_of({"category": "a, b", "domain": ["a", "b"]}) == {"a", "b"}
  with pytest.raises(FieldError, match="unknown field"):
    filters.from_json({"allow": [], "colour": 1}, "tools")


# --------------------------------------------------------------------------- serving

KEY_ALL = "k-all-0123456789abcdef"
KEY_MAIL = "k-mail-0123456789abcdef"
KEY_GH = "k-gh-0123456789abcdef"
TOOL_IDS = tuple([f"gh.t{i}" for i in range(12)] + [f"mail.t{i}" for i in range(12)]
                 + [f"misc.t{i}" for i in range(16)])


def tiny_retriever():
  """A 40-tool Retriever on a hashing 'encoder' (no model download), tagged by prefix."""
  from hyset_jax.model import parameters as model_lib
  from hyset_jax.data.tooltext import definition
  from hyset_jax.serve.retriever import Retriever
  rng = np.random.default_rng(0)
  n, d, m = len(TOOL_IDS), 16, 3
  params = model_lib.host_params(model_lib.init_params(
      rng.normal(size=(n, d)).astype(np.float32), d, m))
  a = rng.normal(size=(m - 1, d, d)).astype(np.float32) * 0.3
  params = params._replace(interactions=(a + a.transpose(0, 2, 1)) / 2)
  model = modeldir.ModelDir(params, TOOL_IDS, m, 4, 8, "hashing")

  def encode(texts):
    rows = [np.random.default_rng(int.from_bytes(
        hashlib.sha256(t.encode("utf-8")).digest()[:8], "big")).normal(size=d) for t in texts]
    return np.asarray(rows, np.float32).reshape(len(texts), d)

  defs = [definition(t, None, {"name": t}) for t in TOOL_IDS]
  tags = {t: frozenset({t.split(".")[0]}) for t in TOOL_IDS}
  return Retriever(model, encode, defs, max_batch=4, tags=tags)


def policies(tmp_path, default=None):
  from hyset_jax.serve import policies as policies_lib
  data = {"keys": {KEY_ALL: {"update_tools": True}, KEY_MAIL: {"tags": ["mail"]},
                   KEY_GH: {"allow": ["gh.*"], "deny": ["gh.t0"]}}}
  if default is not None:
    data["default"] = default
  (tmp_path / "p.json").write_text(json.dumps(data))
  return policies_lib.load(tmp_path / "p.json", tiny_retriever().filter_index)


def test_http_filters_and_key_policies(tmp_path):
  from starlette.testclient import TestClient

  from hyset_jax.serve.app import create_app
  retriever = tiny_retriever()
  app = create_app(retriever, max_batch=4, max_wait_ms=1, warm_up=False,
                   policies=policies(tmp_path))
  query = "find my unread messages and open issues"

  def post(body, key=None, header="Authorization"):
    headers = {} if key is None else {header: f"Bearer {key}" if header == "Authorization"
                                      else key}
    r = c.post("/v1/retrieve", json=body, headers=headers)
    return r.status_code, r.json()

  with TestClient(app, raise_server_exceptions=False) as c:
    assert post({"query": query})[0] == 401                        # a key is required
    assert post({"query": query}, "k-wrong-0123456789abcdef")[0] == 401
    status, body = post({"query": query}, KEY_ALL)
    assert status == 200
    # A policy-limited key never sees another tool, in any field.
    for key, ok in ((KEY_MAIL, lambda t: t.startswith("mail.")),
                    (KEY_GH, lambda t: t.startswith("gh.") and t != "gh.t0")):
      status, body = post({"queries": [query, "weather"]}, key, header="X-API-Key")
      assert status == 200
      for row in body["results"]:
        listed = row["set"] + row["ranking"] + row["shortlist"] + [d["id"] for d in row["tools"]]
        assert listed and all(ok(t) for t in listed), listed
      listing = c.get("/v1/tools", headers={"X-API-Key": key}).json()
      assert listing["tools"] and all(ok(d["id"]) for d in listing["tools"])
    # The served answer is the exact filtered prediction (same as inference on the mask).
    mask = np.array([t.startswith("mail.") for t in TOOL_IDS])
    want = retriever.predict(np.asarray(retriever.encode([query]), np.float32),
                             retriever.defaults, None, mask[None])[0]
    status, body = post({"query": query}, KEY_MAIL)
    assert body["results"][0]["set"] == want["set"]
    assert body["results"][0]["ranking"] == want["ranking"]
    # A request narrows its policy, never widens it.
    status, body = post({"query": query, "tools": {"allow": ["mail.t3", "mail.t4"]}}, KEY_MAIL)
    assert status == 200 and sorted(body["results"][0]["shortlist"]) == ["mail.t3", "mail.t4"]
    status, body = post({"query": query, "tools": {"allow": ["gh.t1"]}}, KEY_MAIL)
    assert status == 422 and body["error"]["field"] == "tools"
    status, body = post({"query": query, "tools": {"tags": ["misc"]}}, KEY_ALL)
    assert status == 200 and all(t.startswith("misc.") for t in body["results"][0]["ranking"])
    # Errors name the entry.
    status, body = post({"query": query, "tools": {"allow": ["gh.t1", "nope"]}}, KEY_ALL)
    assert status == 422 and body["error"]["field"] == "tools.allow[1]"
    assert "'nope'" in body["error"]["message"]
    status, body = post({"query": query, "tools": {"allow": []}}, KEY_ALL)
    assert status == 422 and body["error"]["field"] == "tools"
    status, body = post({"query": query, "tools": {"colour": []}}, KEY_ALL)
    assert status == 422 and body["error"]["field"] == "tools.colour"
    # Changing the catalogue needs a key whose policy says so.
    update = {"remove": ["misc.t15"]}
    assert c.post("/v1/tools", json=update, headers={"X-API-Key": KEY_MAIL}).status_code == 403


def test_mcp_filters_and_key_policies(tmp_path):
  from starlette.testclient import TestClient

  from hyset_jax.serve.mcp_server import build_server
  pols = policies(tmp_path, default={"tags": ["misc"]})
  server = build_server(tiny_retriever(), max_batch=1, max_wait_ms=0, warm_up=False,
                        policies=pols)
  app = server.streamable_http_app(stateless_http=True, json_response=True)
  headers = {"Accept": "application/json, text/event-stream",
             "Content-Type": "application/json"}

  def call(arguments, key=None):
    extra = {} if key is None else {"Authorization": f"Bearer {key}"}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "search_tools", "arguments": arguments}}
    result = c.post("/mcp", json=body, headers={**headers, **extra}).json()["result"]
    return result.get("isError", False), result

  with TestClient(app, raise_server_exceptions=False, base_url="http://127.0.0.1:8080") as c:
    query = {"query": "send an email about the open issue"}
    for key, prefix in ((KEY_MAIL, "mail."), (KEY_GH, "gh."), (None, "misc.")):
      failed, result = call(query, key)
      assert not failed, result
      content = result["structuredContent"]
      listed = [t["id"] for t in content["tools"]] + content["ranking"]
      assert listed and all(t.startswith(prefix) for t in listed), (key, listed)
    failed, result = call({**query, "tools": {"allow": ["gh.t2"]}}, KEY_MAIL)
    assert failed and "tools" in result["content"][0]["text"]     # cannot widen
    failed, result = call({**query, "tools": {"allow": ["mail.t1"]}}, KEY_MAIL)
    assert not failed and result["structuredContent"]["ranking"] == ["mail.t1"]
    failed, result = call(query, "k-wrong-0123456789abcdef")
    assert failed and "unknown API key" in result["content"][0]["text"]

  # stdio: no headers; the session has --mcp-policy's key.
  stdio = build_server(tiny_retriever(), max_batch=1, max_wait_ms=0, warm_up=False,
                       policies=pols, stdio_key=KEY_GH)
  out = asyncio.run(stdio.call_tool("search_tools", query))
  content = out[1] if isinstance(out, tuple) else out
  text = json.dumps(content, default=str)
  assert "gh.t" in text and "mail.t" not in text and "misc.t" not in text


def test_policy_files_and_flags_are_checked(tmp_path, capsys):
  from hyset_jax.errors import UserError
  from hyset_jax.serve import policies as policies_lib
  index = tiny_retriever().filter_index
  for data, message in (({"keys": {"short": {}}}, "at least 16"),
                        ({"keys": {KEY_ALL: {"allow": ["nope"]}}}, "'nope'"),
                        ({"keys": {KEY_ALL: {"tags": ["chat"]}}}, "'chat'"),
                        ({"keys": {KEY_ALL: {"allow": []}}}, "allows none"),
                        ({"keys": {KEY_ALL: {"colour": 1}}}, "unknown field"),
                        ({"users": {}}, "expected")):
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(UserError, match=message):
      policies_lib.load(tmp_path / "bad.json", index)
  pols = policies(tmp_path, default={"tags": ["misc"]})
  assert pols.resolve(None).tools.tags == ("misc",)
  assert pols.resolve(KEY_GH).tools.allow == ("gh.*",)
  with pytest.raises(policies_lib.AuthError):
    pols.resolve(KEY_GH[:-1])
  assert policies_lib.key_from_headers({"x-api-key": " k "}) == "k"
  with pytest.raises(policies_lib.AuthError):
    policies_lib.key_from_headers({"authorization": "Basic abc"})
  # --mcp-policy needs --mcp stdio and --policies: refused before anything loads.
  assert cli.main(["serve", "--model", str(tmp_path), "--mcp-policy", KEY_GH]) == 2
  assert "--mcp-policy needs" in capsys.readouterr().err
