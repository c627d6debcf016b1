"""The paper's main experiment end to end (``toolscout experiment``).

Stages, each a function below:

1. :func:`prepare` — the suite (:mod:`toolscout.sources`), frozen embeddings of
   tools and queries, gold rows.
2. :func:`train_retrievers` — off-the-shelf dense (W = I), the specialist
   (adapter trained on the reference source) and the aggregate (adapter trained
   on every source's training queries, natural mix).
3. :func:`evaluate_retrievers` — depth-20 pools on every source's test split for
   those three and the controls BM25, BM25+dense RRF and BM25+specialist RRF
   (:mod:`hyset_jax.retrievers`); linear and MLP rerankers per dense retriever
   (P@1 among covered, G = coverage · P@1).
4. :func:`detectors` — per-source TF-IDF (query and tool side), sentence-embedding,
   length and multi-step proxies; correlations with specialist coverage;
   leave-one-source-out unsafe-source accuracy; the TF-IDF source classifier.
5. :func:`routing` — batch (one decision per source), rolling-window and
   per-request routing on the mixed stream with LOSO-calibrated τ, and with the
   label-free default τ of ``toolscout fit``; window accuracy; latency.
6. :func:`repair` — few-shot continuation from the specialist on the collapsed sources.
7. :func:`skill_cards` — stages 2, 3 and batch routing again with tools rendered
   as skill cards.

:func:`run` returns the report as a dict; :func:`run_and_write` also writes
``report.json``, ``report.md``, ``report.png`` and ``config.json``.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pathlib
import platform
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hyset_jax.data import splits
from hyset_jax.data.types import Query
from hyset_jax.errors import UserError
from toolscout import adapter, classifier, embedding, proxies
from toolscout import fingerprint as fpr
from toolscout import metrics as tsm
from toolscout import reranker as rr
from toolscout import router, routing_eval, sources
from toolscout.config import ExperimentConfig

DENSE = ("ots", "specialist", "aggregate")
CONTROLS = ("bm25", "fusion", "bm25_specialist")
RERANKERS = ("linear", "mlp")


def _log(message: str) -> None:
  print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- 1. Data and embeddings ------------------------------------------------------


@dataclasses.dataclass
class Prepared:
  """Everything later stages share. ``[s]`` = per source name, ``[s][split]`` = per split."""
  config: ExperimentConfig
  suite: sources.Suite
  names: list[str]  # reference first
  encoder: Any
  tool_emb: np.ndarray  # float32[N, d]
  queries: dict[str, dict[str, tuple[Query, ...]]]
  emb: dict[str, dict[str, np.ndarray]]
  gold: dict[str, dict[str, list[list[int]]]]

  @property
  def reference(self) -> str:
    return self.names[0]

  def texts(self, s: str, split: str) -> list[str]:
    return [q.text for q in self.queries[s][split]]

  def gold_sets(self, s: str, split: str) -> list[set[str]]:
    return [set(q.gold) for q in self.queries[s][split]]


def prepare(config: ExperimentConfig) -> Prepared:
  suite = sources.build_suite(
      config.toollens_spec, config.bfcl_spec or None, config.bfcl_categories or None,
      config.reference_source, config.max_train, config.max_test)
  names = list(suite.sources)
  if len(names) < 3:
    raise UserError(f"the experiment needs at least 3 sources, got {names}")
  if not suite.sources[names[0]].train:
    raise UserError(f"reference source {names[0]!r} has no training queries")
  encoder = embedding.get_encoder(config.encoder, config.encoder_dir)
  _log(f"suite: {len(suite.tools)} tools, {len(names)} sources; embedding tools")
  tool_emb = embedding.embed(encoder, suite.tools.texts)
  index = suite.tools.index()
  queries = {s: {"train": suite.sources[s].train, "test": suite.sources[s].test} for s in names}
  _log("embedding queries")
  emb, gold = {}, {}
  for s in names:
    emb[s] = {sp: embedding.embed(encoder, [q.text for q in qs]) for sp, qs in queries[s].items()}
    gold[s] = {sp: [[index[g] for g in q.gold] for q in qs] for sp, qs in queries[s].items()}
  return Prepared(config, suite, names, encoder, tool_emb, queries, emb, gold)


# --- 2. Retrievers ---------------------------------------------------------------


def _train(data: Prepared, names: Sequence[str], tool_emb: np.ndarray,
           label: str) -> tuple[np.ndarray, dict]:
  q = np.concatenate([data.emb[s]["train"] for s in names if len(data.emb[s]["train"])])
  g = [row for s in names for row in data.gold[s]["train"]]
  start = time.perf_counter()
  w, losses = adapter.train_adapter(q, g, tool_emb, data.config.adapter())
  seconds = time.perf_counter() - start
  _log(f"trained {label} on {len(g)} queries in {seconds:.1f}s (loss {losses[0]:.3f} -> "
       f"{losses[-1]:.3f})")
  return w, {"n_train": len(g), "losses": losses, "seconds": seconds}


def train_retrievers(data: Prepared, tool_emb: np.ndarray) -> tuple[dict[str, np.ndarray], dict]:
  """Projections ``{"ots", "specialist", "aggregate"}`` over ``tool_emb`` and training logs."""
  d = tool_emb.shape[1]
  w_spec, log_spec = _train(data, [data.reference], tool_emb, "specialist")
  w_agg, log_agg = _train(data, data.names, tool_emb, "aggregate")
  return ({"ots": np.eye(d, dtype=np.float32), "specialist": w_spec, "aggregate": w_agg},
          {"specialist": log_spec, "aggregate": log_agg})


# --- 3. Evaluation ----------------------------------------------------------------


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
  coverage: dict[str, dict[str, np.ndarray]]
  hit1: dict[str, dict[str, dict[str, np.ndarray]]]
  pools: dict[str, dict[str, rr.Pools]]
  rerankers: dict[str, dict[str, Any]]


def _bm25_scores(bm25: Any, texts: Sequence[str]) -> np.ndarray:
  if not texts:
    return np.zeros((0, len(bm25.tool_ids)), np.float32)
  return np.concatenate([bm25.scores(texts[i:i + 1000]) for i in range(0, len(texts), 1000)])


def _reranker_sample(data: Prepared) -> list[tuple[str, int]]:
  """(source, row) of the training queries the rerankers learn from, by id hash."""
  items = [(s, i, q.id) for s in data.names for i, q in enumerate(data.queries[s]["train"])]
  items.sort(key=lambda it: splits.unit_hash(it[2], "toolscout-reranker"))
  return [(s, i) for s, i, _ in items[:data.config.reranker_train_queries]]


def _hits(model: Any, feats: np.ndarray, pools: rr.Pools, gold: Sequence[set[str]],
          tool_ids: Sequence[str]) -> np.ndarray:
  top = rr.rerank_top1(model, feats, pools)
  return np.array([tool_ids[t] in g for t, g in zip(top, gold)], np.float64)


def evaluate_retrievers(data: Prepared, tool_emb: np.ndarray, tool_texts: Sequence[str],
                        projections: dict[str, np.ndarray], bm25: Any,
                        bm25_test: dict[str, np.ndarray], bm25_train: np.ndarray,
                        controls: bool = True) -> Evaluation:
  """Coverage for every retriever and reranked top-1 for the dense ones, per source."""
  from hyset_jax.retrievers import FusionRetriever
  from hyset_jax.retrievers.base import top_k_ids

  cfg, depth = data.config, data.config.depth
  ids = data.suite.tools.ids
  stats = rr.ToolStats.from_texts(tool_texts)
  retrievers = {k: adapter.AdapterRetriever(ids, tool_emb, w, data.encoder)
                for k, w in projections.items()}
  cov: dict[str, dict[str, np.ndarray]] = {}
  pools: dict[str, dict[str, rr.Pools]] = {}
  for k, r in retrievers.items():
    pools[k] = {s: rr.pools_from_scores(r.scores_from_embeddings(data.emb[s]["test"]), depth)
                for s in data.names}
    cov[k] = {s: tsm.coverage([[ids[t] for t in row] for row in pools[k][s].rows],
                              data.gold_sets(s, "test"), depth) for s in data.names}
  if controls:
    fusion = FusionRetriever([bm25, retrievers["ots"]])
    fusion_spec = FusionRetriever([bm25, retrievers["specialist"]])
    cov["bm25"], cov["fusion"], cov["bm25_specialist"] = {}, {}, {}
    for s in data.names:
      texts, gold = data.texts(s, "test"), data.gold_sets(s, "test")
      cov["bm25"][s] = tsm.coverage(top_k_ids(bm25_test[s], ids, depth), gold, depth)
      cov["fusion"][s] = tsm.coverage(fusion.retrieve(texts, depth).rankings, gold, depth)
      cov["bm25_specialist"][s] = tsm.coverage(fusion_spec.retrieve(texts, depth).rankings,
                                               gold, depth)

  sample = _reranker_sample(data)
  train_emb = np.stack([data.emb[s]["train"][i] for s, i in sample])
  train_text = [data.queries[s]["train"][i].text for s, i in sample]
  train_gold = [data.gold[s]["train"][i] for s, i in sample]
  hit1: dict[str, dict[str, dict[str, np.ndarray]]] = {}
  models: dict[str, dict[str, Any]] = {}
  for k, r in retrievers.items():
    train_pools = rr.pools_from_scores(r.scores_from_embeddings(train_emb), depth)
    feats = rr.pool_features(train_text, train_pools, bm25_train, stats)
    labels = rr.pool_labels(train_pools, train_gold)
    models[k] = {kind: rr.fit_reranker(feats, labels, kind, cfg.seed, cfg.mlp_hidden,
                                       cfg.mlp_max_iter) for kind in RERANKERS}
    hit1[k] = {kind: {} for kind in RERANKERS}
    for s in data.names:
      test_feats = rr.pool_features(data.texts(s, "test"), pools[k][s], bm25_test[s], stats)
      for kind in RERANKERS:
        hit1[k][kind][s] = _hits(models[k][kind], test_feats, pools[k][s],
                                 data.gold_sets(s, "test"), ids)
    _log(f"evaluated {k}: rerankers fitted on {int(labels.any(axis=1).sum())} covered pools")
  return Evaluation(cov, hit1, pools, models)


def _mean(x: np.ndarray) -> float:
  return float(np.mean(x)) if len(x) else float("nan")


def _p1(hit: np.ndarray, cov: np.ndarray) -> float:
  return float(hit[cov > 0].mean()) if (cov > 0).any() else float("nan")


# --- 4. Detectors -------------------------------------------------------------------


def detector_values(data: Prepared, fp: fpr.Fingerprint) -> dict[str, dict[str, float]]:
  """``[source][detector]`` distance of each source's test split from the reference's train split."""
  ref = data.reference
  tool_texts = data.suite.tools.texts
  ref_tool_texts = [tool_texts[t] for row in data.gold[ref]["train"] for t in row]
  tool_fp = fpr.fit_fingerprint(ref_tool_texts)
  ref_len = proxies.mean_length(data.texts(ref, "train"))
  ref_multi = proxies.multistep_rate([len(g) for g in data.gold[ref]["train"]])
  out = {}
  for s in data.names:
    texts = data.texts(s, "test")
    gold_texts = [tool_texts[t] for row in data.gold[s]["test"] for t in row]
    out[s] = {
        "tfidf": fpr.batch_distance(fp, texts),
        "tfidf_tool": fpr.batch_distance(tool_fp, gold_texts),
        "semantic": fpr.centroid_distance(data.emb[s]["test"], data.emb[ref]["train"]),
        "length_gap": abs(proxies.mean_length(texts) - ref_len),
        "multistep_gap": abs(proxies.multistep_rate([len(g) for g in data.gold[s]["test"]])
                             - ref_multi),
    }
  return out


def judge_detectors(values: dict[str, dict[str, float]], spec_cov: dict[str, float],
                    counts: dict[str, int], floor: float,
                    detectors: Sequence[str] = proxies.DETECTORS) -> dict[str, dict[str, float]]:
  """Correlation with specialist coverage and LOSO unsafe accuracy of each detector."""
  names = list(values)
  cov = np.array([spec_cov[s] for s in names])
  w = np.array([counts[s] for s in names], np.float64)
  unsafe = router.unsafe_labels(cov, floor)
  out = {}
  for det in detectors:
    x = np.array([values[s][det] for s in names])
    loso = router.leave_one_source_out(x, unsafe)
    out[det] = {"pearson": proxies.weighted_pearson(x, cov),
                "weighted_pearson": proxies.weighted_pearson(x, cov, w),
                "loso_accuracy": loso.accuracy, "loso_f1": loso.f1}
  return out


# --- 5. Routing ----------------------------------------------------------------------


def _stream(data: Prepared) -> tuple[list[str], np.ndarray]:
  texts = [t for s in data.names for t in data.texts(s, "test")]
  src = np.array([s for s in data.names for _ in data.queries[s]["test"]])
  return texts, src


def _cat(per_source: dict[str, np.ndarray], names: Sequence[str]) -> np.ndarray:
  return np.concatenate([per_source[s] for s in names])


def route_batches(data: Prepared, fp: fpr.Fingerprint, unsafe: dict[str, bool],
                  spec: dict[str, np.ndarray], agg: dict[str, np.ndarray]) -> dict[str, Any]:
  """One decision per source (the source's test split as a batch), τ calibrated LOSO."""
  dist = {s: routing_eval.source_distance(fp, data.texts(s, "test"), None) for s in data.names}
  taus = routing_eval.loso_thresholds(dist, unsafe)
  choice = {s: str(router.route(np.array([dist[s]]), taus[s])[0]) for s in data.names}
  routed = {s: spec[s] if choice[s] == router.SPECIALIST else agg[s] for s in data.names}
  return {"distance": dist, "tau": taus, "route": choice, "routed": routed}


def routing(data: Prepared, fp: fpr.Fingerprint, ev: Evaluation, unsafe: dict[str, bool],
            ) -> dict[str, Any]:
  """Routed coverage and G on the mixed stream for every mode, plus window accuracy."""
  names = data.names
  stream, src = _stream(data)
  cov_s, cov_a = _cat(ev.coverage["specialist"], names), _cat(ev.coverage["aggregate"], names)
  g_s, g_a = (_cat(ev.hit1["specialist"]["mlp"], names), _cat(ev.hit1["aggregate"]["mlp"], names))
  texts_by_source = {s: data.texts(s, "test") for s in names}
  out: dict[str, Any] = {"modes": {}, "windows": {}}

  batch = route_batches(data, fp, unsafe, ev.coverage["specialist"], ev.coverage["aggregate"])
  choices = np.array([batch["route"][s] for s in src])
  out["batch"] = {k: v for k, v in batch.items() if k != "routed"}
  out["modes"]["batch (one decision per source)"] = choices

  for n in data.config.windows:
    dist = {s: routing_eval.source_distance(fp, texts_by_source[s], n) for s in names}
    taus = routing_eval.loso_thresholds(dist, unsafe)
    d = routing_eval.stream_window_distances(fp, stream, n)
    choices = np.where(d < np.array([taus[s] for s in src]), router.SPECIALIST, router.AGGREGATE)
    label = "per request" if n == 1 else f"rolling window {n}"
    out["modes"][label] = choices
    out["windows"][n] = {"source_distance": dist, "tau": taus,
                         **routing_eval.window_classification(fp, texts_by_source, unsafe, taus, n)}

  ref_ids = [q.id for q in data.queries[data.reference]["train"]]
  default = router.default_thresholds(ref_ids, data.texts(data.reference, "train"))
  out["default_thresholds"] = default
  # Batch mode with the label-free τ: the τ tabulated for the batch's size.
  default_tau = {s: router.threshold_for_window(default, len(texts_by_source[s])) for s in names}
  default_batch = {s: str(router.route(np.array([batch["distance"][s]]), default_tau[s])[0])
                   for s in names}
  out["batch_default"] = {"tau": default_tau, "route": default_batch}
  out["modes"]["batch, default tau (no labels)"] = np.array([default_batch[s] for s in src])
  for n in data.config.windows:
    d = routing_eval.stream_window_distances(fp, stream, n)
    tau = router.threshold_for_window(default, n)
    label = "per request" if n == 1 else f"rolling window {n}"
    out["modes"][f"{label}, default tau (no labels)"] = router.route(d, tau)

  results = {}
  for label, choices in out["modes"].items():
    cov = routing_eval.routed_values(choices, cov_s, cov_a)
    g = routing_eval.routed_values(choices, g_s, g_a)
    matched = src == data.reference
    results[label] = {"coverage": _mean(cov), "global": _mean(g),
                      "matched_coverage": _mean(cov[matched]),
                      "specialist_share": float(np.mean(choices == router.SPECIALIST)),
                      "specialist_share_matched": float(np.mean(choices[matched] == router.SPECIALIST)),
                      "per_source_coverage": {s: _mean(cov[src == s]) for s in names}}
  out["modes"] = results
  return out


def floor_sweep(data: Prepared, fp: fpr.Fingerprint, ev: Evaluation,
                values: dict[str, dict[str, float]], spec_cov: dict[str, float],
                counts: dict[str, int]) -> dict[str, Any]:
  """How the unsafe set, detector LOSO scores and batch routing change with the floor."""
  out = {}
  names = data.names
  for floor in data.config.floor_sweep:
    unsafe = {s: bool(spec_cov[s] < floor) for s in names}
    judged = judge_detectors(values, spec_cov, counts, floor)
    batch = route_batches(data, fp, unsafe, ev.coverage["specialist"], ev.coverage["aggregate"])
    routed = _cat(batch["routed"], names)
    matched = np.array([s == data.reference for s in names for _ in data.queries[s]["test"]])
    out[floor] = {"unsafe_sources": [s for s in names if unsafe[s]],
                  "detectors": {k: {"loso_accuracy": v["loso_accuracy"], "loso_f1": v["loso_f1"]}
                                for k, v in judged.items()},
                  "routed_coverage": _mean(routed), "routed_matched": _mean(routed[matched])}
  return out


def latency(data: Prepared, config: ExperimentConfig) -> dict[str, float]:
  """Fit time, single-request scoring time, and whole-stream scoring time (ms)."""
  ref_texts = data.texts(data.reference, "train")
  start = time.perf_counter()
  fp = fpr.fit_fingerprint(ref_texts)
  fit_ms = 1000 * (time.perf_counter() - start)
  stream, _ = _stream(data)
  singles = []
  for text in stream[:config.latency_requests]:
    start = time.perf_counter()
    fpr.request_distances(fp, [text])
    singles.append(1000 * (time.perf_counter() - start))
  whole = []
  for _ in range(5):
    start = time.perf_counter()
    fpr.batch_distance(fp, stream)
    whole.append(1000 * (time.perf_counter() - start))
  return {"fit_ms": fit_ms, "n_reference": len(ref_texts),
          "request_median_ms": float(np.median(singles)),
          "request_p95_ms": float(np.quantile(singles, 0.95)), "n_timed_requests": len(singles),
          "stream_median_ms": float(np.median(whole)), "n_stream": len(stream)}


# --- 6. Few-shot repair ---------------------------------------------------------------


def repair(data: Prepared, w_spec: np.ndarray, ev: Evaluation, spec_cov: dict[str, float],
           bm25_test: dict[str, np.ndarray]) -> dict[str, Any]:
  """Continuation from the specialist with k matched examples on the most collapsed sources.

  As in the paper (Table 2: "the five ... source slices where the FT-1100
  checkpoint loses coverage most severely"), the repaired sources are the
  ``repair_max_sources`` non-reference sources with the lowest specialist
  coverage among those with enough training queries for every shot count.
  """
  cfg, ids = data.config, data.suite.tools.ids
  stats = rr.ToolStats.from_texts(data.suite.tools.texts)
  mlp = ev.rerankers["specialist"]["mlp"]
  need = max(cfg.repair_shots)
  collapsed = sorted((s for s in data.names[1:] if len(data.queries[s]["train"]) >= need),
                     key=lambda s: (spec_cov[s], s))[:cfg.repair_max_sources]
  per_source = {}
  for s in collapsed:
    order = sorted(range(len(data.queries[s]["train"])),
                   key=lambda i: splits.unit_hash(data.queries[s]["train"][i].id, "toolscout-shots"))
    gold_test = data.gold_sets(s, "test")
    entry = {"n_test": len(gold_test), "n_train": len(order),
             "specialist": {"coverage": _mean(ev.coverage["specialist"][s]),
                            "global": _mean(ev.hit1["specialist"]["mlp"][s])},
             "aggregate": {"coverage": _mean(ev.coverage["aggregate"][s]),
                           "global": _mean(ev.hit1["aggregate"]["mlp"][s])},
             "shots": {}}
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
      feats = rr.pool_features(data.texts(s, "test"), pools, bm25_test[s], stats)
      hit = _hits(mlp, feats, pools, gold_test, ids)
      entry["shots"][k] = {"coverage": _mean(cov), "global": _mean(hit)}
    per_source[s] = entry
    _log(f"repaired {s}: " + ", ".join(f"{k}-shot {v['coverage']:.3f}"
                                       for k, v in entry["shots"].items()))
  weighted = {}
  if per_source:
    n = np.array([per_source[s]["n_test"] for s in per_source], np.float64)

    def avg(get: Callable[[dict], float | None]) -> float | None:
      vals = [get(per_source[s]) for s in per_source]
      if any(v is None for v in vals):
        return None
      return float(np.dot(n, vals) / n.sum())

    for metric in ("coverage", "global"):
      weighted[metric] = {
          "specialist": avg(lambda e: e["specialist"][metric]),
          "aggregate": avg(lambda e: e["aggregate"][metric]),
          **{str(k): avg(lambda e, k=k: e["shots"].get(k, {}).get(metric)) for k in cfg.repair_shots}}
  return {"sources": per_source, "weighted": weighted}


def paired_transfer(data: Prepared, projections: dict[str, np.ndarray]) -> dict[str, Any] | None:
  """Paper Table 30 on ToolLens: natural vs API-template styles over the same tools.

  Rows: off-the-shelf, an adapter trained on each style; columns: coverage on
  each style's test split. None when the suite lacks either style.
  """
  nat, api = sources.TOOLLENS, sources.TOOLLENS_API
  if nat not in data.names or api not in data.names:
    return None
  ids = data.suite.tools.ids
  ws = {"ots": projections["ots"]}
  for name in (nat, api):
    ws[f"ft_{name}"] = (projections["specialist"] if name == data.reference
                        else _train(data, [name], data.tool_emb, f"paired {name}")[0])
  out = {}
  for k, w in ws.items():
    r = adapter.AdapterRetriever(ids, data.tool_emb, w)
    out[k] = {s: _mean(tsm.coverage(r.rank_embeddings(data.emb[s]["test"], data.config.depth),
                                    data.gold_sets(s, "test"), data.config.depth))
              for s in (nat, api)}
  return out


# --- 7. Skill cards ---------------------------------------------------------------------


def skill_cards(data: Prepared, fp: fpr.Fingerprint, values: dict[str, dict[str, float]],
                counts: dict[str, int], default_route: dict[str, str]) -> dict[str, Any]:
  """Collapse, aggregate and batch routing with every tool rendered as a skill card."""
  from toolscout.skillcard import render_cards
  cards = render_cards(data.suite.tools.texts)
  _log("skill cards: embedding cards")
  card_emb = embedding.embed(data.encoder, cards)
  projections, logs = train_retrievers(data, card_emb)
  # BM25 features of the rerankers read the same card texts the dense retrievers see.
  from hyset_jax.data.types import ToolLibrary
  from hyset_jax.retrievers import BM25Retriever
  tools = data.suite.tools
  bm25 = BM25Retriever(ToolLibrary(tools.ids, tuple(cards), tools.metadata))
  bm25_test = {s: _bm25_scores(bm25, data.texts(s, "test")) for s in data.names}
  bm25_train = _bm25_scores(bm25, [data.queries[s]["train"][i].text
                                   for s, i in _reranker_sample(data)])
  ev = evaluate_retrievers(data, card_emb, cards, projections, bm25, bm25_test, bm25_train,
                           controls=False)
  cov = {k: {s: _mean(ev.coverage[k][s]) for s in data.names} for k in DENSE}
  unsafe = {s: bool(v) for s, v in zip(
      data.names, router.unsafe_labels(np.array([cov["specialist"][s] for s in data.names]),
                                       data.config.coverage_floor))}
  batch = route_batches(data, fp, unsafe, ev.coverage["specialist"], ev.coverage["aggregate"])
  mixed = {k: _mean(_cat(ev.coverage[k], data.names)) for k in DENSE}
  mixed["routed"] = _mean(_cat(batch["routed"], data.names))
  # The label-free route depends on the queries only, so it is the main run's.
  mixed["routed_default"] = _mean(np.concatenate([
      ev.coverage["specialist" if default_route[s] == router.SPECIALIST else "aggregate"][s]
      for s in data.names]))
  return {
      "example_card": cards[0],
      "per_source_coverage": cov, "unsafe": unsafe, "mixed_coverage": mixed,
      "route": batch["route"], "training": logs,
      "detectors": judge_detectors(values, cov["specialist"], counts,
                                   data.config.coverage_floor, ("tfidf", "semantic")),
  }


# --- Driver ---------------------------------------------------------------------------------


def _environment(config: ExperimentConfig) -> dict[str, Any]:
  import jax
  import sklearn
  return {"date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
          "command": " ".join(["toolscout"] + sys.argv[1:]) if sys.argv and
          sys.argv[0].endswith("toolscout") else "toolscout experiment --config " + config.name,
          "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
          "cpus": os.cpu_count(), "platform": platform.platform(),
          "python": platform.python_version(), "jax": jax.__version__,
          "jax_backend": jax.default_backend(), "sklearn": sklearn.__version__}


def run(config: ExperimentConfig) -> dict[str, Any]:
  """Runs every stage and returns the report dict (see :mod:`toolscout.report`).

  BLAS runs single-threaded here: the matrices are small, and on a machine
  whose cores are busy, multi-threaded OpenBLAS spins (measured: logistic
  regression 70× slower with 2 threads on 2 shared cores than with 1).
  """
  import threadpoolctl
  with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):
    return _run(config)


