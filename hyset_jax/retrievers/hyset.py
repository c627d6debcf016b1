"""HYSET behind the retriever interface: two-stage set inference (paper Eq. 12-14)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hyset_jax.data.types import ToolLibrary
from hyset_jax.retrievers.base import Retrieval, check_depth
from hyset_jax.retrievers.dense import embed


class HysetRetriever:
  """Predicts a tool set per query, and a ranking for the rank metrics.

  The ranking orders HYSET's shortlist (``ranking``: see
  ``hyset_jax.inference.rankings.rank_tools``; the paper's greedy marginal gain by default), so it
  is at most ``k_pool`` long whatever ``depth`` asks for; the set is the argmax of F over
  the subsets of the shortlist.

  Args:
    params: ``hyset_jax.model.scoring.HysetParams`` (Z, {M_m}, P).
    tool_ids: the tool ids of Z's rows.
    encoder: the frozen query encoder r(x).
    k1, k_pool, max_size: inference settings (paper: 15, 20, 5); ``max_size``
      defaults to the params' M.
    ranking: a ``hyset_jax.choices.RANKINGS`` name; None: the default ranking.
    lexical: the tool texts' BM25 index (``hyset_jax.model.lexical``), needed when the params have
      the lexical term.
    precision: the dtype of the prepared products (``hyset_jax.choices.PRECISIONS``;
      ``hyset_jax.inference.pipeline.prepare``): ``"bf16"`` is approximate.
  """

  def __init__(self, params: Any, tool_ids: Sequence[str], encoder: Any, *,
               k1: int = 15, k_pool: int = 20, max_size: int | None = None,
               ranking: str | None = None, lexical: Any = None, precision: str = "f32"):
    self.params = params
    self.tool_ids = tuple(tool_ids)
    self.encoder = encoder
    self.k1 = k1
    self.k_pool = k_pool
    self.max_size = params.max_set_size if max_size is None else max_size
    self.ranking = ranking
    self.lexical = lexical
    self.precision = precision

  @classmethod
  def untrained(cls, tools: ToolLibrary, encoder: Any, *, max_set_size: int = 5,
                **settings: Any) -> HysetRetriever:
    """HYSET at its natural start: Z = tool embeddings, P = I, M_m = 0 (ranks like dense)."""
    from hyset_jax.model.parameters import init_params
    z = embed(encoder, tools.texts)
    params = init_params(z, query_dim=z.shape[1], max_set_size=max_set_size)
    return cls(params, tools.ids, encoder, **settings)

  def retrieve(self, queries: Sequence[str], depth: int) -> Retrieval:
    check_depth(depth)
    from hyset_jax.inference.pipeline import predict_batched
    from hyset_jax.model.lexical import query_scores
    from hyset_jax.model.query_inputs import QueryInputs
    x = QueryInputs(embed(self.encoder, queries),
                    query_scores(self.params.lexical_weight, self.lexical, queries))
    out = predict_batched(self.params, x, k1=self.k1, k_pool=self.k_pool,
                          max_size=self.max_size, ranking=self.ranking,
                          precision=self.precision)
    ids = np.asarray(self.tool_ids, dtype=object)
    rankings = [ids[row[:depth]].tolist() for row in np.asarray(out.ranking)]
    # set_tools is padded with -1 after the set_size members.
    sets = [ids[row[:n]].tolist()
            for row, n in zip(np.asarray(out.set_tools), np.asarray(out.set_size))]
    return Retrieval(rankings=rankings, sets=sets)
