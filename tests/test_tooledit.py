"""hyset tools add|remove on models whose extensions refer to tool rows: the seen-set prior's
sets keep their tools when rows move (sets that lose a tool are dropped), and the lexical
term's BM25 index follows the library, written and read back as a valid directory."""
import dataclasses

import numpy as np
import pytest

from hyset_jax.inference import pipeline
from hyset_jax.io import modeldir, tooledit
from hyset_jax.errors import UserError
from hyset_jax.model.lexical import LexicalIndex
from hyset_jax.model.scoring import SetPrior

from test_model_extensions import random_params
from test_set_prior import D, K, K1, M, N, prior_in_shortlists

IDS = tuple(f"tool_{i}" for i in range(N))
TEXTS = tuple(f"{w} service for {w} requests" for w in (
    "weather", "square", "currency", "prime", "flight", "hotel", "image", "sentiment", "stock",
    "music", "calendar", "email", "recipe", "translation"))


def a_model(prior: bool, lexical: bool) -> modeldir.ModelDir:
  rng = np.random.default_rng(5)
  params = random_params(rng, n=N, d=D, max_size=M)
  if prior:
    queries = rng.normal(size=(6, D)).astype(np.float32)
    params = params._replace(prior=prior_in_shortlists(params, queries, sets=12))
  if lexical:
    params = params._replace(lexical_weight=np.float32(2.0))
  return modeldir.ModelDir(params=params, tool_ids=IDS, max_set_size=M, k1=K1, k_pool=K,
                           query_encoder=None, ranking="set-max",
                           lexical=LexicalIndex(TEXTS) if lexical else None)


def sets_by_id(m: modeldir.ModelDir) -> list[tuple[str, ...]]:
  return [tuple(m.tool_ids[t] for t in row if t >= 0) for row in np.asarray(m.params.prior.members)]


def test_removing_tools_keeps_each_seen_set_on_its_tools(tmp_path):
  before = a_model(prior=True, lexical=False)
  old_sets = sets_by_id(before)
  gone = {IDS[0], old_sets[0][0]}  # row 0 (every later row moves) and a tool of the first set
  after = tooledit.remove_tools(before, sorted(gone))
  new_sets = sets_by_id(after)
  kept = [s for s, row in enumerate(old_sets) if not gone & set(row)]
  assert 0 < len(kept) < len(old_sets)          # the draw has sets with and without them
  assert new_sets == [old_sets[s] for s in kept]
  np.testing.assert_array_equal(after.params.prior.w, np.asarray(before.params.prior.w)[kept])
  np.testing.assert_array_equal(after.params.prior.b, np.asarray(before.params.prior.b)[kept])
  # Written and read back (the directory's checks pass), and it predicts.
  modeldir.save_model_dir(tmp_path / "m", after, force=False)
  back = modeldir.load_model_dir(tmp_path / "m")
  assert sets_by_id(back) == new_sets
  q = np.random.default_rng(0).normal(size=(3, D)).astype(np.float32)
  pred = pipeline.predict(back.params, q, k1=K1, k_pool=K, max_size=M, ranking="set-max")
  assert np.asarray(pred.set_tools).max() < len(back.tool_ids)
  # Adding tools appends rows: the sets are unchanged.
  added = tooledit.add_tools(before, ["new_tool"], np.ones((1, D), np.float32))
  assert sets_by_id(added) == old_sets


def test_removing_a_tool_of_every_set_drops_the_prior():
  before = a_model(prior=False, lexical=False)
  members = np.array([[0, 1, -1], [2, -1, -1], [0, 3, 5]], np.int32)
  prior = SetPrior(members, np.ones((3, D), np.float32), np.zeros(3, np.float32),
                   np.float32(4), np.float32(np.log(0.1)))
  before = dataclasses.replace(before, params=before.params._replace(prior=prior))
  assert sets_by_id(tooledit.remove_tools(before, [IDS[1]])) == [(IDS[2],),
                                                                (IDS[0], IDS[3], IDS[5])]
  assert tooledit.remove_tools(before, [IDS[0], IDS[2]]).params.prior is None


def test_the_lexical_index_follows_the_library(tmp_path):
  before = a_model(prior=False, lexical=True)
  removed = tooledit.remove_tools(before, [IDS[3]])
  assert removed.lexical.tool_texts == TEXTS[:3] + TEXTS[4:]
  added = tooledit.add_tools(removed, ["pizza"], np.ones((1, D), np.float32),
                             ["pizza ordering service"])
  assert added.lexical.tool_texts[-1] == "pizza ordering service"
  np.testing.assert_array_equal(
      added.lexical_scores(["order a pizza"]),
      LexicalIndex(TEXTS[:3] + TEXTS[4:] + ("pizza ordering service",)).scores(["order a pizza"]))
  assert added.lexical_scores(["order a pizza"])[0].argmax() == len(added.tool_ids) - 1
  modeldir.save_model_dir(tmp_path / "m", added, force=False)
  back = modeldir.load_model_dir(tmp_path / "m")
  assert back.lexical.tool_texts == added.lexical.tool_texts and back.tool_ids == added.tool_ids
  with pytest.raises(UserError, match="lexical term .* texts are needed"):
    tooledit.add_tools(before, ["pizza"], np.ones((1, D), np.float32))


def test_a_model_without_extensions_is_edited_as_before():
  before = a_model(prior=False, lexical=False)
  after = tooledit.remove_tools(before, [IDS[0]])
  assert after.params.prior is None and after.lexical is None
  np.testing.assert_array_equal(after.params.tool_embeddings,
                                np.asarray(before.params.tool_embeddings)[1:])
  assert dataclasses.replace(after, path=None).tool_ids == IDS[1:]
