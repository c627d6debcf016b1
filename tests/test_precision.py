"""``precision="bf16"`` (pipeline.prepare, ``hyset predict --precision``): the prepared products
stored in bfloat16, multiplied with f32 accumulation; close to f32 where scores are well apart,
exact in its own terms (the neighbour table answers as the bf16 full scan), and validated."""
import jax.numpy as jnp
import numpy as np
import pytest

from hyset_jax import cli
from hyset_jax.errors import UserError
from hyset_jax.inference import pipeline
from hyset_jax.model.scoring import HysetParams


def _model(seed: int = 0, n: int = 300, d: int = 32, max_size: int = 3) -> HysetParams:
  """A random model whose logits spread over a few units (P of scale 3), so that rounding the
  products to bf16 (8 significant bits) moves few orderings."""
  rng = np.random.default_rng(seed)
  z = rng.normal(size=(n, d))
  z /= np.linalg.norm(z, axis=1, keepdims=True)
  ms = rng.normal(size=(max_size - 1, d, d)) * 0.5
  return HysetParams(*(jnp.asarray(a, jnp.float32)
                       for a in (z, rng.normal(size=(d, d)) * 3, (ms + ms.transpose(0, 2, 1)) / 2)))


def test_bf16_predictions_run_and_mostly_agree_with_f32(tmp_path):
  params = _model()
  r = jnp.asarray(np.random.default_rng(1).normal(size=(64, 32)), jnp.float32)
  kw = dict(k1=6, k_pool=10, max_size=3)
  f32 = pipeline.prepare(params, max_size=3, k_pool=10, cache_dir=tmp_path)
  bf16 = pipeline.prepare(params, max_size=3, k_pool=10, cache_dir=tmp_path, precision="bf16")
  assert (f32.precision, bf16.precision) == ("f32", "bf16")
  assert bf16.logit_weights.dtype == bf16.keyed.dtype == jnp.bfloat16
  # Each precision's table is its own cache file (bf16 rounds Z M_M before the table is built).
  assert len(list(tmp_path.glob("neighbors-*.npz"))) == 2
  a = pipeline.predict_prepared(f32, r, **kw)
  b = pipeline.predict_prepared(bf16, r, **kw)
  assert b.set_score.dtype == jnp.float32
  same = np.all(np.asarray(a.set_tools) == np.asarray(b.set_tools), axis=1)
  assert same.mean() >= 0.9, same.mean()
  # Exact in its own terms: the table's expansion is the bf16 full scan's, tool for tool.
  scan = pipeline.prepare(params, max_size=3, k_pool=10, neighbor_table=False, precision="bf16")
  np.testing.assert_array_equal(np.asarray(pipeline.shortlist_prepared(bf16, r, 6, 10).tools),
                                np.asarray(pipeline.shortlist_prepared(scan, r, 6, 10).tools))


def test_precision_is_validated(capsys):
  with pytest.raises(UserError, match="unknown precision 'fp16'; choose one of f32, bf16"):
    pipeline.prepare(_model(), max_size=3, k_pool=10, precision="fp16")
  with pytest.raises(SystemExit) as e:
    cli.main(["predict", "--model", "m", "--queries", "q.jsonl", "--out", "o.jsonl",
              "--precision", "fp16"])
  assert e.value.code == 2 and "--precision" in capsys.readouterr().err
