"""Retrievers on toy libraries, RRF against its formula, ``hyset eval`` end to end."""
import json
import os

import numpy as np
import pytest

from hyset_jax import cli, retrievers
from hyset_jax.evaluation import metrics
from hyset_jax.data.types import ToolLibrary
from hyset_jax.retrievers import dense as dense_mod
from hyset_jax.retrievers.bm25 import normalize_text
from hyset_jax.retrievers.fusion import reciprocal_rank_fusion

TOOLLENS = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "toollens")

TOYS = ToolLibrary(
    ids=("weather", "currency", "flights", "hotel"),
    texts=(
        "tool_name:OpenWeather, api_name:getForecast, api_description:Weather forecast for a city",
        "tool_name:FX, api_name:convert_currency, api_description:Convert an amount between currencies",
        "tool_name:Skyscanner, api_name:searchFlights, api_description:Find flights between airports",
        "tool_name:Booking, api_name:searchHotels, api_description:Find hotel rooms in a city",
    ),
    metadata=({}, {}, {}, {}),
)


class FixedRetriever:
  """Returns the same ranking for every query."""

  def __init__(self, ranking):
    self.ranking = list(ranking)

  def retrieve(self, queries, depth):
    return retrievers.Retrieval(rankings=[self.ranking[:depth] for _ in queries])


class FakeEncoder:
  """Bag of words over a fixed vocabulary, unit-normalised: cosine = word overlap."""
  name = "fake-bow"

  def __init__(self, vocab):
    self.vocab = {w: i for i, w in enumerate(vocab)}
    self.dim = len(vocab)

  def encode(self, texts):
    x = np.zeros((len(texts), self.dim), np.float32)
    for i, t in enumerate(texts):
      for w in normalize_text(t).split():
        if w in self.vocab:
          x[i, self.vocab[w]] += 1
    x[:, -1] += 1e-3  # no zero rows
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture
def no_cache(monkeypatch):
  """Encode directly: keeps fake embeddings out of the on-disk embedding cache."""
  def embed(encoder, texts):
    x = np.asarray(encoder.encode(list(texts)), np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)
  monkeypatch.setattr(dense_mod, "embed", embed)
  from hyset_jax.retrievers import heads, set_classifier
  from hyset_jax.retrievers import hyset as hyset_mod
  for module in (hyset_mod, heads, set_classifier):
    monkeypatch.setattr(module, "embed", embed)


def test_retrievers_satisfy_the_protocol(no_cache):
  enc = FakeEncoder(["weather", "city", "flights", "pad"])
  for r in (retrievers.BM25Retriever(TOYS), retrievers.DenseRetriever(TOYS, enc),
            retrievers.FusionRetriever([FixedRetriever(["a"])])):
    assert isinstance(r, retrievers.Retriever)


def test_bm25_ranks_the_matching_tool_first():
  bm25 = retrievers.BM25Retriever(TOYS)
  out = bm25.retrieve(["what's the weather forecast in Paris?",
                       "convert 100 dollars to another currency",
                       "find me cheap flights to Tokyo"], depth=2)
  assert [r[0] for r in out.rankings] == ["weather", "currency", "flights"]
  assert all(len(r) == 2 for r in out.rankings)
  assert out.sets is None


def test_bm25_splits_identifiers():
  # "forecast" only appears inside the camelCase "getForecast" and the description;
  # "hotels" only inside "searchHotels".
  assert normalize_text("api_name:searchHotels") == "api name search hotels"
  out = retrievers.BM25Retriever(TOYS).retrieve(["hotels"], depth=1)
  assert out.rankings == [["hotel"]]


def test_bm25_ties_follow_library_order():
  bm25 = retrievers.BM25Retriever(TOYS)
  # No word of these queries is in the library: every score is 0, so the
  # ranking is the library order, every time.
  out = bm25.retrieve(["zzz qqq", ""], depth=4)
  assert out.rankings == [list(TOYS.ids)] * 2
  # depth beyond the library returns the whole library.
  assert len(bm25.retrieve(["weather"], depth=10).rankings[0]) == 4


def test_top_k_ids_breaks_ties_by_row():
  scores = np.array([[0.5, 0.9, 0.5, 0.9], [0, 0, 0, 1]], np.float32)
  assert retrievers.top_k_ids(scores, ["a", "b", "c", "d"], 3) == [["b", "d", "a"], ["d", "a", "b"]]


