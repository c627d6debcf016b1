"""The lexical term: b is the BM25 baseline's scores over each query's best, ℓ' = ℓ + β·b drives
the shortlist and the best set (exact against brute force, both inference paths), β is chosen on
validation where a words-only signal exists, and it travels through training, hyset/4
directories, hyset predict and hyset eval on real data."""
import dataclasses
import itertools
import json
import types

import numpy as np
import pytest

from hyset_jax import cli
from hyset_jax import config as config_lib
from hyset_jax.inference import pipeline
from hyset_jax.io import modeldir
from hyset_jax.model import parameters, scoring
from hyset_jax.training import train
from hyset_jax.model.query_inputs import QueryInputs
from hyset_jax.data.types import ToolLibrary
from hyset_jax.errors import UserError
from hyset_jax.evaluation.evaluator import evaluate_split
from hyset_jax.model import terms
from hyset_jax.training import post_theta
from hyset_jax.model.lexical import LexicalIndex
from hyset_jax.retrievers import BM25Retriever
from hyset_jax.training.train_data import QuerySet

from test_model_extensions import brute_score, random_params

N, D, M, K1, K = 14, 6, 3, 4, 8
WORDS = ("weather forecast", "square area", "currency exchange", "prime numbers", "flight booking",
         "hotel search", "image rotation", "sentiment analysis", "stock price", "music playlist",
         "calendar event", "email sender", "recipe finder", "translation service")
TEXTS = tuple(f"{w} tool: {w.split()[1]} for the {w}" for w in WORDS)


def test_scores_are_the_bm25_baseline_over_each_querys_best():
  index = LexicalIndex(TEXTS)
  queries = ["what is the weather forecast and the area of a square",
             "book a flight", "nothing matches here zzz"]
  got = index.scores(queries)
  raw = BM25Retriever(ToolLibrary(tuple(map(str, range(N))), TEXTS, ({},) * N)).scores(queries)
  assert got.dtype == np.float32 and got.shape == (3, N)
  np.testing.assert_allclose(got[:2], raw[:2] / raw[:2].max(1, keepdims=True), rtol=1e-6)
  assert got[:2].max(1).tolist() == [1.0, 1.0] and np.all(got[2] == 0)
  assert got[0, 0] > 0 and got[0, 1] > 0 and got[1, 4] == 1.0   # both intents, by their words


def brute_f_prime(params, r, lex, beta, shortlist):
  """Every subset of the shortlist with F' (ℓ' = ℓ + β·b inside F_align), float64."""
  ell = lambda members: np.array([brute_score(params, r, [t]) for t in members])
  align = lambda v: float((np.exp(v - v.max()) / np.exp(v - v.max()).sum() * v).sum())
  out = {}
  for m in range(1, M + 1):
    for subset in itertools.combinations(shortlist.tolist(), m):
      e = ell(subset)
      out[tuple(sorted(subset))] = (brute_score(params, r, list(subset)) - align(e)
                                    + align(e + beta * lex[list(subset)]))
  return out


