"""Stage 3b: linear and MLP rerankers over each dense retriever's depth-k pools.

Each reranker learns from the pools of a fixed sample of training queries (every source's,
:func:`toolscout.experiment.data.reranker_sample`) and is scored on each source's test pools as
reranked top-1 correct (0 for uncovered queries, so its mean is G = coverage · P@1).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from toolscout import adapter
from toolscout import reranker as rr
from toolscout.experiment.data import Prepared, log, reranker_sample
from toolscout.experiment.lexical import Lexical
from toolscout.keys import Reranker, Retriever


def hits(model: Any, feats: np.ndarray, pools: rr.Pools, gold: Sequence[set[str]],
         tool_ids: Sequence[str]) -> np.ndarray:
  """``float64[n]``: 1 where the reranked first tool of the pool is gold."""
  top = rr.rerank_top1(model, feats, pools)
  return np.array([tool_ids[t] in g for t, g in zip(top, gold)], np.float64)


def fit_rerankers(data: Prepared, retriever: adapter.AdapterRetriever, lexical: Lexical,
                  stats: rr.ToolStats) -> tuple[dict[Reranker, Any], int]:
  """Both reranker kinds fitted on ``retriever``'s pools of the training sample.

  Returns:
    the fitted models and how many of the sample's pools were covered (what they learn from).
  """
  cfg = data.config
  sample = reranker_sample(data)
  train_emb = np.stack([data.emb[s]["train"][i] for s, i in sample])
  train_text = [data.queries[s]["train"][i].text for s, i in sample]
  train_gold = [data.gold[s]["train"][i] for s, i in sample]
  pools = rr.pools_from_scores(retriever.scores_from_embeddings(train_emb), cfg.depth)
  feats = rr.pool_features(train_text, pools, lexical.train, stats)
  labels = rr.pool_labels(pools, train_gold)
  models = {kind: rr.fit_reranker(feats, labels, kind, cfg.seed, cfg.mlp_hidden,
                                  cfg.mlp_max_iter) for kind in Reranker}
  return models, int(labels.any(axis=1).sum())


def rerank(data: Prepared, retrievers: Mapping[Retriever, adapter.AdapterRetriever],
           pools: Mapping[Retriever, Mapping[str, rr.Pools]], lexical: Lexical,
           stats: rr.ToolStats) -> tuple[dict, dict]:
  """Rerankers per dense retriever and their top-1 hits on each source's test pools.

  Returns:
    ``hit1[retriever][kind][source] -> float64[n]`` and ``models[retriever][kind]``.
  """
  ids = data.suite.tools.ids
  hit1: dict[Retriever, dict[Reranker, dict[str, np.ndarray]]] = {}
  models: dict[Retriever, dict[Reranker, Any]] = {}
  for k, r in retrievers.items():
    models[k], n_covered = fit_rerankers(data, r, lexical, stats)
    hit1[k] = {kind: {} for kind in Reranker}
    for s in data.names:
      test_feats = rr.pool_features(data.texts(s, "test"), pools[k][s], lexical.test[s], stats)
      for kind in Reranker:
        hit1[k][kind][s] = hits(models[k][kind], test_feats, pools[k][s],
                                data.gold_sets(s, "test"), ids)
    log(f"evaluated {k}: rerankers fitted on {n_covered} covered pools")
  return hit1, models