def test_rrf_follows_the_formula():
  lists = [["a", "b", "c", "d"], ["c", "a", "e"], ["b"]]
  k = 60
  expected = {
      "a": 1 / (k + 1) + 1 / (k + 2),
      "b": 1 / (k + 2) + 1 / (k + 1),
      "c": 1 / (k + 3) + 1 / (k + 1),
      "d": 1 / (k + 4),
      "e": 1 / (k + 3),
  }
  fused = reciprocal_rank_fusion(lists, k=k)
  assert sorted(fused) == sorted(expected)
  # Scores are non-increasing along the fused list.
  s = [expected[t] for t in fused]
  assert all(x >= y for x, y in zip(s, s[1:]))
  # a and b tie exactly (same two terms); a appears first in the first list.
  # e (1/63) edges out d (1/64).
  assert fused == ["a", "b", "c", "e", "d"]


def test_rrf_constant_sets_how_much_agreement_counts():
  lists = [["x", "y", "b"], ["z", "w", "b"]]
  # k = 60: b = 2/63 beats x = z = 1/61 (agreement wins); y = w = 1/62.
  assert reciprocal_rank_fusion(lists, k=60) == ["b", "x", "z", "y", "w"]
  # k = 0: x = z = 1 beat b = 2/3 (top ranks win); y = w = 1/2.
  assert reciprocal_rank_fusion(lists, k=0) == ["x", "z", "b", "y", "w"]


def test_fusion_retriever_fuses_and_cuts_to_depth():
  fusion = retrievers.FusionRetriever([FixedRetriever(["a", "b", "c", "d"]),
                                       FixedRetriever(["d", "c", "b", "a"])], pool_depth=4)
  # a: 1/61 + 1/64, b: 1/62 + 1/63, c: 1/63 + 1/62, d: 1/64 + 1/61.
  # a = d and b = c exactly; 1/61 + 1/64 > 1/62 + 1/63.
  out = fusion.retrieve(["q1", "q2"], depth=3)
  assert out.rankings == [["a", "d", "b"]] * 2


def test_dense_ranks_by_cosine(no_cache):
  enc = FakeEncoder(["weather", "city", "flights", "hotel", "currency", "pad"])
  dense = retrievers.DenseRetriever(TOYS, enc)
  out = dense.retrieve(["hotel in a city", "flights"], depth=4)
  assert out.rankings[0][0] == "hotel"
  assert out.rankings[1][0] == "flights"
  q = enc.encode(["hotel in a city"])[0]
  t = enc.encode(list(TOYS.texts))
  cos = t @ q
  assert out.rankings[0] == [TOYS.ids[i] for i in np.argsort(-cos, kind="stable")]


def _random_library(n=24, d=16, seed=0):
  rng = np.random.default_rng(seed)
  ids = tuple(f"t{i}" for i in range(n))
  return ToolLibrary(ids, tuple(f"tool {i}" for i in range(n)), tuple({} for _ in ids)), rng


class TableEncoder:
  """Looks texts up in a fixed table of unit vectors."""
  name = "table"

  def __init__(self, table):
    self.table = table
    self.dim = next(iter(table.values())).shape[0]

  def encode(self, texts):
    return np.stack([self.table[t] for t in texts]).astype(np.float32)


def test_untrained_hyset_ranks_like_dense(no_cache):
  tools, rng = _random_library()
  d = 16
  vecs = rng.normal(size=(len(tools) + 5, d)).astype(np.float32)
  vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
  queries = [f"query {i}" for i in range(5)]
  table = dict(zip(tools.texts + tuple(queries), vecs))
  enc = TableEncoder(table)
  dense = retrievers.DenseRetriever(tools, enc).retrieve(queries, depth=5)
  hyset = retrievers.HysetRetriever.untrained(tools, enc, max_set_size=3, k1=8, k_pool=10)
  out = hyset.retrieve(queries, depth=5)
  assert out.rankings == dense.rankings
  # With M = 0 the best set under F_align is the top tool alone.
  assert out.sets == [[r[0]] for r in dense.rankings]
  m = metrics.evaluate(out.rankings, [{r[0]} for r in dense.rankings], out.sets)
  assert m["set_exact"] == 1.0


# ----------------------------------------------------------------- hyset eval


