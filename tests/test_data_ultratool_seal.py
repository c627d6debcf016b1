"""The ``ultratool:`` and ``seal:`` readers: the real data against its README, and bad input."""
from __future__ import annotations

import collections
import json
import os
import pathlib
import shutil

import pytest

from hyset_jax import cli
from hyset_jax.data import splits
from hyset_jax.data.specs import load_dataset, parse_spec
from hyset_jax.data.tooltext import render_tool
from hyset_jax.data.types import Dataset
from hyset_jax.errors import UserError

REPO = pathlib.Path(__file__).resolve().parents[1]
DATA = REPO / ".." / "shared" / "data"
ULTRATOOL = f"ultratool:{DATA / 'ultratool'}"
SEAL = f"seal:{DATA / 'seal_tools'}"


@pytest.fixture(scope="module")
def ultratool() -> Dataset:
  return load_dataset(ULTRATOOL)


@pytest.fixture(scope="module")
def seal() -> Dataset:
  return load_dataset(SEAL)


def _sizes(queries) -> dict[int, int]:
  return dict(sorted(collections.Counter(len(q.gold) for q in queries).items()))


# ----------------------------------------------------------------------------- real data


def test_ultratool_matches_its_readme(ultratool):
  assert ultratool.name == "ultratool"
  assert len(ultratool.tools) == 260
  assert list(ultratool.splits) == ["train", "test"]
  assert len(ultratool.split("train")) == 3027 and len(ultratool.split("test")) == 500
  everything = ultratool.split("train") + ultratool.split("test")
  assert _sizes(everything) == {1: 35, 2: 2243, 3: 1023, 4: 204, 5: 22}
  known = set(ultratool.tools.ids)
  for q in everything:
    assert q.gold == tuple(sorted(set(q.gold))) and set(q.gold) <= known
    assert q.text and q.text == q.text.strip() and q.source == "chain"
  assert ultratool.notes == ()
  # test = split_ids.json's ids, exactly.
  split_ids = json.loads((DATA / "ultratool" / "split_ids.json").read_text())
  assert {q.id for q in ultratool.split("test")} == set(split_ids["test_ids"]["chain"])


def test_ultratool_tool_text_and_domain(ultratool):
  row = ultratool.tools.index()["send_sms"]
  assert ultratool.tools.texts[row] == "send_sms: SMS notification sending tool"
  meta = ultratool.tools.metadata[row]
  assert meta["domain"] == ["Repair", "Finance", "Flight", "Train"]
  assert meta["category"] == "Repair, Finance, Flight, Train"
  assert meta["name"] == "send_sms" and meta["description"] == "SMS notification sending tool"
  # The first request of data.json: two tools, in train or test by split_ids.
  first = next(q for qs in ultratool.splits.values() for q in qs if q.id == "3186")
  assert first.gold == ("clock_alarm_cancel", "clock_alarm_change")


def test_seal_matches_its_readme(seal):
  assert seal.name == "seal_tools"
  assert len(seal.tools) == 4076
  assert list(seal.splits) == ["train", "test", "test_out"]
  assert [len(seal.split(s)) for s in ("train", "test", "test_out")] == [700, 700, 654]
  dev = _sizes(seal.split("train"))
  assert (dev[1], dev[3], dev[4]) == (200, 394, 87)
  multi = {s: sum(len(q.gold) > 1 for q in seal.split(s)) / len(seal.split(s))
           for s in seal.splits}
  assert round(100 * multi["train"]) == 71 and round(100 * multi["test_out"]) == 86
  assert {q.source for q in seal.split("test_out")} == {"test_out_domain"}
  known = set(seal.tools.ids)
  for qs in seal.splits.values():
    for q in qs:
      assert q.gold == tuple(sorted(set(q.gold))) and set(q.gold) <= known and q.text
  assert seal.notes == ()


def test_seal_tool_text_is_the_function_schema_rendering(seal, tmp_path):
  row = seal.tools.index()["analyzeEvidence"]
  text, meta = seal.tools.texts[row], seal.tools.metadata[row]
  assert text.startswith("analyzeEvidence: Analyze the chemical evidence collected from a "
                         "crime scene parameters: {\"properties\": {\"evidence_type\": ")
  assert text.endswith('"required": ["evidence_type", "method", "sample"], "type": "object"}')
  assert meta["field"] == meta["category"] == "Chemical Engineering/Forensic engineering"
  schema = meta["parameters"]
  assert schema["type"] == "object" and schema["required"] == ["evidence_type", "method",
                                                               "sample"]
  assert text == render_tool("analyzeEvidence", meta["description"], schema)
  # The same function as an OpenAI tool gets the same text: one rendering for every format.
  openai = tmp_path / "tools.json"
  openai.write_text(json.dumps([{"type": "function", "function": {
      "name": "analyzeEvidence", "description": meta["description"], "parameters": schema}}]))
  assert load_dataset(f"openai:{openai}").tools.texts == (text,)


