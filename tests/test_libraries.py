"""Tool libraries in agent formats (mcp:, openai:), ToolRet files, and ToolBench release roots."""
import json

import pytest

from hyset_jax import cli
from hyset_jax.data import load_dataset
from hyset_jax.data.tooltext import definition, render_tool
from hyset_jax.errors import UserError

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "description": "City"},
                                            "units": {"enum": ["C", "F"]}},
           "required": ["city"]}


def write_json(path, data):
  path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
  return path


def mcp_file(tmp_path, tools=None, name="tools.json"):
  tools = tools if tools is not None else [
      {"name": "get_weather", "description": " Current weather. ", "inputSchema": WEATHER},
      {"name": "ping"}]
  return write_json(tmp_path / name, {"tools": tools})


def test_mcp_and_openai_render_the_same_text(tmp_path):
  mcp = load_dataset(f"mcp:{mcp_file(tmp_path)}")
  openai = write_json(tmp_path / "openai.json", [
      {"type": "function", "function": {"name": "get_weather",
                                        "description": "Current weather.",
                                        # keys in another order: the text must not change
                                        "parameters": dict(reversed(list(WEATHER.items())))}},
      {"type": "function", "name": "ping"}])  # the flat Responses-API form
  oa = load_dataset(f"openai:{openai}")
  assert mcp.tools.ids == oa.tools.ids == ("get_weather", "ping")
  assert mcp.tools.texts == oa.tools.texts
  assert mcp.tools.texts[0] == render_tool("get_weather", "Current weather.", WEATHER)
  assert mcp.tools.texts[0].startswith("get_weather: Current weather. parameters: {")
  assert mcp.tools.texts[1] == "ping:"
  assert mcp.splits == {}
  d = definition(mcp.tools.ids[0], mcp.tools.texts[0], mcp.tools.metadata[0])
  assert d == {"id": "get_weather", "name": "get_weather", "description": "Current weather.",
               "parameters": WEATHER}


def test_bfcl_text_is_the_shared_rendering(tmp_path):
  from hyset_jax.data.bfcl import render_function
  fn = {"name": "f", "description": "Add two numbers.", "parameters": WEATHER}
  assert render_function(fn) == render_tool("f", "Add two numbers.", WEATHER)


def test_mcp_jsonrpc_result_is_read(tmp_path):
  path = write_json(tmp_path / "r.json", {"jsonrpc": "2.0", "id": 1,
                                          "result": {"tools": [{"name": "a"}]}})
  assert load_dataset(f"mcp:{path}").tools.ids == ("a",)


@pytest.mark.parametrize("tools,needles", [
    ([{"name": "a"}, {"description": "no name"}], ["tools[1]", "missing field 'name'"]),
    ([{"name": "a"}, {"name": "a"}], ["duplicate tool id 'a'", "tools[0]", "tools[1]"]),
    ([{"name": "a", "inputSchema": "oops"}], ["tools[0] ('a')", "'inputSchema'", "dict"]),
    ([{"name": ""}], ["tools[0]", "'name' is empty"]),
    (["a"], ["tools[0]", "expected a tool object"]),
    ([], ["tool list is empty"]),
])
def test_bad_mcp_entries(tmp_path, tools, needles):
  path = mcp_file(tmp_path, tools)
  with pytest.raises(UserError) as e:
    load_dataset(f"mcp:{path}")
  for needle in [str(path)] + needles:
    assert needle in str(e.value)


def test_bad_openai_entries(tmp_path, capsys):
  path = write_json(tmp_path / "o.json", [{"type": "function", "function": {"name": "a"}},
                                          {"type": "code_interpreter"}])
  assert cli.main(["data", "stats", f"openai:{path}"]) == 2
  err = capsys.readouterr().err
  assert str(path) in err and "tools[1]" in err and "'code_interpreter'" in err
  write_json(path, {"functions": []})
  with pytest.raises(UserError, match="without a 'tools' list"):
    load_dataset(f"openai:{path}")
  with pytest.raises(UserError, match="missing"):
    load_dataset(f"openai:{tmp_path / 'nowhere.json'}")


# --------------------------------------------------------------------------- ToolRet

