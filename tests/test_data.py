"""Data sets: readers, splits, statistics, TFDS round trip and bad input."""
from __future__ import annotations

import collections
import json
import os
import pathlib
import sys

import pytest

from hyset_jax import cli
from hyset_jax.data import bfcl, splits, tfds_builder
from hyset_jax.data.specs import load_dataset, parse_spec
from hyset_jax.data.types import Dataset, Query, ToolLibrary
from hyset_jax.errors import UserError

DATA = pathlib.Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
TOOLLENS = f"beir:{DATA / 'toollens'}"
TOOLBENCH = f"toolbench:{DATA / 'toolbench_example' / 'instruction'}"


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
  rc = cli.main(list(argv))
  captured = capsys.readouterr()
  return rc, captured.out, captured.err


@pytest.fixture(scope="module")
def toollens() -> Dataset:
  return load_dataset(TOOLLENS)


@pytest.fixture(scope="module")
def bfcl_data() -> Dataset:
  return load_dataset("bfcl")


# ----------------------------------------------------------------------------- real data


def test_toollens_matches_its_readme(toollens):
  assert len(toollens.tools) == 464
  assert list(toollens.splits) == ["train", "test"]
  assert len(toollens.split("train")) == 16893
  assert len(toollens.split("test")) == 1877
  sizes = collections.Counter(len(q.gold) for qs in toollens.splits.values() for q in qs)
  assert set(sizes) == {1, 2, 3}
  total = sum(sizes.values())
  assert round(100 * sizes[3] / total) == 74 and round(100 * sizes[2] / total) == 17
  known = set(toollens.tools.ids)
  for q in toollens.split("test"):
    assert q.gold == tuple(sorted(set(q.gold))) and set(q.gold) <= known and q.text
  assert toollens.tools.texts[0].startswith("category_name:Food, tool_name:Worldwide Recipes")


def test_toolbench_example():
  data = load_dataset(TOOLBENCH)
  assert data.name == "toolbench_example"
  assert len(data.tools) == 26
  queries = [q for qs in data.splits.values() for q in qs]
  assert len(queries) == 10
  assert collections.Counter(q.source for q in queries) == {
      "G1_query": 5, "G2_query": 3, "G3_query": 2}
  assert {q.id for q in queries} >= {"G1_query:1", "G2_query:1", "G3_query:2"}
  assert all("::" in t for t in data.tools.ids)
  assert all(set(q.gold) <= set(data.tools.ids) for q in queries)
  g3 = next(q for q in queries if q.id == "G3_query:2")
  assert len(g3.gold) == 4 and g3.gold == tuple(sorted(g3.gold))
  text = data.tools.texts[data.tools.index()["The Cocktail DB::List of Cocktails"]]
  assert text.startswith("category_name:Food, tool_name:The Cocktail DB, api_name:List of")
  assert load_dataset(TOOLBENCH) == data  # deterministic


def test_bfcl_loads_without_importing_the_package(bfcl_data):
  assert "bfcl_eval" not in sys.modules
  queries = [q for qs in bfcl_data.splits.values() for q in qs]
  sources = collections.Counter(q.source for q in queries)
  assert {"simple_python", "multiple", "parallel", "parallel_multiple",
          "live_simple", "live_multiple", "simple_java"} <= set(sources)
  assert len(queries) > 2000 and len(bfcl_data.tools) > 1500
  notes = "\n".join(bfcl_data.notes)
  assert "skipped 1 category without answers: live_relevance" in notes
  assert "no-tool queries (empty gold set) of the irrelevance categories" in notes
  assert "multi_turn_base" in notes and "format_sensitivity" in notes
  assert "differing definitions" in notes
  assert list(bfcl_data.splits) == ["train", "validation", "test", "irrelevant_train",
                                    "irrelevant_validation", "irrelevant_test"]
  assert max(len(q.gold) for q in queries) >= 2


# ----------------------------------------------------------------------------- splits


