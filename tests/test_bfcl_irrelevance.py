"""BFCL's irrelevance categories as no-tool queries (empty gold sets) in ``irrelevant_*`` splits,
on the real data of the installed bfcl-eval: counted from the raw files here, the relevant
splits unchanged, and the splits carried through prepare_data without reaching training or the
retrieval metrics."""
from __future__ import annotations

import collections
import glob
import hashlib
import json
import os
import re

import numpy as np
import pytest

from hyset_jax import cli, config as config_lib
from hyset_jax.data import bfcl
from hyset_jax.data.specs import load_dataset
from hyset_jax.data.types import Dataset
from hyset_jax.errors import UserError
from hyset_jax.evaluation import metrics

NO_TOOL = ("irrelevance", "live_irrelevance")
SPLITS = ("train", "validation", "test")


# ----------------------------------------------------------------------------- the raw files


def _newest_files(data_dir: str) -> dict[str, str]:
  newest: dict[str, tuple[int, str]] = {}
  for path in glob.glob(os.path.join(data_dir, "BFCL_v*_*.json")):
    m = re.match(r"^BFCL_v(\d+)_(.+)\.json$", os.path.basename(path))
    if m and (m.group(2) not in newest or int(m.group(1)) > newest[m.group(2)][0]):
      newest[m.group(2)] = (int(m.group(1)), path)
  return {c: p for c, (_, p) in newest.items()}


def _jsonl(path: str) -> list[dict] | None:
  try:
    with open(path, encoding="utf-8") as f:
      return [json.loads(line) for line in f if line.strip()]
  except json.JSONDecodeError:  # format_sensitivity: one JSON document
    return None


def _split(query_id: str) -> str:
  """The 80/10/10 id-hash split, written out here rather than taken from hyset_jax.data.splits."""
  u = int.from_bytes(hashlib.sha256(f"split:{query_id}".encode()).digest()[:8], "big") / 2**64
  return "train" if u < 0.8 else "validation" if u < 0.9 else "test"


@pytest.fixture(scope="module")
def raw() -> dict:
  """From the files alone: no-tool ids per category, relevant id -> gold, function names."""
  data_dir = bfcl.find_data_dir()
  no_tool: dict[str, list[str]] = {}
  relevant: dict[str, tuple[str, ...]] = {}
  functions: set[str] = set()
  for category, path in _newest_files(data_dir).items():
    records = _jsonl(path)
    if records is None:
      continue
    functions.update(f["name"] for r in records for f in r.get("function", ()))
    answer = os.path.join(data_dir, "possible_answer", os.path.basename(path))
    if category in NO_TOOL:
      assert not os.path.exists(answer)
      no_tool[category] = [r["id"] for r in records]
    elif os.path.exists(answer) and all("function" in r for r in records):
      for a in _jsonl(answer):
        relevant[a["id"]] = tuple(sorted({name for call in a["ground_truth"] for name in call}))
  return {"no_tool": no_tool, "relevant": relevant, "functions": functions}


@pytest.fixture(scope="module")
def data() -> Dataset:
  return load_dataset("bfcl")


# ----------------------------------------------------------------------------- the reader


def test_irrelevant_splits_hold_every_no_tool_question(data, raw):
  assert {c: len(ids) for c, ids in raw["no_tool"].items()} == {
      "irrelevance": 240, "live_irrelevance": 884}  # bfcl-eval 2026.3.23
  assert list(data.splits) == [*SPLITS, *(f"irrelevant_{s}" for s in SPLITS)]
  want = collections.defaultdict(set)
  for category, ids in raw["no_tool"].items():
    for i in ids:
      want[f"irrelevant_{_split(i)}"].add((i, category))
  for s in SPLITS:
    name = f"irrelevant_{s}"
    got = data.split(name)
    assert {(q.id, q.source) for q in got} == want[name] and len(got) == len(want[name])
    assert all(q.gold == () and q.source in NO_TOOL and q.text.strip() for q in got)
  assert sum(len(data.split(f"irrelevant_{s}")) for s in SPLITS) == 1124
  notes = "\n".join(data.notes)
  assert ("read 1124 no-tool queries (empty gold set) of the irrelevance categories: "
          "irrelevance 240, live_irrelevance 884; splits irrelevant_train "
          f"{len(data.split('irrelevant_train'))}, ") in notes


