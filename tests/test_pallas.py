"""The Pallas stage-2 kernel (hyset_jax/inference/pallas_stage2.py) against the gather form, in Pallas
interpret mode on the CPU: the same best sets (ties included) and the same scores to float
rounding, for every (K_pool, M) the presets use (M = 6 at a smaller K_pool: see SIZES);
dispatch by ``--method pallas`` and ``auto``; and that the kernel lowers for TPU (Mosaic) and
GPU (Triton) without either.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hyset_jax import config
from hyset_jax.inference import enumeration, pallas_stage2, subsets
from hyset_jax.benchmarking import workload


def _config_sizes() -> list[tuple[int, int]]:
  """(K_pool, M) of every preset and of the defaults."""
  sizes = {(config.ModelConfig().k_pool, config.ModelConfig().max_set_size)}
  for name in config.presets():
    m = config.load_preset(name).model
    sizes.add((m.k_pool, m.max_set_size))
  return sorted(sizes)


# The kernel is one generated program per M (a loop nest per set size, K only a loop bound), so
# a preset's M = 6 is checked at K_pool = 12, not 20: the same program depth and more than one
# row chunk (2509 subsets), at a quarter of the interpret-mode time of K_pool = 20 (~60k
# subsets). Every other preset size is checked as it is.
SMALL_K_FOR_M = {6: 12}
SIZES = sorted({(min(k, SMALL_K_FOR_M.get(m, k)), m) for k, m in _config_sizes()})


def test_the_presets_sizes_are_covered():
  assert {(10, 3), (20, 3), (20, 5)} <= set(SIZES)
  # Every preset's M is checked, at its K_pool or at a smaller one (SMALL_K_FOR_M).
  assert {m for _, m in _config_sizes()} == {m for _, m in SIZES}


def _ties(k: int, m: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """Queries built for exact ties, one pattern per query (12 queries):

  0-1 every logit equal, G = 0 (every set ties; the first singleton wins); 2-3 every logit
  equal, G small integers (F exact: ties within and across sizes); 4-5 duplicated logits,
  G = 0; 6-7 duplicated logits and duplicated rows/columns of G (swapping the twins ties);
  8-9 a pair whose F equals the best singleton's exactly (ℓ_a = ℓ_c, G = 0 elsewhere); 10-11
  random with duplicated logits.
  """
  w = workload.make_workload(k, m, 12, seed=seed)
  rng = np.random.default_rng(seed)
  logits, pairs = w.logits.copy(), w.pairs.copy()
  logits[0:4] = 0.75
  pairs[0:2] = 0.0
  pairs[2:4] = rng.integers(-1, 2, size=pairs[2:4].shape).astype(np.float32)
  logits[4:8, 1] = logits[4:8, 0]
  logits[4:8, 3] = logits[4:8, 2]
  pairs[4:6] = 0.0
  for q in (6, 7):
    pairs[q] = (pairs[q] + pairs[q].transpose(0, 2, 1)) / 2
    pairs[q, :, 1, :] = pairs[q, :, 0, :]
    pairs[q, :, :, 1] = pairs[q, :, :, 0]
  logits[8:10] = rng.normal(size=(2, k)).astype(np.float32) - 5.0
  logits[8:10, 2] = logits[8:10, 5] = 3.0        # {2}, {5} and {2, 5} all score 3.0 exactly
  pairs[8:10] = 0.0
  logits[10:12, 1::2] = logits[10:12, 0:k - 1:2]   # tools 2i and 2i + 1 are twins
  return logits, pairs


RANDOM = slice(0, 12)
TIES = slice(12, 24)


@functools.lru_cache(maxsize=None)
def _results(k: int, m: int) -> dict:
  """Both forms, both outputs, on 12 random queries then the 12 of :func:`_ties`.

  One batch shape per (K, M), shared by the tests below: in interpret mode nearly all the time
  is compilation (a few seconds per program), the run itself is milliseconds.
  """
  w = workload.make_workload(k, m, 12, seed=k + m)
  tie_logits, tie_pairs = _ties(k, m, seed=k * m)
  logits = np.concatenate([w.logits, tie_logits])
  pairs = np.concatenate([w.pairs, tie_pairs])
  table = subsets.subset_table(k, m)
  out = {"logits": logits, "pairs": pairs}
  for method in ("gather", "pallas"):
    every = enumeration.score_subsets(logits, pairs, table, method)
    out[method] = {"scores": np.asarray(every.scores), "order": np.asarray(every.positions)}
  # The gather form's best set is the first maximum of its every score (tests/test_speed.py
  # checks its best-set output against that); the kernel's best-set output is its own program.
  want = out["gather"]
  rows = np.argmax(want["scores"], axis=1)
  want["positions"], want["mask"] = _positions_of_rows(rows, want["order"], k, m)
  want["score"] = want["scores"][np.arange(len(rows)), rows]
  best = enumeration.best_subset(logits, pairs, table, "pallas")
  out["pallas"].update(positions=np.asarray(best.positions[:, 0]),
                       mask=np.asarray(best.mask[:, 0]), score=np.asarray(best.scores[:, 0]))
  return out


def _positions_of_rows(rows: np.ndarray, order: np.ndarray, k: int, m: int):
  """(shortlist positions padded with 0, mask) of table rows, as best_subset reports them."""
  table = subsets.subset_table(k, m)
  mask = table.mask[rows]
  pos = np.take_along_axis(order, table.members[rows], axis=1)
  return np.where(mask, pos, 0), mask


def _assert_same_best(k: int, m: int, queries: slice) -> dict:
  r = _results(k, m)
  got, want = r["pallas"], r["gather"]
  np.testing.assert_array_equal(got["mask"][queries], want["mask"][queries])
  np.testing.assert_array_equal(got["positions"][queries], want["positions"][queries])
  np.testing.assert_allclose(got["score"][queries], want["score"][queries], rtol=1e-6,
                             atol=1e-6)
  return got


@pytest.mark.parametrize("k,m", SIZES)
def test_best_set_matches_gather_on_random_inputs(k, m):
  _assert_same_best(k, m, RANDOM)


@pytest.mark.parametrize("k,m", SIZES)
def test_best_set_matches_gather_on_tie_cases(k, m):
  got = _assert_same_best(k, m, TIES)
  pos, size = got["positions"][TIES], got["mask"][TIES].sum(1)
  # All sets tie: the first row, the singleton {0} of the ascending-ℓ order (stable: tool 0).
  assert size[0] == 1 and pos[0, 0] == 0
  # {2}, {5} and {2, 5} tie at the top: the smaller set and, within size 1, the first in
  # ascending-ℓ order (stable: tool 2 before tool 5).
  assert size[8] == 1 and pos[8, 0] == 2


@pytest.mark.parametrize("k,m", SIZES)
def test_every_score_matches_gather(k, m):
  """Every score to float rounding (random and tie queries), the same positions; and the
  best-set output is the first maximum of the kernel's own every score, bit for bit."""
  r = _results(k, m)
  got, want = r["pallas"], r["gather"]
  np.testing.assert_array_equal(got["order"], want["order"])
  np.testing.assert_allclose(got["scores"], want["scores"], rtol=1e-6, atol=1e-5)
  rows = np.argmax(got["scores"], axis=1)
  pos, mask = _positions_of_rows(rows, got["order"], k, m)
  np.testing.assert_array_equal(got["mask"], mask)
  np.testing.assert_array_equal(got["positions"], pos)
  np.testing.assert_array_equal(got["score"], got["scores"][np.arange(len(rows)), rows])


