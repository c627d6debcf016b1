"""An approximate first stage for very large tool libraries (opt-in per model; docs/speed.md,
"Approximate first stage").

Stage 1 and the complementarity expansion (Eq. 12-13) are both maximum-inner-product searches
over the N tool embeddings z_t:

- ℓ(x, t) = q(r)ᵀ P z_t = q̃ᵀ z_t with q̃ = Pᵀ q(r) (q the query tower);
- g(t) = max_{i∈S0} z_tᵀ M_M z_i = max_i k_iᵀ z_t with k_i = M_M z_i (row i of ``keyed[:, -1]``).

The exact path scans every tool for both (a [Q, d]×[d, N] product; the expansion reads a
neighbour table whose N²·d build is out of reach at N = 10⁶, else it scans too). Here one
faiss index over the rows of Z, searched by inner product, proposes candidates for both, and
everything that decides the answer is computed exactly on the candidates:

1. the index returns the C1 tools of largest q̃ᵀz_t (C1 = max(``candidates``, K_pool)); their ℓ
   is computed exactly from Z's rows, and S0 is the K1 best by (ℓ desc, row asc) — the exact
   path's top-K1 order;
2. the expansion's candidates: with ``expansion="index"`` each k_i, i ∈ S0, returns its
   ``neighbors`` tools of largest k_iᵀz_t from the index; with ``expansion="lowrank"`` one scan
   of every tool under M_M's rank-r factor proposes the ``expansion_candidates`` tools of
   largest g̃(t) = max_i k_iᵀ V_r V_rᵀ z_t (V_r: M_M's top-r right singular vectors, Z V_r kept
   beside the index — r·N floats, made on first use per M_M). The k_i point away from the
   tools (out of Z's distribution), which a graph or IVF search handles badly; a trained M_M's
   spectrum is concentrated (Seal-Tools: the top 32 of 384 singular values carry g's ranking),
   which the scan uses instead. Over those candidates, the other stage-1 candidates and
   K_pool fixed filler rows (0..K_pool−1: the expansion is never short of tools), g and ℓ are
   computed exactly, and the expansion is the K_pool − K1 best outside S0 by (g desc, ℓ desc,
   row asc) — the exact path's order;
3. stage 2 and the ranking run unchanged on the shortlist's exact ℓ (q̃ᵀz_t) and G_m.

What is approximate is only which tools are candidates: a tool of the exact shortlist that
the index (or the low-rank scan) does not propose is missed (the shortlist recall measured in
benchmarks/ann_first_stage.py). With ``index="flat"`` (faiss's exact inner-product scan) and
``expansion="index"`` (the default) the candidates are the true top ones, and the shortlist and
the best set are the exact path's up to float rounding (the tests check it; also for
``expansion="lowrank"`` at full rank with every tool a candidate). Z has unit rows (the model
format requires them), so the search is a cosine search over the library, whatever the query's
norm.

Not through the index (the exact path runs, same answers as without this module): a batch
with a tool filter (``QueryInputs.allowed``) or lexical scores (a model with the lexical term:
ℓ' = ℓ + β·b is not an inner product over Z). The searches run on the host, inside the compiled
program, through ``jax.pure_callback``.

Why faiss (faiss-cpu): measured at N = 10⁵ on this project's 2-core CPU (docs/speed.md), its
HNSW built the graph fastest of faiss, hnswlib and usearch (87 s against 124 s and 220 s, d = 256,
M = 32) at the same recall per search effort, and the one package also gives the exact scan
(``flat``) the tests compare with, IVF (``ivf``: measured against HNSW in
benchmarks/ann_first_stage.py, docs/speed.md), IVF over 8-bit codes (``ivf_sq8``: the same
lists, a quarter of the bytes per probe; at 10⁶ real + distractor tools ``ivf``'s quality
with stage 1 15.7× faster than the exact one at batch 1) and a documented serialisation.

The index is built once per (Z, index parameters) and cached like the neighbour table, keyed
by a hash of Z (:func:`load_or_build`, in :func:`neighbors.cache_dir_beside`'s folder).
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import sys
import threading
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hyset_jax.model import scoring

# Bump when what an index file holds changes for the same Z and parameters.
INDEX_VERSION = 1
INDEXES = ("hnsw_sq8", "hnsw", "ivf", "ivf_sq8", "flat")
# The IVF indexes (searched with nprobe; nlist k-means lists).
IVF_INDEXES = ("ivf", "ivf_sq8")
# Rows the 8-bit scalar quantiser's ranges are trained on (a seeded sample of Z).
SQ_TRAIN_ROWS = 100_000
# IVF: k-means over a seeded sample of IVF_TRAIN_PER_LIST rows per list (faiss's advice: 30-256),
# IVF_TRAIN_ITERATIONS iterations; at most N // IVF_TRAIN_PER_LIST lists (a small library).
IVF_TRAIN_PER_LIST = 40
IVF_TRAIN_ITERATIONS = 20
# Rows per faiss add() call while building (progress steps).
BUILD_CHUNK = 50_000
# Rows of Z V_r per product in the low-rank expansion's scan (a cache-sized block).
LOWRANK_CHUNK = 32_768
EXPANSIONS = ("index", "lowrank")


@dataclasses.dataclass(frozen=True)
class Settings:
  """The approximate first stage's parameters (a model's manifest ``first_stage`` object).

  Attributes:
    index: ``"hnsw_sq8"`` (faiss IndexHNSWSQ: an HNSW graph over 8-bit codes of Z, inner
      product — a quarter of Z's bytes, ~1.5× faster searches than full floats at the same
      recall, measured; the candidates are rescored exactly anyway), ``"hnsw"`` (IndexHNSWFlat,
      full floats), ``"ivf"`` (IndexIVFFlat: Z's rows in ``nlist`` k-means lists, a search
      scans the ``nprobe`` lists whose centroids have the largest inner product with the
      query, full floats), ``"ivf_sq8"`` (IndexIVFScalarQuantizer: the same lists over 8-bit
      codes of each row's residual from its list's centroid — a quarter of the bytes a probe
      reads; the ``candidates`` it returns are re-scored exactly from Z's rows, as every
      index's are) or ``"flat"`` (IndexFlatIP: an exact scan, for checking and small
      libraries).
    hnsw_m: HNSW graph degree M (links per node; memory N·M·8 bytes beside Z's copy).
    ef_construction: HNSW build effort (larger: better graph, slower build).
    ef_search: HNSW search effort per query vector (larger: higher recall, slower).
    nlist: IVF lists (k-means centroids; at most N // 40: a small library gets fewer).
    nprobe: IVF lists scanned per query vector (larger: higher recall, slower).
    expansion_effort: the search effort of the expansion's index searches (efSearch for
      HNSW, nprobe for IVF); 0: the stage-1 one (``ef_search`` / ``nprobe``).
    candidates: stage-1 candidates C1 the index returns per query (at least K_pool are).
    neighbors: tools the index returns per S0 member for the expansion (``expansion="index"``).
    expansion: how the expansion finds its candidates: ``"index"`` (each k_i searches the
      index) or ``"lowrank"`` (a scan of every tool under a rank-r factor of M_M: g̃(t) =
      max_i k_iᵀ V_r V_rᵀ z_t, V_r the top ``expansion_rank`` right singular vectors of M_M;
      the ``expansion_candidates`` best by g̃ are the candidates. No index search, no graph:
      the keys being out of Z's distribution costs it nothing; r·N floats beside Z, made
      when first needed, per M_M).
    expansion_rank: r of ``expansion="lowrank"`` (at most d).
    expansion_candidates: the candidates ``expansion="lowrank"`` proposes per query (S0
      members among them do not count).
  """
  index: str = "hnsw_sq8"
  hnsw_m: int = 32
  ef_construction: int = 40
  ef_search: int = 512
  nlist: int = 4096
  nprobe: int = 256
  expansion_effort: int = 0
  candidates: int = 128
  neighbors: int = 40
  expansion: str = "index"
  expansion_rank: int = 32
  expansion_candidates: int = 256

  def build_key(self) -> str:
    """What decides the built index (the search parameters do not)."""
    if self.index == "flat":
      return "flat"
    if self.index in IVF_INDEXES:
      return f"{self.index}/nlist{self.nlist}/iter{IVF_TRAIN_ITERATIONS}x{IVF_TRAIN_PER_LIST}"
    return f"{self.index}/m{self.hnsw_m}/efc{self.ef_construction}"

  def effort(self, expansion: bool = False) -> int:
    """The search effort (efSearch or nprobe) of stage 1's searches or the expansion's."""
    first = self.nprobe if self.index in IVF_INDEXES else self.ef_search
    return self.expansion_effort if expansion and self.expansion_effort else first

  def describe(self) -> str:
    ext = (f", expansion {'nprobe' if self.index in IVF_INDEXES else 'efSearch'}="
           f"{self.expansion_effort}" if self.expansion_effort else "")
    if self.expansion == "lowrank":
      ext = (f", expansion by a rank-{self.expansion_rank} scan of M_M's factor "
             f"({self.expansion_candidates} candidates)")
    if self.index == "flat":
      return "flat (exact inner-product scan)" + ext
    if self.index in IVF_INDEXES:
      codes = "SQ8 (8-bit residual codes)" if self.index == "ivf_sq8" else "Flat"
      return f"IVF-{codes}, nlist={self.nlist}, nprobe={self.nprobe}{ext}"
    codes = ", 8-bit codes" if self.index == "hnsw_sq8" else ""
    return (f"HNSW{codes}, M={self.hnsw_m}, efConstruction={self.ef_construction}, "
            f"efSearch={self.ef_search}{ext}")


def settings(first_stage: dict | None, override: str | None = None) -> Settings | None:
  """The first stage to run: None for the exact path, else the ANN's :class:`Settings`.

  Args:
    first_stage: a model's recorded choice (``ModelDir.first_stage``: None = exact, else the
      validated manifest object ``{"kind": "ann", ...parameters}``).
    override: ``"exact"`` or ``"ann"`` from the command line (None: the model's); ``"ann"`` on a
      model that records none uses the default parameters.
  """
  if override == "exact" or (override is None and first_stage is None):
    return None
  params = {k: v for k, v in (first_stage or {}).items() if k != "kind"}
  return Settings(**params)


# --------------------------------------------------------------------------- the index


_BLAS = None


def _one_blas_thread():
  """A context with NumPy's BLAS on one thread: inside a compiled program's host callback its
  threads fight XLA's own (measured at N = 2·10⁵, batch 1: the shortlist with the low-rank scan
  164 ms with BLAS's 2 threads, 39 ms with one)."""
  global _BLAS
  from threadpoolctl import ThreadpoolController
  if _BLAS is None:
    _BLAS = ThreadpoolController()
  return _BLAS.limit(limits=1, user_api="blas")


class Index:
  """A faiss index over Z's rows, searched by inner product from inside a compiled program.

  Hashed by identity: it is a static argument of the compiled prediction (one compilation per
  index object, as per prepared model).
  """

  def __init__(self, index: Any, settings: Settings, num_tools: int, dim: int,
               build_s: float | None = None, z: np.ndarray | None = None):
    self.index = index
    self.settings = settings
    self.num_tools = num_tools
    self.dim = dim
    self.build_s = build_s  # seconds the build took; None when read from the cache
    self.z = z  # Z f32[N, d] (for expansion="lowrank"; None: only the index's searches)
    self._factors: dict = {}  # M_M's fingerprint -> (V_r f32[d, r], Z V_r f32[N, r])
    self._lock = threading.Lock()

  def lowrank_factor(self, mm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(V_r, Z V_r) for M_M f32[d, d]: V_r its top-r right singular vectors (r =
    ``expansion_rank``), made on first use and kept per M_M (a model's M_M for each M)."""
    mm = np.ascontiguousarray(mm, np.float32)
    key = hashlib.blake2b(mm.tobytes(), digest_size=16).hexdigest()
    with self._lock:
      if key not in self._factors:
        if self.z is None:
          raise ValueError("expansion='lowrank' needs the Index to hold Z (ann.build does)")
        r = min(self.settings.expansion_rank, self.dim)
        _, _, vt = np.linalg.svd(mm.astype(np.float64))
        vr = np.ascontiguousarray(vt[:r].T, np.float32)
        self._factors[key] = (vr, np.ascontiguousarray(self.z @ vr))
      return self._factors[key]

  def lowrank_search(self, keyed: np.ndarray, mm: np.ndarray, k: int) -> np.ndarray:
    """int32[Q, k]: per query, the k rows of largest g̃(t) = max_i (V_rᵀ k_i)ᵀ(V_rᵀ z_t) over
    its keys f32[Q, K1, d] (rows z_iᵀ M_M), best first (k is capped at N; -1 past it)."""
    vr, y = self.lowrank_factor(mm)
    with _one_blas_thread():
      return self._lowrank_scan(np.asarray(keyed, np.float32) @ vr, y, k)

  def _lowrank_scan(self, proj: np.ndarray, y: np.ndarray, k: int) -> np.ndarray:
    """The scan of :meth:`lowrank_search` for proj = V_rᵀ k_i f32[Q, K1, r]."""
    n = self.num_tools
    kk = min(k, n)
    out = np.full((proj.shape[0], k), -1, np.int32)
    g = np.empty(n, np.float32)
    block = np.empty((proj.shape[1], min(LOWRANK_CHUNK, n)), np.float32)   # [K1, chunk]
    for q in range(proj.shape[0]):
      for s in range(0, n, LOWRANK_CHUNK):  # g̃ of a block of tools: [K1, r] × [r, chunk], max
        m = min(LOWRANK_CHUNK, n - s)
        np.matmul(proj[q], y[s:s + m].T, out=block[:, :m])
        np.maximum.reduce(block[:, :m], axis=0, out=g[s:s + m])
      top = np.argpartition(-g, kk - 1)[:kk] if kk < n else np.arange(n)
      out[q, :kk] = top[np.argsort(-g[top], kind="stable")]
    return out

  def search(self, x: np.ndarray, k: int, expansion: bool = False) -> np.ndarray:
    """int32[..., k]: per vector of f32[..., d], the k rows of largest inner product, best
    first; -1 where the index found fewer (k is capped at N). ``expansion``: with the
    expansion's search effort (:meth:`Settings.effort`)."""
    x = np.asarray(x, np.float32)
    flat = np.ascontiguousarray(x.reshape(-1, self.dim))
    kk = min(k, self.num_tools)
    effort = self.settings.effort(expansion)
    if self.settings.index in IVF_INDEXES:
      import faiss
      # Fewer vectors than faiss's threads (batch 1): each vector's lists split over the
      # threads (parallel_mode 1; measured at N = 10⁶, nprobe 256, 2 cores: 5.2 -> 2.9 ms per
      # query with 8-bit codes, 8.3 -> 5.5 ms with floats), else the vectors do (0). A
      # runtime field, not in the file; a concurrent search setting it otherwise only costs
      # speed.
      self.index.parallel_mode = 1 if len(flat) < faiss.omp_get_max_threads() else 0
      _, ids = self.index.search(flat, kk, params=faiss.SearchParametersIVF(nprobe=effort))
    elif self.settings.index != "flat":
      import faiss
      params = faiss.SearchParametersHNSW(efSearch=max(effort, kk))
      _, ids = self.index.search(flat, kk, params=params)
    else:
      _, ids = self.index.search(flat, kk)
    ids = ids.astype(np.int32)
    if kk < k:
      ids = np.concatenate([ids, np.full((ids.shape[0], k - kk), -1, np.int32)], axis=1)
    return ids.reshape(x.shape[:-1] + (k,))


def _new_index(settings: Settings, z: np.ndarray):
  import faiss
  dim = z.shape[1]
  if settings.index == "flat":
    return faiss.IndexFlatIP(dim)
  if settings.index in IVF_INDEXES:
    nlist = max(1, min(settings.nlist, len(z) // IVF_TRAIN_PER_LIST))
    if settings.index == "ivf":
      index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
    else:  # the same k-means lists (same sample and seed); per-dimension 8-bit ranges
      # trained on the sample's residuals (a row's code is its residual from its centroid:
      # at N = 10⁶ as fast as codes of the rows themselves, measured, and finer)
      index = faiss.IndexIVFScalarQuantizer(faiss.IndexFlatIP(dim), dim, nlist,
                                            faiss.ScalarQuantizer.QT_8bit,
                                            faiss.METRIC_INNER_PRODUCT, True)
    index.cp.niter = IVF_TRAIN_ITERATIONS
    index.cp.seed = 1234
    rows = np.random.default_rng(0).permutation(len(z))[:nlist * IVF_TRAIN_PER_LIST]
    index.train(z[np.sort(rows)])
    return index
  if settings.index == "hnsw":
    index = faiss.IndexHNSWFlat(dim, settings.hnsw_m, faiss.METRIC_INNER_PRODUCT)
  else:
    index = faiss.IndexHNSWSQ(dim, faiss.ScalarQuantizer.QT_8bit, settings.hnsw_m,
                              faiss.METRIC_INNER_PRODUCT)
    rows = np.random.default_rng(0).permutation(len(z))[:SQ_TRAIN_ROWS]
    index.train(z[np.sort(rows)])
  index.hnsw.efConstruction = settings.ef_construction
  return index


def build(z: np.ndarray, settings: Settings, progress: bool = False) -> Index:
  """The index over ``z`` (f32[N, d], unit rows), added in chunks of :data:`BUILD_CHUNK` rows
  (a progress bar with ``progress``)."""
  if settings.index not in INDEXES:
    raise ValueError(f"ANN parameter 'index' must be one of {', '.join(INDEXES)}, got "
                     f"{settings.index!r}")
  if settings.expansion not in EXPANSIONS:
    raise ValueError(f"ANN parameter 'expansion' must be one of {', '.join(EXPANSIONS)}, got "
                     f"{settings.expansion!r}")
  z = np.ascontiguousarray(np.asarray(z, np.float32))
  n, dim = z.shape
  start = time.perf_counter()
  index = _new_index(settings, z)
  starts = range(0, n, BUILD_CHUNK)
  if progress:
    from tqdm import tqdm
    print(f"building the ANN index over {n:,} tools ({settings.describe()}); cached for "
          f"the next run", file=sys.stderr)
    starts = tqdm(starts, desc="ANN index", unit="chunk", file=sys.stderr)
  for s in starts:
    index.add(z[s:s + BUILD_CHUNK])
  return Index(index, settings, n, dim, time.perf_counter() - start, z)


def fingerprint(z: np.ndarray, settings: Settings) -> str:
  """A hex sha256 of (Z, the build parameters, the index version): what decides the index."""
  h = hashlib.sha256(f"hyset-ann/{INDEX_VERSION}/{settings.build_key()}".encode())
  a = np.ascontiguousarray(z, np.float32)
  h.update(str(a.shape).encode())
  h.update(a.tobytes())
  return h.hexdigest()


def cache_path(cache_dir: str | os.PathLike, z: np.ndarray, settings: Settings) -> pathlib.Path:
  return pathlib.Path(cache_dir) / f"ann-{fingerprint(z, settings)[:32]}.faiss"


def load_or_build(z, settings: Settings, cache_dir: str | os.PathLike | None = None,
                  progress: bool = False) -> Index:
  """The index for (Z, ``settings``): read from ``cache_dir/ann-<hash>.faiss`` when present,
  else built (and written there when ``cache_dir`` is given). An unreadable file, or one of
  another size, is rebuilt, never trusted."""
  z = np.asarray(z, np.float32)
  n, dim = z.shape
  if cache_dir is None:
    return build(z, settings, progress)
  import faiss
  path = cache_path(cache_dir, z, settings)
  if path.is_file():
    try:
      index = faiss.read_index(str(path))
      if index.ntotal == n and index.d == dim and index.metric_type == faiss.METRIC_INNER_PRODUCT:
        return Index(index, settings, n, dim, z=z)
    except RuntimeError:  # faiss's error for a damaged or foreign file
      pass
  built = build(z, settings, progress)
  from hyset_jax import io_utils
  from hyset_jax.errors import UserError
  try:
    io_utils.ensure_writable_dir(path.parent, "ANN index cache folder")
    with io_utils.atomic_write(path, "wb") as f:
      faiss.write_index(built.index, faiss.PyCallbackIOWriter(f.write))
  except UserError as e:  # a cache that cannot be written only costs a rebuild next time
    print(f"warning: ANN index not cached ({e})", file=sys.stderr)
  return built


# --------------------------------------------------------------------------- the shortlist


def _search(index: Index, x: jax.Array, k: int, expansion: bool = False) -> jax.Array:
  """int32[..., k] from the host index (inside a compiled program)."""
  shape = jax.ShapeDtypeStruct(x.shape[:-1] + (k,), jnp.int32)
  search = ((lambda a: index.search(a, k, expansion=True)) if expansion else
            (lambda a: index.search(a, k)))
  return jax.pure_callback(search, shape, x.astype(jnp.float32), vmap_method="sequential")


def _first_only(rows: jax.Array) -> jax.Array:
  """bool[Q, C]: True at the first occurrence of each row value in its query's row."""
  q, c = rows.shape
  pos = jnp.broadcast_to(jnp.arange(c, dtype=jnp.int32), (q, c))
  srt, perm = jax.lax.sort((rows, pos), dimension=1, num_keys=2)
  first = jnp.concatenate([jnp.ones((q, 1), bool), srt[:, 1:] != srt[:, :-1]], axis=1)
  return jnp.zeros((q, c), bool).at[jnp.arange(q)[:, None], perm].set(first)


class Stage1(NamedTuple):
  """Stage 1 through the index: ``query`` f32[Q, d_z] = Pᵀ q(r) (ℓ(x, t) = query·z_t); ``s0``
  int32[Q, K1] and ``logits`` f32[Q, K1] their exact ℓ, best first; ``rest`` int32[Q, C] the
  other candidates by ℓ (N where none)."""
  query: jax.Array
  s0: jax.Array
  logits: jax.Array
  rest: jax.Array


def stage1(index: Index, prep, embedding: jax.Array, k1: int, k_pool: int) -> Stage1:
  """Step 1 of the module docstring: the index's candidates and the filler rows 0..K_pool−1,
  scored exactly; S0 the K1 best by (ℓ desc, row asc)."""
  params = prep.params
  z = params.tool_embeddings                                             # [N, d_z]
  n = z.shape[0]
  q = scoring.query_tower(params.tower, embedding) @ params.projection   # [Q, d_z]
  fill = jnp.broadcast_to(jnp.arange(k_pool, dtype=jnp.int32), (q.shape[0], k_pool))
  cand = jnp.concatenate([_search(index, q, max(index.settings.candidates, k_pool)), fill], 1)
  ok = (cand >= 0) & _first_only(cand)
  rows = jnp.maximum(cand, 0)
  ell = jnp.where(ok, jnp.einsum("qd,qcd->qc", q, z[rows]), -jnp.inf)
  neg, rows = jax.lax.sort((-ell, jnp.where(ok, rows, n)), dimension=1, num_keys=2)
  return Stage1(q, rows[:, :k1], -neg[:, :k1], rows[:, k1:])


def shortlist(index: Index, prep, embedding: jax.Array, k1: int, k_pool: int
              ) -> tuple[jax.Array, jax.Array]:
  """Stage 1 and the expansion through the index (see the module docstring).

  Args:
    index: the ANN index over ``prep.params.tool_embeddings``.
    prep: the :class:`hyset_jax.inference.pipeline.PreparedModel` (θ and ``keyed``).
    embedding: f32[Q, d_r] query embeddings (no lexical term, no filter).
    k1, k_pool: K1, K_pool.

  Returns:
    (tools int32[Q, K_pool] in shortlist order, their ℓ f32[Q, K_pool]).
  """
  z = prep.params.tool_embeddings
  n = z.shape[0]
  q, s0, s0_ell, rest = stage1(index, prep, embedding, k1, k_pool)
  # The expansion: the other stage-1 candidates (fillers included) and each S0 member's
  # neighbours, with exact g and ℓ.
  keyed = prep.keyed[s0, -1].astype(jnp.float32)                         # [Q, K1, d_z]
  if index.settings.expansion == "lowrank":
    k = index.settings.expansion_candidates + k1
    near = jax.pure_callback(lambda a, mm: index.lowrank_search(a, mm, k),
                             jax.ShapeDtypeStruct((q.shape[0], k), jnp.int32), keyed,
                             prep.params.interactions[-1].astype(jnp.float32),
                             vmap_method="sequential")
  else:
    near = _search(index, keyed, index.settings.neighbors, expansion=True)
    near = near.reshape(q.shape[0], -1)
  cand = jnp.concatenate([rest, near], axis=1)
  ok = (cand >= 0) & (cand < n) & _first_only(cand)
  ok &= ~jnp.any(cand[:, :, None] == s0[:, None, :], axis=-1)
  rows = jnp.clip(cand, 0, n - 1)
  zc = z[rows]                                                           # [Q, C, d_z]
  g = jnp.where(ok, jnp.max(jnp.einsum("qkd,qcd->qck", keyed, zc), axis=-1), -jnp.inf)
  ell = jnp.where(ok, jnp.einsum("qd,qcd->qc", q, zc), -jnp.inf)
  neg_g, neg_l, rows = jax.lax.sort((-g, -ell, jnp.where(ok, rows, n)), dimension=1,
                                    num_keys=3)
  n_ext = k_pool - k1
  tools = jnp.concatenate([s0, rows[:, :n_ext]], axis=1).astype(jnp.int32)
  return tools, jnp.concatenate([s0_ell, -neg_l[:, :n_ext]], axis=1)


# --------------------------------------------------------------------------- for a model


def for_model(params, settings: Settings | None, *, cache_dir=None, progress: bool = False,
              filtered: bool = False, log=lambda msg: print(msg, file=sys.stderr)
              ) -> Index | None:
  """The index a model's queries run with under ``settings`` (:func:`settings`), or None for
  the exact path: no settings, a model with the lexical term, or ``filtered`` (every query
  has a tool filter) — the last two say so through ``log``, since the model asked for the
  ANN."""
  if settings is None:
    return None
  if params.lexical_weight is not None or filtered:
    why = ("the model has the lexical term (ℓ + β·BM25 is not an inner product over Z)"
           if params.lexical_weight is not None else "the queries have a tool filter")
    log(f"note: first stage exact, not ann: {why}")
    return None
  return load_or_build(params.tool_embeddings, settings, cache_dir, progress)
