"""The paper's set-level baselines (cardinality, MMR, facility location, DeepSets, Set
Transformer): they recover gold sets a query determines, are deterministic given a seed, and
run end to end through ``hyset eval``."""
from __future__ import annotations

import functools
import hashlib
import json

import numpy as np
import pytest

from hyset_jax import cli, retrievers
from hyset_jax.evaluation import metrics
from hyset_jax.commands import eval as eval_cmd
from hyset_jax.data.types import Query, ToolLibrary
from hyset_jax.retrievers import dense, greedy_sets, heads, set_scorers, shortlist, trained

# Six gold sets of sizes 2, 3, 1, 2, 3, 2; tool 1 is in two of them.
SETS = [(0, 1), (2, 3, 4), (5,), (6, 7), (1, 8, 9), (10, 11)]
# Small widths and few steps: the set scorers fit in seconds on one core.
SMALL = dict(width=16, heads=2, negatives=15, batch_size=32, steps=150, eval_every=25,
             learning_rate=1e-2)


class TableEncoder:
  """Query embeddings from a table; any other text (a tool's) a fixed random vector."""
  name = "table"

  def __init__(self, table, dim):
    self.table, self.dim = table, dim

  def encode(self, texts):
    def vector(text):
      if text in self.table:
        return self.table[text]
      seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
      return np.random.default_rng(seed).normal(size=self.dim)
    return np.stack([vector(t) for t in texts]).astype(np.float32)


@functools.lru_cache(maxsize=None)
def synthetic(n_tools=12, d=16, n_queries=240, seed=0):
  """Queries near the centroid of their set's cluster: the query determines its gold set (and
  its size); tool embeddings are random, so only training can map one to the other. Cached:
  one encoder object, so every fit here shares ℓ's head (shortlist._stage1_head)."""
  rng = np.random.default_rng(seed)
  centroids = rng.normal(size=(len(SETS), d))
  tools = ToolLibrary(ids=tuple(f"t{i}" for i in range(n_tools)),
                      texts=tuple(f"tool {i}" for i in range(n_tools)), metadata=({},) * n_tools)
  table, queries = {}, []
  for q in range(n_queries):
    s = q % len(SETS)
    table[f"query {q}"] = centroids[s] + 0.3 * rng.normal(size=d)
    queries.append(Query(id=f"q{q}", text=f"query {q}",
                         gold=tuple(sorted(f"t{t}" for t in SETS[s]))))
  return tools, TableEncoder(table, d), queries[:150], queries[150:180], queries[180:]


@pytest.fixture
def no_cache(monkeypatch):
  """Encode directly: keeps fake embeddings out of the on-disk embedding cache."""
  def embed(encoder, texts):
    x = np.asarray(encoder.encode(list(texts)), np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)
  for module in (dense, heads, shortlist):
    monkeypatch.setattr(module, "embed", embed)


def fit(name, seed=0, **settings):
  tools, enc, train, val, _ = synthetic()
  extra = SMALL if name in trained.SET_SCORER_METHODS else {}
  return trained.fit_baseline(name, tools, enc, train, seed=seed, validation=val,
                              **{**extra, **settings})


@pytest.mark.parametrize("name", trained.SET_METHODS)
def test_set_methods_recover_the_gold_sets(no_cache, name):
  *_, test = synthetic()
  r = fit(name)
  assert isinstance(r, retrievers.Retriever)
  texts = [q.text for q in test]
  got = r.retrieve(texts, 5)
  # Well-formed: 5 distinct ids, a non-empty set of at most M = 3 of the shortlist's tools.
  assert all(len(x) == len(set(x)) == 5 for x in got.rankings)
  assert all(1 <= len(s) <= 3 == r.stage1.max_size for s in got.sets)
  deep = r.retrieve(texts, 50).rankings  # at most K_pool = 11 long (12 tools)
  assert all(len(x) == r.stage1.k_pool == 11 and set(s) <= set(x)
             for x, s in zip(deep, got.sets))
  m = metrics.evaluate(got.rankings, [q.gold for q in test], got.sets)
  # Dense on random tool embeddings is at chance here (comp@3 ≈ 0, set exact 0).
  assert m["comp@3"] > 0.95 and m["set_f1"] > 0.9
  assert m["set_exact"] > (0.75 if name == "facility-location" else 0.9)
  if name == "mmr":
    assert r.setting in greedy_sets.MMR_LAMBDAS
  if name == "facility-location":
    assert r.setting in greedy_sets.FL_TEMPERATURES and r.gamma > 0
  if name in trained.SET_SCORER_METHODS:
    assert r.ranking in set_scorers.RANKINGS and 0 < r.info["best_step"] <= r.info["steps"]


def test_cardinality_predicts_the_size_and_ranks_by_the_linear_head(no_cache):
  *_, test = synthetic()
  r = fit("cardinality")
  got = r.retrieve([q.text for q in test], 11)
  sizes = np.array([len(s) for s in got.sets])
  assert np.mean(sizes == np.array([len(q.gold) for q in test])) > 0.95
  assert {1, 2, 3} <= set(sizes.tolist())
  # Its ranking is ℓ's, the linear head's (the same fit, shared through the stage-1 cache).
  assert got.rankings == r.stage1.head.retrieve([q.text for q in test], 11).rankings
  assert all(x[:len(s)] == s for x, s in zip(got.rankings, got.sets))


