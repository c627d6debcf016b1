"""Training: negatives, losses, sharded steps, resume, and a real run on the tiny config."""
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hyset_jax import choices, config as config_lib
from hyset_jax.model import parameters, scoring
from hyset_jax.training import batches, losses, negatives, sharding, train
from hyset_jax.errors import UserError
from hyset_jax.testing import small_config, synthetic_data


# ------------------------------------------------------------------ negatives

def test_pools_distinct_never_gold_and_in_proportion():
  rng = np.random.default_rng(0)
  n_tools, batch = 200, 64
  gold = [tuple(sorted(rng.choice(n_tools, 3, replace=False).tolist())) for _ in range(batch)]
  nbrs = rng.integers(0, n_tools, size=(batch, 3, 8)).astype(np.int32)
  pools = negatives.sample_pools(gold, range(batch), num_tools=n_tools, k_neg=64, max_size=3,
                                 mix=(0.5, 0.3, 0.2), neighbors=nbrs, seed=1, step=7)
  counts = np.zeros(5)
  for i in range(batch):
    sets = [tuple(pools.members[i, j][pools.mask[i, j]]) for j in range(64)]
    assert sets[0] == gold[i] and pools.source[i, 0] == negatives.GOLD
    assert len(set(sets)) == 64                      # distinct
    assert gold[i] not in sets[1:]                   # never the gold set as a negative
    assert all(len(set(s)) == len(s) for s in sets)  # no repeated tool in a set
    counts += np.bincount(pools.source[i], minlength=5)
  frac = counts[1:4] / counts[1:4].sum()
  np.testing.assert_allclose(frac, [31 / 63, 19 / 63, 13 / 63], atol=1e-9)
  np.testing.assert_allclose(frac, [0.5, 0.3, 0.2], atol=0.015)
  again = negatives.sample_pools(gold, range(batch), num_tools=n_tools, k_neg=64, max_size=3,
                                 mix=(0.5, 0.3, 0.2), neighbors=nbrs, seed=1, step=7)
  np.testing.assert_array_equal(again.members, pools.members)
  # A process building only rows 10..19 gets exactly those rows' pools.
  part = negatives.sample_pools(gold, range(10, 20), num_tools=n_tools, k_neg=64, max_size=3,
                                mix=(0.5, 0.3, 0.2), neighbors=nbrs, seed=1, step=7)
  np.testing.assert_array_equal(part.members, pools.members[10:20])


def test_pools_top_up_and_refuse_impossible():
  gold = [(0,), (1,)]
  nbrs = np.zeros((2, 1, 0), np.int32)
  pools = negatives.sample_pools(gold, [0], num_tools=6, k_neg=20, max_size=2,
                                 mix=(0.5, 0.3, 0.2), neighbors=nbrs, seed=0, step=0)
  sets = {tuple(pools.members[0, j][pools.mask[0, j]]) for j in range(20)}
  assert len(sets) == 20   # 6 singletons + 15 pairs exist; sizes other than |E*| fill the pool
  with pytest.raises(UserError, match="lower train.k_neg"):
    negatives.sample_pools(gold, [0], num_tools=6, k_neg=30, max_size=2, mix=(0.5, 0.3, 0.2),
                           neighbors=nbrs, seed=0, step=0)


# ------------------------------------------------------------------ losses

def test_self_training_gradient_treats_selection_and_reward_as_constants():
  scores = jnp.array([[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]])
  selected = jnp.array([1, 2])
  reward = jnp.array([0.7, 0.2])
  g_scores, g_reward = jax.grad(losses.self_training_loss, argnums=(0, 2))(scores, selected, reward)
  # Hand-derived: d/ds [−ρ log softmax(s)_Ê] / B = −ρ (onehot(Ê) − softmax(s)) / B.
  want = -(reward[:, None] * (jax.nn.one_hot(selected, 3) - jax.nn.softmax(scores, -1))) / 2
  np.testing.assert_allclose(g_scores, want, atol=1e-6)
  np.testing.assert_array_equal(g_reward, 0.0)  # ρ is a constant, not a parameter
  r = float(losses.retrieval_loss(scores))
  assert r == pytest.approx(float(-jnp.mean(jax.nn.log_softmax(scores)[:, 0])))


