"""Trained baselines (per-tool heads, set classifier) and the unseen-set split script."""
import json

import numpy as np
import pytest

from hyset_jax import cli, retrievers
from hyset_jax.evaluation import metrics
from hyset_jax.commands import eval as eval_cmd
from hyset_jax.data.specs import load_dataset
from hyset_jax.data.types import Query, ToolLibrary
from hyset_jax.retrievers import heads, set_classifier, trained

from test_retrievers import TOOLLENS, fake_encoder, no_cache  # noqa: F401 (fixtures)


class TableEncoder:
  """Looks embeddings up by text (queries and tools of a synthetic problem)."""
  name = "table"

  def __init__(self, table):
    self.table = table
    self.dim = len(next(iter(table.values())))

  def encode(self, texts):
    return np.stack([self.table[t] for t in texts]).astype(np.float32)


def synthetic(n_tools=12, d=16, n_queries=240, seed=0):
  """Queries whose gold set is one of 6 fixed sets, embedded near their set's centroid.

  Tool embeddings are random (unrelated to the queries), so dense retrieval is at chance and
  only a trained head can learn the mapping.
  """
  rng = np.random.default_rng(seed)
  sets = [(0, 1), (2, 3, 4), (5,), (6, 7), (1, 8, 9), (10, 11)]
  centroids = rng.normal(size=(len(sets), d))
  table, queries = {}, []
  tools = ToolLibrary(ids=tuple(f"t{i}" for i in range(n_tools)),
                      texts=tuple(f"tool {i}" for i in range(n_tools)), metadata=({},) * n_tools)
  for i in range(n_tools):
    table[f"tool {i}"] = rng.normal(size=d)
  for q in range(n_queries):
    s = q % len(sets)
    text = f"query {q}"
    table[text] = centroids[s] + 0.3 * rng.normal(size=d)
    queries.append(Query(id=str(q), text=text, gold=tuple(sorted(f"t{t}" for t in sets[s]))))
  return tools, TableEncoder(table), queries[:180], queries[180:]


FAST = dict(steps=300, batch_size=64, learning_rate=3e-2)


@pytest.mark.parametrize("name,loss", [("linear-head", "softmax"), ("mlp-head", "sigmoid"),
                                       ("set-classifier", "softmax")])
def test_trained_baselines_learn_and_are_deterministic(no_cache, name, loss):
  tools, enc, train, test = synthetic()
  hidden = {"hidden": 32} if name == "mlp-head" else {}
  fit = lambda seed: trained.fit_baseline(name, tools, enc, train, seed=seed, loss=loss,
                                          **hidden, **FAST)
  a, b = fit(0), fit(0)
  assert isinstance(a, retrievers.Retriever)
  texts = [q.text for q in test]
  got, again = a.retrieve(texts, 5), b.retrieve(texts, 5)
  assert got.rankings == again.rankings and got.sets == again.sets
  m = metrics.evaluate(got.rankings, [q.gold for q in test], got.sets)
  assert m["comp@3"] > 0.95  # dense on random tool embeddings is near 0 here
  if name == "set-classifier":
    assert m["set_exact"] > 0.95
    # The predicted set heads the ranking.
    assert all(r[:len(s)] == s for r, s in zip(got.rankings, got.sets))
  else:
    assert got.sets is None  # top 5, as for the rank-only retrievers
  other = fit(1)
  assert any(not np.array_equal(a.params[k], other.params[k]) for k in a.params)


def test_thresholded_head_predicts_variable_size_sets(no_cache):
  tools, enc, train, test = synthetic()
  head = trained.fit_baseline("linear-head", tools, enc, train[:150], validation=train[150:],
                              set_rule="threshold", loss="sigmoid", **FAST)
  assert head.threshold is not None and 0 < head.threshold < 1
  got = head.retrieve([q.text for q in test], 5)
  m = metrics.evaluate(got.rankings, [q.gold for q in test], got.sets)
  assert {len(s) for s in got.sets} == {1, 2, 3}
  assert m["set_exact"] > 0.9
  with pytest.raises(Exception, match="validation"):
    trained.fit_baseline("linear-head", tools, enc, train, set_rule="threshold", **FAST)