def test_stats_from_the_repo_root(monkeypatch, capsys):
  monkeypatch.chdir(REPO)
  assert cli.main(["data", "stats", "ultratool:../shared/data/ultratool"]) == 0
  out = capsys.readouterr().out
  assert "tools: 260" in out and "queries: 3527 (train 3027, test 500)" in out
  assert "2: 2243 (63.6%)" in out and "chain: 3527" in out
  assert cli.main(["data", "stats", "seal:../shared/data/seal_tools"]) == 0
  out = capsys.readouterr().out
  assert "tools: 4076" in out and "queries: 2054 (train 700, test 700, test_out 654)" in out
  assert "test_out_domain: 654 (test_out 654)" in out


@pytest.mark.parametrize("spec", [ULTRATOOL, SEAL])
def test_validation_is_carved_from_train_by_hash(spec):
  data = load_dataset(spec)
  carved = splits.with_validation(data)
  train, validation = carved.split("train"), carved.split("validation")
  assert list(carved.splits)[:2] == ["train", "validation"]
  assert len(train) + len(validation) == len(data.split("train"))
  assert {q.id for q in validation} == {
      q.id for q in data.split("train") if splits.assign(
          q.id, (("validation", 0.1), ("train", 0.9)), salt="validation") == "validation"}
  assert 0.05 < len(validation) / len(data.split("train")) < 0.15
  assert carved.split("test") == data.split("test")


@pytest.mark.parametrize("name,scheme,max_size", [("ultratool", "ultratool", 5),
                                                  ("seal_tools", "seal", 6)])
def test_presets_resolve_and_read_their_data(name, scheme, max_size):
  from hyset_jax import config
  from hyset_jax.training.train_data import load_config_dataset
  c = config.resolve(name)
  assert name in config.presets() and c.name == name
  assert parse_spec(c.data.spec).scheme == scheme and c.model.max_set_size == max_size
  # What training reads: every split within M (Seal-Tools' 6-tool sets kept), validation carved.
  data = load_config_dataset(c.data, c.model.max_set_size)
  assert {"train", "validation", "test"} <= set(data.splits)
  assert max(len(q.gold) for qs in data.splits.values() for q in qs) == max_size
  # Seen sets (UltraTool): Z trained, the prior on; new sets (Seal-Tools): Z fixed, no prior.
  seen = name == "ultratool"
  assert c.model.train_tool_embeddings == seen and c.model.set_prior == seen


def test_seal_root_with_test_files_only(tmp_path):
  for name in ("tool.jsonl", "test_out_domain.jsonl"):
    shutil.copy(DATA / "seal_tools" / name, tmp_path / name)
  data = load_dataset(f"seal:{tmp_path}")
  assert list(data.splits) == ["test_out"] and len(data.split("test_out")) == 654
  assert any("not present: dev.jsonl, test_in_domain.jsonl" in n for n in data.notes)
  with pytest.raises(UserError, match="no train split to carve"):
    splits.with_validation(data)


def test_specs_need_a_path():
  assert parse_spec("seal:x").scheme == "seal" and parse_spec("ultratool:x").path == "x"
  for spec in ("seal", "ultratool"):
    with pytest.raises(UserError, match=f"names no path; expected {spec}:PATH"):
      parse_spec(spec)


# ----------------------------------------------------------------------------- bad input


def _lines(path: pathlib.Path, rows) -> None:
  path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def _request(i, *tasks, text="do it"):
  return {"id": str(i), "user_request": text, "task_nodes": [{"task": t} for t in tasks],
          "type": "chain"}


def ultratool_folder(tmp_path, requests=None, test_ids=("2",), nodes=None) -> pathlib.Path:
  root = tmp_path / "ultra"
  root.mkdir()
  nodes = nodes if nodes is not None else [
      {"id": "a", "desc": "Tool A", "domain": ["X"]},
      {"id": "b", "desc": "Tool B", "domain": ["X", "Y"]}]
  (root / "tool_desc.json").write_text(json.dumps({"nodes": nodes}))
  (root / "split_ids.json").write_text(json.dumps({"test_ids": {"chain": list(test_ids)}}))
  _lines(root / "data.json", requests if requests is not None else
         [_request(1, "a", "b"), _request(2, "b", "a", "b")])
  return root


