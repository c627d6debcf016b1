"""ToolBench instruction files (G1/G2/G3 JSON) at the paper's settings (§3.1).

Point data.spec at a full ToolBench release with `--set data.spec=toolbench:/path/to/instruction`;
the default is the small example that ships beside this project.
"""
from hyset_jax.config import Config, DataConfig, ModelConfig, RewardConfig, TrainConfig, shared_data


def get_config() -> Config:
  return Config(
      name="toolbench",
      data=DataConfig(spec="toolbench:" + shared_data("toolbench_example", "instruction")),
      model=ModelConfig(max_set_size=5, k1=15, k_pool=20),
      train=TrainConfig(batch_size=256, num_steps=100000, learning_rate=1e-3, warmup_steps=1000,
                        k_neg=64, eval_every=2000, checkpoint_every=2000, patience=5),
      rewards=RewardConfig(provider="none", refresh_every=20000, refresh_size=5000))
