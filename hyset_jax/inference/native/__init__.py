"""Native CPU kernels of inference, called from JAX programs through the XLA FFI.

- ``subsets.cc`` (stage 2, Eq. 14): every subset of a K-tool shortlist scored by a depth-first
  walk over the subsets, a group of 16 queries at a time with queries on the vector lanes, over
  XLA's intra-op thread pool; the best set per query (:func:`best_rows`: subtrees whose
  bound cannot beat a set already scored are skipped, exactly) or every score
  (:func:`subset_scores`), with the scores of :mod:`hyset_jax.inference.enumeration`'s forms to
  float rounding and the same ties (and the best set's score bit for bit its entry among every
  score). Why: XLA:CPU cannot express the fast form (the walk's state stays in L1; XLA writes
  each level of subsets to memory and gathers it back), measured in docs/speed.md.
- ``expansion.cc`` (Eq. 13): :func:`hyset_jax.inference.neighbors.expand` from the neighbour
  table, one query at a time (:func:`expand`): the same picks and boundary ties, without XLA's
  few dozen small reductions per batch; ℓ as [Q, N] or ℓᵀ [N, Q] (``by_tool``).
- ``pairs.cc`` (Eq. 3): a shortlist's pair matrices G_m from the prepared Z M_m rows
  (:func:`pair_matrices`), the upper triangle computed and mirrored (M_m is symmetric).
- ``greedy.cc``: the paper's greedy ranking of the shortlist (:func:`greedy_ranking`, what
  ``rankings.rank_tools(..., "greedy")`` returns), one query at a time.
- ``topk.cc`` (Eq. 12): stage 1's K1 tools of largest ℓ (:func:`top_k`, ``jax.lax.top_k``'s
  indices and order), a row per thread, one pass over it against the current K-th key; or, from
  ℓᵀ [N, Q] (``by_tool``, a small batch's layout), 16 queries per task.

Build: the first use on a machine compiles the sources with the system C++ compiler (``$CXX``,
else ``c++``, ``g++`` or ``clang++``; C++17 with GCC ≥ 12 or Clang, for
``__builtin_shufflevector``) against JAX's FFI headers (``jax.ffi.include_dir()``), with
``-O3 -march=native``, into ``$HYSET_CACHE/native/<key>/`` (``~/.cache/hyset_jax/native``);
the key hashes the sources, the flags, the compiler's version, the jaxlib version and the CPU's
model and flags, so a changed source or another machine builds anew. The build takes a few
seconds; it is written to a temporary file and renamed, so concurrent first uses do not
collide. A failed build is not retried in the same process.

Where it runs: the CPU backend only, for K ≤ 62 and at most 1 GiB of working memory per thread
(:func:`fits`). :func:`available` tells whether it can run here (and
:func:`unavailable_reason` why not); ``method="auto"`` (:func:`enumeration.resolve_method`)
picks it when it can and the gather form otherwise. Not differentiable: training uses the JAX
forms.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import pathlib
import platform
import shutil
import subprocess
import tempfile
import threading

import jax
import jax.numpy as jnp

from hyset_jax.errors import UserError
from hyset_jax.inference.subsets import count_subsets

SOURCES = tuple(pathlib.Path(__file__).with_name(f)
                for f in ("subsets.cc", "expansion.cc", "pairs.cc", "greedy.cc", "topk.cc"))
HEADERS = (pathlib.Path(__file__).with_name("parallel.h"),)
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-ffp-contract=off")
# Queries scored together (kLanes in subsets.cc): one per vector lane.
LANES = 16

_lock = threading.Lock()
_state: dict = {}          # "library": path once registered; "error": why it cannot run


def _compiler() -> str:
  """``$CXX`` when set (it must exist), else the first of c++, g++, clang++ on the PATH."""
  if os.environ.get("CXX"):
    found = shutil.which(os.environ["CXX"])
    if found is None:
      raise RuntimeError(f"$CXX is {os.environ['CXX']!r}, which is not an executable")
    return found
  for name in ("c++", "g++", "clang++"):
    if shutil.which(name):
      return shutil.which(name)
  raise RuntimeError("no C++ compiler found (set $CXX, or install g++ or clang++)")


def _cpu_signature() -> str:
  """The CPU's model and feature flags: -march=native code is only valid on such a CPU."""
  model, flags = platform.machine(), ""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        key = line.split(":", 1)[0].strip()
        if key == "model name" and not model.endswith("|"):
          model += "|" + line.split(":", 1)[1].strip()
        elif key in ("flags", "Features") and not flags:
          flags = line.split(":", 1)[1].strip()
  except OSError:
    pass
  return model + "|" + flags