@pytest.mark.parametrize("method", ["gather", "native"])
def test_shortlist_and_best_set_are_exact_under_the_term(method):
  rng = np.random.default_rng(3)
  params = random_params(rng, n=N, d=D, max_size=M)
  queries = rng.normal(size=(10, D)).astype(np.float32)
  lex = LexicalIndex(TEXTS).scores([WORDS[q % N] + " and " + WORDS[(3 * q + 5) % N]
                                    for q in range(10)])
  beta = np.float32(3.0)
  with_term = params._replace(lexical_weight=beta)
  x = QueryInputs(queries, lex)
  got = pipeline.predict(with_term, x, k1=K1, k_pool=K, max_size=M, method=method,
                          ranking="logit")
  plain = pipeline.predict(params, queries, k1=K1, k_pool=K, max_size=M, method=method,
                            ranking="logit")
  # The prepared path (hyset predict, serve) gives the same answers.
  fast = pipeline.predict_batched(with_term, x, k1=K1, k_pool=K, max_size=M, method=method,
                                   ranking="logit", batch_size=4)
  for name in ("shortlist", "set_tools", "set_size", "ranking"):
    np.testing.assert_array_equal(np.asarray(getattr(got, name)), getattr(fast, name))
  np.testing.assert_allclose(np.asarray(got.set_score), fast.set_score, rtol=1e-5, atol=1e-5)
  ell = np.asarray(scoring.query_logits(params, queries)) + beta * lex
  moved = 0
  for q in range(len(queries)):
    top = np.argsort(-ell[q], kind="stable")[:K1]
    assert sorted(np.asarray(got.shortlist[q][:K1]).tolist()) == sorted(top.tolist())
    scores = brute_f_prime(params, queries[q].astype(np.float64), lex[q].astype(np.float64),
                           float(beta), np.asarray(got.shortlist[q]))
    best = max(scores, key=scores.get)
    assert tuple(sorted(int(t) for t in got.set_tools[q][:got.set_size[q]])) == best
    assert float(got.set_score[q]) == pytest.approx(scores[best], rel=1e-4, abs=1e-4)
    moved += (set(np.asarray(got.shortlist[q]).tolist())
              != set(np.asarray(plain.shortlist[q]).tolist()))
  assert moved >= 3   # the term really moved shortlists
  # β = 0 is the model without the term; a model with the term refuses to run without scores.
  zero = pipeline.predict(params._replace(lexical_weight=np.float32(0)), x, k1=K1,
                           k_pool=K, max_size=M, method=method, ranking="logit")
  np.testing.assert_array_equal(np.asarray(zero.set_tools), np.asarray(plain.set_tools))
  with pytest.raises(ValueError, match="lexical term"):
    pipeline.predict_batched(with_term, queries, k1=K1, k_pool=K, max_size=M)


def test_validation_chooses_beta_where_the_words_name_the_tool():
  """Dense vectors that say nothing, query texts that name the gold tool: a β > 0 wins and lifts
  recall; with query texts that match no tool, no β is chosen (the model stays as it was)."""
  rng = np.random.default_rng(0)
  z = rng.normal(size=(N, D)).astype(np.float32)
  z /= np.linalg.norm(z, axis=1, keepdims=True)
  params = parameters.init_params(z, D, M)
  gold = [tuple(sorted({q % N, (q * 5 + 2) % N})) for q in range(40)]
  texts = tuple(" and ".join(WORDS[t] for t in g) for g in gold)
  qs = QuerySet(tuple(map(str, range(40))), texts, rng.normal(size=(40, D)).astype(np.float32),
                tuple(gold))
  config = config_lib.resolve("tiny", [f"model.k1={K1}", f"model.k_pool={K}",
                                       f"model.max_set_size={M}", "train.eval_batch_size=16"])
  mc, ids = config.model, tuple(map(str, range(N)))
  data = types.SimpleNamespace(splits={config.data.val_split: qs}, tool_ids=ids,
                               tool_texts=TEXTS)
  model = modeldir.ModelDir(params, ids, M, K1, K, None)
  term = terms.REGISTRY["lexical"]
  chosen, ranking, table, record = post_theta.fit_term(term, model, data, config)
  beta = float(chosen.params.lexical_weight)
  assert beta > 0 and record["chosen"] == f"β={beta:g}" and f"lexical β={beta:g} {ranking}" in table
  assert record["scores"][f"β={beta:g} {ranking}"] > record["scores"][f"none {ranking}"]
  assert (evaluate_split(chosen.params, qs, ids, mc, 16, ranking, lexical=chosen.lexical)["recall@3"]
          > evaluate_split(params, qs, ids, mc, 16, ranking)["recall@3"] + 0.3)
  blind = types.SimpleNamespace(splits={config.data.val_split: QuerySet(
      qs.ids, ("zzz qqq",) * 40, qs.embeddings, qs.gold)}, tool_ids=ids, tool_texts=TEXTS)
  kept, _, _, record = post_theta.fit_term(term, model, blind, config)
  assert kept is model and record["chosen"] == "none"