def write_jsonl(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
  return path


def toolret_folder(tmp_path, queries=None):
  root = tmp_path / "toolret"
  root.mkdir(exist_ok=True)
  write_jsonl(root / "tools.jsonl", [
      {"id": "apigen_tool_1", "documentation": json.dumps(
          {"name": "bacterial_growth", "description": "Population after a time.",
           "parameters": {"rate": {"type": "float"}}})},
      {"id": "tb_tool_2", "documentation": {"category_name": "Data", "tool_name": "YT",
                                            "api_name": "Search", "api_description": "Find.",
                                            "required_parameters": [], "optional_parameters": []}},
      {"id": "plain_3", "documentation": "Converts currencies."}])
  write_jsonl(root / "queries.jsonl", queries or [
      {"id": "q1", "query": "bacteria after 45 min?", "instruction": "Retrieve growth tools",
       "labels": json.dumps([{"id": "apigen_tool_1", "relevance": 1},
                             {"id": "plain_3", "relevance": 0}])},
      {"id": "q2", "query": "find a video", "instruction": "",
       "labels": [{"id": "tb_tool_2", "relevance": 1}, {"id": "plain_3", "relevance": 2}]},
      {"id": "q3", "query": "nothing relevant", "labels": [{"id": "plain_3", "relevance": 0}]}])
  return root


def test_toolret_folder(tmp_path):
  from hyset_jax.data.toolbench import render_api
  d = load_dataset(f"toolret:{toolret_folder(tmp_path)}")
  assert d.tools.ids == ("apigen_tool_1", "tb_tool_2", "plain_3")
  assert d.tools.texts[0] == render_tool("bacterial_growth", "Population after a time.",
                                         {"rate": {"type": "float"}})
  assert d.tools.texts[1].startswith("category_name:Data, tool_name:YT, api_name:Search")
  assert d.tools.texts[1] == render_api({"category_name": "Data", "tool_name": "YT",
                                         "api_name": "Search", "api_description": "Find.",
                                         "required_parameters": [], "optional_parameters": []})
  assert d.tools.texts[2] == "Converts currencies."
  (q1, q2), = [d.splits["test"]]
  assert q1.text == "Instruct: Retrieve growth tools\nQuery: bacteria after 45 min?"
  assert q1.gold == ("apigen_tool_1",)  # relevance 0 is not gold
  assert q2.text == "find a video" and q2.gold == ("plain_3", "tb_tool_2")
  assert any("1 queries have no label" in n for n in d.notes)


def test_toolret_bad_label(tmp_path):
  root = toolret_folder(tmp_path, queries=[
      {"id": "q1", "query": "x", "labels": [{"id": "ghost", "relevance": 1}]}])
  with pytest.raises(UserError) as e:
    load_dataset(f"toolret:{root}")
  assert "queries.jsonl:1" in str(e.value) and "'ghost'" in str(e.value)
  assert "labels[0]" in str(e.value)
  write_jsonl(root / "queries.jsonl", [{"id": "q1", "query": "x", "labels": "[not json"}])
  with pytest.raises(UserError, match="'labels' is a string but not JSON"):
    load_dataset(f"toolret:{root}")


# --------------------------------------------------------------------------- ToolBench release

def api(tool, name):
  return {"category_name": "Cat", "tool_name": tool, "api_name": name,
          "api_description": f"{name} of {tool}", "required_parameters": [],
          "optional_parameters": [], "method": "GET"}


def tb_query(qid, apis, relevant, text=None):
  return {"api_list": apis, "query": text or f"query {qid}", "query_id": qid,
          "relevant APIs": relevant}


def toolbench_release(tmp_path):
  """A release root in ToolBench's layout: data/{instruction,test_instruction,test_query_ids}."""
  data = tmp_path / "ToolBench" / "data"
  for d in ("instruction", "test_instruction", "test_query_ids"):
    (data / d).mkdir(parents=True)
  a, b, c = api("T", "a"), api("T", "b"), api("U", "c")
  g1 = [tb_query(i, [a, b], [["T", "a"], ["T", "b"]]) for i in (1, 2, 3, 4)]
  g2 = [tb_query(i, [b, c], [["U", "c"]]) for i in (1, 2)]
  write_json(data / "instruction" / "G1_query.json", g1)
  write_json(data / "instruction" / "G2_query.json", g2)
  only_test = api("V", "new")  # an API that appears in a test set only
  write_json(data / "test_instruction" / "G1_instruction.json",
             [g1[1], tb_query(3, [a, only_test], [["V", "new"]])])
  write_json(data / "test_instruction" / "G2_category.json", [g2[0]])
  write_json(data / "test_query_ids" / "G1_instruction.json", {"2": 0, "3": 0})
  write_json(data / "test_query_ids" / "G2_category.json", {"1": 0})
  return tmp_path / "ToolBench"


def test_toolbench_release_root(tmp_path):
  root = toolbench_release(tmp_path)
  for spec in (f"toolbench:{root}", f"toolbench:{root / 'data'}"):
    d = load_dataset(spec)
    assert d.name == "ToolBench"
    assert list(d.splits) == ["train", "G1_instruction", "G2_category"]
    # Test queries of a group never train: G1 2 and 3, G2 1 are held out.
    assert [q.id for q in d.splits["train"]] == ["G1_query:1", "G1_query:4", "G2_query:2"]
    assert [q.id for q in d.splits["G1_instruction"]] == ["G1_instruction:2",
                                                          "G1_instruction:3"]
    assert d.splits["G1_instruction"][1].gold == ("V::new",)
    assert d.splits["G2_category"][0].source == "G2_category"
    assert set(d.tools.ids) == {"T::a", "T::b", "U::c", "V::new"}


def test_toolbench_release_filters_by_test_query_ids(tmp_path):
  root = toolbench_release(tmp_path)
  write_json(root / "data" / "test_query_ids" / "G1_instruction.json", {"2": 0, "99": 0})
  d = load_dataset(f"toolbench:{root}")
  assert [q.id for q in d.splits["G1_instruction"]] == ["G1_instruction:2"]
  assert any("not in test_query_ids/G1_instruction.json" in n for n in d.notes)
  assert any("1 ids of test_query_ids/G1_instruction.json have no query" in n for n in d.notes)
  write_json(root / "data" / "test_query_ids" / "G1_instruction.json", "nope")
  with pytest.raises(UserError, match="keyed by query id"):
    load_dataset(f"toolbench:{root}")


def test_stabletoolbench_official_test_sets(shared_data):
  """The real six test sets (no instruction/): named splits, in ToolBench's order."""
  root = shared_data / "stabletoolbench"
  d = load_dataset(f"toolbench:{root}")
  names = ["G1_instruction", "G1_category", "G1_tool", "G2_instruction", "G2_category",
           "G3_instruction"]
  assert list(d.splits) == names
  for name in names:
    raw = json.loads((root / "test_instruction" / f"{name}.json").read_text())
    ids = json.loads((root / "test_query_ids" / f"{name}.json").read_text())
    assert len(d.splits[name]) == len(raw) == len(ids)
    assert {q.id for q in d.splits[name]} == {f"{name}:{k}" for k in ids}
  assert sum(len(v) for v in d.splits.values()) == 765  # the data README's count
  assert len(d.tools) == 2479
