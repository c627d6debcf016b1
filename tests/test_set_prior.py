"""The seen-set prior: the best set is the exact argmax of F' = F + the prior's bonus against
brute force, bad tensors are refused by name (its travel through every export:
tests/test_terms.py), and training fits it and chooses it on real data."""
import itertools
import json

import numpy as np
import pytest

from hyset_jax import config as config_lib
from hyset_jax.inference import pipeline, subsets
from hyset_jax.io import modeldir, reference
from hyset_jax.model import parameters, set_prior
from hyset_jax.training import train
from hyset_jax.errors import UserError
from hyset_jax.model.scoring import SetPrior

from test_model_extensions import brute_score, random_params

N, D, M, K1, K = 14, 6, 3, 4, 8


def prior_in_shortlists(params, queries, sets: int = 30, weight: float = 20.0, seed: int = 0):
  """A prior over random sets drawn from the queries' own shortlists (so they compete)."""
  rng = np.random.default_rng(seed)
  shortlists = np.asarray(pipeline.predict(params, queries, k1=K1, k_pool=K, max_size=M,
                                            ranking="logit").shortlist)
  members, seen, s, draw = np.full((sets, M), -1, np.int32), set(), 0, 0
  while s < sets:  # distinct sets, as the training gold sets are
    size = 1 + s % M
    draw += 1
    row = tuple(np.sort(rng.choice(shortlists[draw % len(queries)], size, replace=False)).tolist())
    if row not in seen:
      seen.add(row)
      members[s, :size] = row
      s += 1
  return SetPrior(members, (3 * rng.normal(size=(sets, D))).astype(np.float32),
                  np.zeros(sets, np.float32), np.float32(weight), np.float32(np.log(0.02)))


def brute_f_prime(params, prior, r, shortlist):
  """Every subset of the shortlist with F' (float64, from the definitions)."""
  logits = r @ prior.w.T.astype(np.float64) + prior.b
  logp = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
  bonus = prior.weight * np.maximum(logp - prior.floor, 0)
  seen = {tuple(int(t) for t in row if t >= 0): s for s, row in enumerate(prior.members)}
  out = {}
  for m in range(1, M + 1):
    for subset in itertools.combinations(shortlist.tolist(), m):
      key = tuple(sorted(subset))
      out[key] = brute_score(params, r, list(subset)) + (bonus[seen[key]] if key in seen else 0)
  return out


@pytest.mark.parametrize("method", ["gather", "native"])
def test_best_set_and_set_mean_are_exact_under_the_prior(method):
  # "native": the kernels build on every machine the tests run on (tests/test_native.py
  # asserts it), so there is nothing to skip.
  rng = np.random.default_rng(1)
  params = random_params(rng, n=N, d=D, max_size=M)
  queries = rng.normal(size=(12, D)).astype(np.float32)
  prior = prior_in_shortlists(params, queries)
  plain = pipeline.predict(params, queries, k1=K1, k_pool=K, max_size=M, method=method,
                            ranking="logit")
  with_prior = params._replace(prior=prior)
  got = pipeline.predict(with_prior, queries, k1=K1, k_pool=K, max_size=M, method=method,
                          ranking="set-mean")
  by_max = pipeline.predict(with_prior, queries, k1=K1, k_pool=K, max_size=M, method=method,
                             ranking="set-max")
  by_first = pipeline.predict(with_prior, queries, k1=K1, k_pool=K, max_size=M, method=method,
                               ranking="set-first")
  # The same prior naming every tool as well (singletons whose bonus is 0: a bias far below
  # the floor), so that set-max ranks every query by F'.
  full = prior._replace(
      members=np.concatenate([prior.members, np.full((N, prior.members.shape[1]), -1,
                                                      prior.members.dtype)]),
      w=np.concatenate([prior.w, np.zeros((N, D), np.float32)]),
      b=np.concatenate([prior.b, np.full(N, -1e4, np.float32)]))
  full.members[len(prior.members):, 0] = np.arange(N)
  by_max_named = pipeline.predict(params._replace(prior=full), queries, k1=K1, k_pool=K,
                                  max_size=M, method=method, ranking="set-max")
  named_tools = set(prior.members[prior.members >= 0].tolist())
  changed = unnamed = 0
  for q in range(len(queries)):
    scores = brute_f_prime(with_prior, prior, queries[q].astype(np.float64),
                           np.asarray(got.shortlist[q]))
    best = max(scores, key=scores.get)
    got_set = tuple(sorted(int(t) for t in got.set_tools[q][:got.set_size[q]]))
    assert got_set == best
    assert float(got.set_score[q]) == pytest.approx(scores[best], rel=1e-4, abs=1e-4)
    changed += got_set != tuple(sorted(int(t) for t in plain.set_tools[q][:plain.set_size[q]]))
    # set-mean: each shortlist tool by the mean F' of the subsets that contain it
    mean = {t: np.mean([v for s, v in scores.items() if t in s]) for t in got.shortlist[q].tolist()}
    means = [mean[t] for t in np.asarray(got.ranking[q]).tolist()]
    assert all(a >= b - 1e-4 for a, b in zip(means, means[1:]))
    # set-max: by the best F' of a subset that contains the tool; Ê's members first — where
    # every shortlist tool is named by a seen set (the prior naming every tool: F' is the same)
    best_of = {t: max(v for s, v in scores.items() if t in s) for t in got.shortlist[q].tolist()}
    order = np.asarray(by_max_named.ranking[q]).tolist()
    assert set(order[:len(best)]) == set(best)
    assert all(best_of[a] >= best_of[b] - 1e-4 for a, b in zip(order, order[1:]))
    # a shortlist holding a tool no seen set names is ranked set-first
    if not set(got.shortlist[q].tolist()) <= named_tools:
      unnamed += 1
      np.testing.assert_array_equal(by_max.ranking[q], by_first.ranking[q])
    else:
      np.testing.assert_array_equal(by_max.ranking[q], by_max_named.ranking[q])
  assert changed >= 3  # the prior mattered in this test
  assert 1 <= unnamed < len(queries)  # both branches of set-max were exercised
  count = subsets.subsets_containing(K, M)
  assert count == sum(1 for m in range(1, M + 1) for s in itertools.combinations(range(K), m)
                      if 0 in s)