@pytest.mark.heavy
def test_training_chooses_the_term_and_predict_uses_it_on_real_bfcl(tmp_path, capsys):
  """BFCL (the embedded data set): a 10-step run of the preset chooses β on validation, best/ is
  hyset/4 with the tool texts, its test metrics beat the same θ without the term on recall,
  hyset predict answers text queries with it and refuses bare embeddings, and hyset eval
  agrees. (10 steps: what is tested is the term's choice and travel, not θ's training — at 50
  steps best/ was the step-0 model all the same.)"""
  from hyset_jax.training.train_data import prepare_data
  c = config_lib.resolve("bfcl", ["train.num_steps=10", "train.eval_every=10",
                                  "train.checkpoint_every=10", "train.log_every=10"])
  assert c.model.lexical   # the bfcl preset has the term on
  summary = train.train_and_evaluate(c, tmp_path / "run", progress=False, num_devices=1)
  best = modeldir.load_model_dir(tmp_path / "run" / "best")
  assert best.params.lexical_weight is not None and float(best.params.lexical_weight) > 0
  manifest = json.loads((tmp_path / "run" / "best" / "manifest.json").read_text())
  assert manifest["format"] == modeldir.FORMAT and "lexical" in manifest["terms"]
  # ... and the β it uses on a library with none of its tools (post_theta.fit_foreign).
  assert manifest["foreign"] == best.foreign and best.foreign["lexical_weight"] >= 0
  data = prepare_data(c)
  assert best.lexical.tool_texts == data.tool_texts
  test = data.splits[c.data.test_split]
  without = evaluate_split(best.params._replace(lexical_weight=None), test, best.tool_ids,
                           c.model, 64, ranking=summary["ranking"])
  assert summary["test"]["recall@5"] > without["recall@5"]
  # hyset predict on three test queries, from their text
  queries = tmp_path / "queries.jsonl"
  queries.write_text("".join(json.dumps({"_id": test.ids[i], "text": test.texts[i]}) + "\n"
                             for i in range(3)))
  out = tmp_path / "pred.jsonl"
  assert cli.main(["predict", "--model", str(tmp_path / "run"), "--queries", str(queries),
                   "--out", str(out)]) == 0
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  want = pipeline.predict_batched(best.params,
                                   best.query_inputs(test.embeddings[:3], test.texts[:3]),
                                   k1=best.k1, k_pool=best.k_pool, max_size=best.max_set_size,
                                   ranking=best.ranking)
  assert [r["set"] for r in rows] == [[best.tool_ids[t] for t in s if t >= 0]
                                       for s in want.set_tools]
  emb = tmp_path / "emb.npy"
  np.save(emb, test.embeddings[:3])
  assert cli.main(["predict", "--model", str(tmp_path / "run"), "--query-embeddings",
                   str(emb), "--out", str(tmp_path / "p2.jsonl")]) == 2
  assert "needs the query texts: pass --queries" in capsys.readouterr().err
  assert not (tmp_path / "p2.jsonl").exists()
  # hyset tools remove: the BM25 index follows the library, and the edited model predicts.
  gone = best.tool_ids[int(want.set_tools[0][0])]
  assert cli.main(["tools", "remove", "--model", str(tmp_path / "run"), "--ids", gone,
                   "--out", str(tmp_path / "edited")]) == 0
  edited = modeldir.load_model_dir(tmp_path / "edited")
  assert gone not in edited.tool_ids and len(edited.lexical.tool_texts) == len(edited.tool_ids)
  assert cli.main(["predict", "--model", str(tmp_path / "edited"), "--queries", str(queries),
                   "--out", str(tmp_path / "p3.jsonl")]) == 0
  edited_rows = [json.loads(line) for line in (tmp_path / "p3.jsonl").read_text().splitlines()]
  assert len(edited_rows) == 3 and all(gone not in r["set"] + r["ranking"] for r in edited_rows)


def test_bad_lexical_files_are_refused_by_name(tmp_path):
  rng = np.random.default_rng(1)
  params = random_params(rng, n=N, d=D, max_size=M)._replace(lexical_weight=np.float32(2))
  md = modeldir.ModelDir(params, tuple(map(str, range(N))), M, K1, K, None,
                         lexical=LexicalIndex(TEXTS))
  modeldir.save_model_dir(tmp_path / "ok", md)
  back = modeldir.load_model_dir(tmp_path / "ok")
  assert float(back.params.lexical_weight) == 2 and back.lexical.tool_texts == TEXTS
  lexfile = tmp_path / "ok" / modeldir.LEXICAL_FILE
  doc = json.loads(lexfile.read_text())
  lexfile.write_text(json.dumps({**doc, "tool_texts": doc["tool_texts"][:-1]}))
  with pytest.raises(UserError, match="tool_texts.*13 texts.*14 rows"):
    modeldir.load_model_dir(tmp_path / "ok")
  lexfile.unlink()
  with pytest.raises(UserError, match="has the lexical term but no lexical.json"):
    modeldir.load_model_dir(tmp_path / "ok")
  with pytest.raises(UserError, match="lexical_weight"):
    modeldir.save_model_dir(tmp_path / "bad", md.__class__(**{**md.__dict__, "lexical": None}))


