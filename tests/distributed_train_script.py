"""A small synthetic training run for the multi-process tests (no encoder, no data files).

    python tests/distributed_train_script.py WORKDIR [NUM_STEPS [STOP_AFTER]]

Run it alone (one process, however many devices XLA_FLAGS gives) or under
``launch/local.py`` (each rank builds the same data deterministically; train_and_evaluate joins
the job from the launcher's environment). Importing this file does nothing.
"""
from __future__ import annotations

import json
import sys

import numpy as np


def synthetic_data(n_tools=40, dim=16, n_queries=96, max_size=3, seed=0):
  """Queries near the mean of their gold tools' embeddings; identical in every process."""
  from hyset_jax import train
  rng = np.random.default_rng(seed)
  tools = rng.normal(size=(n_tools, dim)).astype(np.float32)
  tools /= np.linalg.norm(tools, axis=1, keepdims=True)

  def queries(n, salt):
    r = np.random.default_rng((seed, salt))
    gold = [tuple(sorted(r.choice(n_tools, r.integers(1, max_size + 1), replace=False).tolist()))
            for _ in range(n)]
    emb = np.stack([tools[list(g)].mean(0) + 0.3 * r.normal(size=dim) for g in gold])
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    return train.QuerySet(tuple(f"q{salt}_{i}" for i in range(n)), tuple("" for _ in range(n)),
                          emb.astype(np.float32), tuple(gold))
  return train.TrainingData(tuple(f"t{i}" for i in range(n_tools)), tools, "synthetic",
                            {"train": queries(n_queries, 1), "validation": queries(32, 2),
                             "test": queries(32, 3)})


def small_config(num_steps=8):
  from hyset_jax import config as config_lib
  c = config_lib.Config(name="distributed-test")
  c.model = config_lib.ModelConfig(max_set_size=3, k1=4, k_pool=8)
  c.train = config_lib.TrainConfig(batch_size=16, num_steps=num_steps, learning_rate=1e-2,
                                   warmup_steps=2, k_neg=12, log_every=2, eval_every=4,
                                   checkpoint_every=4, patience=100, eval_batch_size=32)
  return config_lib.validate(c)


def main(argv: list[str]) -> int:
  from hyset_jax import train
  workdir = argv[0]
  steps = int(argv[1]) if len(argv) > 1 else 8
  stop_after = int(argv[2]) if len(argv) > 2 else None
  summary = train.train_and_evaluate(small_config(steps), workdir, data=synthetic_data(),
                                     progress=False, stop_after=stop_after)
  import jax
  print(json.dumps({"process": jax.process_index(), "processes": jax.process_count(),
                    "devices": jax.device_count(), **summary}))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