def test_choose_threshold_is_exact_on_a_separable_case():
  probs = np.array([[0.6, 0.3, 0.05, 0.05], [0.9, 0.04, 0.03, 0.03], [0.4, 0.35, 0.2, 0.05]])
  gold = [[0, 1], [0], [0, 1]]
  tau = heads.choose_threshold(probs, gold, max_size=3)
  assert 0.2 < tau <= 0.3  # keeps 0.3 and 0.35, drops 0.2 and 0.05
  assert [s.tolist() for s in heads.threshold_sets(probs, tau, 3)] == [[0, 1], [0], [0, 1]]


def test_set_classifier_ranks_best_set_then_marginals():
  # Sets {0,1} p=0.5, {2} p=0.3, {1,3} p=0.2: best set first (1 has marginal 0.7 > 0's 0.5),
  # then tool 2 (0.3), then 3 (0.2), then 4 (in no set) last.
  membership = np.array([[1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 1, 0, 1, 0]], np.float32)
  scores, best = set_classifier.set_ranking_scores(np.array([[0.5, 0.3, 0.2]]), membership)
  assert best.tolist() == [0]
  assert np.argsort(-scores[0], kind="stable").tolist() == [1, 0, 2, 3, 4]


def test_trained_methods_are_spelled_alike():
  assert eval_cmd.TRAINED_METHODS == trained.TRAINED_METHODS
  assert set(eval_cmd.TRAINED_METHODS) <= set(eval_cmd.METHODS)


@pytest.mark.parametrize("method", ["linear-head", "set-classifier"])
def test_eval_fits_a_trained_baseline_on_toollens(tmp_path, fake_encoder, method):
  """Fit on ToolLens' train split (bag-of-words embeddings), scored on 200 test queries."""
  out = tmp_path / "m.json"
  base = ["eval", "--data", f"beir:{TOOLLENS}", "--split", "test", "--limit", "200"]
  assert cli.main(base + ["--method", method, "--out", str(out)]) == 0
  m = json.loads(out.read_text())
  assert cli.main(base + ["--method", "dense", "--out", str(tmp_path / "d.json")]) == 0
  dense = json.loads((tmp_path / "d.json").read_text())
  # Trained on 15k ToolLens queries: above the untrained ranking on the same 13 features
  # (measured: linear head R@5 21.2 vs dense 12.7).
  assert m["recall@5"] > dense["recall@5"] + 0.05
  if method == "set-classifier":
    # Its argmax set is sometimes exactly right (measured 13%); dense's top 5 never is.
    assert m["set_exact"] > 0.08 and dense["set_exact"] == 0
    assert m["set_precision"] > dense["set_precision"]


def test_eval_refuses_to_score_a_trained_baseline_on_its_train_split(tmp_path, capsys):
  assert cli.main(["eval", "--data", f"beir:{TOOLLENS}", "--split", "train", "--method",
                   "mlp-head", "--out", str(tmp_path / "m.json")]) == 2
  assert "fit on the train split" in capsys.readouterr().err


# ----------------------------------------------------------------------- unseen-set split

def _split(tmp_path, name, *extra):
  from benchmarks import unseen_split
  return unseen_split.main(["--data", f"beir:{TOOLLENS}", "--out", str(tmp_path / name),
                            *extra])


