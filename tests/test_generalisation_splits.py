"""benchmarks/generalisation_splits.py on the real data sets: what each split promises, read back
through the BEIR reader, independently of the builder's own checks."""
from __future__ import annotations

import json
import pathlib

import pytest

from benchmarks import generalisation_splits as gs
from hyset_jax import config as config_lib
from hyset_jax.data.specs import load_dataset
from hyset_jax.training.train_data import prepare_data

DATA = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"
TOOLLENS = f"beir:{DATA / 'toollens'}"
SEAL = f"seal:{DATA / 'seal_tools'}"


def _build(tmp_path, name, *args):
  out = tmp_path / name
  assert gs.main([*args, "--out", str(out)]) == 0
  return out, json.loads((out / "split.json").read_text())


def test_held_out_tools_leave_the_training_library(tmp_path):
  out, manifest = _build(tmp_path, "ut", "--kind", "tools", "--data", TOOLLENS, "--seed", "3")
  train, test = load_dataset(f"beir:{out}/train"), load_dataset(f"beir:{out}/test")
  held = set(manifest["held_out_tools"])
  pooled = load_dataset(TOOLLENS)
  named = {t for qs in pooled.splits.values() for q in qs for t in q.gold}
  assert len(held) == round(0.1 * len(named))
  assert not held & set(train.tools.ids)
  assert set(test.tools.ids) == set(pooled.tools.ids)
  assert all(not held & set(q.gold) for q in train.split("train"))
  assert test.split("test") and all(held & set(q.gold) for q in test.split("test"))
  # Every pooled query with gold is in exactly one of the two.
  ids = [q.id for q in train.split("train")] + [q.id for q in test.split("test")]
  assert len(ids) == len(set(ids)) == manifest["pooled_queries"]
  # Training reads the train folder although it has no test split (validation only).
  c = config_lib.Config()
  c.data = config_lib.DataConfig(spec=f"beir:{out}/train", max_train_queries=16,
                                 max_eval_queries=16)
  data = prepare_data(config_lib.validate(c))
  assert set(data.splits) == {"train", "validation"}
  assert len(data.tool_ids) == len(train.tools.ids)


def test_same_seed_same_split_other_seed_other_split(tmp_path):
  _, a = _build(tmp_path, "a", "--kind", "pairs", "--data", TOOLLENS, "--seed", "0")
  _, b = _build(tmp_path, "b", "--kind", "pairs", "--data", TOOLLENS, "--seed", "0")
  _, c = _build(tmp_path, "c", "--kind", "pairs", "--data", TOOLLENS, "--seed", "1")
  assert a == b
  assert a["pairs"] != c["pairs"]


def test_unseen_pairs_are_new_pairs_of_known_tools(tmp_path):
  out, manifest = _build(tmp_path, "pairs", "--kind", "pairs", "--data", TOOLLENS,
                         "--pairs", "12", "--validation-pairs", "4")
  data = load_dataset(f"beir:{out}")
  pairs = [tuple(p) for p in manifest["pairs"]]
  val_pairs = [tuple(p) for p in manifest["validation_pairs"]]
  assert len(pairs) == 12 and len(val_pairs) == 4
  train = data.split("train")
  both = lambda q, p: p[0] in q.gold and p[1] in q.gold
  assert not any(both(q, p) for q in train for p in pairs + val_pairs)
  train_tools = {t for q in train for t in q.gold}
  test = data.split("test")
  assert test and all(any(both(q, p) for p in pairs) for q in test)
  assert {t for q in test + data.split("validation") for t in q.gold} <= train_tools


def test_held_out_categories_with_an_adapt_split_on_seal_tools(tmp_path):
  out, manifest = _build(tmp_path, "uc", "--kind", "categories", "--data", SEAL,
                         "--categories", "4", "--adapt-fraction", "0.3", "--seed", "2")
  test = load_dataset(f"beir:{out}/test")
  train = load_dataset(f"beir:{out}/train")
  chosen = set(manifest["held_out_categories"])
  assert len(chosen) == 4
  lib = test.tools
  cats = {t: gs.categories_of(x, m) for t, x, m in zip(lib.ids, lib.texts, lib.metadata)}
  held = set(manifest["held_out_tools"])
  # A tool is held out exactly when it is needed by some query and each of its categories is.
  assert all(cats[t] and cats[t] <= chosen for t in held)
  assert not held & set(train.tools.ids)
  adapt, tests = test.split("adapt"), test.split("test")
  assert not {q.id for q in adapt} & {q.id for q in tests}
  category = lambda q: min(c for t in q.gold if t in held for c in cats[t])
  for c in {category(q) for q in adapt + tests}:
    n_adapt = sum(category(q) == c for q in adapt)
    n_all = n_adapt + sum(category(q) == c for q in tests)
    assert n_adapt == min(n_all - 1, max(1, round(0.3 * n_all))), c
  # The adapt split lists each category's queries together: its first k are the k-shot set.
  order = [category(q) for q in adapt]
  assert order == sorted(order)


@pytest.mark.parametrize("args, expected", [
    (["--kind", "tools", "--fraction", "1.5"], "--fraction"),
    (["--kind", "categories", "--categories", "999"], "categories"),
])
def test_bad_options_are_user_errors(tmp_path, capsys, args, expected):
  assert gs.main([*args, "--data", TOOLLENS, "--out", str(tmp_path / "x")]) == 2
  assert expected in capsys.readouterr().err
  assert not (tmp_path / "x").exists()


def test_an_existing_output_is_kept_without_force(tmp_path, capsys):
  out = tmp_path / "kept"
  out.mkdir()
  (out / "mine.txt").write_text("mine")
  assert gs.main(["--kind", "pairs", "--data", TOOLLENS, "--out", str(out)]) == 2
  assert "--force" in capsys.readouterr().err
  assert (out / "mine.txt").read_text() == "mine"


def test_sets_is_the_unseen_split(tmp_path):
  out, manifest = _build(tmp_path, "sets", "--kind", "sets", "--data", TOOLLENS,
                         "--sets", "5", "--validation-sets", "2")
  assert len(manifest["held_out"]) == 5 and len(manifest["validation_held_out"]) == 2
