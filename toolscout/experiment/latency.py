"""Stage 5b: what the TF-IDF fingerprint costs on CPU (paper A.3: fit time, per-request and
whole-stream scoring time)."""
from __future__ import annotations

import time

import numpy as np

from toolscout import fingerprint as fpr
from toolscout.experiment.data import Prepared

_STREAM_REPEATS = 5  # whole-stream timings; the median is reported


def _ms_since(start: float) -> float:
  return 1000 * (time.perf_counter() - start)


def latency(data: Prepared) -> dict[str, float]:
  """Fit time, single-request scoring time, and whole-stream scoring time (ms)."""
  ref_texts = data.texts(data.reference, "train")
  start = time.perf_counter()
  fp = fpr.fit_fingerprint(ref_texts)
  fit_ms = _ms_since(start)
  stream, _ = data.stream()
  singles = []
  for text in stream[:data.config.latency_requests]:
    start = time.perf_counter()
    fpr.request_distances(fp, [text])
    singles.append(_ms_since(start))
  whole = []
  for _ in range(_STREAM_REPEATS):
    start = time.perf_counter()
    fpr.batch_distance(fp, stream)
    whole.append(_ms_since(start))
  return {"fit_ms": fit_ms, "n_reference": len(ref_texts),
          "request_median_ms": float(np.median(singles)),
          "request_p95_ms": float(np.quantile(singles, 0.95)), "n_timed_requests": len(singles),
          "stream_median_ms": float(np.median(whole)), "n_stream": len(stream)}
