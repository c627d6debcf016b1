"""Tool-parallel sharding (hyset_jax.training.sharding): the (data, tools) mesh, Z on ``tools``, the
per-shard top-k, training and predictions equal across meshes, and ``hyset train --dry-run``."""
import dataclasses
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from hyset_jax import cli
from hyset_jax.inference import pipeline
from hyset_jax.io import modeldir
from hyset_jax.model import parameters
from hyset_jax.training import batches, dry_run, sharding, train
from hyset_jax import config as config_lib
from hyset_jax.errors import UserError
from hyset_jax.testing import small_config, synthetic_data

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_mesh_shapes_and_rules():
  assert sharding.mesh_shape(-1, 4, 8) == (2, 4)
  assert sharding.mesh_shape(2, -1, 8) == (2, 4)
  assert sharding.mesh_shape(-1, 1, 8) == (8, 1)
  with pytest.raises(UserError, match="must equal the 8 devices"):
    sharding.mesh_shape(-1, 3, 8)
  with pytest.raises(UserError, match="must equal the 8 devices"):
    sharding.mesh_shape(2, 2, 8)
  with pytest.raises(UserError, match="mesh.data and mesh.tools"):
    config_lib.resolve("tiny", ["mesh.data=-1", "mesh.tools=-1"])
  mesh = sharding.make_mesh(data=2, tools=4)
  assert dict(mesh.shape) == {"data": 2, "tools": 4}
  theta = parameters.init_theta(synthetic_data().tool_embeddings, 16, small_config().model, 0)
  opt = train.make_optimizer(small_config().train)
  shardings = sharding.state_shardings(train.TrainState(theta, opt.init(theta)), mesh)
  assert shardings.theta["z"].spec == PartitionSpec("tools", None)
  assert shardings.theta["p"].spec == PartitionSpec() and shardings.theta["m"].spec == PartitionSpec()
  adam = shardings.opt_state[1][0]  # clip, then (adam, schedule)
  assert adam.mu["z"].spec == PartitionSpec("tools", None) and adam.count.spec == PartitionSpec()
  with pytest.raises(UserError, match="do not split evenly over mesh.tools=4.*e.g. 2"):
    sharding.check_tool_rows(42, mesh)