def test_the_server_scores_request_texts_with_the_term():
  """hyset serve's retriever: a hyset/4 model's answers use each request's own words."""
  from hyset_jax.serve.retriever import Retriever
  rng = np.random.default_rng(2)
  params = random_params(rng, n=N, d=D, max_size=M)._replace(lexical_weight=np.float32(50))
  md = modeldir.ModelDir(params, tuple(map(str, range(N))), M, K1, K, None,
                         ranking="logit", lexical=LexicalIndex(TEXTS))
  vectors = {}
  encode = lambda texts: np.stack([vectors.setdefault(t, rng.normal(size=D).astype(np.float32))
                                   for t in texts])
  server = Retriever(md, encode, [{"name": str(i)} for i in range(N)], max_batch=4)
  texts = [WORDS[1] + " and " + WORDS[7], WORDS[4], "no words in common zzz"]
  rows = server.retrieve_batch([(texts[:2], server.defaults), (texts[2:], server.defaults)])
  want = pipeline.predict_batched(params, md.query_inputs(encode(texts), texts), k1=K1,
                                   k_pool=K, max_size=M, ranking="logit")
  got = [r for request in rows for r in request]
  assert [r["set"] for r in got] == [[str(t) for t in s if t >= 0] for s in want.set_tools]
  assert [r["ranking"] for r in got] == [[str(t) for t in s] for s in want.ranking]
  assert "1" in got[0]["shortlist"] and "7" in got[0]["shortlist"] and "4" in got[1]["shortlist"]
  server.warm_up()                   # compiles with zero scores: every bucket, no error
  with pytest.raises(ValueError, match="lexical scores"):
    server.predict(encode(texts[:1]), server.defaults)   # embeddings alone would drop the words


def test_switching_the_term_on_a_finished_run_rechooses_without_retraining(tmp_path):
  """model.lexical is chosen after θ: a finished workdir accepts it and only rechooses."""
  short = ["train.num_steps=20"]  # what is tested happens after θ: a short θ will do
  c = config_lib.resolve("tiny", short)
  first = train.train_and_evaluate(c, tmp_path / "run", progress=False, num_devices=1)
  params = modeldir.load_model_dir(tmp_path / "run" / "best").params
  assert params.lexical_weight is None
  on = config_lib.resolve("tiny", short + ["model.lexical=true"])
  again = train.train_and_evaluate(on, tmp_path / "run", progress=False, num_devices=1)
  assert again["steps"] == first["steps"]          # nothing trained again
  best = modeldir.load_model_dir(tmp_path / "run" / "best")
  np.testing.assert_array_equal(best.params.projection, params.projection)
  rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  assert any(k.startswith("lexical β=") for k in rows[-1]["validation_by_ranking"])
  assert [f["term"] for f in rows[-1]["fits"] if "library" not in f] == ["lexical"]
  # With the term chosen, its β for a wholly new library is chosen after it (post_theta).
  foreign = [f for f in rows[-1]["fits"] if f.get("library") == "foreign"]
  assert len(foreign) == (best.lexical is not None) and (best.foreign is not None) == bool(foreign)
  # Switched off again, a best/ that has the term (forced here: tiny's validation may not
  # choose one) loses it and is scored without it.
  forced = dataclasses.replace(best, params=best.params._replace(lexical_weight=np.float32(2)),
                               lexical=LexicalIndex(tuple(f"tool {i}" for i in best.tool_ids)))
  modeldir.save_model_dir(tmp_path / "run" / "best", forced, force=True)
  assert modeldir.load_model_dir(tmp_path / "run" / "best").lexical is not None
  off = train.train_and_evaluate(c, tmp_path / "run", progress=False, num_devices=1)
  best = modeldir.load_model_dir(tmp_path / "run" / "best")
  assert best.lexical is None and best.params.lexical_weight is None
  assert off["test"] == first["test"]
  # Anything that changes θ is still refused.
  with pytest.raises(UserError, match="different config"):
    train.train_and_evaluate(config_lib.resolve("tiny", short + ["model.lexical=true",
                                                                 "train.seed=7"]),
                             tmp_path / "run", progress=False, num_devices=1)


