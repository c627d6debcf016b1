"""One timing protocol for every implementation (JAX forms, NumPy, naive loop, PyTorch).

Two outputs (:data:`hyset_jax.choices.STAGE2_OUTPUTS`): ``scores`` times every subset's score
written as f32[Q, n]; ``best`` times the best set per query (``enumeration.best_subset`` for
JAX, the scores and an argmax for the others — what a user of those libraries would write).

Protocol: build inputs where the implementation computes (``jax.device_put`` for JAX), compile
(JAX: ``jit(...).lower(...).compile()``, timed as ``compile_s``), warm up, then ``repeats``
samples; a sample times enough back-to-back calls to last ≥ 20 ms and reports the mean per call.
The reported time is the median sample. Every call waits for its result (``block_until_ready``).

Peak memory is the implementation's own working set for one call: XLA's buffer assignment
(arguments + outputs + temporaries, from ``compiled.memory_analysis()``) for JAX, the
``tracemalloc`` peak for NumPy and the loop (NumPy reports its buffers there), and
``torch.cuda.max_memory_allocated`` for PyTorch on a GPU (not measured for PyTorch on CPU).
"""
from __future__ import annotations

import dataclasses
import statistics
import time
import tracemalloc
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from hyset_jax import choices
from hyset_jax.errors import UserError

if TYPE_CHECKING:  # the workload module imports JAX; the CLI reads IMPLS without it
  from hyset_jax.benchmarking.workload import Workload  # noqa: F401

# Implementation name → enumeration method, for the JAX forms and the native kernel; "jax" is
# the library default ("auto": the native kernel on a CPU where it builds, else gather).
# Built from the one list of method names (imports no JAX: the CLI reads it for --help).
JAX_METHODS = {"jax": None,
               **{"jax-" + m.replace("_", "-"): m for m in choices.ENUMERATION_METHODS},
               # The gather form's scores left subset-major (f32[n, Q]): what the final
               # transpose to the API's [Q, n] costs on this machine.
               "jax-gather-subset-major": "gather/subset-major"}
OTHER_IMPLS = ("numpy", "numpy-matmul", "torch", "naive")
IMPLS = tuple(JAX_METHODS) + OTHER_IMPLS


@dataclasses.dataclass
class Prepared:
  """An implementation ready to run on one workload."""
  call: Callable[[], Any]
  compile_s: float | None = None
  peak_bytes: int | None = None
  peak_source: str = ""
  method: str | None = None


@dataclasses.dataclass
class Measurement:
  impl: str
  settings: dict
  status: str = "ok"                      # or "not run: <why>"
  method: str | None = None
  times_s: list[float] = dataclasses.field(default_factory=list)
  calls_per_sample: int = 0
  compile_s: float | None = None
  peak_bytes: int | None = None
  peak_source: str = ""

  @property
  def ok(self) -> bool:
    return self.status == "ok"

  @property
  def time_s(self) -> float:
    return statistics.median(self.times_s)

  @property
  def queries_per_s(self) -> float:
    return self.settings["batch"] / self.time_s

  @property
  def subsets_per_s(self) -> float:
    return self.queries_per_s * self.settings["n_subsets"]

  def to_json(self) -> dict:
    out = {"impl": self.impl, "status": self.status, "method": self.method, **self.settings}
    if self.ok:
      out.update(queries_per_s=self.queries_per_s, subsets_per_s=self.subsets_per_s,
                 time_s=self.time_s, times_s=self.times_s,
                 calls_per_sample=self.calls_per_sample, repeats=len(self.times_s),
                 compile_s=self.compile_s, peak_bytes=self.peak_bytes,
                 peak_source=self.peak_source)
    return out


