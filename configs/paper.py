"""The paper's configuration on ToolLens (§2.4, Eq. 10): InfoNCE over pools with the 50/30/20
uniform / in-batch / hard mix, no per-tool loss, no shortlist negatives, the linear P (no query
tower), the query-independent F_set (no conditioned term), no exhaustive-shortlist loss and greedy
marginal-gain ranking. Kept so its numbers stay reproducible beside the preset.
"""
from hyset_jax.config import Config
from hyset_jax.configs import toollens


def get_config() -> Config:
  c = toollens.get_config()
  c.name = "paper"
  c.train.tool_loss_weight = 0.0
  c.train.shortlist_negatives = 0.0
  c.train.exhaustive_loss_weight = 0.0
  c.model.tower_depth = 0
  c.model.conditioned = False
  c.model.set_prior = False
  c.model.lexical = False
  c.model.row_blend = False
  c.model.ranking = "greedy"
  c.train.num_steps = 1500  # the budget its numbers in docs/results.md were measured with
  return c
