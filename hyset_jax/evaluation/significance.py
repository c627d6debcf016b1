"""Paired significance of the difference between two systems scored on the same queries.

Every function takes per-query values — what :mod:`hyset_jax.evaluation.metrics`' functions return,
``float[n]`` — of system A and system B for the same ``n`` queries in the same order. The
difference is always ``B − A`` (B's mean minus A's), so a positive difference means B scores
higher.

- :func:`paired_bootstrap`: the difference of means with a percentile confidence interval from
  resampling the *queries* with replacement (both systems keep the same resample, which is what
  makes it paired). Any metric, binary or graded.
- :func:`mcnemar_exact`: the exact (binomial) McNemar test for a binary per-query outcome
  (``set_exact``, ``comp@k``): under H0 the queries only one system gets right are equally
  likely to be A's or B's, so their split is Binomial(discordant, 1/2); two-sided p-value.
- :func:`per_query_metrics` and :func:`compare`: the ``hyset eval`` metrics per query, and
  both tests for each, as ``hyset compare`` reports them.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

import numpy as np

from hyset_jax.evaluation import metrics

# Per-query outcomes that are 0 or 1: McNemar applies to these.
BINARY_KEYS = ("comp@3", "comp@5", "set_exact")

# Resamples drawn per chunk are bounded so the [chunk, n] count matrix stays near 32 MB.
_CHUNK_ELEMENTS = 1 << 22


@dataclasses.dataclass(frozen=True)
class Bootstrap:
  """A paired-bootstrap result; each field is a float (1-D input) or ``float[m]`` (2-D)."""
  diff: np.ndarray | float   # mean(B) − mean(A) on the full sample
  low: np.ndarray | float    # lower end of the percentile interval
  high: np.ndarray | float   # upper end


@dataclasses.dataclass(frozen=True)
class McNemar:
  """The exact McNemar test: discordant counts and the two-sided p-value."""
  a_only: int    # queries A gets right and B does not
  b_only: int    # queries B gets right and A does not
  p_value: float


def _paired(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
  a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
  if a.shape != b.shape or a.ndim not in (1, 2):
    raise ValueError(f"expected A and B of the same shape [n] or [n, m], got {a.shape} and "
                     f"{b.shape}")
  if a.shape[0] == 0:
    raise ValueError("no queries to compare")
  if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
    raise ValueError("per-query values must be finite")
  return a, b


def paired_bootstrap(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, *,
                     resamples: int = 10_000, seed: int = 0,
                     confidence: float = 0.95) -> Bootstrap:
  """mean(B) − mean(A) and its paired-bootstrap percentile interval.

  Each resample draws ``n`` query indices uniformly with replacement (``numpy``'s
  ``default_rng(seed)``) and takes the mean of ``b − a`` over them; the interval is the
  ``(1 − confidence)/2`` and ``(1 + confidence)/2`` quantiles of those means (linear
  interpolation). The resamples are drawn once and shared by every column, so with 2-D input
  every metric sees the same resampled query sets. Deterministic for a given seed and ``n``.

  Args:
    a: A's per-query values, ``float[n]``, or ``float[n, m]`` for ``m`` metrics at once.
    b: B's, the same shape, the same queries in the same order.
    resamples: number of bootstrap resamples (≥ 1).
    seed: the generator's seed.
    confidence: the interval's coverage, in (0, 1).

  Returns:
    :class:`Bootstrap` with ``diff``, ``low``, ``high``: floats for 1-D input, ``float[m]``
    for 2-D. Identical inputs give a zero-width interval at 0.

  >>> r = paired_bootstrap([1.0, 0.0, 1.0], [1.0, 0.0, 1.0])
  >>> (r.diff, r.low, r.high)
  (0.0, 0.0, 0.0)
  >>> r = paired_bootstrap([0.0] * 50 + [1.0] * 50, [1.0] * 100, seed=1)
  >>> r.diff, bool(0.39 < r.low < 0.5 < r.high < 0.61)
  (0.5, True)
  """
  a, b = _paired(a, b)
  if resamples < 1:
    raise ValueError(f"resamples must be at least 1, got {resamples}")
  if not 0.0 < confidence < 1.0:
    raise ValueError(f"confidence must be in (0, 1), got {confidence}")
  d = (b - a).reshape(a.shape[0], -1)  # [n, m]
  n = d.shape[0]
  rng = np.random.default_rng(seed)
  means = np.empty((resamples, d.shape[1]))  # [R, m]
  chunk = max(1, _CHUNK_ELEMENTS // n)
  for start in range(0, resamples, chunk):
    c = min(chunk, resamples - start)
    idx = rng.integers(0, n, size=(c, n))  # [c, n] query indices
    # How often each query is drawn in each resample: one bincount over offset indices turns
    # the mean over the resample into a matrix product, for every metric column at once.
    counts = np.bincount((idx + n * np.arange(c)[:, None]).ravel(), minlength=c * n)
    means[start:start + c] = counts.reshape(c, n).astype(np.float64) @ d / n
  tail = (1.0 - confidence) / 2.0
  low, high = np.quantile(means, [tail, 1.0 - tail], axis=0)  # [m] each
  diff = d.mean(axis=0)
  if a.ndim == 1:
    return Bootstrap(float(diff[0]), float(low[0]), float(high[0]))
  return Bootstrap(diff, low, high)


def mcnemar_exact(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> McNemar:
  """Exact two-sided McNemar test of paired binary outcomes.

  With ``a_only`` queries right for A only and ``b_only`` for B only, the p-value is
  ``min(1, 2 · P[X ≤ min(a_only, b_only)])`` for X ~ Binomial(a_only + b_only, 1/2) — the
  two-sided binomial test at 1/2 (``scipy.stats.binomtest``) — and 1 when no query is
  discordant. Queries both systems get right, or both wrong, carry no information here.

  Args:
    a: A's per-query outcomes, ``float[n]`` or ``bool[n]`` of 0s and 1s.
    b: B's, the same queries in the same order.

  Returns:
    :class:`McNemar` with ``a_only``, ``b_only`` and ``p_value``.

  >>> mcnemar_exact([1, 1, 1, 0], [0, 0, 0, 0])
  McNemar(a_only=3, b_only=0, p_value=0.25)
  >>> mcnemar_exact([1, 0], [1, 0]).p_value
  1.0
  """
  from scipy import stats  # only here: scipy's import costs every command that skips this
  a, b = _paired(a, b)
  if a.ndim != 1:
    raise ValueError(f"expected per-query outcomes [n], got shape {a.shape}")
  if not (np.all((a == 0) | (a == 1)) and np.all((b == 0) | (b == 1))):
    raise ValueError("McNemar's test needs binary per-query outcomes (0 or 1)")
  a_only = int(np.sum((a == 1) & (b == 0)))
  b_only = int(np.sum((a == 0) & (b == 1)))
  discordant = a_only + b_only
  if discordant == 0:
    return McNemar(a_only, b_only, 1.0)
  p = 2.0 * float(stats.binom.cdf(min(a_only, b_only), discordant, 0.5))
  return McNemar(a_only, b_only, min(1.0, p))


def per_query_metrics(rankings: Sequence[Sequence[str]], gold_sets: Sequence[Collection[str]],
                      predicted_sets: Sequence[Collection[str]]) -> dict[str, np.ndarray]:
  """The ``hyset eval`` metrics (:func:`hyset_jax.evaluation.metrics.evaluate`) per query.

  Returns:
    metric key (``metrics.METRIC_KEYS`` less ``n_queries``, in that order) -> ``float64[n]``;
    each column's mean is what ``evaluate`` reports for the same inputs.

  >>> m = per_query_metrics([["a", "x", "b"], ["x"]], [{"a", "b"}, {"y"}], [["a"], ["x"]])
  >>> m["comp@3"].tolist(), m["set_recall"].tolist()
  ([1.0, 0.0], [0.5, 0.0])
  """
  out: dict[str, np.ndarray] = {}
  for k in metrics.REPORT_KS:
    out[f"recall@{k}"] = metrics.recall_at_k(rankings, gold_sets, k)
  for k in metrics.REPORT_KS:
    out[f"ndcg@{k}"] = metrics.ndcg_at_k(rankings, gold_sets, k)
  for k in metrics.REPORT_KS:
    out[f"comp@{k}"] = metrics.comp_at_k(rankings, gold_sets, k)
  out["set_precision"] = metrics.set_precision(predicted_sets, gold_sets)
  out["set_recall"] = metrics.set_recall(predicted_sets, gold_sets)
  out["set_f1"] = metrics.set_f1(predicted_sets, gold_sets)
  out["set_exact"] = metrics.set_exact(predicted_sets, gold_sets)
  assert tuple(out) + ("n_queries",) == metrics.METRIC_KEYS
  return out


def compare(a: dict[str, np.ndarray], b: dict[str, np.ndarray], *, resamples: int = 10_000,
            seed: int = 0, confidence: float = 0.95) -> dict[str, dict[str, float | int]]:
  """Both tests for every metric of two :func:`per_query_metrics` results.

  Returns:
    metric key -> ``{"a", "b", "diff", "ci_low", "ci_high"}`` (means and the bootstrap
    interval of ``b − a``, all metrics sharing one set of resamples), plus for
    :data:`BINARY_KEYS` ``"a_only"``, ``"b_only"`` and ``"mcnemar_p"``.

  >>> r = compare({"set_exact": np.array([1.0, 0.0])}, {"set_exact": np.array([1.0, 1.0])},
  ...             resamples=100)
  >>> r["set_exact"]["diff"], r["set_exact"]["b_only"], r["set_exact"]["mcnemar_p"]
  (0.5, 1, 1.0)
  """
  keys = list(a)
  if keys != list(b):
    raise ValueError(f"A and B hold different metrics: {keys} and {list(b)}")
  stack_a = np.stack([a[k] for k in keys], axis=1)  # [n, m]
  stack_b = np.stack([b[k] for k in keys], axis=1)
  boot = paired_bootstrap(stack_a, stack_b, resamples=resamples, seed=seed,
                          confidence=confidence)
  out: dict[str, dict[str, float | int]] = {}
  for j, key in enumerate(keys):
    row: dict[str, float | int] = {
        "a": float(stack_a[:, j].mean()), "b": float(stack_b[:, j].mean()),
        "diff": float(boot.diff[j]), "ci_low": float(boot.low[j]),
        "ci_high": float(boot.high[j])}
    if key in BINARY_KEYS:
      test = mcnemar_exact(a[key], b[key])
      row.update(a_only=test.a_only, b_only=test.b_only, mcnemar_p=test.p_value)
    out[key] = row
  return out