def test_ultratool_small_folder(tmp_path):
  data = load_dataset(f"ultratool:{ultratool_folder(tmp_path)}")
  assert [q.id for q in data.split("train")] == ["1"]
  assert data.split("test")[0].gold == ("a", "b")
  assert data.tools.texts == ("a: Tool A", "b: Tool B")


def test_ultratool_request_without_task_nodes_is_counted(tmp_path):
  root = ultratool_folder(tmp_path, requests=[_request(1, "a"), _request(2, "b"), _request(3)])
  data = load_dataset(f"ultratool:{root}")
  assert sum(len(qs) for qs in data.splits.values()) == 2
  assert data.notes == ("1 requests have no task nodes (no gold set; 0 of them in test), "
                        "e.g. '3'; left out",)


@pytest.mark.parametrize("case,needle", [
    ("unknown task", "data.json:2 (request '2') task_nodes[0]: tool 'zzz' is not in "
                     "tool_desc.json"),
    ("bad json", "data.json:2: malformed JSON"),
    ("duplicate id", "duplicate request id '1': first at"),
    ("empty text", "data.json:2 (request '2'): field 'user_request' is empty"),
    ("task not a string", "task_nodes[0]: field 'task' should be str or int, found list"),
    ("nodes not a list", "data.json:1 (request '1'): field 'task_nodes' should be list"),
    ("unknown test id", "split_ids.json: 1 test ids are not requests of"),
    ("split ids shape", "split_ids.json: expected {\"test_ids\""),
    ("repeated test id", "duplicate test id '2'"),
    ("no nodes", "tool_desc.json: expected {\"nodes\""),
    ("duplicate tool", "duplicate tool id 'a'"),
    ("bad domain", "nodes[0] ('a'): field 'domain' should be a list of strings"),
    ("domain not a list", "nodes[0] ('a'): field 'domain' should be list, found str"),
    ("missing desc", "nodes[0] ('a'): missing field 'desc'"),
    ("missing split file", "split_ids.json: missing UltraTool split ids"),
    ("not a folder", "expected an UltraTool folder"),
])
def test_ultratool_bad_input(tmp_path, case, needle):
  requests = [_request(1, "a"), _request(2, "b")]
  kwargs = {}
  if case == "unknown task":
    requests[1] = _request(2, "zzz")
  elif case == "bad json":
    requests[1] = '{"id": "2", "user_request": '
  elif case == "duplicate id":
    requests[1] = _request(1, "b")
  elif case == "empty text":
    requests[1] = _request(2, "b", text="  \n")
  elif case == "task not a string":
    requests[1] = {"id": "2", "user_request": "x", "task_nodes": [{"task": ["a"]}]}
  elif case == "nodes not a list":
    requests[0] = {"id": "1", "user_request": "x", "task_nodes": {"task": "a"}}
  elif case == "unknown test id":
    kwargs["test_ids"] = ("2", "99")
  elif case == "repeated test id":
    kwargs["test_ids"] = ("2", "2")
  elif case == "duplicate tool":
    kwargs["nodes"] = [{"id": "a", "desc": "A"}, {"id": "a", "desc": "again"}]
  elif case == "bad domain":
    kwargs["nodes"] = [{"id": "a", "desc": "A", "domain": ["X", 3]}]
  elif case == "domain not a list":
    kwargs["nodes"] = [{"id": "a", "desc": "A", "domain": "X"}]
  elif case == "missing desc":
    kwargs["nodes"] = [{"id": "a", "domain": []}]
  root = ultratool_folder(tmp_path, requests=requests, **kwargs)
  if case == "split ids shape":
    (root / "split_ids.json").write_text(json.dumps({"test": ["2"]}))
  elif case == "no nodes":
    (root / "tool_desc.json").write_text(json.dumps([{"id": "a"}]))
  elif case == "missing split file":
    os.remove(root / "split_ids.json")
  elif case == "not a folder":
    root = root / "data.json"
  with pytest.raises(UserError) as e:
    load_dataset(f"ultratool:{root}")
  assert needle in str(e.value), str(e.value)


def _tool(name, params=("x",), required=("x",), field="F"):
  return {"api_name": name, "api_description": f"{name} does things", "field": field,
          "parameters": {p: {"type": "str", "description": p} for p in params},
          "required": list(required), "responses": {}}


def _call(i, *apis, prefix="dev"):
  return {"id": f"{prefix}-{i}", "query": f"request {i}",
          "calling": [{"api": a, "parameters": {}, "responses": []} for a in apis]}