def _jax_prepare(method: str | None, w: "Workload", output: str) -> Prepared:
  import jax
  import jax.numpy as jnp

  from hyset_jax.inference import enumeration, subsets
  from hyset_jax.model import scoring

  # Record the implementation that runs ("auto" names none).
  if method != "gather/subset-major":
    method = enumeration.resolve_method(method or choices.DEFAULT_METHOD, w.k_pool, w.max_size,
                                        all_scores=output == "scores")
  table = subsets.subset_table(w.k_pool, w.max_size)

  def score(logits, pairs):
    if method == "gather/subset-major":
      if output == "best":
        raise ImportError("subset-major is a scores layout; --output best has no such variant")
      return enumeration.score_subsets_subset_major(logits, pairs, table, "gather")[0]
    if output == "best":
      return enumeration.best_subset(logits, pairs, table, method)
    return enumeration.score_subsets(logits, pairs, table, method).scores

  if w.dim == 0:
    fn = score
    args = (w.logits, w.pairs)
  else:
    def fn(query, tools, interactions):
      logits = jnp.einsum("qkd,qd->qk", tools, query)
      return score(logits, scoring.pair_matrices(tools, interactions))
    args = (w.query, w.tools, w.interactions)
  args = jax.device_put(args)
  start = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  compile_s = time.perf_counter() - start
  peak, source = None, ""
  try:
    mem = compiled.memory_analysis()
    peak = int(mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
               - mem.alias_size_in_bytes)
    source = "xla buffer assignment"
  except (AttributeError, NotImplementedError, RuntimeError):
    pass
  return Prepared(lambda: jax.block_until_ready(compiled(*args)), compile_s, peak, source, method)


def _traced_peak(fn: Callable[[], Any]) -> int:
  tracemalloc.start()
  try:
    fn()
    return tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()


def _host_prepare(fn: Callable[[], Any], measure_peak: bool, output: str) -> Prepared:
  if output == "best":
    scores = fn
    fn = lambda: np.argmax(scores(), axis=1)  # noqa: E731
  return Prepared(fn, None, _traced_peak(fn) if measure_peak else None,
                  "tracemalloc" if measure_peak else "")


def _torch_prepare(w: "Workload", output: str) -> Prepared:
  import torch

  from hyset_jax.benchmarking import references
  device = "cuda" if torch.cuda.is_available() else "cpu"

  def call():
    out = references.torch_gather(w, device)
    if output == "best":
      out = torch.argmax(out, dim=1)
    if device == "cuda":
      torch.cuda.synchronize()
    return out

  peak, source = None, ""
  if device == "cuda":
    torch.cuda.reset_peak_memory_stats()
    call()
    peak, source = int(torch.cuda.max_memory_allocated()), "torch.cuda"
  return Prepared(call, None, peak, source, f"torch-{device}")


def prepare(impl: str, w: "Workload", measure_peak: bool = True,
            output: str = "scores") -> Prepared:
  """Ready ``impl`` for ``w``. Raises ``ImportError`` for torch when it is not installed."""
  from hyset_jax.benchmarking import references
  choices.check("stage-2 output", output, choices.STAGE2_OUTPUTS)
  if impl in JAX_METHODS:
    return _jax_prepare(JAX_METHODS[impl], w, output)
  if impl == "numpy":
    return _host_prepare(lambda: references.numpy_gather(w), measure_peak, output)
  if impl == "numpy-matmul":
    return _host_prepare(lambda: references.numpy_matmul(w), measure_peak, output)
  if impl == "naive":
    return _host_prepare(lambda: references.naive(w), False, output)
  if impl == "torch":
    if not references.torch_available():
      raise ImportError("torch not installed")
    return _torch_prepare(w, output)
  raise ValueError(f"unknown implementation {impl!r}; choose one of {', '.join(IMPLS)}")


def measure(impl: str, w: "Workload", repeats: int = 5, min_sample_s: float = 0.02,
            measure_peak: bool = True, output: str = "scores") -> Measurement:
  """Time ``impl`` on ``w`` (see the module docstring); torch missing, or the native kernel
  unable to run here (another backend, no compiler), gives status ``"not run: <why>"``."""
  settings = {**w.settings(), "output": output}
  try:
    p = prepare(impl, w, measure_peak, output)
  except (ImportError, UserError) as e:  # torch missing; the native kernel cannot run here
    return Measurement(impl, settings, status=f"not run: {e}")
  p.call()                                              # warm-up: first-call costs
  start = time.perf_counter()
  p.call()
  first = time.perf_counter() - start
  calls = max(1, min(1000, int(np.ceil(min_sample_s / max(first, 1e-6)))))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    for _ in range(calls):
      p.call()
    times.append((time.perf_counter() - start) / calls)
  return Measurement(impl, settings, method=p.method, times_s=times, calls_per_sample=calls,
                     compile_s=p.compile_s, peak_bytes=p.peak_bytes, peak_source=p.peak_source)