def test_set_losses_can_leave_z_to_the_per_tool_loss():
  """train.set_losses_train_z=false: Z's gradient is the per-tool loss's alone; P still gets
  the set losses' gradient."""
  rng = np.random.default_rng(5)
  z = rng.normal(size=(12, 6)).astype(np.float32)
  z /= np.linalg.norm(z, axis=1, keepdims=True)
  mc = config_lib.ModelConfig(max_set_size=3, k1=3, k_pool=5, tower_depth=1, conditioned=True,
                              conditioned_rank=2)
  theta = parameters.init_theta(z, 6, mc, seed=0)
  query = jnp.asarray(rng.normal(size=(2, 6)), jnp.float32)
  members = jnp.asarray([[[0, 1, 0], [2, 3, 4], [5, 0, 0]], [[6, 7, 8], [9, 0, 0], [1, 2, 0]]])
  mask = jnp.asarray([[[1, 1, 0], [1, 1, 1], [1, 0, 0]], [[1, 1, 1], [1, 0, 0], [1, 1, 0]]], bool)
  shortlist = jnp.asarray([[0, 1, 2, 3, 4], [6, 7, 8, 9, 10]], jnp.int32)
  zeros = jnp.zeros(2, jnp.int32), jnp.zeros(2)

  def grads(**overrides):
    tc = config_lib.TrainConfig(exhaustive_loss_weight=1.0, **overrides)
    # jit: eager grad compiles every op of the enumeration one by one (48 s against 4 s).
    return jax.jit(jax.grad(lambda t: train.objective(t, query, members, mask, *zeros,
                                                      shortlist, mc=mc, tc=tc)[0]))(theta)
  joint = grads(tool_loss_weight=0.5)
  apart = grads(tool_loss_weight=0.5, set_losses_train_z=False)
  tool_only = jax.jit(jax.grad(lambda t: 0.5 * losses.tool_loss(
      scoring.query_logits(parameters.materialize(t, mc), query), members[:, 0],
      mask[:, 0])))(theta)
  np.testing.assert_allclose(apart["z"], tool_only["z"], atol=1e-6)
  assert np.abs(np.asarray(joint["z"] - apart["z"])).max() > 1e-4   # the set losses moved Z
  np.testing.assert_allclose(apart["p"], joint["p"], atol=1e-6)       # and still train P
  with pytest.raises(UserError, match="needs train.tool_loss_weight"):
    config_lib.resolve("tiny", ["train.set_losses_train_z=false", "train.tool_loss_weight=0"])


# ------------------------------------------------------------------ sharded step

@pytest.mark.heavy
def test_one_step_on_eight_devices_equals_one_device():
  assert jax.device_count() == 8
  data = synthetic_data()
  c = small_config(batch_size=16)
  # With the exhaustive-shortlist loss on: its enumeration runs on rows sharded over devices.
  mc, tc = c.model, dataclasses.replace(c.train, exhaustive_loss_weight=1.0)
  optimizer = train.make_optimizer(tc)
  qs = data.splits["train"]
  idx = np.arange(16)
  gold = [qs.gold[i] for i in idx]
  nbrs = np.zeros((16, 3, 4), np.int32)
  pools = negatives.sample_pools(gold, range(16), num_tools=40, k_neg=12, max_size=3,
                                 mix=tc.negative_mix, neighbors=nbrs, seed=0, step=0)
  rng = np.random.default_rng(0)
  shortlists = np.stack([rng.permutation(40)[:mc.k_pool] for _ in idx]).astype(np.int32)
  batch = batches.Batch(qs.embeddings[idx], pools.members, pools.mask,
                        np.zeros(16, np.int32), np.zeros(16, np.float32), shortlists)
  out = []
  for n in (1, 8):
    mesh = sharding.make_mesh(n)
    theta = parameters.init_theta(data.tool_embeddings, 16, mc, 0)
    state = train.TrainState(theta, optimizer.init(theta))
    step = train.make_step_fn(mesh, mc, tc, optimizer)
    for _ in range(3):
      state, metrics = step(state, batch)
    assert len(state.theta["z"].sharding.device_set) == n
    assert np.isfinite(float(metrics["loss_enum"]))
    out.append(jax.device_get(state.theta))
  for k in out[0]:
    np.testing.assert_allclose(out[0][k], out[1][k], atol=1e-5)


# ------------------------------------------------------------------ the loop

def read_final(workdir):
  from safetensors.numpy import load_file
  return load_file(str(workdir / "final" / "params.safetensors"))


