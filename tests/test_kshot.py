"""benchmarks/kshot.py: the settings it trains on, from a real held-out-category split (the
training itself is the hyset train tested elsewhere; the benchmark runs it)."""
from __future__ import annotations

import argparse
import collections
import pathlib

from benchmarks import generalisation_splits as gs
from benchmarks import kshot
from hyset_jax.data.specs import load_dataset

TOOLLENS = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "toollens"


def test_settings_add_k_shots_per_category_and_share_validation_and_test(tmp_path):
  args = argparse.Namespace(data=f"beir:{TOOLLENS}", seed=0, categories=3, shots=[1, 5],
                            shot_share=0.1)
  settings = kshot._settings(args, tmp_path)
  meta = settings.pop("_meta")
  test = load_dataset(f"beir:{tmp_path}/split/test")
  held = set(load_dataset(f"beir:{tmp_path}/split/train").tools.ids) ^ set(test.tools.ids)
  cats = gs.library_categories(test.tools)
  base = load_dataset(settings["base"]["eval"])
  assert len(base.split("train")) == meta["train"]
  for k in (1, 5):
    data = load_dataset(settings[f"{k}-shot"]["eval"])
    trained = load_dataset(settings[f"{k}-shot"]["spec"])
    assert trained.split("train") == data.split("train") and "test" not in trained.splits
    extra = [q for q in data.split("train") if "#" in q.id]
    originals = {q.id.split("#")[0] for q in extra}
    per_category = collections.Counter(
        gs.query_category(q, held, cats) for q in test.split("adapt") if q.id in originals)
    assert set(per_category.values()) == {k} and len(per_category) == 3
    repeats = settings[f"{k}-shot"]["repeats"]
    assert len(extra) == repeats * 3 * k
    # The shots are about --shot-share of what the setting trains on.
    assert 0.09 < len(extra) / len(data.split("train")) < 0.12
    assert data.split("validation") == base.split("validation")
    assert data.split("test") == base.split("test")
    # No training query needs a held-out tool except the shots.
    assert all(held & set(q.gold) for q in extra)
    # HYSET trains over the base's library plus the held-out tools the shots name, no other.
    named = {t for q in extra for t in q.gold}
    assert set(trained.tools.ids) == (set(test.tools.ids) - held) | named
    assert held - named and len(trained.tools) == settings[f"{k}-shot"]["library"]
    assert data.tools == test.tools
    assert not any(held & set(q.gold) for q in data.split("train") if "#" not in q.id)
  full = load_dataset(settings["full"]["spec"])
  assert len(full.split("train")) == meta["train"] + meta["adapt"]