def test_the_per_tool_baseline_gets_the_same_words():
  """The linear-head baseline with the lexical term: β chosen on validation where the words name
  the tool (so HYSET's gain from the term is not counted as the set term's)."""
  from hyset_jax.data.types import Query
  from hyset_jax.retrievers.heads import LexicalHeadRetriever
  rng = np.random.default_rng(4)
  ids = tuple(map(str, range(N)))

  class Head:  # a head whose logits know nothing
    tool_ids = ids
    def logits(self, queries):
      return rng.normal(size=(len(queries), N)).astype(np.float32)

  val = [Query(str(i), WORDS[i % N], (str(i % N),)) for i in range(28)]
  fused = LexicalHeadRetriever.fit(Head(), LexicalIndex(TEXTS), val)
  assert fused.weight > 0
  got = fused.retrieve([WORDS[3], WORDS[9]], depth=2).rankings
  assert [r[0] for r in got] == ["3", "9"]
  blind = [Query(q.id, "zzz", q.gold) for q in val]
  assert LexicalHeadRetriever.fit(Head(), LexicalIndex(TEXTS), blind).weight == 0


def test_the_cost_benchmark_times_each_step_on_real_queries(tmp_path, capsys):
  """benchmarks.lexical_cost on a hyset/4 model over ToolLens queries (the tiny preset's):
  every step timed, the ratios computed from them, its outputs kept without --force, and a
  model without the term refused by name."""
  from benchmarks import lexical_cost
  c = config_lib.resolve("tiny", ["train.num_steps=2"])
  train.train_and_evaluate(c, tmp_path / "run", progress=False, num_devices=1)
  best = modeldir.load_model_dir(tmp_path / "run" / "best")
  plain = tmp_path / "plain"
  modeldir.save_model_dir(plain, best, force=False)
  forced = dataclasses.replace(best, params=best.params._replace(lexical_weight=np.float32(2)),
                               lexical=LexicalIndex(tuple(f"tool {i}" for i in best.tool_ids)))
  modeldir.save_model_dir(tmp_path / "lex", forced, force=False)
  args = ["--model", str(tmp_path / "lex"), "--config", "tiny", "--tag", "t", "--batches", "1",
          "3", "--repeats", "1", "--queries", "4", "--out", str(tmp_path)]
  assert lexical_cost.main(args) == 0
  got = json.loads((tmp_path / "lexical_cost_t.json").read_text())
  assert got["meta"]["test_queries"] == 4 and got["meta"]["beta"] == 2.0
  for row in got["by_batch"].values():
    assert all(row[k] > 0 for k in lexical_cost.STEPS)
    assert row["request"] == pytest.approx(
        (row["encoder"] + row["bm25"] + row["predict_with_b"]) / (row["encoder"] + row["predict"]))
  assert set(got["by_batch"]) == {"1", "3"}
  assert "| 3 |" in (tmp_path / "lexical_cost_t.md").read_text()
  assert (tmp_path / "lexical_cost_t.png").read_bytes()[:4] == b"\x89PNG"
  capsys.readouterr()
  assert lexical_cost.main(args) == 2 and "--force" in capsys.readouterr().err
  assert lexical_cost.main(args[:1] + [str(plain)] + args[2:] + ["--force"]) == 2
  assert "has no lexical term" in capsys.readouterr().err
  # hyset export --format hyset says the format it wrote.
  assert cli.main(["export", "--workdir", str(tmp_path / "lex"), "--out", str(tmp_path / "exp"),
                   "--format", "hyset"]) == 0
  assert f"format {modeldir.FORMAT}" in capsys.readouterr().out
  assert (tmp_path / "exp" / "lexical.json").is_file()