def test_relevant_splits_and_library_are_unchanged(data, raw):
  got = {q.id: (q.gold, s) for s in SPLITS for q in data.split(s)}
  assert got == {i: (gold, _split(i)) for i, gold in raw["relevant"].items()}
  assert len(got) == 2501
  assert all(q.gold for s in SPLITS for q in data.split(s))
  no_tool = {q.id for s in SPLITS for q in data.split(f"irrelevant_{s}")}
  assert not no_tool & set(got)
  # The library is every function of every question file, the irrelevance ones included.
  assert set(data.tools.ids) == raw["functions"] and len(data.tools) == 1853


def test_live_relevance_stays_skipped(data):
  # Some candidate function is right there, but no answer names it: neither gold nor no-tool.
  ids = {q.id for qs in data.splits.values() for q in qs}
  assert not any(i.startswith("live_relevance") for i in ids)
  assert "skipped 1 category without answers: live_relevance" in "\n".join(data.notes)


def test_candidate_functions_are_each_questions_own_list(data, raw):
  """Every question read gets its own offered functions, in file order: the gold calls of a
  relevant one are among them, and an irrelevance question's candidates are all in the library
  (an empty list stays empty: nothing offered)."""
  cands = bfcl.candidate_functions()
  read = {q.id: q for qs in data.splits.values() for q in qs}
  assert set(read) <= set(cands)
  library = set(data.tools.ids)
  for qid, gold in raw["relevant"].items():
    assert set(gold) <= set(cands[qid]), qid
  no_tool = [i for ids in raw["no_tool"].values() for i in ids]
  assert all(set(cands[i]) <= library for i in no_tool)
  first = _jsonl(_newest_files(bfcl.find_data_dir())["irrelevance"])[0]
  assert cands[first["id"]] == tuple(f["name"] for f in first["function"])


def test_candidate_functions_name_a_bad_entry(tmp_path):
  (tmp_path / "BFCL_v4_simple.json").write_text(json.dumps(
      {"id": "simple_0", "question": [[{"role": "user", "content": "q"}]],
       "function": ["not an object"]}) + "\n")
  with pytest.raises(UserError, match=r"BFCL_v4_simple.json:1 function\[0\]: expected a "
                                      r"function object"):
    bfcl.candidate_functions(str(tmp_path))


def test_answers_for_an_irrelevance_category_are_refused(tmp_path):
  (tmp_path / "possible_answer").mkdir()
  fn = {"name": "f", "description": "d", "parameters": {"type": "dict", "properties": {}}}
  for name in ("simple", "irrelevance"):
    (tmp_path / f"BFCL_v4_{name}.json").write_text(json.dumps(
        {"id": f"{name}_0", "question": [[{"role": "user", "content": "q"}]],
         "function": [fn]}) + "\n")
    (tmp_path / "possible_answer" / f"BFCL_v4_{name}.json").write_text(
        json.dumps({"id": f"{name}_0", "ground_truth": [{"f": {}}]}) + "\n")
  with pytest.raises(UserError, match="answers for the irrelevance category 'irrelevance'"):
    load_dataset(f"bfcl:{tmp_path}")


def test_stats_count_no_tool_queries_apart(data, capsys):
  from hyset_jax.data.stats import compute_stats
  stats = compute_stats(data)
  assert stats["no_tool_queries"] == {f"irrelevant_{s}": len(data.split(f"irrelevant_{s}"))
                                      for s in SPLITS}
  assert "0" not in stats["set_sizes_all"] and sum(stats["set_sizes_all"].values()) == 2501
  assert stats["set_sizes"]["irrelevant_test"] == {"0": len(data.split("irrelevant_test"))}


def test_tfds_round_trips_empty_gold_sets(data, tmp_path):
  import dataclasses
  from hyset_jax.data import tfds_builder
  small = dataclasses.replace(data, splits={"test": data.split("test"),
                                            "irrelevant_test": data.split("irrelevant_test")})
  tfds_builder.prepare(small, str(tmp_path))
  assert tfds_builder.load_prepared(str(tmp_path)) == small


# ----------------------------------------------------------------------------- metrics


def test_metrics_refuse_an_empty_gold_split(data):
  qs = data.split("irrelevant_test")
  rankings = [["x", "y", "z", "u", "v"]] * len(qs)
  with pytest.raises(UserError, match=r"split 'irrelevant_test': \d+ of \d+ queries have an "
                     r"empty gold set \(no-tool requests, e\.g\. query '"):
    metrics.evaluate(rankings, [q.gold for q in qs], split="irrelevant_test",
                     query_ids=[q.id for q in qs])
  # Without a name it is still refused, as the ValueError it always was.
  with pytest.raises(ValueError, match="empty gold set"):
    metrics.recall_at_k(rankings, [q.gold for q in qs], 3)