def cache_dir() -> pathlib.Path:
  """``$HYSET_CACHE/native`` when set, else ``~/.cache/hyset_jax/native``."""
  root = os.environ.get("HYSET_CACHE") or "~/.cache/hyset_jax"
  return pathlib.Path(root).expanduser() / "native"


def _build_key(cxx: str) -> str:
  import jaxlib
  version = subprocess.run([cxx, "--version"], capture_output=True, text=True,
                           timeout=60).stdout
  digest = hashlib.sha256()
  parts = [f.read_bytes() for f in SOURCES + HEADERS]
  for part in (*parts, " ".join(FLAGS).encode(), version.encode(), jaxlib.__version__.encode(),
               _cpu_signature().encode()):
    digest.update(part)
    digest.update(b"\0")
  return digest.hexdigest()[:20]


def build(force: bool = False) -> pathlib.Path:
  """Compile the kernel library (or find it in the cache); its path. Raises RuntimeError with
  the compiler's message when it cannot be built."""
  cxx = _compiler()
  target = cache_dir() / _build_key(cxx) / "libhyset_subsets.so"
  if target.exists() and not force:
    return target
  target.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
  os.close(fd)
  try:
    cmd = [cxx, *FLAGS, "-I", jax.ffi.include_dir(), *map(str, SOURCES), "-o", tmp]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
      raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr.strip()[-2000:]}")
    os.replace(tmp, target)
  finally:
    if os.path.exists(tmp):
      os.unlink(tmp)
  return target


def _register() -> None:
  """Build, load and register the FFI targets once per process; records why on failure."""
  with _lock:
    if _state:
      return
    try:
      path = build()
      lib = ctypes.cdll.LoadLibrary(str(path))
      for name, symbol in (("hyset_best_subset", lib.HysetBestSubset),
                           ("hyset_subset_scores", lib.HysetSubsetScores),
                           ("hyset_expand", lib.HysetExpand),
                           ("hyset_pair_matrices", lib.HysetPairMatrices),
                           ("hyset_greedy_ranking", lib.HysetGreedyRanking),
                           ("hyset_top_k", lib.HysetTopK)):
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(symbol), platform="cpu")
      _state["library"] = path
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
      _state["error"] = str(e)


def unavailable_reason() -> str | None:
  """None when the kernel can run on the default backend; otherwise why not."""
  if jax.default_backend() != "cpu":
    return f"the native kernel runs on the CPU backend only (this is {jax.default_backend()})"
  _register()
  if "error" in _state:
    return f"the native kernel could not be built: {_state['error']}"
  return None


def available() -> bool:
  """Whether the kernels (:func:`best_rows`, :func:`subset_scores`, :func:`expand`,
  :func:`pair_matrices`, :func:`greedy_ranking`, :func:`top_k`) can run here."""
  return unavailable_reason() is None


def require() -> None:
  """Raise a UserError saying why the kernel cannot run, if it cannot."""
  why = unavailable_reason()
  if why is not None:
    raise UserError(f"{why}; choose another --method (gather runs everywhere)")