def test_unseen_split_on_toollens(tmp_path, capsys):
  from hyset_jax.data.splits import with_validation
  assert _split(tmp_path, "a", "--seed", "0", "--sets", "10") == 0
  printed = capsys.readouterr().out
  assert "held out 10 sets" in printed and "checked:" in printed
  manifest = json.loads((tmp_path / "a" / "split.json").read_text())
  data = with_validation(load_dataset(f"beir:{tmp_path / 'a'}"))
  train, test = data.split("train"), data.split("test")
  held = {tuple(s) for s in manifest["held_out"]}
  assert len(held) == 10 and all(len(s) >= 2 for s in held)
  assert {q.gold for q in test} == held
  assert not held & {q.gold for q in train}
  assert {t for q in test for t in q.gold} <= {t for q in train for t in q.gold}
  official = load_dataset(f"beir:{TOOLLENS}")
  assert len(train) + len(data.split("validation")) + len(test) == sum(
      len(qs) for qs in official.splits.values())
  assert manifest["held_out_queries"] == len(test)
  assert data.tools == official.tools
  # Validation is held out the same way (default 20 sets): new combinations, not test's either.
  val = data.split("validation")
  val_sets = {tuple(s) for s in manifest["validation_held_out"]}
  assert len(val_sets) == 20 and {q.gold for q in val} == val_sets
  assert not val_sets & held and not val_sets & {q.gold for q in train}
  assert {t for q in val for t in q.gold} <= {t for q in train for t in q.gold}
  # Same seed: the same bytes; another seed: other sets.
  assert _split(tmp_path, "b", "--seed", "0", "--sets", "10") == 0
  for f in ("corpus.jsonl", "queries.jsonl", "qrels/train.tsv", "qrels/test.tsv", "split.json"):
    assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
  assert _split(tmp_path, "c", "--seed", "1", "--sets", "10") == 0
  assert json.loads((tmp_path / "c" / "split.json").read_text())["held_out"] != manifest["held_out"]
  # --validation-sets 0: validation is carved from train when read (its sets are seen there),
  # and the test sets are still unseen after the carve.
  assert _split(tmp_path, "d", "--seed", "0", "--sets", "10", "--validation-sets", "0") == 0
  assert not (tmp_path / "d" / "qrels" / "validation.tsv").exists()
  carved = with_validation(load_dataset(f"beir:{tmp_path / 'd'}"))
  carved_train = {q.gold for q in carved.split("train")}
  assert not {q.gold for q in carved.split("test")} & carved_train
  carved_val = carved.split("validation")
  assert sum(q.gold in carved_train for q in carved_val) > 0.9 * len(carved_val) > 0
  assert "carved" in capsys.readouterr().out


def test_unseen_split_refuses_to_clobber(tmp_path, capsys):
  assert _split(tmp_path, "a", "--sets", "3") == 0
  capsys.readouterr()
  assert _split(tmp_path, "a", "--sets", "3") == 2
  assert "--force" in capsys.readouterr().err
  assert _split(tmp_path, "a", "--sets", "4", "--force") == 0
  assert json.loads((tmp_path / "a" / "split.json").read_text())["held_out_sets"] == 4
  (tmp_path / "f").write_text("x")
  assert _split(tmp_path, "f", "--sets", "3", "--force") == 2
  assert "is a file" in capsys.readouterr().err
  assert (tmp_path / "f").read_text() == "x"
  assert _split(tmp_path, "g", "--sets", "100000") == 2
  assert "can be held out" in capsys.readouterr().err
  assert _split(tmp_path, "g", "--sets", "3", "--validation-sets", "100000") == 2
  assert "--validation-sets 100000" in capsys.readouterr().err
  assert _split(tmp_path, "g", "--sets", "3", "--validation-sets", "-1") == 2
  assert "--validation-sets must be >= 0" in capsys.readouterr().err
  assert not (tmp_path / "g").exists()


# ----------------------------------------------------------------------- quality benchmark

def test_retrieval_quality_checks_its_outputs_before_any_work(tmp_path, capsys):
  """An existing result needs --force, a missing --out folder is an error: both before the
  benchmark reads data or trains (so neither costs an hour)."""
  from benchmarks import retrieval_quality
  (tmp_path / "retrieval_toollens_baselines.md").write_text("mine")
  argv = ["--config", "toollens", "--baselines-only", "--out", str(tmp_path)]
  assert retrieval_quality.main(argv) == 2
  assert "--force" in capsys.readouterr().err
  assert (tmp_path / "retrieval_toollens_baselines.md").read_text() == "mine"
  assert retrieval_quality.main(["--config", "toollens", "--baselines-only",
                                 "--out", str(tmp_path / "missing")]) == 2
  err = capsys.readouterr().err
  assert "missing" in err and "Traceback" not in err


