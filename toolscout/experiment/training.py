"""Stage 2: the dense retrievers — off-the-shelf (W = I), the specialist (an adapter trained on
the reference source) and the aggregate (trained on every source's training queries)."""
from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from toolscout import adapter
from toolscout.experiment.data import Prepared, log
from toolscout.keys import Retriever


def train_projection(data: Prepared, names: Sequence[str], tool_emb: np.ndarray,
                     label: str) -> tuple[np.ndarray, dict]:
  """An adapter on the training queries of ``names`` over ``tool_emb`` (``float32[N, d]``).

  Returns:
    ``float32[d, d]`` and a log ``{"n_train", "losses", "seconds"}``.
  """
  q = np.concatenate([data.emb[s]["train"] for s in names if len(data.emb[s]["train"])])
  g = [row for s in names for row in data.gold[s]["train"]]
  start = time.perf_counter()
  w, losses = adapter.train_adapter(q, g, tool_emb, data.config.adapter())
  seconds = time.perf_counter() - start
  log(f"trained {label} on {len(g)} queries in {seconds:.1f}s (loss {losses[0]:.3f} -> "
      f"{losses[-1]:.3f})")
  return w, {"n_train": len(g), "losses": losses, "seconds": seconds}


def train_retrievers(data: Prepared, tool_emb: np.ndarray
                     ) -> tuple[dict[Retriever, np.ndarray], dict[str, dict]]:
  """Projections of the three dense retrievers over ``tool_emb`` and the training logs."""
  d = tool_emb.shape[1]
  w_spec, log_spec = train_projection(data, [data.reference], tool_emb, "specialist")
  w_agg, log_agg = train_projection(data, data.names, tool_emb, "aggregate")
  projections = {Retriever.OTS: np.eye(d, dtype=np.float32), Retriever.SPECIALIST: w_spec,
                 Retriever.AGGREGATE: w_agg}
  return projections, {Retriever.SPECIALIST: log_spec, Retriever.AGGREGATE: log_agg}