def _run(config: ExperimentConfig) -> dict[str, Any]:
  from hyset_jax.retrievers import BM25Retriever
  config.validate()
  t0 = time.perf_counter()
  timing: dict[str, float] = {}

  def lap(name: str, since: float) -> float:
    now = time.perf_counter()
    timing[name] = round(now - since, 2)
    return now

  data = prepare(config)
  t = lap("prepare_s", t0)
  names = data.names
  counts = {s: len(data.queries[s]["test"]) for s in names}
  projections, training = train_retrievers(data, data.tool_emb)
  t = lap("train_s", t)

  bm25 = BM25Retriever(data.suite.tools)
  bm25_test = {s: _bm25_scores(bm25, data.texts(s, "test")) for s in names}
  sample = _reranker_sample(data)
  bm25_train = _bm25_scores(bm25, [data.queries[s]["train"][i].text for s, i in sample])
  ev = evaluate_retrievers(data, data.tool_emb, data.suite.tools.texts, projections, bm25,
                           bm25_test, bm25_train)
  t = lap("evaluate_s", t)

  retrievers = DENSE + CONTROLS
  spec_cov = {s: _mean(ev.coverage["specialist"][s]) for s in names}
  unsafe = {s: bool(spec_cov[s] < config.coverage_floor) for s in names}
  fp = fpr.fit_fingerprint(data.texts(data.reference, "train"))
  values = detector_values(data, fp)
  judged = judge_detectors(values, spec_cov, counts, config.coverage_floor)
  query_tool_r = proxies.weighted_pearson(
      np.array([values[s]["tfidf"] for s in names]),
      np.array([values[s]["tfidf_tool"] for s in names]),
      np.array([counts[s] for s in names], np.float64))
  all_texts = [q.text for s in names for sp in ("train", "test") for q in data.queries[s][sp]]
  all_src = [s for s in names for sp in ("train", "test") for _ in data.queries[s][sp]]
  source_clf = classifier.source_classifier_cv(all_texts, all_src, config.classifier_min_count,
                                               seed=config.seed)
  t = lap("detectors_s", t)

  floors = floor_sweep(data, fp, ev, values, spec_cov, counts)
  routes = routing(data, fp, ev, unsafe)
  lat = latency(data, config)
  t = lap("routing_s", t)

  repaired = repair(data, projections["specialist"], ev, spec_cov, bm25_test)
  paired = paired_transfer(data, projections)
  t = lap("repair_s", t)
  cards = (skill_cards(data, fp, values, counts, routes["batch_default"]["route"])
           if config.skill_cards else None)
  t = lap("skill_cards_s", t)

  per_source = {}
  for s in names:
    per_source[s] = {
        "n_train": len(data.queries[s]["train"]), "n_test": counts[s],
        "coverage": {k: _mean(ev.coverage[k][s]) for k in retrievers},
        "p1_covered": {k: {kind: _p1(ev.hit1[k][kind][s], ev.coverage[k][s]) for kind in RERANKERS}
                       for k in DENSE},
        "global": {k: {kind: _mean(ev.hit1[k][kind][s]) for kind in RERANKERS} for k in DENSE},
        "unsafe": unsafe[s], "detectors": values[s],
        "mean_words": proxies.mean_length(data.texts(s, "test")),
        "multistep_rate": proxies.multistep_rate([len(g) for g in data.gold[s]["test"]]),
    }
  mixed = {"n": int(sum(counts.values())),
           "coverage": {k: _mean(_cat(ev.coverage[k], names)) for k in retrievers},
           "global": {k: {kind: _mean(_cat(ev.hit1[k][kind], names)) for kind in RERANKERS}
                      for k in DENSE},
           "p1_covered": {k: {kind: _p1(_cat(ev.hit1[k][kind], names), _cat(ev.coverage[k], names))
                              for kind in RERANKERS} for k in DENSE}}
  mismatched = [s for s in names if s != data.reference]
  batch_mode = routes["modes"]["batch (one decision per source)"]
  default_mode = routes["modes"]["batch, default tau (no labels)"]
  agg_mixed = mixed["coverage"]["aggregate"]
  summary = {
      "reference": data.reference,
      "specialist_matched": spec_cov[data.reference],
      "aggregate_matched": per_source[data.reference]["coverage"]["aggregate"],
      "specialist_mismatched": _mean(_cat(ev.coverage["specialist"], mismatched)),
      "aggregate_mismatched": _mean(_cat(ev.coverage["aggregate"], mismatched)),
      "unsafe_sources": [s for s in names if unsafe[s]],
      "mixed_specialist": mixed["coverage"]["specialist"],
      "mixed_aggregate": mixed["coverage"]["aggregate"],
      "mixed_routed_batch": batch_mode["coverage"],
      "routed_over_aggregate": batch_mode["coverage"] / agg_mixed if agg_mixed else float("nan"),
      "routed_matched": batch_mode["matched_coverage"],
      "mixed_routed_default": default_mode["coverage"],
      "routed_default_over_aggregate": default_mode["coverage"] / agg_mixed
      if agg_mixed else float("nan"),
      "routed_default_matched": default_mode["matched_coverage"],
  }
  # Goal: routed ≥ 0.95× aggregate on the mixed stream while keeping the
  # specialist's edge on matched traffic (routed matched ≥ aggregate matched).
  summary["goal_met"] = bool(summary["routed_over_aggregate"] >= 0.95
                             and summary["routed_matched"] >= summary["aggregate_matched"])
  summary["goal_met_default"] = bool(summary["routed_default_over_aggregate"] >= 0.95
                                     and summary["routed_default_matched"]
                                     >= summary["aggregate_matched"])
  timing["total_s"] = round(time.perf_counter() - t0, 2)
  return {
      "format": "toolscout-report/1",
      "config": dataclasses.asdict(config), "environment": _environment(config), "timing": timing,
      "suite": {"n_tools": len(data.suite.tools), "notes": list(data.suite.notes),
                "sources": {s: {"n_train": len(data.queries[s]["train"]), "n_test": counts[s]}
                            for s in names}},
      "summary": summary, "training": training, "per_source": per_source, "mixed": mixed,
      "detectors": judged, "query_tool_weighted_r": query_tool_r, "source_classifier": source_clf,
      "routing": {k: v for k, v in routes.items()}, "floor_sweep": floors, "latency": lat,
      "reranker_coefficient_mass": {k: rr.coefficient_mass(ev.rerankers[k]["linear"])
                                    for k in DENSE},
      "repair": repaired, "paired_transfer": paired, "skill_cards": cards,
  }