# Working memory one thread of the stage-2 kernel may take (its tables and the walk's state for
# 16 queries, 0.12 MB at K = 20, M = 5, and with every score the group's [n][16] scores, 1.4 MB more).
SCRATCH_LIMIT_BYTES = 1 << 30
MAX_POOL = 62  # kMaxPool in subsets.cc (its binomial table); the other kernels take up to 64
MAX_TOP_K = 64  # kMaxK in topk.cc


def scratch_bytes(k: int, max_size: int, all_scores: bool) -> int:
  """Bytes of per-thread working memory the stage-2 kernel needs for (K, M) (Scratch in
  subsets.cc)."""
  pairs = k * (k - 1) // 2
  # ℓ, the two softmax tables, G_m, the walk's state, the bounds' column and triangle maxima,
  # slack and floor; the order in both layouts.
  floats = LANES * (k + 2 * pairs + (max_size - 1) * pairs
                    + max_size * (max_size + 1) * (1 + k) + (2 * k + 1) + 2)
  ints = 2 * LANES * k
  return 4 * (floats + ints + (count_subsets(k, max_size) * LANES if all_scores else 0))


def _check(logits: jax.Array, pairs: jax.Array, all_scores: bool = False) -> tuple[int, int]:
  q, k = logits.shape
  if pairs.shape[0] != q or pairs.shape[2:] != (k, k) or pairs.shape[1] < 1:
    raise ValueError(f"expected logits [Q, K] and pairs [Q, M−1, K, K], got {logits.shape} "
                     f"and {pairs.shape}")
  _check_fits(k, pairs.shape[1] + 1, all_scores)
  return q, k


def _check_fits(k: int, max_size: int, all_scores: bool = False) -> None:
  if k > MAX_POOL:
    raise UserError(f"K_pool = {k} is beyond the native kernel (K ≤ {MAX_POOL}); use --method "
                    "gather")
  n = count_subsets(k, max_size)
  if n >= 2 ** 31:
    raise UserError(f"K_pool = {k}, M = {max_size} is beyond the native kernel: {n} subsets, "
                    "over its int32 rows; use --method gather")
  if not fits(k, max_size, all_scores):
    raise UserError(f"K_pool = {k}, M = {max_size} is beyond the native kernel: it needs "
                    f"{scratch_bytes(k, max_size, all_scores) >> 20} MiB of working memory per "
                    f"thread, over its {SCRATCH_LIMIT_BYTES >> 20} MiB; use --method gather")


def _ffi(name: str, result):
  """The FFI call of one kernel (building and registering them first), batched by vmap one
  element at a time."""
  require()
  return jax.ffi.ffi_call(name, result, vmap_method="sequential")


def fits(k: int, max_size: int, all_scores: bool = False) -> bool:
  """Whether the kernels take a shortlist of K tools and sets of up to M (``auto`` runs the
  gather form otherwise)."""
  return (k <= MAX_POOL and count_subsets(k, max_size) < 2 ** 31   # rows are int32
          and scratch_bytes(k, max_size, all_scores) <= SCRATCH_LIMIT_BYTES)