def test_hash_split_is_stable_and_order_free():
  # Fixed expectations: the split must not change across runs, machines, versions.
  assert [splits.assign(f"q{i}") for i in range(8)] == [
      splits.assign(f"q{i}") for i in range(8)]
  assert splits.unit_hash("simple_python_0", "split") == pytest.approx(0.2446656390848690)
  queries = [Query(id=f"q{i}", text="t", gold=("a",)) for i in range(2000)]
  a = splits.hash_split(queries)
  b = splits.hash_split(list(reversed(queries)))
  assert {k: {q.id for q in v} for k, v in a.items()} == {
      k: {q.id for q in v} for k, v in b.items()}
  assert list(a) == ["train", "validation", "test"]
  assert 0.75 < len(a["train"]) / 2000 < 0.85
  assert sum(len(v) for v in a.values()) == 2000


def test_with_validation_carves_from_train(toollens):
  carved = splits.with_validation(toollens, 0.1)
  assert list(carved.splits) == ["train", "validation", "test"]
  assert carved.split("test") == toollens.split("test")
  train = {q.id for q in carved.split("train")}
  valid = {q.id for q in carved.split("validation")}
  assert not train & valid
  assert train | valid == {q.id for q in toollens.split("train")}
  assert 0.08 < len(valid) / len(toollens.split("train")) < 0.12
  assert splits.with_validation(toollens, 0.1) == carved
  assert splits.with_validation(carved, 0.2) is carved


# ----------------------------------------------------------------------------- TFDS


def test_tfds_prepare_and_read_back(tmp_path, capsys):
  import tensorflow_datasets as tfds
  out = tmp_path / "prepared"
  rc, stdout, err = run_cli(capsys, "data", "prepare", TOOLBENCH, "--out", str(out))
  assert rc == 0, err
  assert "hyset_data/queries" in stdout
  data = load_dataset(TOOLBENCH)
  source = tfds.data_source("hyset_data/queries", data_dir=str(out))
  assert set(source) == {"train", "validation", "test"}
  first = source["train"][0]
  q = data.split("train")[0]
  assert first["id"].decode() == q.id and [g.decode() for g in first["gold"]] == list(q.gold)
  tools = tfds.data_source("hyset_data/tools", data_dir=str(out))["tools"]
  assert [tools[i]["id"].decode() for i in range(len(tools))] == list(data.tools.ids)
  assert load_dataset(f"tfds:{out}") == data
  assert "tensorflow" not in sys.modules

  # A non-empty --out is never overwritten without --force.
  rc, _, err = run_cli(capsys, "data", "prepare", TOOLBENCH, "--out", str(out))
  assert rc == 2 and "--force" in err and str(out) in err
  (out / "keep.txt").write_text("mine")
  rc, _, err = run_cli(capsys, "data", "prepare", TOOLBENCH, "--out", str(out), "--force")
  assert rc == 0, err
  assert (out / "keep.txt").read_text() == "mine"


def test_tfds_keeps_empty_splits_and_metadata(tmp_path):
  tools = ToolLibrary(("a", "b"), ("tool a", "tool ü"), ({"k": 1}, {}))
  data = Dataset(name="tiny", tools=tools, notes=("a note",), splits={
      "train": (Query("q1", "x", ("a", "b"), "s1"), Query("q2", "y", ("b",), "s2")),
      "test": ()})
  tfds_builder.prepare(data, str(tmp_path))
  assert tfds_builder.load_prepared(str(tmp_path)) == data


def test_tfds_missing_prepared_data(tmp_path, capsys):
  rc, _, err = run_cli(capsys, "data", "stats", f"tfds:{tmp_path}")
  assert rc == 2 and "hyset data prepare" in err and str(tmp_path) in err


# ----------------------------------------------------------------------------- stats