@pytest.mark.heavy
def test_interrupted_run_resumes_to_the_same_parameters(tmp_path):
  data = synthetic_data()
  c = small_config()
  full = train.train_and_evaluate(c, tmp_path / "full", data=data, progress=False,
                                  num_devices=1)
  assert full["steps"] == 12
  part = train.train_and_evaluate(c, tmp_path / "split", data=data, progress=False,
                                  stop_after=6, num_devices=1)
  assert part == {"interrupted_at": 6}
  assert not (tmp_path / "split" / "final").exists()
  rest = train.train_and_evaluate(c, tmp_path / "split", data=data, progress=False,
                                  num_devices=1)
  assert rest["steps"] == 12
  a, b = read_final(tmp_path / "full"), read_final(tmp_path / "split")
  for k in a:
    np.testing.assert_allclose(a[k], b[k], atol=1e-6, err_msg=k)
  rows = [json.loads(line) for line in (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()]
  # One header (this start's per-device memory; docs/sharding.md), then the steps once each,
  # then the ranking chosen at the end.
  assert [r["step"] for r in rows if "ranking" not in r] == [-1, 0, 2, 4, 6, 8, 10, 12]
  assert rows[0]["memory"]["parameters"] > 0
  assert rows[-1]["ranking"] in choices.RANKINGS
  # A workdir from before a config field existed resumes: the run used that field's default.
  saved = json.loads((tmp_path / "split" / "config.json").read_text())
  del saved["train"]["set_losses_train_z"]
  (tmp_path / "split" / "config.json").write_text(json.dumps(saved))
  assert train.train_and_evaluate(c, tmp_path / "split", data=data, progress=False,
                                  num_devices=1)["steps"] == 12
  # A different config on the same workdir is refused, not silently mixed.
  other = small_config(learning_rate=0.5)
  with pytest.raises(UserError, match="different config.*learning_rate"):
    train.train_and_evaluate(other, tmp_path / "split", data=data, progress=False,
                             num_devices=1)


@pytest.mark.heavy
def test_a_run_that_stopped_early_is_finished(tmp_path):
  """Rerunning a workdir that stopped early (to rechoose what follows θ) trains no further."""
  data = synthetic_data()
  c = small_config(learning_rate=1e-12, patience=0, eval_every=2, checkpoint_every=2)
  first = train.train_and_evaluate(c, tmp_path, data=data, progress=False, num_devices=1)
  assert first["steps"] < c.train.num_steps       # θ barely moves: validation stalls
  before = read_final(tmp_path)
  again = train.train_and_evaluate(c, tmp_path, data=data, progress=False, num_devices=1)
  assert again["steps"] == first["steps"] and again["best_step"] == first["best_step"]
  for k, v in read_final(tmp_path).items():
    np.testing.assert_array_equal(v, before[k], err_msg=k)
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  steps = [r["step"] for r in rows if r["step"] > 0 and "ranking" not in r]
  assert steps == sorted(set(steps)) and max(steps) == first["steps"]


@pytest.mark.heavy
def test_rewards_and_ablations_run(tmp_path):
  data = synthetic_data()
  c = small_config(config_lib.RewardConfig(provider="proxy", refresh_every=2, refresh_size=16),
                   eta=0.5, num_steps=4)
  # One device each: these are other programs than the sharded step (tested above); on one
  # device they compile in about half the time.
  out = train.train_and_evaluate(c, tmp_path / "proxy", data=data, progress=False, num_devices=1)
  rows = [json.loads(x) for x in (tmp_path / "proxy" / "metrics.jsonl").read_text().splitlines()]
  assert any(r.get("loss_self", 0) > 0 for r in rows)
  assert out["steps"] == 4
  for mode in ("shared", "identity", "none"):
    c = small_config(num_steps=2)
    c.model.interaction = mode
    c.model.ranking = "greedy"   # what is checked is θ; choosing a ranking would compile more
    train.train_and_evaluate(c, tmp_path / mode, data=data, progress=False, num_devices=1)
    m = read_final(tmp_path / mode)
    if mode == "shared":
      np.testing.assert_allclose(m["interaction_2"], m["interaction_3"])
    elif mode == "identity":
      np.testing.assert_array_equal(m["interaction_2"], np.eye(16))
    else:
      assert not np.any(m["interaction_3"])


@pytest.mark.heavy
def test_tiny_config_learns_on_real_toollens(tmp_path, shared_data):
  c = config_lib.resolve("tiny", [f"data.spec=beir:{shared_data / 'toollens'}"])
  # One device: learning is checked here; the sharded step has its own tests (on 8 fake devices
  # sharing two cores each of the 60 steps costs eight device programs).
  summary = train.train_and_evaluate(c, tmp_path / "tiny", progress=False, num_devices=1)
  rows = [json.loads(x) for x in (tmp_path / "tiny" / "metrics.jsonl").read_text().splitlines()]
  losses_ = [r["loss"] for r in rows if "loss" in r]
  assert losses_[-1] < 0.5 * losses_[0]
  # Step 0 is validation of the untrained model (= the dense retriever), before any update.
  untrained = next(r for r in rows if r["step"] == 0 and "val_recall@5" in r)
  assert summary["best_val_recall@5"] > untrained["val_recall@5"] + 0.05
  assert (tmp_path / "tiny" / "curves.png").stat().st_size > 1000
  assert summary["test"]["n_queries"] == 128


def test_config_errors_before_any_work():
  with pytest.raises(UserError, match="unknown config key 'train.batch_sise'.*batch_size"):
    config_lib.resolve("tiny", ["train.batch_sise=3"])
  with pytest.raises(UserError, match="expected int"):
    config_lib.resolve("tiny", ["train.batch_size=big"])
  with pytest.raises(UserError, match="k1 must satisfy"):
    config_lib.resolve("tiny", ["model.k1=10"])
  with pytest.raises(UserError, match="k_neg must be"):
    config_lib.resolve("tiny", ["train.k_neg=1"])
  with pytest.raises(UserError, match="unknown config 'tinyy'.*did you mean 'tiny'"):
    config_lib.resolve("tinyy")
  with pytest.raises(UserError, match="needs a reward provider"):
    config_lib.resolve("tiny", ["train.eta=0.5"])
  c = config_lib.resolve("tiny", ["train.negative_mix=0.6,0.2,0.2", "model.interaction=shared"])
  assert c.train.negative_mix == (0.6, 0.2, 0.2) and c.model.interaction == "shared"
  assert config_lib.from_dict(json.loads(c.to_json())) == c


@pytest.mark.heavy
def test_ranking_is_chosen_on_validation_and_recorded(tmp_path):
  from hyset_jax.io import modeldir
  from hyset_jax.evaluation.evaluator import RANK_METRICS
  data = synthetic_data()
  out = train.train_and_evaluate(small_config(), tmp_path / "auto", data=data, progress=False,
                                 num_devices=1)
  last = json.loads((tmp_path / "auto" / "metrics.jsonl").read_text().splitlines()[-1])
  by = last["validation_by_ranking"]
  assert set(by) == set(choices.RANKINGS)
  mean = {r: np.mean([m[k] for k in RANK_METRICS]) for r, m in by.items()}
  assert out["ranking"] == last["ranking"] == max(mean, key=mean.get)
  for d in ("best", "final"):
    assert modeldir.load_model_dir(tmp_path / "auto" / d).ranking == out["ranking"]
  # The delivered set does not depend on the ranking.
  assert len({m["set_f1"] for m in by.values()}) == 1
  c = small_config()
  c.model.ranking = "logit"
  fixed = train.train_and_evaluate(c, tmp_path / "fixed", data=data, progress=False,
                                   num_devices=1)
  assert fixed["ranking"] == "logit"
  assert modeldir.load_model_dir(tmp_path / "fixed" / "best").ranking == "logit"


def test_query_noise_is_seeded_per_row_and_keeps_each_norm():
  rng = np.random.default_rng(0)
  q = rng.standard_normal((8, 16)).astype(np.float32) * np.arange(1, 9)[:, None]
  full = batches.noisy_queries(q, 0.3, seed=1, step=5, rows=range(8), batch_size=8)
  np.testing.assert_allclose(np.linalg.norm(full, axis=1), np.linalg.norm(q, axis=1), rtol=1e-5)
  assert not np.allclose(full, q)
  # A process supplying rows 4..7 draws those rows' noise, so the global batch is the same
  # whatever the process count; another step draws other noise.
  half = batches.noisy_queries(q[4:], 0.3, seed=1, step=5, rows=range(4, 8), batch_size=8)
  np.testing.assert_array_equal(half, full[4:])
  again = batches.noisy_queries(q, 0.3, seed=1, step=6, rows=range(8), batch_size=8)
  assert not np.allclose(again, full)
  # σ sets the angle: mean cosine to the clean row falls as σ grows.
  cos = [np.mean(np.sum(batches.noisy_queries(q, s, seed=1, step=5, rows=range(8),
                                              batch_size=8) * q, 1)
                 / np.linalg.norm(q, axis=1) ** 2) for s in (0.1, 0.5, 1.0)]
  assert 1 > cos[0] > cos[1] > cos[2] > 0
  with pytest.raises(UserError, match="query_noise must be ≥ 0"):
    config_lib.resolve("tiny", ["train.query_noise=-0.1"])
