"""Small deterministic training inputs that need no encoder and no data files.

Used by the tests, the multi-process and fault scripts, and the kill/resume soak. Every process
that calls these builds exactly the same data, as a multi-host run requires.
"""
from __future__ import annotations

import numpy as np

from hyset_jax import config as config_lib
from hyset_jax.training.train_data import QuerySet, TrainingData


def synthetic_data(n_tools: int = 40, dim: int = 16, n_queries: int = 96, max_size: int = 3,
                   seed: int = 0) -> TrainingData:
  """Queries near the mean of their gold tools' embeddings: learnable, deterministic."""
  rng = np.random.default_rng(seed)
  tools = rng.normal(size=(n_tools, dim)).astype(np.float32)
  tools /= np.linalg.norm(tools, axis=1, keepdims=True)

  def queries(n: int, salt: int) -> QuerySet:
    r = np.random.default_rng((seed, salt))
    gold = [tuple(sorted(r.choice(n_tools, r.integers(1, max_size + 1), replace=False).tolist()))
            for _ in range(n)]
    emb = np.stack([tools[list(g)].mean(0) + 0.3 * r.normal(size=dim) for g in gold])
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    return QuerySet(tuple(f"q{salt}_{i}" for i in range(n)), tuple("" for _ in range(n)),
                    emb.astype(np.float32), tuple(gold))

  return TrainingData(tuple(f"t{i}" for i in range(n_tools)), tools, "synthetic",
                      {"train": queries(n_queries, 1), "validation": queries(32, 2),
                       "test": queries(32, 3)})


def small_config(rewards: config_lib.RewardConfig | None = None,
                 **train_overrides) -> config_lib.Config:
  """A validated config sized for :func:`synthetic_data` (M = 3, K1 = 4, K_pool = 8)."""
  c = config_lib.Config(name="test", rewards=rewards or config_lib.RewardConfig())
  c.model = config_lib.ModelConfig(max_set_size=3, k1=4, k_pool=8)
  c.train = config_lib.TrainConfig(batch_size=16, num_steps=12, learning_rate=1e-2,
                                   warmup_steps=2, k_neg=12, log_every=2, eval_every=4,
                                   checkpoint_every=4, patience=100, eval_batch_size=32)
  for k, v in train_overrides.items():
    setattr(c.train, k, v)
  return config_lib.validate(c)


def main(argv: list[str] | None = None) -> int:
  """``python -m hyset_jax.testing WORKDIR [--steps N]``: a synthetic training run as a real
  process — what the fault tests kill with SIGKILL and the soak kills over and over."""
  import argparse
  from hyset_jax.training.train import train_and_evaluate
  parser = argparse.ArgumentParser(description=main.__doc__)
  parser.add_argument("workdir")
  parser.add_argument("--steps", type=int, default=40)
  args = parser.parse_args(argv)
  config = small_config(num_steps=args.steps, checkpoint_every=5, eval_every=10, log_every=1)
  train_and_evaluate(config, args.workdir, data=synthetic_data(), progress=False)
  return 0


if __name__ == "__main__":
  import sys
  sys.exit(main())