def test_stats_command(tmp_path, capsys):
  out = tmp_path / "stats.json"
  rc, stdout, err = run_cli(capsys, "data", "stats", TOOLLENS, "--json", str(out))
  assert rc == 0, err
  assert "tools: 464" in stdout and "train 16893" in stdout and "test 1877" in stdout
  assert "tools never used as gold: 0" in stdout
  stats = json.loads(out.read_text())
  assert stats["queries"] == {"train": 16893, "test": 1877}
  assert set(stats["set_sizes_all"]) == {"1", "2", "3"} and stats["max_set_size"] == 3
  assert stats["queries_missing_gold"]["count"] == 0

  rc, stdout, _ = run_cli(capsys, "data", "stats", "bfcl")
  assert rc == 0 and "live_multiple" in stdout and "skipped 1 category" in stdout
  assert "no-tool queries (empty gold set): 1124 (irrelevant_train " in stdout


def test_stats_reports_missing_gold_tools(tmp_path, capsys):
  path = _toolbench_file(tmp_path, relevant=[["T", "a"], ["T", "gone"]])
  rc, stdout, _ = run_cli(capsys, "data", "stats", f"toolbench:{path}")
  assert rc == 0
  assert "gold tools are missing from the library: 1" in stdout and "T::gone" in stdout


# ----------------------------------------------------------------------------- bad input


CORPUS = ['{"_id": "t1", "title": "", "text": "tool one", "metadata": {}}',
          '{"_id": "t2", "title": "Two", "text": "tool two", "metadata": {}}']
QUERIES = ['{"_id": "q1", "text": "do one", "metadata": {}}',
           '{"_id": "q2", "text": "do two", "metadata": {}}']
QRELS = "query-id\tcorpus-id\tscore\nq1\tt1\t1\nq2\tt1\t1\nq2\tt2\t1\n"


def _beir(tmp_path, corpus=CORPUS, queries=QUERIES, qrels=QRELS) -> pathlib.Path:
  root = tmp_path / "beir"
  (root / "qrels").mkdir(parents=True)
  for name, content in (("corpus.jsonl", corpus), ("queries.jsonl", queries)):
    if content is not None:
      data = content if isinstance(content, bytes) else "\n".join(content).encode() + b"\n"
      (root / name).write_bytes(data)
  (root / "qrels" / "train.tsv").write_text(qrels)
  return root


def _toolbench_file(tmp_path, relevant=(("T", "a"),), query="q", query_id=1, extra=()):
  api = {"category_name": "C", "tool_name": "T", "api_name": "a", "api_description": "d",
         "required_parameters": [], "optional_parameters": []}
  entries = [{"api_list": [api], "query": query, "query_id": query_id,
              "relevant APIs": [list(r) for r in relevant]}, *extra]
  path = tmp_path / "G1_query.json"
  path.write_text(json.dumps(entries, indent=1))
  return path


def _expect_error(capsys, spec: str, *needles: str, extra=()) -> str:
  rc, _, err = run_cli(capsys, "data", "stats", spec, *extra)
  assert rc == 2, err
  assert err.startswith("error: ") and "Traceback" not in err
  for needle in needles:
    assert needle in err, (needle, err)
  return err


def test_small_beir_folder_reads(tmp_path):
  data = load_dataset(f"beir:{_beir(tmp_path)}")
  assert data.tools.texts == ("tool one", "Two tool two")
  assert data.split("train") == (Query("q1", "do one", ("t1",)),
                                 Query("q2", "do two", ("t1", "t2")))


def test_malformed_jsonl_names_file_and_line(tmp_path, capsys):
  root = _beir(tmp_path, corpus=[CORPUS[0], '{"_id": "t2", "title": ,}', CORPUS[1]])
  _expect_error(capsys, f"beir:{root}", f"{root / 'corpus.jsonl'}:2", "malformed JSON")


def test_truncated_jsonl(tmp_path, capsys):
  root = _beir(tmp_path, queries=[QUERIES[0], QUERIES[1][:20]])
  _expect_error(capsys, f"beir:{root}", f"{root / 'queries.jsonl'}:2", "truncated")


