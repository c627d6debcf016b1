"""A model on a library with none of its tools uses the lexical weight training chose for that
case (the manifest's ``foreign``): chosen on validation scored as such a library sees the model,
written and read back with the model, applied (and said) when the model is carried."""
import dataclasses
import json
import types

import numpy as np
import pytest

from hyset_jax import config as config_lib
from hyset_jax.data.types import ToolLibrary
from hyset_jax.errors import UserError
from hyset_jax.evaluation.evaluator import evaluate_split
from hyset_jax.io import carry, modeldir
from hyset_jax.model import parameters
from hyset_jax.model.lexical import LexicalIndex
from hyset_jax.training import post_theta
from hyset_jax.training.train_data import QuerySet

from test_lexical import TEXTS, WORDS

N, D, M, K1, K = 14, 6, 3, 4, 8


def _case(words_name_the_tools: bool):
  """A model with the lexical term (β = 0.5) whose trained rows fit its validation, tool
  encoder rows that say nothing about the queries, and query texts that name the gold tools
  (or no tool at all)."""
  rng = np.random.default_rng(0)
  encoder = rng.normal(size=(N, D)).astype(np.float32)
  gold = [tuple(sorted({q % N, (q * 5 + 2) % N})) for q in range(40)]
  queries = rng.normal(size=(40, D)).astype(np.float32)
  # Trained rows: each tool's row is the mean of the queries that need it (the dense part
  # answers in-domain), unit length.
  z = np.stack([queries[[q for q, g in enumerate(gold) if t in g]].mean(0) for t in range(N)])
  z /= np.linalg.norm(z, axis=1, keepdims=True)
  texts = tuple(" and ".join(WORDS[t] for t in g) if words_name_the_tools else "zzz qqq"
                for g in gold)
  qs = QuerySet(tuple(map(str, range(40))), texts, queries, tuple(gold))
  config = config_lib.resolve("tiny", [f"model.k1={K1}", f"model.k_pool={K}",
                                       f"model.max_set_size={M}", "train.eval_batch_size=16"])
  ids = tuple(f"t{i}" for i in range(N))
  data = types.SimpleNamespace(splits={config.data.val_split: qs}, tool_ids=ids,
                               tool_texts=TEXTS, tool_embeddings=encoder)
  params = parameters.init_params(z, D, M)._replace(lexical_weight=np.float32(0.5))
  model = modeldir.ModelDir(params, ids, M, K1, K, None, lexical=LexicalIndex(TEXTS))
  return model, data, config


def test_the_foreign_weight_is_chosen_as_a_wholly_new_library_sees_the_model():
  model, data, config = _case(words_name_the_tools=True)
  chosen, table, record = post_theta.fit_foreign(model, data, config)
  beta = chosen.foreign["lexical_weight"]
  # The in-domain model is left as it was; β there is larger: the encoder rows say nothing.
  assert chosen.params.lexical_weight == model.params.lexical_weight and beta > 0.5
  assert record["library"] == "foreign" and record["chosen"] == f"β={beta:g}"
  assert record["ranking"] == "logit" and f"foreign lexical β={beta:g} logit" in table
  assert record["scores"][f"β={beta:g} logit"] > record["scores"]["none logit"]
  # What was chosen on: the model's rows replaced by the encoder's, the queries' own gold.
  seen = post_theta._as_if_foreign(model, data)
  np.testing.assert_allclose(seen.params.tool_embeddings, data.tool_embeddings / np.linalg.norm(
      data.tool_embeddings, axis=1, keepdims=True), rtol=1e-6)
  assert seen.params.lexical_weight is None and seen.ranking == "logit"
  qs = data.splits[config.data.val_split]
  at = lambda b: evaluate_split(seen.params._replace(lexical_weight=np.float32(b)), qs,
                                data.tool_ids, config.model, 16, "logit",
                                lexical=LexicalIndex(TEXTS))["recall@5"]
  assert at(beta) > at(0.5)
  # Query texts that match no tool: no β helps, the term is left out there.
  model, data, config = _case(words_name_the_tools=False)
  chosen, _, record = post_theta.fit_foreign(model, data, config)
  assert chosen.foreign == {"lexical_weight": 0.0} and record["chosen"] == "none"
  # Without the lexical term there is nothing to choose.
  bare = dataclasses.replace(model, params=model.params._replace(lexical_weight=None),
                             lexical=None)
  assert post_theta.fit_foreign(bare, data, config) == (bare, {}, None)


def test_carried_onto_a_wholly_new_library_the_model_uses_and_says_it(tmp_path):
  model, data, config = _case(words_name_the_tools=True)
  model = dataclasses.replace(model, foreign={"lexical_weight": 8.0}, query_encoder="enc")
  modeldir.save_model_dir(tmp_path / "m", model)
  assert json.loads((tmp_path / "m" / "manifest.json").read_text())["foreign"] == {
      "lexical_weight": 8.0}
  loaded = modeldir.load_model_dir(tmp_path / "m")
  assert loaded.foreign == {"lexical_weight": 8.0}
  new = ToolLibrary(tuple(f"n{i}" for i in range(N)), TEXTS, ({},) * N)
  encode = lambda texts: np.stack([data.tool_embeddings[TEXTS.index(t)] for t in texts])
  carried, report = carry.carry(loaded, new, encode)
  carried, changes = carry.foreign(carried)
  assert report.foreign and float(carried.params.lexical_weight) == 8.0
  assert any("foreign-library one, β = 8 (not 0.5)" in c for c in changes)
  # A library that keeps one of the model's tools is not foreign: β stays the in-domain one.
  kept = ToolLibrary(("t0",) + new.ids[1:], TEXTS, ({},) * N)
  part, report = carry.carry(loaded, kept, encode)
  assert not report.foreign and float(part.params.lexical_weight) == 0.5
  # β = 0 there: the term is left out.
  zero = dataclasses.replace(loaded, foreign={"lexical_weight": 0.0})
  carried, changes = carry.foreign(carry.carry(zero, new, encode)[0])
  assert carried.lexical is None and carried.params.lexical_weight is None
  assert any("lexical term is left out" in c for c in changes)


@pytest.mark.parametrize("value, message", [
    ({"lexical_weight": -1}, "'lexical_weight' must be a number ≥ 0"),
    ({"lexical_weight": "4"}, "'lexical_weight' must be a number ≥ 0"),
    ({"beta": 4}, "unknown setting(s) 'beta'"),
    ([4], "must be an object"),
])
def test_a_bad_foreign_field_is_refused_by_name(tmp_path, value, message):
  model, _, _ = _case(words_name_the_tools=True)
  modeldir.save_model_dir(tmp_path / "m", model)
  path = tmp_path / "m" / "manifest.json"
  manifest = json.loads(path.read_text())
  path.write_text(json.dumps(manifest | {"foreign": value}))
  with pytest.raises(UserError, match="field 'foreign'") as e:
    modeldir.load_model_dir(tmp_path / "m")
  assert message in str(e.value) and str(path) in str(e.value)


def test_a_foreign_weight_needs_the_lexical_term(tmp_path):
  model, _, _ = _case(words_name_the_tools=True)
  bare = dataclasses.replace(model, params=model.params._replace(lexical_weight=None),
                             lexical=None, foreign={"lexical_weight": 2.0})
  with pytest.raises(UserError, match="has no lexical term"):
    modeldir.save_model_dir(tmp_path / "m", bare)