def test_a_nan_score_wins_as_in_argmax():
  """A NaN score is the best, the first one in table order, as jnp.argmax over every score."""
  r = _results(10, 3)
  pairs = r["pairs"].copy()
  pairs[1, 0, 3, 7] = pairs[1, 0, 7, 3] = np.nan
  pairs[2, 1, 0, 1] = pairs[2, 1, 1, 0] = np.nan
  table = subsets.subset_table(10, 3)
  scores = enumeration.score_subsets(r["logits"], pairs, table, "gather")
  best = enumeration.best_subset(r["logits"], pairs, table, "pallas")
  pos, mask = _positions_of_rows(np.argmax(np.asarray(scores.scores), axis=1),
                                 np.asarray(scores.positions), 10, 3)
  np.testing.assert_array_equal(np.asarray(best.positions[:, 0]), pos)
  np.testing.assert_array_equal(np.asarray(best.mask[:, 0]), mask)
  score = np.asarray(best.scores[:, 0])
  assert np.isnan(score[1:3]).all() and not np.isnan(score[[0, 3]]).any()


def test_several_query_blocks_and_row_chunks(monkeypatch):
  """200 queries in blocks of 128 (the second mostly padding), and every-score chunks of 16
  rows (a size's subsets split over several chunks, each started from its first subset)."""
  monkeypatch.setattr(pallas_stage2, "_sublanes", lambda *a, **kw: 1)
  monkeypatch.setattr(pallas_stage2, "SCORES_ROWS_INTERPRET", 16)
  w = workload.make_workload(10, 3, 200, seed=7)
  table = subsets.subset_table(10, 3)
  want = enumeration.score_subsets_gather(w.logits, w.pairs, table)
  got = pallas_stage2.score_subsets(w.logits, w.pairs, table)
  np.testing.assert_allclose(np.asarray(got.scores), np.asarray(want.scores), rtol=1e-6,
                             atol=1e-5)
  best, rows, order = pallas_stage2.best_rows(w.logits, w.pairs, table)
  np.testing.assert_array_equal(np.asarray(order), np.asarray(want.positions))
  np.testing.assert_array_equal(np.asarray(rows), np.argmax(np.asarray(got.scores), axis=1))