def test_jsonl_line_that_is_not_an_object(tmp_path, capsys):
  root = _beir(tmp_path, corpus=[CORPUS[0], "[1, 2]"])
  _expect_error(capsys, f"beir:{root}", "corpus.jsonl:2", "expected a JSON object")


def test_malformed_tsv_row(tmp_path, capsys):
  root = _beir(tmp_path, qrels=QRELS + "q1 t2 1\n")
  _expect_error(capsys, f"beir:{root}", f"{root / 'qrels' / 'train.tsv'}:5",
                "3 tab-separated fields")


def test_tsv_bad_header_and_bad_score(tmp_path, capsys):
  root = _beir(tmp_path, qrels="qid\tdoc\tscore\nq1\tt1\t1\n")
  _expect_error(capsys, f"beir:{root}", "train.tsv:1", "query-id<TAB>corpus-id<TAB>score")
  (root / "qrels" / "train.tsv").write_text(QRELS + "q1\tt2\thigh\n")
  _expect_error(capsys, f"beir:{root}", "train.tsv:5", "not an integer")


def test_qrels_with_unknown_ids(tmp_path, capsys):
  root = _beir(tmp_path, qrels=QRELS + "q9\tt1\t1\nq8\tt1\t1\nq1\tt7\t1\n")
  _expect_error(capsys, f"beir:{root}", "train.tsv", "2 query ids not in queries.jsonl",
                "'q9' (line 5)", "1 corpus ids not in corpus.jsonl", "'t7' (line 7)")


def test_duplicate_ids(tmp_path, capsys):
  root = _beir(tmp_path, corpus=CORPUS + ['{"_id": "t1", "text": "again"}'])
  _expect_error(capsys, f"beir:{root}", "duplicate tool id 't1'",
                f"{root / 'corpus.jsonl'}:1", f"{root / 'corpus.jsonl'}:3")
  root2 = _beir(tmp_path / "b", queries=QUERIES + [QUERIES[1]])
  _expect_error(capsys, f"beir:{root2}", "duplicate query id 'q2'", "queries.jsonl:2",
                "queries.jsonl:3")


def test_duplicate_toolbench_query_ids(tmp_path, capsys):
  path = _toolbench_file(tmp_path, extra=[{
      "api_list": [], "query": "again", "query_id": 1, "relevant APIs": [["T", "a"]]}])
  _expect_error(capsys, f"toolbench:{path}", "duplicate query id 'G1_query:1'", "entry #0",
                "entry #1")


def test_query_with_empty_text(tmp_path, capsys):
  root = _beir(tmp_path, queries=[QUERIES[0], '{"_id": "q2", "text": "  "}'])
  _expect_error(capsys, f"beir:{root}", f"{root / 'queries.jsonl'}:2", "'q2' has empty text")
  path = _toolbench_file(tmp_path, query="")
  _expect_error(capsys, f"toolbench:{path}", str(path), "G1_query:1", "empty text")


def test_empty_corpus(tmp_path, capsys):
  root = _beir(tmp_path, corpus=b"\n")
  _expect_error(capsys, f"beir:{root}", f"{root / 'corpus.jsonl'}", "empty corpus")


def test_missing_files(tmp_path, capsys):
  root = _beir(tmp_path, corpus=None)
  _expect_error(capsys, f"beir:{root}", f"{root / 'corpus.jsonl'}", "missing")
  _expect_error(capsys, f"beir:{tmp_path / 'nowhere'}", "nowhere", "missing")
  _expect_error(capsys, f"toolbench:{tmp_path / 'nowhere'}", "nowhere", "missing")
  (root / "corpus.jsonl").write_text("\n".join(CORPUS))
  for f in (root / "qrels").iterdir():
    f.unlink()
  _expect_error(capsys, f"beir:{root}", "qrels", "<split>.tsv")


