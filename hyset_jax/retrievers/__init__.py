"""Retrievers behind one interface, so HYSET and its baselines are scored alike.

- :class:`Retriever` / :class:`Retrieval`: the interface and its result.
- :class:`BM25Retriever`: lexical BM25 (bm25s).
- :class:`DenseRetriever`: frozen-encoder cosine.
- :class:`FusionRetriever`: reciprocal-rank fusion of several retrievers.
- :class:`HysetRetriever`: HYSET's two-stage set inference (paper Eq. 12-14).
- :class:`ToolHeadRetriever`: a per-tool linear or MLP head fit on frozen embeddings.
- :class:`SetClassifierRetriever`: a classifier over the training gold sets.
- :class:`GreedySetRetriever`, :class:`SetScorerRetriever`: the paper's set-level baselines
  (cardinality, MMR, facility location; DeepSets, Set Transformer).
- :func:`fit_baseline`: those trained baselines by name (``hyset eval --method``).
"""
from hyset_jax.retrievers.base import Retrieval, Retriever, top_k_ids
from hyset_jax.retrievers.bm25 import BM25Retriever
from hyset_jax.retrievers.dense import DenseRetriever
from hyset_jax.retrievers.fusion import FusionRetriever, reciprocal_rank_fusion
from hyset_jax.retrievers.greedy_sets import GreedySetRetriever
from hyset_jax.retrievers.heads import HeadConfig, ToolHeadRetriever
from hyset_jax.retrievers.hyset import HysetRetriever
from hyset_jax.retrievers.set_classifier import SetClassifierRetriever
from hyset_jax.retrievers.set_scorers import SetScorerRetriever
from hyset_jax.retrievers.trained import TRAINED_METHODS, fit_baseline

__all__ = [
    "BM25Retriever", "DenseRetriever", "FusionRetriever", "GreedySetRetriever", "HeadConfig",
    "HysetRetriever", "Retrieval", "Retriever", "SetClassifierRetriever", "SetScorerRetriever",
    "TRAINED_METHODS", "ToolHeadRetriever", "fit_baseline", "reciprocal_rank_fusion",
    "top_k_ids",
]