def test_hyset_eval_refuses_an_irrelevant_split(tmp_path, capsys):
  rc = cli.main(["eval", "--data", "bfcl", "--split", "irrelevant_test", "--method", "bm25",
                 "--out", str(tmp_path / "m.json")])
  err = capsys.readouterr().err
  assert rc == 2 and "split 'irrelevant_test' have no gold tools" in err
  assert not (tmp_path / "m.json").exists()


# ----------------------------------------------------------------------------- training


class HashEncoder:
  """Deterministic vectors from a text's hash: no model, nothing cached."""
  name = "hash"
  dim = 16

  def encode(self, texts, **_):
    rows = [np.random.default_rng(int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "big"))
            .normal(size=self.dim) for t in texts]
    return np.asarray(rows, np.float32).reshape(len(texts), self.dim)


def _config(**data_overrides) -> config_lib.Config:
  c = config_lib.Config(name="bfcl-irrelevance")
  c.data = config_lib.DataConfig(spec="bfcl", max_train_queries=64, max_eval_queries=32,
                                 **data_overrides)
  c.model = config_lib.ModelConfig(max_set_size=5, k1=4, k_pool=8, ranking="greedy")
  c.train = config_lib.TrainConfig(batch_size=16, num_steps=2, learning_rate=1e-2,
                                   warmup_steps=1, k_neg=12, log_every=1, eval_every=2,
                                   checkpoint_every=2, patience=100, eval_batch_size=32)
  return config_lib.validate(c)


@pytest.fixture
def hash_encoder(monkeypatch):
  import hyset_jax.encoder
  monkeypatch.setattr(hyset_jax.encoder, "load_encoder", lambda *a, **k: HashEncoder())


def test_prepare_data_carries_the_irrelevant_splits_and_trains_on_train_only(
    tmp_path, data, hash_encoder, monkeypatch):
  from hyset_jax.evaluation.evaluator import evaluate_split
  from hyset_jax.training import batches, train
  from hyset_jax.training.train_data import prepare_data
  c = _config()
  prepared = prepare_data(c)
  assert list(prepared.splits) == [*SPLITS, *(f"irrelevant_{s}" for s in SPLITS)]
  assert prepared.tool_ids == data.tools.ids
  for s in SPLITS:
    qs = prepared.splits[f"irrelevant_{s}"]
    want = data.split(f"irrelevant_{s}")[:32]   # max_eval_queries applies to them too
    assert qs.ids == tuple(q.id for q in want) and qs.texts == tuple(q.text for q in want)
    assert qs.gold == ((),) * len(want) and qs.embeddings.shape == (len(want), 16)
    assert all(prepared.splits[s].gold)  # the relevant splits keep their gold rows
  with pytest.raises(UserError, match="empty gold set"):
    evaluate_split(_untrained(prepared, c), prepared.splits["irrelevant_test"],
                   prepared.tool_ids, c.model, 32)

  # Training reads data.train_split alone: every batch's queries are the train QuerySet.
  seen = []
  make_batch = batches.make_batch
  monkeypatch.setattr(batches, "make_batch",
                      lambda step, params, queries, *a, **k:
                      seen.append(queries) or make_batch(step, params, queries, *a, **k))
  summary = train.train_and_evaluate(c, tmp_path / "run", data=prepared, progress=False,
                                     num_devices=1)
  assert seen and all(q is prepared.splits["train"] for q in seen)
  assert summary["steps"] == 2 and summary["test"]["n_queries"] == 32
  assert 0.0 <= summary["test"]["recall@5"] <= 1.0


def _untrained(prepared, c):
  from hyset_jax.model import parameters
  return parameters.init_params(prepared.tool_embeddings, 16, c.model.max_set_size)


def test_an_irrelevant_split_cannot_be_configured(hash_encoder):
  from hyset_jax.training.train_data import prepare_data
  for key in ("train_split", "val_split", "test_split"):
    with pytest.raises(UserError, match=r"split 'irrelevant_test' has \d+ queries with an empty "
                       r"gold set .*cannot be the train, validation or test split"):
      prepare_data(_config(**{key: "irrelevant_test"}))