def test_non_utf8_bytes(tmp_path, capsys):
  bad = ("\n".join(CORPUS) + "\n").encode() + b'{"_id": "t3", "text": "caf\xe9"}\n'
  root = _beir(tmp_path, corpus=bad)
  offset = bad.index(b"\xe9")
  _expect_error(capsys, f"beir:{root}", f"{root / 'corpus.jsonl'}:3", "invalid UTF-8",
                f"byte offset {offset}", "0xe9")


def test_gold_set_larger_than_max_set_size(tmp_path, capsys):
  root = _beir(tmp_path)
  _expect_error(capsys, f"beir:{root}", "1 queries have gold sets larger than max_set_size=1",
                "largest: 2", "'q2'", "--max-size", extra=("--max-size", "1"))
  with pytest.raises(UserError, match="max_set_size"):
    load_dataset(f"beir:{root}", max_set_size=1)
  assert len(load_dataset(f"beir:{root}", max_set_size=2).split("train")) == 2


def test_typo_in_scheme(capsys):
  err = _expect_error(capsys, "bier:../x", "unknown data spec scheme 'bier'", "beir:PATH",
                      "toolbench:PATH", "did you mean beir:../x")
  assert "bfcl" in err
  with pytest.raises(UserError, match="did you mean toolbench"):
    parse_spec("toolbnech:/data")
  with pytest.raises(UserError, match="names no path"):
    parse_spec("beir:")


def test_malformed_toolbench_json(tmp_path, capsys):
  path = _toolbench_file(tmp_path)
  text = path.read_text()
  line = text[:text.index('"query": "q",')].count("\n") + 1
  path.write_text(text.replace('"query": "q",', '"query": "q"'))  # a missing comma
  _expect_error(capsys, f"toolbench:{path}", f"{path}:{line + 1}", "malformed JSON",
                "Expecting ',' delimiter")
  path.write_text(path.read_text()[:50])
  _expect_error(capsys, f"toolbench:{path}", str(path), "truncated")
  _toolbench_file(tmp_path, relevant=[["T"]])
  _expect_error(capsys, f"toolbench:{path}", "'relevant APIs'[0]", "[tool_name, api_name]")


def _bfcl_dir(tmp_path) -> pathlib.Path:
  root = tmp_path / "bfcl"
  (root / "possible_answer").mkdir(parents=True)

  def fn(name, description="d"):
    return {"name": name, "description": description,
            "parameters": {"type": "dict", "properties": {}}}

  def question(qid, *functions, content="ask"):
    return json.dumps({"id": qid, "question": [[{"role": "system", "content": "sys"},
                                                {"role": "user", "content": content}]],
                       "function": list(functions)})

  files = {
      "BFCL_v4_simple.json": [question("simple_0", fn("f")), question("simple_1", fn("g"))],
      "BFCL_v4_parallel.json": [question("parallel_0", fn("f", "other"), fn("h"))],
      "BFCL_v4_irrelevance.json": [question("irrelevance_0", fn("z"))],
      "BFCL_v4_multi_turn_base.json": [json.dumps({"id": "mt_0", "question": [[]]})],
  }
  answers = {
      "BFCL_v4_simple.json": ['{"id": "simple_0", "ground_truth": [{"f": {}}]}',
                              '{"id": "simple_1", "ground_truth": [{"g": {"x": [1]}}]}'],
      "BFCL_v4_parallel.json": ['{"id": "parallel_0", "ground_truth": '
                                '[{"h": {}}, {"f": {}}, {"h": {}}]}'],
      "BFCL_v4_multi_turn_base.json": ['{"id": "mt_0", "ground_truth": [["cd(a=1)"]]}'],
  }
  for name, lines in files.items():
    (root / name).write_text("\n".join(lines) + "\n")
  for name, lines in answers.items():
    (root / "possible_answer" / name).write_text("\n".join(lines) + "\n")
  (root / "BFCL_v4_format_sensitivity.json").write_text('{\n  "simple": ["simple_0"]\n}\n')
  return root


