"""A few-second run on a slice of ToolLens: smoke tests and the README's first look."""
from hyset_jax.config import Config
from hyset_jax.configs import toollens


def get_config() -> Config:
  c = toollens.get_config()
  c.name = "tiny"
  c.data.max_train_queries, c.data.max_eval_queries = 512, 128
  c.model.max_set_size, c.model.k1, c.model.k_pool = 3, 6, 10
  c.train.batch_size, c.train.num_steps, c.train.learning_rate = 32, 60, 1e-2
  c.train.warmup_steps, c.train.k_neg = 5, 16
  c.train.log_every, c.train.eval_every, c.train.checkpoint_every = 10, 20, 20
  c.train.patience, c.train.eval_batch_size = 100, 64
  # The paper's objective: tiny checks the method, not the preset's additions.
  c.train.tool_loss_weight, c.train.shortlist_negatives = 0.0, 0.0
  c.train.exhaustive_loss_weight = 0.0
  c.model.set_prior = False
  c.model.lexical = False
  c.model.row_blend = False
  return c
