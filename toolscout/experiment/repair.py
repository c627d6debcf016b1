"""Stage 6: few-shot continuation from the specialist on the collapsed sources, and the paired
natural/API-template transfer over the same tools (paper Table 30)."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from hyset_jax.data import splits
from toolscout import adapter, sources
from toolscout import metrics as tsm
from toolscout import reranker as rr
from toolscout.experiment.data import Prepared, log
from toolscout.experiment.evaluation import Evaluation
from toolscout.experiment.outcomes import mean
from toolscout.experiment.reranking import hits
from toolscout.experiment.training import train_projection
from toolscout.keys import Reranker, Retriever


def collapsed_sources(data: Prepared, spec_cov: Mapping[str, float]) -> list[str]:
  """The sources to repair.

  As in the paper (Table 2: "the five ... source slices where the FT-1100
  checkpoint loses coverage most severely"), the ``repair_max_sources``
  non-reference sources with the lowest specialist coverage among those with
  enough training queries for every shot count.
  """
  need = max(data.config.repair_shots)
  eligible = (s for s in data.names[1:] if len(data.queries[s]["train"]) >= need)
  return sorted(eligible, key=lambda s: (spec_cov[s], s))[:data.config.repair_max_sources]


def _before(ev: Evaluation, k: Retriever, s: str) -> dict[str, float]:
  return {"coverage": mean(ev.coverage[k][s]), "global": mean(ev.hit1[k][Reranker.MLP][s])}


def repair_source(data: Prepared, s: str, w_spec: np.ndarray, ev: Evaluation,
                  bm25_test: np.ndarray, stats: rr.ToolStats) -> dict[str, Any]:
  """Coverage and G on ``s``'s test split after continuation with k of its training queries.

  The k examples are the first k by id hash (nested across k); G uses the specialist's MLP
  reranker unchanged. ``bm25_test`` is ``float32[n, N]``, BM25 of ``s``'s test queries.
  """
  cfg, ids = data.config, data.suite.tools.ids
  train = data.queries[s]["train"]
  order = sorted(range(len(train)), key=lambda i: splits.unit_hash(train[i].id, "toolscout-shots"))
  gold_test = data.gold_sets(s, "test")
  entry = {"n_test": len(gold_test), "n_train": len(order),
           "specialist": _before(ev, Retriever.SPECIALIST, s),
           "aggregate": _before(ev, Retriever.AGGREGATE, s), "shots": {}}
  mlp = ev.rerankers[Retriever.SPECIALIST][Reranker.MLP]
  for k in cfg.repair_shots:
    if k > len(order):
      continue
    rows = order[:k]
    w, _ = adapter.train_adapter(data.emb[s]["train"][rows],
                                 [data.gold[s]["train"][i] for i in rows], data.tool_emb,
                                 cfg.adapter(epochs=cfg.repair_epochs), init=w_spec)
    r = adapter.AdapterRetriever(ids, data.tool_emb, w)
    pools = rr.pools_from_scores(r.scores_from_embeddings(data.emb[s]["test"]), cfg.depth)
    cov = tsm.coverage([[ids[t] for t in row] for row in pools.rows], gold_test, cfg.depth)
    feats = rr.pool_features(data.texts(s, "test"), pools, bm25_test, stats)
    entry["shots"][k] = {"coverage": mean(cov), "global": mean(hits(mlp, feats, pools, gold_test,
                                                                    ids))}
  return entry


def weighted(per_source: Mapping[str, dict], shots: tuple[int, ...]) -> dict[str, dict]:
  """Test-count-weighted means over the repaired sources, ``[metric][column]``; a column some
  source lacks is None."""
  if not per_source:
    return {}
  n = np.array([e["n_test"] for e in per_source.values()], np.float64)

  def avg(get: Callable[[dict], float | None]) -> float | None:
    vals = [get(e) for e in per_source.values()]
    return None if any(v is None for v in vals) else float(np.dot(n, vals) / n.sum())

  return {metric: {
      "specialist": avg(lambda e: e["specialist"][metric]),
      "aggregate": avg(lambda e: e["aggregate"][metric]),
      **{str(k): avg(lambda e, k=k: e["shots"].get(k, {}).get(metric)) for k in shots}}
      for metric in ("coverage", "global")}


def repair(data: Prepared, w_spec: np.ndarray, ev: Evaluation, spec_cov: Mapping[str, float],
           bm25_test: Mapping[str, np.ndarray]) -> dict[str, Any]:
  """Continuation from the specialist (``float32[d, d]``) with k matched examples on the most
  collapsed sources; ``bm25_test`` as :attr:`toolscout.experiment.lexical.Lexical.test`."""
  stats = rr.ToolStats.from_texts(data.suite.tools.texts)
  per_source = {}
  for s in collapsed_sources(data, spec_cov):
    per_source[s] = repair_source(data, s, w_spec, ev, bm25_test[s], stats)
    log(f"repaired {s}: " + ", ".join(f"{k}-shot {v['coverage']:.3f}"
                                      for k, v in per_source[s]["shots"].items()))
  return {"sources": per_source, "weighted": weighted(per_source, data.config.repair_shots)}


def paired_transfer(data: Prepared, projections: Mapping[Retriever, np.ndarray]
                    ) -> dict[str, Any] | None:
  """Paper Table 30 on ToolLens: natural vs API-template styles over the same tools.

  Rows: off-the-shelf, an adapter trained on each style; columns: coverage on
  each style's test split. None when the suite lacks either style.
  """
  nat, api = sources.TOOLLENS, sources.TOOLLENS_API
  if nat not in data.names or api not in data.names:
    return None
  ids, depth = data.suite.tools.ids, data.config.depth
  ws = {"ots": projections[Retriever.OTS]}
  for name in (nat, api):
    ws[f"ft_{name}"] = (projections[Retriever.SPECIALIST] if name == data.reference
                        else train_projection(data, [name], data.tool_emb, f"paired {name}")[0])
  out = {}
  for k, w in ws.items():
    r = adapter.AdapterRetriever(ids, data.tool_emb, w)
    out[k] = {s: mean(tsm.coverage(r.rank_embeddings(data.emb[s]["test"], depth),
                                   data.gold_sets(s, "test"), depth)) for s in (nat, api)}
  return out
