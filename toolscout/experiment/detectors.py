"""Stage 4: per-source detectors of specialist collapse (:mod:`toolscout.proxies`), how well each
tracks the specialist's coverage, and the TF-IDF source classifier."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from toolscout import classifier, proxies, router
from toolscout import fingerprint as fpr
from toolscout.experiment.data import Prepared
from toolscout.keys import Detector


def detector_values(data: Prepared, fp: fpr.Fingerprint) -> dict[str, dict[Detector, float]]:
  """``[source][detector]``: distance of each source's test split from the reference's train split."""
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
        Detector.TFIDF: fpr.batch_distance(fp, texts),
        Detector.TFIDF_TOOL: fpr.batch_distance(tool_fp, gold_texts),
        Detector.SEMANTIC: fpr.centroid_distance(data.emb[s]["test"], data.emb[ref]["train"]),
        Detector.LENGTH_GAP: abs(proxies.mean_length(texts) - ref_len),
        Detector.MULTISTEP_GAP: abs(proxies.multistep_rate([len(g) for g in data.gold[s]["test"]])
                                    - ref_multi),
    }
  return out


def judge_detectors(values: Mapping[str, Mapping[Detector, float]], spec_cov: Mapping[str, float],
                    counts: Mapping[str, int], floor: float,
                    detectors: Sequence[Detector] = tuple(Detector)
                    ) -> dict[Detector, dict[str, float]]:
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


def query_tool_correlation(values: Mapping[str, Mapping[Detector, float]],
                           counts: Mapping[str, int]) -> float:
  """Query-count-weighted r of the query-side and tool-side TF-IDF distances (paper Table 28)."""
  names = list(values)
  return proxies.weighted_pearson(np.array([values[s][Detector.TFIDF] for s in names]),
                                  np.array([values[s][Detector.TFIDF_TOOL] for s in names]),
                                  np.array([counts[s] for s in names], np.float64))


def source_classifier(data: Prepared) -> dict[str, Any]:
  """Cross-validated TF-IDF classifier of every query's source (train and test queries)."""
  texts = [q.text for s in data.names for sp in ("train", "test") for q in data.queries[s][sp]]
  src = [s for s in data.names for sp in ("train", "test") for _ in data.queries[s][sp]]
  return classifier.source_classifier_cv(texts, src, data.config.classifier_min_count,
                                         seed=data.config.seed)