def test_top_k_per_shard_equals_lax_top_k_with_ties():
  rng = np.random.default_rng(0)
  x = np.round(rng.normal(size=(2, 5, 40)), 1).astype(np.float32)  # many ties at 1 decimal
  x[..., [3, 17, 29, 38]] = 9.0                                     # ties across shards
  want = jax.lax.top_k(x, 12)
  for tools in (2, 4, 8):
    mesh = sharding.make_mesh(data=8 // tools, tools=tools)
    xs = jax.device_put(x, NamedSharding(mesh, PartitionSpec(None, None, "tools")))
    with jax.set_mesh(mesh):
      got = jax.jit(sharding.top_k, static_argnums=1)(xs, 12)
      small = jax.jit(sharding.top_k, static_argnums=1)(xs, 40)  # k > N/T per shard
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(small[1], jax.lax.top_k(x, 40)[1])


@pytest.mark.heavy
def test_stage1_and_hard_negatives_with_z_sharded_equal_replicated():
  data = synthetic_data()
  mc = small_config().model
  params = parameters.init_params(data.tool_embeddings, 16, mc.max_set_size, jax.random.key(1))
  # A trained-looking θ: non-zero, symmetric M so the expansion is not the dense order.
  m = jax.random.normal(jax.random.key(2), params.interactions.shape)
  params = params._replace(interactions=parameters.symmetrize(m))
  q = data.splits["validation"].embeddings
  gold = batches.pad_sets(data.splits["train"].gold[:16], mc.max_set_size)
  want_sl = pipeline.shortlist(params, q, mc.k1, mc.k_pool, mc.max_set_size)
  want_nb = batches.gold_neighbors(params.tool_embeddings, gold, 8)
  mesh = sharding.make_mesh(data=2, tools=4)
  z = jax.device_put(params.tool_embeddings, NamedSharding(mesh, PartitionSpec("tools", None)))
  sharded = params._replace(tool_embeddings=z)
  with jax.set_mesh(mesh):
    sl = jax.jit(pipeline.shortlist, static_argnums=(2, 3, 4))(sharded, q, mc.k1, mc.k_pool,
                                                                 mc.max_set_size)
    nb = batches.gold_neighbors(z, gold, 8)
    distinct = pipeline.shortlist_distinct(sharded, q, mc.k1, mc.k_pool, mc.max_set_size)
  np.testing.assert_array_equal(sl.tools, want_sl.tools)
  np.testing.assert_array_equal(distinct.tools, want_sl.tools)
  np.testing.assert_allclose(sl.logits, want_sl.logits, atol=1e-5)
  np.testing.assert_array_equal(nb, want_nb)


def test_set_neighbors_searches_each_distinct_gold_tool_once_with_the_same_answer():
  data = synthetic_data()
  mc = small_config().model
  params = parameters.init_params(data.tool_embeddings, 16, mc.max_set_size, jax.random.key(1))
  gold = list(data.splits["train"].gold[:40]) + [()]  # tools repeat across sets; an empty set
  assert len({t for s in gold for t in s}) < sum(map(len, gold))
  want = np.asarray(batches.gold_neighbors(params.tool_embeddings,
                                           batches.pad_sets(gold, mc.max_set_size), 8))
  got = batches.set_neighbors(params.tool_embeddings, gold, mc.max_set_size, 8)
  assert got.shape == want.shape
  for i, s in enumerate(gold):
    np.testing.assert_array_equal(got[i, :len(s)], want[i, :len(s)])
    assert not got[i, len(s):].any()  # padding slots hold 0


def _run(tmp_path, name, data, tools, num_devices=None):
  c = small_config(num_steps=8)
  c = dataclasses.replace(c, mesh=config_lib.MeshConfig(data=-1, tools=tools))
  train.train_and_evaluate(c, tmp_path / name, data=data, progress=False,
                           num_devices=num_devices)
  rows = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
  return modeldir.load_model_dir(tmp_path / name / "final"), rows[0]


@pytest.mark.heavy
def test_training_and_predictions_equal_across_meshes(tmp_path):
  """mesh (2, 4) == mesh (8, 1) == 1 device: θ to 1e-5, the same sets and rankings.

  The promise of README/docs/sharding.md holds for the paper's model, which this is: with the
  query tower or the conditioned term on, rounding-level gradients of their zero-initialised
  leaves become full Adam steps and θ drifts apart (benchmarks/determinism.py measures it)."""
  assert jax.device_count() == 8
  mc = small_config().model
  assert mc.tower_depth == 0 and not mc.conditioned
  data = synthetic_data()
  runs = {"2x4": _run(tmp_path, "2x4", data, tools=4), "8x1": _run(tmp_path, "8x1", data, tools=1),
          "1": _run(tmp_path, "one", data, tools=1, num_devices=1)}
  headers = {k: h for k, (_, h) in runs.items()}
  assert headers["2x4"]["step"] == -1 and headers["2x4"]["memory"]["mesh"] == {"data": 2, "tools": 4}
  # Z (40 × 16 f32) and Adam's two copies of it are split 4 ways on the 2x4 mesh.
  z_bytes = 40 * 16 * 4
  assert headers["8x1"]["memory"]["parameters"] - headers["2x4"]["memory"]["parameters"] == \
      z_bytes - z_bytes // 4
  assert headers["8x1"]["memory"]["optimizer_state"] - \
      headers["2x4"]["memory"]["optimizer_state"] == 2 * (z_bytes - z_bytes // 4)
  q = data.splits["test"].embeddings
  mc = small_config().model
  preds = {}
  for k, (md, _) in runs.items():
    preds[k] = pipeline.predict_batched(md.params, q, k1=mc.k1, k_pool=mc.k_pool,
                                         max_size=mc.max_set_size)
  base = runs["1"][0].params
  for k in ("2x4", "8x1"):
    for a, b in zip(jax.tree.leaves(base), jax.tree.leaves(runs[k][0].params)):
      np.testing.assert_allclose(a, b, atol=1e-5, err_msg=k)
    for field in ("set_tools", "set_size", "ranking", "shortlist"):
      np.testing.assert_array_equal(getattr(preds[k], field), getattr(preds["1"], field),
                                    err_msg=f"{k} {field}")


def test_resume_on_another_mesh_keeps_one_header(tmp_path):
  data = synthetic_data()
  c = dataclasses.replace(small_config(num_steps=8), mesh=config_lib.MeshConfig(tools=4))
  assert train.train_and_evaluate(c, tmp_path / "w", data=data, progress=False,
                                  stop_after=4) == {"interrupted_at": 4}
  c2 = dataclasses.replace(c, mesh=config_lib.MeshConfig(tools=1))  # the layout may change
  assert train.train_and_evaluate(c2, tmp_path / "w", data=data, progress=False)["steps"] == 8
  rows = [json.loads(x) for x in (tmp_path / "w" / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if "ranking" not in r] == [-1, 0, 2, 4, 6, 8]
  assert rows[0]["memory"]["mesh"] == {"data": 8, "tools": 1}  # this start's layout


@pytest.mark.heavy
def test_dry_run_reports_and_checks_the_budget(capsys):
  # No data set is read: the library is sized by --num-tools, d_z by the encoder's files.
  args = ["train", "--config", "tiny", "--dry-run", "--num-tools", "4000", "--set",
          "mesh.tools=4", "--set", "data.spec=beir:/nonexistent", "--json"]
  assert cli.main(args) == 0
  report = json.loads(capsys.readouterr().out)
  assert report["mesh"] == {"data": 2, "tools": 4} and report["num_tools"] == 4000
  assert report["parameters"] >= 4000 * 384 * 4 // 4 and report["flops_per_device"] > 0
  assert report["arguments"] == report["parameters"] + report["optimizer_state"] + report["batch"]
  one = dry_run.dry_run(config_lib.resolve("tiny", ["mesh.tools=1"]), num_tools=4000,
                        tool_dim=384, query_dim=384)
  assert one.parameters - report["parameters"] == 4000 * 384 * 4 * 3 // 4
  # 4,000 tools: the pools are scored in set_scores' "keyed" order, whose loop XLA counts once.
  assert report["flops_lower_bound"] and "a lower bound" in one.lines()[-1]
  small = dry_run.dry_run(config_lib.resolve("tiny", ["mesh.tools=1"]), num_tools=40,
                          tool_dim=384, query_dim=384)
  assert not small.flops_lower_bound and "lower bound" not in small.lines()[-1]
  code = cli.main(args[:-1] + ["--set", "mesh.memory_per_device_gb=0.001"])
  err = capsys.readouterr().err
  assert code == 2
  assert "more than mesh.memory_per_device_gb=0.001" in err and "optimiser state" in err
  assert cli.main(["train", "--config", "tiny", "--dry-run", "--num-tools", "4001", "--set",
                   "mesh.tools=4"]) == 2
  assert "do not split evenly over mesh.tools=4" in capsys.readouterr().err
  assert cli.main(["train", "--config", "tiny"]) == 2
  assert "needs --workdir" in capsys.readouterr().err
  base = ["train", "--config", "tiny", "--dry-run", "--num-tools", "4000"]
  assert cli.main(base + ["--topology", "gpu:h100"]) == 2
  assert "expected tpu:NAME" in capsys.readouterr().err
  assert cli.main(base + ["--topology", "tpu:v5e:2x2", "--devices", "4"]) == 2
  assert "not both" in capsys.readouterr().err
  if importlib.util.find_spec("libtpu") is None:  # this venv: no TPU runtime
    assert cli.main(base + ["--topology", "tpu:v5e:2x2"]) == 2
    assert "pip install libtpu" in capsys.readouterr().err


@pytest.mark.heavy
def test_dry_run_compiles_for_another_device_count(tmp_path):
  """--devices N compiles for N CPU devices whatever this machine has; nothing is written."""
  env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  out = subprocess.run([sys.executable, "-m", "hyset_jax.cli", "train", "--config", "tiny",
                        "--dry-run", "--devices", "16", "--num-tools", "1600", "--set",
                        "mesh.tools=8"], env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stderr
  assert "mesh: data=2 x tools=8 = 16 cpu device(s)" in out.stdout
  assert "optimiser state" in out.stdout and "FLOPs per step" in out.stdout
  assert list(tmp_path.iterdir()) == []


def test_metrics_header_replaces_the_old_one_and_a_fresh_start_keeps_no_rows(tmp_path):
  from hyset_jax.training.workdir import MetricsLog
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"step": -1, "memory": {"old": 1}}\n{"step": 0, "v": 1}\n{"step": 5, "v": 2}\n'
                  '{"step": 10, "v": 3}\n')
  log = MetricsLog(path, 5, header={"step": -1, "memory": {"new": 1}})
  assert [json.loads(x) for x in path.read_text().splitlines()] == \
      [{"step": -1, "memory": {"new": 1}}, {"step": 0, "v": 1}, {"step": 5, "v": 2}]
  assert [r["step"] for r in log.rows] == [0, 5]  # curves see steps only
  # Killed before the first checkpoint: the step-0 row is logged again by the new start.
  MetricsLog(path, 0, header={"step": -1, "memory": {}})
  assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [-1]
