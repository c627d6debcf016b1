"""The retrieval metrics of θ's two-stage inference on one query split."""
from __future__ import annotations

import jax
import numpy as np

from hyset_jax import inference, metrics
from hyset_jax.scoring import HysetParams
from hyset_jax.train_data import QuerySet


def evaluate_split(params: HysetParams, qs: QuerySet, tool_ids: tuple[str, ...], mc,
                   batch_size: int) -> dict[str, float]:
  """Recall/NDCG/COMP@K and the set metrics (hyset_jax.metrics.evaluate) of ``params`` on ``qs``.

  ``mc`` (a ModelConfig) gives K1, K_pool and M.
  """
  pred = inference.predict_batched(jax.device_get(params), qs.embeddings, k1=mc.k1,
                                   k_pool=mc.k_pool, max_size=mc.max_set_size,
                                   batch_size=batch_size)
  ids = np.asarray(tool_ids, dtype=object)
  rankings = [ids[r].tolist() for r in pred.ranking]
  sets = [ids[t[:n]].tolist() for t, n in zip(pred.set_tools, pred.set_size)]
  gold = [[tool_ids[t] for t in g] for g in qs.gold]
  return metrics.evaluate(rankings, gold, sets)
