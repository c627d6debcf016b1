"""Random enumeration workloads and the floating-point work they need.

A workload is what stage 2 (paper Eq. 14) receives for a batch of queries. With ``dim = 0`` it
is the shortlist's ℓ (f32[Q, K]) and pair matrices G_m (f32[Q, M−1, K, K]): the timed work is
the enumeration alone. With ``dim = d > 0`` it is the projected query rP (f32[Q, d]), the
shortlist's tool embeddings Z_S (f32[Q, K, d]) and M_2..M_M (f32[M−1, d, d]); the timed work
then also builds ℓ = Z_S (rP) and G_m = Z_S M_m Z_Sᵀ as :func:`scoring.pair_matrices` does.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from hyset_jax.inference import subsets


@dataclasses.dataclass(frozen=True)
class Workload:
  k_pool: int
  max_size: int
  batch: int
  dim: int
  seed: int
  logits: np.ndarray                  # f32[Q, K]
  pairs: np.ndarray                   # f32[Q, M−1, K, K]
  query: np.ndarray | None = None     # f32[Q, d]      (dim > 0)
  tools: np.ndarray | None = None     # f32[Q, K, d]   (dim > 0)
  interactions: np.ndarray | None = None  # f32[M−1, d, d] (dim > 0)

  @property
  def n_subsets(self) -> int:
    return subsets.count_subsets(self.k_pool, self.max_size)

  def settings(self) -> dict:
    return {"k_pool": self.k_pool, "max_size": self.max_size, "batch": self.batch,
            "dim": self.dim, "seed": self.seed, "n_subsets": self.n_subsets}


def make_workload(k_pool: int = 20, max_size: int = 5, batch: int = 1024, dim: int = 0,
                  seed: int = 0) -> Workload:
  """Random inputs on the scale of a trained model: unit tool rows, ℓ of order 1, G_m of
  order 0.1 (symmetric), so no size dominates and the argmax varies across queries."""
  subsets.validate_sizes(k_pool, max_size)
  if batch < 1 or dim < 0:
    raise ValueError(f"batch must be ≥ 1 and dim ≥ 0, got {batch}, {dim}")
  rng = np.random.default_rng(seed)
  if dim == 0:
    logits = rng.normal(size=(batch, k_pool)).astype(np.float32)
    g = rng.normal(scale=0.1, size=(batch, max_size - 1, k_pool, k_pool)).astype(np.float32)
    return Workload(k_pool, max_size, batch, 0, seed, logits, (g + g.transpose(0, 1, 3, 2)) / 2)
  tools = rng.normal(size=(batch, k_pool, dim)).astype(np.float32)
  tools /= np.linalg.norm(tools, axis=-1, keepdims=True)
  query = rng.normal(size=(batch, dim)).astype(np.float32)
  query /= np.linalg.norm(query, axis=-1, keepdims=True)
  m = rng.normal(scale=0.1, size=(max_size - 1, dim, dim)).astype(np.float32)
  m = (m + m.transpose(0, 2, 1)) / 2
  logits = np.einsum("qkd,qd->qk", tools, query)
  # One BLAS matmul per M_m over all Q·K rows (einsum over the 4 operands is far slower).
  keyed = np.stack([(tools.reshape(-1, dim) @ mm).reshape(batch, k_pool, dim) for mm in m], 1)
  pairs = np.matmul(keyed, np.swapaxes(tools, 1, 2)[:, None]).astype(np.float32)
  return Workload(k_pool, max_size, batch, dim, seed, logits, pairs, query, tools, m)


def min_flops_per_query(k_pool: int, max_size: int) -> int:
  """Floating-point operations per query of the cheapest exact schedule we know.

  That is the colex recurrence of :func:`gather_colex._colex_query_last`, counting an FMA as 2:
  per subset of size ≥ 2, two FMAs for the softmax sums, a division and an add (6); per subset
  of size k ≥ 3 and each cardinality m ≥ k still being summed, two adds for the pair sums.
  Singletons and pairs read their scores straight from ℓ and G_m. Preparation (sorting K
  logits, K² exponentials) is O(K²) and left out.

  >>> min_flops_per_query(20, 5)
  187302
  """
  n = subsets.count_subsets(k_pool, max_size)
  align = 6 * (n - k_pool)
  pairs = sum(2 * math.comb(k_pool, k) * (max_size - k + 1) for k in range(3, max_size + 1))
  return align + pairs


def matmul_flops_per_query(k_pool: int, max_size: int) -> int:
  """Multiply-adds ×2 of the incidence-matmul form: for every subset of size ≥ 2, a
  C(K,2)-long dot for F_set and two K-long dots for the softmax sums."""
  n2 = subsets.count_subsets(k_pool, max_size) - k_pool
  return 2 * n2 * (math.comb(k_pool, 2) + 2 * k_pool)


def stage2_flops_per_query(k_pool: int, max_size: int, dim: int) -> int:
  """Extra work when ℓ and G_m are built from d-dimensional embeddings (dim > 0):
  ℓ = Z_S(rP), Z_S M_m, and (Z_S M_m) Z_Sᵀ."""
  if dim == 0:
    return 0
  return 2 * k_pool * dim + (max_size - 1) * (2 * k_pool * dim * dim + 2 * k_pool ** 2 * dim)


def output_bytes_per_query(k_pool: int, max_size: int) -> int:
  """f32 scores written per query: the memory floor of any implementation that returns them."""
  return 4 * subsets.count_subsets(k_pool, max_size)