def test_method_dispatch(monkeypatch):
  """``--method pallas`` runs the kernel anywhere; ``auto`` never picks it on a CPU and picks
  it on GPU/TPU (where the native kernel cannot run)."""
  from hyset_jax.inference import native
  assert enumeration.resolve_method("pallas", 20, 5) == "pallas"
  assert enumeration.resolve_method("auto", 20, 5) != "pallas"      # this CPU
  assert pallas_stage2.platform() == "interpret"
  for backend, where in (("tpu", "tpu"), ("gpu", "gpu"), ("cuda", "gpu"), ("cpu", "interpret")):
    assert pallas_stage2.platform(backend) == where
  monkeypatch.setattr(native, "available", lambda: False)
  monkeypatch.setattr(pallas_stage2, "platform", lambda backend=None: "tpu")
  assert enumeration.resolve_method("auto", 20, 5) == "pallas"
  assert enumeration.resolve_method("auto", 20, 5, all_scores=True) == "pallas"
  assert enumeration.resolve_method("auto") == "pallas"


@pytest.mark.parametrize("where,platform", [("tpu", "tpu"), ("gpu", "cuda")])
def test_the_kernel_lowers_for_tpu_and_gpu(where, platform):
  """Both outputs lower to Mosaic (TPU) and Triton (GPU) at K_pool = 20, M = 5 on this CPU:
  every op of the kernel has a lowering there. (Compiling the lowered kernel needs libtpu or
  a GPU: benchmarks/gpu.sh runs it.)"""
  table = subsets.subset_table(20, 5)
  args = (jax.ShapeDtypeStruct((2048, 20), jnp.float32),
          jax.ShapeDtypeStruct((2048, 4, 20, 20), jnp.float32))
  checks = [jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
  for fn in (pallas_stage2.best_rows, pallas_stage2.score_subsets):
    exported = jax.export.export(jax.jit(functools.partial(fn, table=table, where=where)),
                                 platforms=[platform], disabled_checks=checks)(*args)
    text = exported.mlir_module()
    assert ("tpu_custom_call" in text) if where == "tpu" else ("triton" in text)


def test_on_a_mesh_each_device_runs_its_queries():
  """Inputs split over a (data 2, tools 4) mesh of make test's 8 fake CPU devices: the kernel
  call is wrapped in a shard_map (Mosaic cannot be partitioned automatically), each device
  scores its 3 of the 24 queries, and the best sets are the gather form's, bit for bit. A
  batch that does not divide stays whole on every device."""
  from jax.sharding import NamedSharding, PartitionSpec
  from hyset_jax.training import sharding
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
  mesh = sharding.make_mesh(devices=jax.devices()[:8], data=2, tools=4)
  assert pallas_stage2.batch_axes(mesh.abstract_mesh, 24) == ("data", "tools")
  assert pallas_stage2.batch_axes(mesh.abstract_mesh, 6) == ("data",)
  assert pallas_stage2.batch_axes(mesh.abstract_mesh, 3) == ()
  r = _results(10, 3)
  table = subsets.subset_table(10, 3)
  split = NamedSharding(mesh, PartitionSpec(sharding.DATA_AXIS))
  logits, pairs = jax.device_put(r["logits"], split), jax.device_put(r["pairs"], split)
  assert "shard_map" in str(jax.make_jaxpr(
      lambda lg, pr: pallas_stage2.best_rows(lg, pr, table))(logits, pairs))
  got = enumeration.best_subset(logits, pairs, table, "pallas")
  want = enumeration.best_subset(r["logits"], r["pairs"], table, "gather")
  for a, b in zip(got, want):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