def test_greedy_ranking_and_a_zero_weight(tmp_path):
  rng = np.random.default_rng(2)
  params = random_params(rng, n=N, d=D, max_size=M)
  queries = rng.normal(size=(6, D)).astype(np.float32)
  prior = prior_in_shortlists(params, queries)
  with pytest.raises(UserError, match="greedy ranking does not support a seen-set prior"):
    pipeline.predict(params._replace(prior=prior), queries, k1=K1, k_pool=K, max_size=M,
                      ranking="greedy")
  # λ = 0 is the model without the prior.
  off = set_prior.with_weight(prior, 0.0, 0.5)
  a = pipeline.predict(params, queries, k1=K1, k_pool=K, max_size=M, ranking="set-mean")
  b = pipeline.predict(params._replace(prior=off), queries, k1=K1, k_pool=K, max_size=M,
                        ranking="set-mean")
  for x, y in zip(a, b):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  with pytest.raises(UserError, match="λ ≥ 0 and 0 < τ ≤ 1"):
    set_prior.with_weight(prior, -1.0, 0.5)
  with pytest.raises(UserError, match="set_prior=true rules out model.ranking=greedy"):
    config_lib.resolve("tiny", ["model.set_prior=true", "model.ranking=greedy"])


def test_bad_prior_tensors_are_refused_by_name(tmp_path):
  from safetensors.numpy import load_file, save_file
  rng = np.random.default_rng(4)
  params = random_params(rng, n=N, d=D, max_size=M)
  queries = rng.normal(size=(4, D)).astype(np.float32)
  params = parameters.host_params(params._replace(prior=prior_in_shortlists(params, queries, 8)))
  md = modeldir.ModelDir(params, tuple(f"t{i}" for i in range(N)), M, K1, K, None,
                         ranking="logit")
  modeldir.save_model_dir(tmp_path / "m", md)
  ppath, mpath = tmp_path / "m" / "params.safetensors", tmp_path / "m" / "manifest.json"
  good, manifest = load_file(str(ppath)), json.loads(mpath.read_text())

  def write(tensors, fmt="hyset/3"):
    save_file(tensors, str(ppath))
    mpath.write_text(json.dumps(dict(manifest, format=fmt)))

  descending = good["prior_members"].copy()
  descending[1, :2] = descending[1, 1::-1]  # row 1 is a pair: now in descending order
  write(dict(good, prior_members=descending))
  with pytest.raises(UserError, match="'prior_members' row 1 .*ascending"):
    modeldir.load_model_dir(tmp_path / "m")
  with pytest.raises(reference.ModelError, match="'prior_members' row 1 .*ascending"):
    reference.load_model(tmp_path / "m")
  repeated = good["prior_members"].copy()
  repeated[3] = repeated[0]
  write(dict(good, prior_members=repeated))
  with pytest.raises(UserError, match="'prior_members' row 3 repeats row 0"):
    modeldir.load_model_dir(tmp_path / "m")
  with pytest.raises(reference.ModelError, match="'prior_members' row 3 repeats row 0"):
    reference.load_model(tmp_path / "m")
  write(dict(good, prior_members=good["prior_members"].astype(np.float32)))
  with pytest.raises(UserError, match="'prior_members' must be integer"):
    modeldir.load_model_dir(tmp_path / "m")
  write(dict(good, prior_weight=np.array(-1.0, np.float32)))
  with pytest.raises(UserError, match="'prior_weight'"):
    modeldir.load_model_dir(tmp_path / "m")
  write(good, fmt="hyset/2")  # prior tensors under an older format
  for load, error in ((modeldir.load_model_dir, UserError), (reference.load_model,
                                                              reference.ModelError)):
    with pytest.raises(error, match="'prior_members' belongs to the prior term "
                                    "\\(format 'hyset/3' on\\)"):
      load(tmp_path / "m")
  write({k: v for k, v in good.items() if not k.startswith("prior_")})  # hyset/3 without them
  with pytest.raises(UserError, match="format 'hyset/3'.*needs the prior term's tensors"):
    modeldir.load_model_dir(tmp_path / "m")
  save_file(good, str(ppath))
  mpath.write_text(json.dumps(dict(manifest, ranking="greedy")))
  with pytest.raises(UserError, match="field 'ranking' is 'greedy'.*prior term needs"):
    modeldir.load_model_dir(tmp_path / "m")
  with pytest.raises(reference.ModelError, match="'ranking' is 'greedy'.*prior term needs"):
    reference.load_model(tmp_path / "m")
  write({k: v for k, v in good.items() if k != "prior_b"})
  with pytest.raises(UserError, match="missing tensor 'prior_b'"):
    modeldir.load_model_dir(tmp_path / "m")