def _jsonable(x: Any) -> Any:
  if isinstance(x, dict):
    return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
  if isinstance(x, np.ndarray):
    return _jsonable(x.tolist())
  if isinstance(x, (np.floating, float)):
    return None if not np.isfinite(x) else round(float(x), 6)
  if isinstance(x, np.integer):
    return int(x)
  if isinstance(x, np.bool_):
    return bool(x)
  return x


def run_and_write(config: ExperimentConfig, out: pathlib.Path) -> dict[str, Any]:
  """Runs the experiment and writes report.json, report.md, report.png and config.json."""
  from hyset_jax.io_utils import atomic_write
  from toolscout import report as rep
  try:
    out.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise UserError(f"cannot create folder {out}: {e.strerror}") from None
  with atomic_write(out / "config.json") as f:
    json.dump(_jsonable(dataclasses.asdict(config)), f, indent=2)
  result = _jsonable(run(config))
  with atomic_write(out / "report.json") as f:
    json.dump(result, f, indent=2, ensure_ascii=False)
  with atomic_write(out / "report.md") as f:
    f.write(rep.markdown(result))
  rep.figure(result, out / "report.png")
  _log(f"wrote {out / 'report.json'}, report.md, report.png ({result['timing']['total_s']:.0f}s)")
  return result
