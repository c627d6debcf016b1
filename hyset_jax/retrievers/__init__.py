"""Retrievers behind one interface, so HYSET and its baselines are scored alike.

- :class:`Retriever` / :class:`Retrieval`: the interface and its result.
- :class:`BM25Retriever`: lexical BM25 (bm25s).
- :class:`DenseRetriever`: frozen-encoder cosine.
- :class:`FusionRetriever`: reciprocal-rank fusion of several retrievers.
- :class:`HysetRetriever`: HYSET's two-stage set inference (paper Eq. 12-14).
"""
from hyset_jax.retrievers.base import Retrieval, Retriever, top_k_ids
from hyset_jax.retrievers.bm25 import BM25Retriever
from hyset_jax.retrievers.dense import DenseRetriever
from hyset_jax.retrievers.fusion import FusionRetriever, reciprocal_rank_fusion
from hyset_jax.retrievers.hyset import HysetRetriever

__all__ = [
    "BM25Retriever", "DenseRetriever", "FusionRetriever", "HysetRetriever", "Retrieval",
    "Retriever", "reciprocal_rank_fusion", "top_k_ids",
]
