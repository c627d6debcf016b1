"""Stage 3: coverage of every retriever on each source's test split, and reranked top-1 of the
dense ones (:mod:`toolscout.experiment.reranking`).

Controls: BM25, BM25+dense RRF and BM25+specialist RRF (:mod:`hyset_jax.retrievers`).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from toolscout import adapter
from toolscout import metrics as tsm
from toolscout import reranker as rr
from toolscout.experiment import reranking
from toolscout.experiment.data import Prepared
from toolscout.experiment.lexical import Lexical
from toolscout.keys import Reranker, Retriever


@dataclasses.dataclass
class Evaluation:
  """Per-query outcomes on each source's test split.

  Attributes:
    coverage: ``[retriever][source] -> float64[n]`` 0/1.
    hit1: ``[retriever][reranker][source] -> float64[n]``: the reranked first
      tool is gold (0 for uncovered queries), so its mean is G.
    pools: ``[retriever][source] -> Pools`` for the dense retrievers.
    rerankers: ``[retriever][kind]`` fitted models.
  """
  coverage: dict[Retriever, dict[str, np.ndarray]]
  hit1: dict[Retriever, dict[Reranker, dict[str, np.ndarray]]]
  pools: dict[Retriever, dict[str, rr.Pools]]
  rerankers: dict[Retriever, dict[Reranker, Any]]


def dense_pools(data: Prepared, retrievers: Mapping[Retriever, adapter.AdapterRetriever]
                ) -> tuple[dict, dict]:
  """Depth-k pools ``[retriever][source]`` of the dense retrievers and their coverage."""
  depth, ids = data.config.depth, data.suite.tools.ids
  pools: dict[Retriever, dict[str, rr.Pools]] = {}
  cov: dict[Retriever, dict[str, np.ndarray]] = {}
  for k, r in retrievers.items():
    pools[k] = {s: rr.pools_from_scores(r.scores_from_embeddings(data.emb[s]["test"]), depth)
                for s in data.names}
    cov[k] = {s: tsm.coverage([[ids[t] for t in row] for row in pools[k][s].rows],
                              data.gold_sets(s, "test"), depth) for s in data.names}
  return pools, cov


def control_coverage(data: Prepared, retrievers: Mapping[Retriever, adapter.AdapterRetriever],
                     lexical: Lexical) -> dict[Retriever, dict[str, np.ndarray]]:
  """Coverage ``[control][source]`` of BM25 and its RRF fusions with the dense retrievers."""
  from hyset_jax.retrievers import FusionRetriever
  from hyset_jax.retrievers.base import top_k_ids
  depth, ids = data.config.depth, data.suite.tools.ids
  fusion = FusionRetriever([lexical.bm25, retrievers[Retriever.OTS]])
  fusion_spec = FusionRetriever([lexical.bm25, retrievers[Retriever.SPECIALIST]])
  cov: dict[Retriever, dict[str, np.ndarray]] = {
      Retriever.BM25: {}, Retriever.FUSION: {}, Retriever.BM25_SPECIALIST: {}}
  for s in data.names:
    texts, gold = data.texts(s, "test"), data.gold_sets(s, "test")
    cov[Retriever.BM25][s] = tsm.coverage(top_k_ids(lexical.test[s], ids, depth), gold, depth)
    cov[Retriever.FUSION][s] = tsm.coverage(fusion.retrieve(texts, depth).rankings, gold, depth)
    cov[Retriever.BM25_SPECIALIST][s] = tsm.coverage(
        fusion_spec.retrieve(texts, depth).rankings, gold, depth)
  return cov


def evaluate_retrievers(data: Prepared, tool_emb: np.ndarray, tool_texts: Sequence[str],
                        projections: Mapping[Retriever, np.ndarray], lexical: Lexical,
                        controls: bool = True) -> Evaluation:
  """Coverage for every retriever and reranked top-1 for the dense ones, per source.

  Args:
    tool_emb: ``float32[N, d]``, the embeddings of ``tool_texts`` (one rendering of the library).
    projections: ``[retriever] -> float32[d, d]`` of the dense retrievers.
    lexical: BM25 over the same rendering.
    controls: also the lexical controls (skill cards skip them).
  """
  ids = data.suite.tools.ids
  retrievers = {k: adapter.AdapterRetriever(ids, tool_emb, w, data.encoder)
                for k, w in projections.items()}
  pools, cov = dense_pools(data, retrievers)
  if controls:
    cov.update(control_coverage(data, retrievers, lexical))
  stats = rr.ToolStats.from_texts(tool_texts)
  hit1, models = reranking.rerank(data, retrievers, pools, lexical, stats)
  return Evaluation(cov, hit1, pools, models)
