"""A few-second run on a slice of ToolLens: smoke tests and the README's first look."""
from hyset_jax.config import Config, DataConfig, ModelConfig, TrainConfig


def get_config() -> Config:
  return Config(
      name="tiny",
      data=DataConfig(spec="beir:../shared/data/toollens", max_train_queries=512,
                      max_eval_queries=128),
      model=ModelConfig(max_set_size=3, k1=6, k_pool=10),
      train=TrainConfig(batch_size=32, num_steps=60, learning_rate=1e-2, warmup_steps=5,
                        k_neg=16, log_every=10, eval_every=20, checkpoint_every=20, patience=100,
                        eval_batch_size=64))