def test_retrieval_quality_plot_only_draws_an_existing_result(tmp_path, capsys):
  from benchmarks import retrieval_quality
  m = {"recall@5": 0.5, "comp@3": 0.1, "comp@5": 0.2}
  (tmp_path / "retrieval_x.json").write_text(json.dumps(
      {"meta": {"spec": "beir:x", "test_queries": 3}, "rows": {"a": [m], "b": [m, m]}}))
  argv = ["--tag", "x", "--plot-only", "--out", str(tmp_path)]
  assert retrieval_quality.main(argv) == 0
  png = (tmp_path / "retrieval_x.png").read_bytes()
  assert png.startswith(b"\x89PNG") and len(png) > 1000
  assert retrieval_quality.main(argv) == 2 and "--force" in capsys.readouterr().err
  assert retrieval_quality.main(argv + ["--force"]) == 0
  (tmp_path / "retrieval_y.json").write_text("[1, 2]")
  assert retrieval_quality.main(["--tag", "y", "--plot-only", "--out", str(tmp_path)]) == 2
  assert "expected a retrieval_quality result" in capsys.readouterr().err
  assert retrieval_quality.main(["--tag", "z", "--plot-only", "--out", str(tmp_path)]) == 2
  assert "retrieval_z.json: missing" in capsys.readouterr().err


def test_set_errors_labels_mistakes_and_checks_outputs_first(tmp_path, capsys):
  from benchmarks import set_errors
  seen = {frozenset({1, 2}), frozenset({3})}
  assert set_errors.mistake(frozenset({1, 2}), frozenset({1, 3}), {1, 2, 3}, seen) == (
      "right size, a training set, gold in the shortlist")
  assert set_errors.mistake(frozenset({1, 2, 4}), frozenset({1, 2}), {1, 2}, seen) == (
      "wrong size (a superset of the gold set), not a training set, gold in the shortlist")
  assert set_errors.mistake(frozenset({3}), frozenset({1, 5}), {1, 3}, seen) == (
      "wrong size, a training set, gold not in the shortlist")
  # An existing result needs --force, checked before the model is read.
  (tmp_path / "set_errors_t.md").write_text("mine")
  argv = ["--model", str(tmp_path / "nope"), "--tag", "t", "--out", str(tmp_path)]
  assert set_errors.main(argv) == 2
  assert "--force" in capsys.readouterr().err
  assert (tmp_path / "set_errors_t.md").read_text() == "mine"
  assert set_errors.main(argv + ["--force"]) == 2
  err = capsys.readouterr().err
  assert "nope" in err and "Traceback" not in err


def test_a_training_killed_before_its_first_checkpoint_still_reports_its_time(tmp_path,
                                                                             monkeypatch):
  """retrieval_quality.run_hyset: a wall time for a training run start to end here — also in a
  workdir left by a run killed before any checkpoint (it trains from step 0 again); the same
  time again for a rerun of that finished run (the fits after θ chosen again), and none for a
  run resumed part-way."""
  from benchmarks import retrieval_quality
  from hyset_jax.training import train as train_lib
  steps = {"n": 40}

  def fake(config, workdir, progress):
    (workdir / "checkpoints" / "40").mkdir(parents=True, exist_ok=True)
    return {"steps": steps["n"]}

  monkeypatch.setattr(train_lib, "train_and_evaluate", fake)
  wd = tmp_path / "run_hyset_s0"
  (wd / "checkpoints").mkdir(parents=True)       # what a killed run leaves: no step saved
  (wd / "config.json").write_text("{}")
  first = retrieval_quality.run_hyset("tiny", "hyset", [], 0, tmp_path, "run")
  assert first["wall_s"] is not None and first["workdir"] == str(wd)
  again = retrieval_quality.run_hyset("tiny", "hyset", [], 0, tmp_path, "run")
  assert again["wall_s"] == first["wall_s"]
  steps["n"] = 80  # resumed from step 40 to a larger budget: its time says nothing
  assert retrieval_quality.run_hyset("tiny", "hyset", [], 0, tmp_path, "run")["wall_s"] is None