def seal_folder(tmp_path, tools=None, dev=None, test=None) -> pathlib.Path:
  root = tmp_path / "seal"
  root.mkdir()
  _lines(root / "tool.jsonl", tools if tools is not None else [_tool("f"), _tool("g")])
  _lines(root / "dev.jsonl", dev if dev is not None else [_call(0, "f", "g", "f")])
  if test is not None:
    _lines(root / "test_in_domain.jsonl", test)
  return root


def test_seal_small_folder(tmp_path):
  data = load_dataset(f"seal:{seal_folder(tmp_path, test=[_call(1, 'g', prefix='t')])}")
  assert list(data.splits) == ["train", "test"]
  assert data.split("train")[0].gold == ("f", "g") and data.split("test")[0].source == (
      "test_in_domain")
  assert data.tools.texts[0] == (
      'f: f does things parameters: {"properties": {"x": {"description": "x", "type": "str"}}, '
      '"required": ["x"], "type": "object"}')


def test_seal_empty_calling_is_counted(tmp_path):
  data = load_dataset(f"seal:{seal_folder(tmp_path, dev=[_call(0, 'f'), _call(1)])}")
  assert len(data.split("train")) == 1
  assert data.notes[0] == "train: 1 requests have an empty 'calling' (no gold set), e.g. " \
                          "'dev-1'; left out"


@pytest.mark.parametrize("case,needle", [
    ("unknown api", "dev.jsonl:1 (request 'dev-0') calling[1]: api 'zzz' is not in tool.jsonl"),
    ("bad json", "dev.jsonl:2: malformed JSON"),
    ("duplicate request", "duplicate request id 'dev-0': first at"),
    ("calling not a list", "(request 'dev-0'): field 'calling' should be list, found dict"),
    ("call without api", "(request 'dev-0') calling[0]: missing field 'api'"),
    ("empty query", "(request 'dev-0'): field 'query' is empty"),
    ("required not a parameter", "tool.jsonl:1 ('f'): required[0] = 'y' is not one of its "
                                 "parameters (x)"),
    ("parameter not an object", "tool.jsonl:1 ('f'): parameters['x'] should be an object"),
    ("duplicate tool", "duplicate tool id 'f': first at"),
    ("missing api_name", "tool.jsonl:1: missing field 'api_name'"),
    ("no tools", "tool.jsonl: no tools"),
    ("no request file", "no request file; expected at least one of dev.jsonl"),
    ("no tool file", "tool.jsonl: missing Seal-Tools tools"),
])
def test_seal_bad_input(tmp_path, case, needle):
  tools = [_tool("f"), _tool("g")]
  dev = [_call(0, "f", "g")]
  test = None
  if case == "unknown api":
    dev = [_call(0, "f", "zzz")]
  elif case == "bad json":
    dev.append("{oops")
  elif case == "duplicate request":
    test = [_call(0, "g")]  # the same id in another file
  elif case == "calling not a list":
    dev = [{"id": "dev-0", "query": "q", "calling": {"api": "f"}}]
  elif case == "call without api":
    dev = [{"id": "dev-0", "query": "q", "calling": [{"name": "f"}]}]
  elif case == "empty query":
    dev = [{"id": "dev-0", "query": " ", "calling": [{"api": "f"}]}]
  elif case == "required not a parameter":
    tools[0] = _tool("f", required=("y",))
  elif case == "parameter not an object":
    tools[0] = dict(_tool("f"), parameters={"x": "str"})
  elif case == "duplicate tool":
    tools[1] = _tool("f")
  elif case == "missing api_name":
    tools[0] = {"api_description": "nameless"}
  elif case == "no tools":
    tools = []
  root = seal_folder(tmp_path, tools=tools, dev=dev, test=test)
  if case == "duplicate request":
    (root / "test_in_domain.jsonl").write_text(json.dumps(_call(0, "g")) + "\n")
  elif case == "no request file":
    os.remove(root / "dev.jsonl")
  elif case == "no tool file":
    os.remove(root / "tool.jsonl")
  with pytest.raises(UserError) as e:
    load_dataset(f"seal:{root}")
  assert needle in str(e.value), str(e.value)


def test_bad_input_through_the_cli(tmp_path, capsys):
  root = seal_folder(tmp_path, dev=[_call(0, "f", "zzz")])
  assert cli.main(["data", "stats", f"seal:{root}"]) == 2
  err = capsys.readouterr().err
  assert err.count("error:") == 1 and "'dev-0'" in err and "Traceback" not in err