def test_eval_bm25_on_toollens(tmp_path, capsys):
  out = tmp_path / "metrics.json"
  argv = ["eval", "--data", f"beir:{TOOLLENS}", "--split", "test", "--method", "bm25",
          "--limit", "50", "--out", str(out)]
  assert cli.main(argv) == 0
  m = json.loads(out.read_text())
  assert tuple(m) == metrics.METRIC_KEYS
  assert m["n_queries"] == 50
  assert all(0 <= v <= 1 for k, v in m.items() if k != "n_queries")
  assert m["recall@5"] > 0.2  # BM25 is far better than chance (5/464) on ToolLens
  line = capsys.readouterr().out.strip()
  assert line.startswith("bm25 ") and "n=50" in line and str(out) in line
  # An existing --out is kept unless --force.
  assert cli.main(argv) == 2
  assert "--force" in capsys.readouterr().err
  assert cli.main(argv + ["--force"]) == 0


def test_eval_rejects_bad_flags(tmp_path, capsys):
  base = ["eval", "--data", f"beir:{TOOLLENS}", "--split", "test", "--out",
          str(tmp_path / "m.json")]
  assert cli.main(base + ["--method", "bm25", "--model", str(tmp_path)]) == 2
  assert "--model is only used with --method hyset" in capsys.readouterr().err
  with pytest.raises(SystemExit) as e:  # argparse: "--limit: expected an integer ≥ 1"
    cli.main(base + ["--method", "bm25", "--limit", "0"])
  assert e.value.code == 2 and "--limit" in capsys.readouterr().err
  assert cli.main(base[:-4] + ["--split", "nope", "--method", "bm25", "--out",
                               str(tmp_path / "m.json")]) == 2
  assert "no split 'nope'" in capsys.readouterr().err


@pytest.fixture
def fake_encoder(monkeypatch, no_cache):
  """``hyset eval`` with a bag-of-words encoder instead of MiniLM (seconds, not minutes)."""
  from hyset_jax.commands import eval as eval_cmd
  enc = FakeEncoder(["weather", "email", "search", "news", "stock", "music", "movie", "recipe",
                     "translate", "currency", "flight", "hotel", "pad"])
  enc.loaded = []  # the paths eval asked for

  def load(path):
    enc.loaded.append(path)
    return enc
  monkeypatch.setattr(eval_cmd, "_load_encoder", load)
  return enc


def test_eval_every_method_wires_up(tmp_path, fake_encoder):
  results = {}
  for method in ("dense", "fusion", "hyset"):
    out = tmp_path / f"{method}.json"
    assert cli.main(["eval", "--data", f"beir:{TOOLLENS}", "--split", "test", "--method", method,
                     "--limit", "20", "--out", str(out)]) == 0
    results[method] = json.loads(out.read_text())
    assert tuple(results[method]) == metrics.METRIC_KEYS
  # Untrained HYSET (P = I, M = 0) ranks exactly like dense ...
  for key in ("recall@3", "recall@5", "ndcg@3", "ndcg@5", "comp@3", "comp@5"):
    assert results["hyset"][key] == results["dense"][key]
  # ... but predicts its own set (the top tool alone), not dense's top 5.
  assert results["hyset"]["set_recall"] <= results["dense"]["set_recall"]


def test_eval_hyset_from_a_model_directory(tmp_path, fake_encoder, capsys):
  from hyset_jax.io import modeldir
  from hyset_jax.model import parameters
  from hyset_jax.data.specs import load_dataset
  from hyset_jax.retrievers import HysetRetriever
  tools = load_dataset(f"beir:{TOOLLENS}").tools
  # M = 5 and 20 queries: the shapes of the test above, so predict compiles once.
  untrained = HysetRetriever.untrained(tools, fake_encoder, max_set_size=5)
  params = parameters.host_params(untrained.params)
  modeldir.save_model_dir(tmp_path / "model", modeldir.ModelDir(
      params=params, tool_ids=tools.ids, max_set_size=5, k1=15, k_pool=20,
      query_encoder="fake-bow"))
  base = ["eval", "--data", f"beir:{TOOLLENS}", "--split", "test", "--limit", "20"]
  assert cli.main(base + ["--method", "hyset", "--model", str(tmp_path / "model"),
                          "--out", str(tmp_path / "model.json")]) == 0
  assert fake_encoder.loaded[-1] == "fake-bow"  # the manifest names the query encoder
  assert cli.main(base + ["--method", "dense", "--out", str(tmp_path / "dense.json")]) == 0
  from_dir = json.loads((tmp_path / "model.json").read_text())
  dense = json.loads((tmp_path / "dense.json").read_text())
  assert from_dir["recall@5"] == dense["recall@5"]