def best_rows(logits: jax.Array, pairs: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The best subset per query.

  Args:
    logits: f32[Q, K] ℓ of the shortlist; pairs: f32[Q, M−1, K, K] G_m.

  Returns:
    (best F f32[Q], its row in ``subsets.subset_table(K, M)`` int32[Q], the ascending-ℓ
    order int32[Q, K] that the row's members index), as the gather and colex forms report.
  """
  q, k = _check(logits, pairs)
  call = _ffi("hyset_best_subset",
              (jax.ShapeDtypeStruct((q,), jnp.float32), jax.ShapeDtypeStruct((q,), jnp.int32),
               jax.ShapeDtypeStruct((q, k), jnp.int32)))
  return call(logits.astype(jnp.float32), pairs.astype(jnp.float32))


def subset_scores(logits: jax.Array, pairs: jax.Array, n: int) -> tuple[jax.Array, jax.Array]:
  """Every subset's F, f32[Q, n] in table order (n = Σ C(K, m)), and the ascending-ℓ order
  int32[Q, K] (``SubsetScores.positions``). Arguments as :func:`best_rows`."""
  q, k = _check(logits, pairs, all_scores=True)
  call = _ffi("hyset_subset_scores",
              (jax.ShapeDtypeStruct((q, n), jnp.float32), jax.ShapeDtypeStruct((q, k), jnp.int32)))
  return call(logits.astype(jnp.float32), pairs.astype(jnp.float32))


def expand(ids: jax.Array, scores: jax.Array, logits: jax.Array, s0: jax.Array,
           n_ext: int, by_tool: bool = False) -> tuple[jax.Array, jax.Array]:
  """:func:`hyset_jax.inference.neighbors.expand` as a native kernel: the same (extra
  int32[Q, n_ext], tie bool[Q]) from the table (ids int32[N, W], scores f32[N, W]), ℓ f32[Q, N]
  (``by_tool``: ℓᵀ f32[N, Q]) and S0 int32[Q, K1]."""
  q = s0.shape[0]
  call = _ffi("hyset_expand",
              (jax.ShapeDtypeStruct((q, n_ext), jnp.int32), jax.ShapeDtypeStruct((q,), jnp.int32)))
  extra, tie = call(ids.astype(jnp.int32), scores.astype(jnp.float32),
                    logits.astype(jnp.float32), s0.astype(jnp.int32), by_tool=bool(by_tool))
  return extra, tie.astype(bool)


def pair_matrices(keyed: jax.Array, z: jax.Array, tools: jax.Array) -> jax.Array:
  """G_m[a, c] = (z_a M_m)·z_c of each shortlist, f32[Q, M−1, K, K], from keyed f32[N, M−1, d]
  (row t: z_tᵀ M_m, the prepared model's), Z f32[N, d] and the shortlists int32[Q, K]. Exactly
  symmetric (the upper triangle is computed and mirrored; M_m is symmetric)."""
  q, k = tools.shape
  _check_fits(k, 2)
  call = _ffi("hyset_pair_matrices",
              jax.ShapeDtypeStruct((q, keyed.shape[1], k, k), jnp.float32))
  return call(keyed.astype(jnp.float32), z.astype(jnp.float32), tools.astype(jnp.int32))


def greedy_ranking(logits: jax.Array, pairs: jax.Array) -> jax.Array:
  """``rankings.rank_tools(logits, pairs, _, "greedy", M)`` as a native kernel: int32[Q, K]
  shortlist positions, the M greedy picks then the rest by descending ℓ (ties in shortlist
  order), from ℓ f32[Q, K] and G_m f32[Q, M−1, K, K]."""
  q, k = logits.shape
  _check_fits(k, 2)
  call = _ffi("hyset_greedy_ranking", jax.ShapeDtypeStruct((q, k), jnp.int32))
  return call(logits.astype(jnp.float32), pairs.astype(jnp.float32))


def top_k(x: jax.Array, k: int, by_tool: bool = False) -> jax.Array:
  """The indices of ``jax.lax.top_k(x, k)``, int32[Q, k], as a native kernel: the k largest of
  each row of x f32[Q, N] in descending order, ties to the lower index, floats ordered as XLA
  orders them (-0.0 below +0.0, NaN above +inf). k ≤ :data:`MAX_TOP_K` and ≤ N.
  ``by_tool``: x is f32[N, Q] and the answer ``jax.lax.top_k(x.T, k)``'s, without the transpose."""
  q, n = x.shape[::-1] if by_tool else x.shape
  if not 1 <= k <= min(MAX_TOP_K, n):
    raise ValueError(f"the native top-k takes 1 ≤ k ≤ min({MAX_TOP_K}, N = {n}), got k = {k}")
  call = _ffi("hyset_top_k", jax.ShapeDtypeStruct((q, k), jnp.int32))
  return call(x.astype(jnp.float32), by_tool=bool(by_tool))
