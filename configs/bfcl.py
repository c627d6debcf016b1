"""BFCL (the data shipped in bfcl-eval): ~1.85k functions, ~2.5k answered queries, 1-5 calls.

The default data set of `make demo`. Splits are the deterministic id-hash split (80/10/10).
Same two additions to the paper's objective as configs/toollens.py (set both to 0 to remove).
Z stays the encoder's tool embeddings: most BFCL test queries need functions that no training
query uses (706 of the 1,853 are never gold), and a trained Z only moves the seen ones.
"""
from hyset_jax.config import Config, DataConfig, ModelConfig, TrainConfig


def get_config() -> Config:
  return Config(
      name="bfcl",
      data=DataConfig(spec="bfcl"),
      model=ModelConfig(max_set_size=5, k1=15, k_pool=20, train_tool_embeddings=False),
      train=TrainConfig(batch_size=128, num_steps=600, learning_rate=3e-3, warmup_steps=50,
                        k_neg=64, log_every=25, eval_every=100, checkpoint_every=100, patience=3,
                        tool_loss_weight=1.0, shortlist_negatives=0.4))