@pytest.mark.parametrize("name", ["facility-location", "deepsets", "set-transformer"])
def test_set_methods_are_deterministic_given_the_seed(no_cache, name):
  *_, test = synthetic()
  texts = [q.text for q in test]
  a, b = fit(name).retrieve(texts, 5), fit(name).retrieve(texts, 5)
  assert a.rankings == b.rankings and a.sets == b.sets
  if name in trained.SET_SCORER_METHODS:
    p0, p1 = fit(name, steps=25).params, fit(name, seed=1, steps=25).params
    assert any(not np.array_equal(p0[k], p1[k]) for k in p0)


def test_greedy_orders_on_hand_made_cases():
  sim = np.array([[[1, .9, 0], [.9, 1, 0], [0, 0, 1]]], np.float32)
  rel = np.array([[1, .9, .5]], np.float32)
  assert greedy_sets.mmr_order(rel, sim, 1.0).tolist() == [[0, 1, 2]]  # λ = 1: ℓ's order
  assert greedy_sets.mmr_order(rel, sim, 0.5).tolist() == [[0, 2, 1]]  # the near-copy waits
  order, gains = greedy_sets.facility_order(np.array([[.5, .3, .2]]), sim)
  assert order.tolist() == [[0, 2, 1]] and np.all(np.diff(gains) <= 0)
  assert greedy_sets._cut_sizes(gains, 0.1, 3).tolist() == [2]
  assert greedy_sets._cut_sizes(gains, 5.0, 3).tolist() == [1]  # never empty


def test_candidate_pools_put_the_gold_set_first_and_mask_its_copies():
  rng = np.random.default_rng(0)
  gold_pos = np.array([[0, 1, 0], [4, 22, 0], [3, 0, 0]], np.int32)  # 22: outside S (K = 20)
  gold_mask = np.array([[1, 1, 0], [1, 1, 0], [1, 0, 0]], bool)
  members, mask, valid = set_scorers.sample_pool(rng, gold_pos, gold_mask, 20, 31)
  assert members.shape == mask.shape == (3, 32, 3) and valid.shape == (3, 32)
  for b in range(3):
    gold = set(gold_pos[b][gold_mask[b]].tolist())
    assert set(members[b, 0][mask[b, 0]].tolist()) == gold
    for c in range(1, 32):
      cand = members[b, c][mask[b, c]].tolist()
      assert 1 <= len(cand) == len(set(cand)) <= 3
      assert set(cand) <= set(range(20)) | gold  # shortlist tools, or E*'s own
      assert valid[b, c] == (set(cand) != gold)
    assert valid[b].sum() >= 25  # few negatives hit E* by chance


def test_decode_set_first_and_set_max():
  from hyset_jax.inference.subsets import subset_table
  t = subset_table(3, 2)  # {0} {1} {2} {0,1} {0,2} {1,2}
  scores = np.array([[0.0, 0.5, 0.1, 0.2, 0.3, 1.0]], np.float32)
  sl = np.array([[7, 8, 9]])
  rank, sets = set_scorers.decode(scores, t.members, t.mask, sl, "set-first")
  assert sets[0].tolist() == [8, 9] and rank.tolist() == [[8, 9, 7]]
  # set-max: 8 and 9 (in {1,2}, 1.0) first, then 7 (best set holding it: {0,2}, 0.3).
  assert set_scorers.decode(scores, t.members, t.mask, sl, "set-max")[0].tolist() == [[8, 9, 7]]
  scores[0, 4] = 2.0  # {0, 2} wins; 1's best set is {1, 2} (1.0)
  rank, sets = set_scorers.decode(scores, t.members, t.mask, sl, "set-max")
  assert sets[0].tolist() == [7, 9] and rank.tolist() == [[7, 9, 8]]


def test_set_methods_need_validation_and_take_no_set_rule(no_cache):
  tools, enc, train, val, _ = synthetic()
  with pytest.raises(Exception, match="validation"):
    trained.fit_baseline("mmr", tools, enc, train)
  with pytest.raises(Exception, match="set rule"):
    trained.fit_baseline("deepsets", tools, enc, train, validation=val, set_rule="threshold")
  assert set(trained.SET_METHODS) <= set(eval_cmd.TRAINED_METHODS) == set(
      trained.TRAINED_METHODS)


def _beir(root, tools, queries_by_split):
  (root / "qrels").mkdir(parents=True)
  with open(root / "corpus.jsonl", "w") as f:
    for i, text in zip(tools.ids, tools.texts):
      f.write(json.dumps({"_id": i, "title": "", "text": text}) + "\n")
  with open(root / "queries.jsonl", "w") as f:
    for qs in queries_by_split.values():
      for q in qs:
        f.write(json.dumps({"_id": q.id, "text": q.text}) + "\n")
  for split, qs in queries_by_split.items():
    rows = [f"{q.id}\t{t}\t1" for q in qs for t in q.gold]
    (root / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n"
                                                 + "\n".join(rows) + "\n")


@pytest.mark.parametrize("name", trained.SET_METHODS)
def test_hyset_eval_runs_each_set_method(tmp_path, monkeypatch, no_cache, name):
  tools, enc, train, val, test = synthetic()
  _beir(tmp_path / "data", tools, {"train": train + val, "test": test})
  monkeypatch.setattr(eval_cmd, "_load_encoder", lambda path: enc)
  monkeypatch.setattr(shortlist, "SetBaselineConfig",
                      functools.partial(shortlist.SetBaselineConfig, **SMALL))
  out = tmp_path / "m.json"
  assert cli.main(["eval", "--data", f"beir:{tmp_path / 'data'}", "--split", "test",
                   "--method", name, "--out", str(out)]) == 0
  m = json.loads(out.read_text())
  assert tuple(m) == metrics.METRIC_KEYS and m["n_queries"] == len(test)
  assert m["comp@3"] > 0.9 and m["set_exact"] > 0.7
