"""A model carried onto another tool library (hyset_jax.io.carry) by ``hyset predict --tools`` and
``hyset eval --model``: the same predictions as the hand-made ``hyset tools remove`` + ``hyset
tools add`` steps, a line on stderr saying what changed, nothing when nothing did, and exit 2
when there is nothing to carry onto.

The model is random (no training: carrying never touches θ beyond Z's rows) with the seen-set
prior and the lexical term, the two terms that refer to tool rows, and its manifest names a tiny
random 8-d encoder directory, so queries and new tools are embedded for real in milliseconds.
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from hyset_jax import cli
from hyset_jax.io import carry, modeldir
from hyset_jax.data.specs import load_dataset
from hyset_jax.errors import UserError
from hyset_jax.model.lexical import LexicalIndex
from hyset_jax.model.scoring import SetPrior

from test_encoder import write_tiny_model
from test_model_extensions import random_params

N, D, M, K1, K_POOL = 14, 8, 3, 4, 8  # D: the tiny encoder's width
WORDS = ("weather", "square", "currency", "prime", "flight", "hotel", "image", "sentiment",
         "stock", "music", "calendar", "email", "recipe", "translation")
NEW = {"n0": "pizza", "n1": "taxi", "n2": "lyrics", "n3": "weather radar"}
QUERIES = ["what is the weather in paris", "convert euros to dollars and book a flight",
           "order a pizza and call a taxi", "find song lyrics and play music",
           "email my boss the stock report", "translate this recipe"]


def write_library(path, names: dict[str, str]):
  """An MCP tools/list result; returns its spec."""
  tools = [{"name": n, "description": f"{w} service for {w} requests",
            "inputSchema": {"type": "object", "properties": {"x": {"type": "string"}}}}
           for n, w in names.items()]
  path.write_text(json.dumps({"tools": tools}), encoding="utf-8")
  return f"mcp:{path}"


MODEL_TOOLS = {f"t{i}": w for i, w in enumerate(WORDS)}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  """The model directory (prior, lexical term, tiny encoder) and a queries file."""
  root = tmp_path_factory.mktemp("carry")
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("HYSET_CACHE", str(root / "cache"))
    encoder = write_tiny_model(root / "encoder")
    library = load_dataset(write_library(root / "own.json", MODEL_TOOLS)).tools
    rng = np.random.default_rng(3)
    params = random_params(rng, n=N, d=D, max_size=M)
    members = np.array([[0, 1, -1], [2, 5, 9], [4, -1, -1], [3, 12, -1]], np.int32)
    prior = SetPrior(members, rng.normal(size=(4, D)).astype(np.float32),
                     np.zeros(4, np.float32), np.float32(4), np.float32(np.log(0.1)))
    params = params._replace(prior=prior, lexical_weight=np.float32(1.0))
    model = modeldir.ModelDir(params, library.ids, M, K1, K_POOL, str(encoder), ranking="set-max",
                              lexical=LexicalIndex(library.texts))
    modeldir.save_model_dir(root / "model", model)
    queries = root / "queries.jsonl"
    queries.write_text("".join(json.dumps({"_id": f"q{i}", "text": t}) + "\n"
                               for i, t in enumerate(QUERIES)), encoding="utf-8")
    yield root


@pytest.fixture(autouse=True)
def _cache(world, monkeypatch):
  monkeypatch.setenv("HYSET_CACHE", str(world / "cache"))


def predict(world, capsys, model, *extra, out="pred.jsonl"):
  """``hyset predict`` rows and its stderr."""
  path = world / out
  capsys.readouterr()
  assert cli.main(["predict", "--model", str(model), "--queries", str(world / "queries.jsonl"),
                   "--out", str(path), "--force", *extra]) == 0
  err = capsys.readouterr().err
  return [json.loads(line) for line in path.read_text().splitlines()], err


def hand_made(world, capsys, name, drop=(), add_spec=None):
  """The model edited by the hand-made steps: ``tools remove --ids``, then ``tools add``."""
  src, out = world / "model", world / name
  if drop:
    assert cli.main(["tools", "remove", "--model", str(src), "--ids", ",".join(drop),
                     "--out", str(out), "--force"]) == 0
    src = out
  if add_spec:
    assert cli.main(["tools", "add", "--model", str(src), "--tools", add_spec, "--out",
                     str(out) + "+", "--force"]) == 0
    out = world / (name + "+")
  capsys.readouterr()
  return out


def test_the_model_s_own_library_changes_nothing(world, capsys):
  before, _ = predict(world, capsys, world / "model")
  # The same ids in another order: nothing to carry, nothing said.
  spec = write_library(world / "same.json", dict(reversed(MODEL_TOOLS.items())))
  after, err = predict(world, capsys, world / "model", "--tools", spec, out="same.jsonl")
  assert after == before and "carried" not in err
  model = modeldir.load_model_dir(world / "model")
  same, report = carry.carry(model, load_dataset(spec).tools, None)
  assert same is model and not report.changed and report.kept == N


def test_dropped_tools_are_never_predicted_and_match_tools_remove(world, capsys):
  drop = ("t0", "t2", "t5")  # row 0 (every row moves), and tools of the prior's sets
  spec = write_library(world / "fewer.json",
                       {k: w for k, w in MODEL_TOOLS.items() if k not in drop})
  rows, err = predict(world, capsys, world / "model", "--tools", spec, out="fewer.jsonl")
  assert f"carried onto {spec}: 11 tools kept, 0 added (encoder embeddings), 3 dropped" in err
  named = {t for r in rows for key in ("set", "ranking", "shortlist") for t in r[key]}
  assert not named & set(drop)
  expected, err = predict(world, capsys, hand_made(world, capsys, "removed", drop=drop))
  assert rows == expected and "carried" not in err


def test_new_tools_match_tools_add(world, capsys):
  spec = write_library(world / "more.json", {**MODEL_TOOLS, **NEW})
  rows, err = predict(world, capsys, world / "model", "--tools", spec, out="more.jsonl")
  assert f"carried onto {spec}: 14 tools kept, 4 added (encoder embeddings), 0 dropped" in err
  new_only = write_library(world / "new.json", NEW)
  expected, _ = predict(world, capsys, hand_made(world, capsys, "added", add_spec=new_only))
  assert rows == expected
  assert {t for r in rows for t in r["shortlist"]} & set(NEW)  # the new tools do compete


def test_both_through_predict_and_eval(world, capsys):
  drop = ("t1", "t7", "t13")
  kept = {k: w for k, w in MODEL_TOOLS.items() if k not in drop}
  spec = write_library(world / "both.json", {**kept, **NEW})
  rows, err = predict(world, capsys, world / "model", "--tools", spec, out="both.jsonl")
  assert "11 tools kept, 4 added (encoder embeddings), 3 dropped" in err
  made = hand_made(world, capsys, "both", drop=drop,
                   add_spec=write_library(world / "new.json", NEW))
  expected, _ = predict(world, capsys, made)
  assert rows == expected
  # hyset eval on a BEIR data set over the same library: the carried model scores as the
  # hand-made one (whose library is the data's: it is not carried again).
  beir = world / "beir"
  (beir / "qrels").mkdir(parents=True)
  library = load_dataset(spec).tools
  (beir / "corpus.jsonl").write_text("".join(
      json.dumps({"_id": t, "title": "", "text": x}) + "\n"
      for t, x in zip(library.ids, library.texts)), encoding="utf-8")
  (beir / "queries.jsonl").write_text((world / "queries.jsonl").read_text(), encoding="utf-8")
  gold = [("q0", "t0"), ("q1", "t2"), ("q1", "t4"), ("q2", "n0"), ("q2", "n1"), ("q3", "n2"),
          ("q3", "t9"), ("q4", "t11"), ("q4", "t8"), ("q5", "t12"), ("q5", "t3")]
  (beir / "qrels" / "test.tsv").write_text(
      "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{t}\t1\n" for q, t in gold))
  metrics, errs = {}, {}
  for name, model in (("carried", world / "model"), ("made", made)):
    capsys.readouterr()
    assert cli.main(["eval", "--data", f"beir:{beir}", "--split", "test", "--method", "hyset",
                     "--model", str(model), "--out", str(world / f"{name}.json"),
                     "--force"]) == 0
    errs[name] = capsys.readouterr().err
    metrics[name] = json.loads((world / f"{name}.json").read_text())
  assert (f"carried onto beir:{beir}: 11 tools kept, 4 added (encoder embeddings), 3 dropped"
          in errs["carried"])
  assert "carried" not in errs["made"]
  assert metrics["carried"] == metrics["made"]
  assert metrics["carried"]["n_queries"] == len(QUERIES)


def test_a_wholly_new_library_drops_the_tower_and_ranks_by_logit(world, capsys):
  # None of the model's tools listed: besides the carrying, the query tower is left out and the
  # ranking is logit (carry.foreign) — the predictions of that model made by hand, and stderr
  # says so. warm_start's carry() keeps both (θ is trained there).
  strangers = {f"s{i}": w for i, w in enumerate(WORDS[:6])} | NEW
  spec = write_library(world / "strangers_new.json", strangers)
  rows, err = predict(world, capsys, world / "model", "--tools", spec, out="foreign.jsonl")
  assert (f"carried onto {spec}: 0 tools kept, 10 added (encoder embeddings), 14 dropped; none "
          "of the model's tools is listed: its query tower is left out, tools are ranked by ℓ "
          "(logit, not set-max)") in err
  model = modeldir.load_model_dir(world / "model")
  assert model.params.tower is not None
  carried, report = carry.carry(model, load_dataset(spec).tools, carry.tool_encoder(model))
  assert report.foreign and carried.params.tower is not None and carried.ranking == "set-max"
  by_hand = dataclasses.replace(carried, params=carried.params._replace(tower=None),
                                ranking="logit", path=None)
  modeldir.save_model_dir(world / "by_hand", by_hand, force=True)
  expected, err = predict(world, capsys, world / "by_hand")
  assert rows == expected and "carried" not in err
  kept_tower, _ = predict(world, capsys, world / "model", "--tools", spec, "--ranking", "logit",
                          out="foreign_logit.jsonl")
  assert kept_tower == rows  # an explicit --ranking still wins; the tower is left out either way
  with_tower = dataclasses.replace(carried, ranking="logit", path=None)
  modeldir.save_model_dir(world / "with_tower", with_tower, force=True)
  towered, _ = predict(world, capsys, world / "with_tower")
  assert towered != rows  # the tower mattered (scores, if not the order)
  # One tool kept: the model's own rows are there, nothing else changes.
  one = write_library(world / "one_kept.json", {"t0": MODEL_TOOLS["t0"]} | strangers)
  _, err = predict(world, capsys, world / "model", "--tools", one, out="one.jsonl")
  assert "1 tools kept" in err and "tower" not in err
  assert carry.foreign(by_hand) == (by_hand, [])


def test_errors_exit_2(world, capsys):
  model = modeldir.load_model_dir(world / "model")
  bare = dataclasses.replace(model, query_encoder=None, lexical=None, path=None,
                             params=model.params._replace(prior=None, lexical_weight=None))
  modeldir.save_model_dir(world / "bare", bare, force=True)
  np.save(world / "q.npy", np.ones((2, D), np.float32))
  strangers = write_library(world / "strangers.json", {f"s{i}": w for i, w in enumerate(WORDS)})
  args = ["predict", "--model", str(world / "bare"), "--query-embeddings", str(world / "q.npy"),
          "--out", str(world / "e.jsonl"), "--force", "--tools"]
  capsys.readouterr()
  assert cli.main(args + [strangers]) == 2
  err = capsys.readouterr().err
  assert "shares no tool ids with the model" in err and "names no" in err
  # Too few tools left for the shortlist: the sizes are named.
  few = write_library(world / "few.json", dict(list(MODEL_TOOLS.items())[:5]))
  assert cli.main(args + [few]) == 2
  assert "would have 5 tools (5 kept, 0 added), fewer than its k_pool 8" in capsys.readouterr().err
  with pytest.raises(UserError, match="would have 5 tools"):
    carry.carry(model, load_dataset(few).tools, carry.tool_encoder(model))
  # Without an encoder but with shared tools, new ones are left out, and said so.
  both = {**{k: w for k, w in MODEL_TOOLS.items() if k not in ("t1", "t7", "t13")}, **NEW}
  carried, report = carry.carry(bare, load_dataset(write_library(world / "b.json", both)).tools,
                                None)
  assert report == carry.CarryReport(kept=11, added=0, dropped=3, left_out=4)
  assert carried.tool_ids == tuple(t for t in bare.tool_ids if t not in ("t1", "t7", "t13"))
  assert "4 new tools left out" in report.message("X")
  # The edits themselves still refuse what tooledit refuses (a library with a repeated id).
  with pytest.raises(UserError, match="given twice"):
    lib = load_dataset(write_library(world / "n.json", {**MODEL_TOOLS, **NEW})).tools
    lib = dataclasses.replace(lib, ids=lib.ids + ("n0",), texts=lib.texts + ("x",))
    carry.carry(model, lib, carry.tool_encoder(model))