def test_fit_recovers_the_sets_of_separable_queries():
  rng = np.random.default_rng(5)
  sets = [(0,), (1, 2), (3, 4, 5), (2, 6)]
  centres = rng.normal(size=(len(sets), 8))
  labels = rng.integers(0, len(sets), 400)
  x = (centres[labels] + 0.1 * rng.normal(size=(400, 8))).astype(np.float32)
  gold = [sets[c] for c in labels] + [(1, 2, 3, 4)]  # a set larger than M is left out
  x = np.concatenate([x, rng.normal(size=(1, 8)).astype(np.float32)])
  prior = set_prior.fit(x, gold, 3)
  learned = [tuple(int(t) for t in row if t >= 0) for row in prior.members]
  assert sorted(learned) == sorted(sets) and prior.members.shape == (4, 3)
  p = np.asarray(set_prior.bonus(set_prior.with_weight(prior, 1.0, 0.5), centres[labels[:50]]))
  assert [learned[s] for s in p.argmax(1)] == [sets[c] for c in labels[:50]]
  with pytest.raises(UserError, match="needs training queries with 1..3 gold tools"):
    set_prior.fit(x[:1], [(1, 2, 3, 4)], 3)


@pytest.mark.heavy
def test_training_fits_and_chooses_the_prior_on_real_toollens(tmp_path, shared_data):
  """ToolLens repeats its training sets: on the tiny run validation picks a prior, best/ carries
  it (hyset/3), and on test it names the gold set more often than the same θ without it."""
  from hyset_jax.evaluation.evaluator import evaluate_split
  from hyset_jax.training.train_data import prepare_data
  c = config_lib.resolve("tiny", [f"data.spec=beir:{shared_data / 'toollens'}",
                                  "model.set_prior=true"])
  summary = train.train_and_evaluate(c, tmp_path / "run", progress=False, num_devices=1)
  assert summary["ranking"] != "greedy"
  best = modeldir.load_model_dir(tmp_path / "run" / "best")
  assert best.params.prior is not None and float(best.params.prior.weight) > 0
  manifest = json.loads((tmp_path / "run" / "best" / "manifest.json").read_text())
  assert manifest["format"] == modeldir.FORMAT and "prior" in manifest["terms"]
  assert modeldir.load_model_dir(tmp_path / "run" / "final").params.prior is None
  last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
  assert {"prior none logit", "prior λ=1 τ=0.01 set-first"} <= set(last["validation_by_ranking"])
  fit = manifest["fits"][0]  # the choice's record, also in the model directory
  assert fit["term"] == "prior" and fit["chosen"] != "none" and fit["ranking"] == summary["ranking"]
  assert fit["scores"][f"{fit['chosen']} {fit['ranking']}"] == max(
      v for v in fit["scores"].values() if v is not None)
  test = prepare_data(c).splits[c.data.test_split]
  without = evaluate_split(best.params._replace(prior=None), test, best.tool_ids, c.model, 64,
                           ranking=summary["ranking"])
  assert summary["test"]["set_exact"] > without["set_exact"]