def test_small_bfcl_folder(tmp_path):
  data = load_dataset(f"bfcl:{_bfcl_dir(tmp_path)}")
  assert set(data.tools.ids) == {"f", "g", "h", "z"}
  queries = {q.id: q for qs in data.splits.values() for q in qs}
  assert set(queries) == {"simple_0", "simple_1", "parallel_0", "irrelevance_0"}
  assert queries["parallel_0"].gold == ("f", "h")
  assert queries["parallel_0"].source == "parallel" and queries["simple_0"].text == "ask"
  # The irrelevance question is a no-tool query, in the irrelevant_ twin of its hash split.
  assert queries["irrelevance_0"].gold == () and queries["irrelevance_0"].source == "irrelevance"
  assert queries["irrelevance_0"] in data.split(
      "irrelevant_" + splits.assign("irrelevance_0"))
  notes = "\n".join(data.notes)
  assert "read 1 no-tool queries (empty gold set) of the irrelevance categories: " \
         "irrelevance 1" in notes
  assert "without answers" not in notes
  assert "skipped 1 category without inline function lists" in notes
  assert "1 file that are not question files: format_sensitivity" in notes
  assert "1 function names had differing definitions (e.g. 'f')" in notes
  # Two definitions of f, one each: the first seen (category order) wins.
  assert data.tools.texts[data.tools.index()["f"]].startswith("f: other")


def test_bad_bfcl_answers(tmp_path, capsys):
  root = _bfcl_dir(tmp_path)
  answers = root / "possible_answer" / "BFCL_v4_simple.json"
  answers.write_text('{"id": "simple_0", "ground_truth": [{"f": {}}]}\n')
  _expect_error(capsys, f"bfcl:{root}", str(answers), "no answer for 1 questions",
                "'simple_1' (line 2)")
  answers.write_text('{"id": "simple_0", "ground_truth": [{"f": {}}]}\n'
                     '{"id": "simple_1", "ground_truth": [{"g": {}}]}\n'
                     '{"id": "simple_7", "ground_truth": [{"g": {}}]}\n')
  _expect_error(capsys, f"bfcl:{root}", "1 answers name unknown question ids",
                "'simple_7' (line 3)")
  answers.write_text('{"id": "simple_0", "ground_truth": ["f()"]}\n')
  _expect_error(capsys, f"bfcl:{root}", f"{answers}:1", "{function_name: arguments}")
  question = root / "BFCL_v4_simple.json"
  question.write_text(question.read_text()[:-30])
  _expect_error(capsys, f"bfcl:{root}", f"{question}:2", "malformed JSON")


def test_bfcl_not_installed(monkeypatch):
  monkeypatch.setattr(bfcl.importlib.util, "find_spec", lambda name: None)
  monkeypatch.setattr(sys, "path", [])
  with pytest.raises(UserError, match="pip install --no-deps bfcl-eval"):
    bfcl.find_data_dir()


def test_beir_ids_with_surrounding_spaces_round_trip(tmp_path):
  """ToolBench names tools like " Quotes API": written to a BEIR folder, the qrels' (stripped)
  TSV field still names the corpus id."""
  from hyset_jax.data.beir import load_beir
  (tmp_path / "qrels").mkdir()
  (tmp_path / "corpus.jsonl").write_text(
      '{"_id": " Quotes API::q", "title": "", "text": "quotes"}\n'
      '{"_id": "b", "title": "", "text": "other"}\n')
  (tmp_path / "queries.jsonl").write_text('{"_id": "x", "text": "a quote please"}\n')
  (tmp_path / "qrels" / "test.tsv").write_text(
      "query-id\tcorpus-id\tscore\nx\t Quotes API::q\t1\nx\tb\t1\n")
  data = load_beir(str(tmp_path))
  assert data.split("test")[0].gold == (" Quotes API::q", "b")
