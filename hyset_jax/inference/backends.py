"""The inference backends: which implementation runs each step, chosen once, by name.

A backend bundles the kernels of the steps that have more than one implementation — stage 2
(the subset enumeration, :func:`hyset_jax.inference.enumeration.best_subset` by ``name``), stage
1's top K1, the expansion's read of the neighbour table, the shortlist's pair matrices G_m and
the greedy ranking. A member
left None runs the portable JAX form of :mod:`hyset_jax.inference.pipeline`. :func:`get` resolves a
user's ``--method`` (``auto`` included: :func:`hyset_jax.inference.enumeration.resolve_method`) once;
inference passes the bundle down and never tests a backend's name. A new backend (a GPU
kernel, an approximate first stage) is one entry in :data:`BACKENDS` and its tests.

- ``native``: the C++ kernels of :mod:`hyset_jax.inference.native` (XLA FFI, CPU) for every step.
- ``pallas``: the Pallas stage-2 kernel (:mod:`hyset_jax.inference.pallas_stage2`, GPU/TPU); JAX elsewhere.
- ``gather``, ``colex``, ``matmul``, ``matmul_bf16``: the JAX stage-2 forms; JAX elsewhere.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax

from hyset_jax import choices


class Backend(NamedTuple):
  """The implementation of each inference step (None: the JAX form in :mod:`inference`).

  Attributes:
    name: the stage-2 implementation, a :data:`hyset_jax.choices.ENUMERATION_METHODS` name.
    expand: ``(table, logits f32[Q, N], s0 int32[Q, K1], n_ext) -> neighbors.Expansion``, the
      neighbour-table expansion (Eq. 13).
    pair_matrices: ``(keyed f32[N, M-1, d], z f32[N, d], tools int32[Q, K]) -> f32[Q, M-1, K,
      K]``, G_m of each shortlist from the prepared Z M_m.
    greedy: ``(logits f32[Q, K], pairs f32[Q, M-1, K, K]) -> int32[Q, K]``, the whole greedy
      ranking (M picks under F, then the rest by ℓ), shortlist positions.
    top_k: ``(logits f32[Q, N], k) -> int32[Q, k]``, stage 1's K1 tools: the indices of
      ``jax.lax.top_k`` (its order and ties).
    by_tool_queries: stage 1 computes ℓ tool-major, ℓᵀ f32[N, Q], for batches of at most this
      many queries (0: never), and then passes it to ``top_k`` and ``expand`` with
      ``by_tool=True``; both kernels must take it.
  """
  name: str
  expand: Callable | None = None
  pair_matrices: Callable | None = None
  greedy: Callable | None = None
  top_k: Callable | None = None
  by_tool_queries: int = 0


# XLA:CPU (its YNNPACK dot) computes a small batch's ℓ = R (Z Pᵀ)ᵀ faster as ℓᵀ [N, Q] than as
# ℓ [Q, N] at N = 13,860, d = 768 (2-core AMD EPYC, 2026-12-05): 2.8× at 8 queries, 1.3× at 32,
# 1.13× at 64, even at 128, 0.89× at 256; ℓᵀ also spares the transpose a [Q, N] consumer would
# need, so the native kernels read it as it is.
NATIVE_BY_TOOL_QUERIES = 64


def _native_expand(table, logits, s0, n_ext, by_tool=False):
  from hyset_jax.inference import native, neighbors
  return neighbors.Expansion(*native.expand(table.ids, table.scores, logits, s0, n_ext,
                                            by_tool))


def _native_pair_matrices(keyed, z, tools):
  from hyset_jax.inference import native
  return native.pair_matrices(keyed, z, tools)


def _native_greedy(logits, pairs):
  from hyset_jax.inference import native
  return native.greedy_ranking(logits, pairs)


def _native_top_k(logits, k, by_tool=False):
  from hyset_jax.inference import native
  n = logits.shape[0 if by_tool else 1]
  if k > min(native.MAX_TOP_K, n):                    # beyond the kernel: XLA's, same answer
    return jax.lax.top_k(logits.T if by_tool else logits, k)[1]
  return native.top_k(logits, k, by_tool)


BACKENDS: dict[str, Backend] = {name: Backend(name) for name in choices.ENUMERATION_METHODS}
BACKENDS["native"] = Backend("native", expand=_native_expand,
                             pair_matrices=_native_pair_matrices, greedy=_native_greedy,
                             top_k=_native_top_k, by_tool_queries=NATIVE_BY_TOOL_QUERIES)


def get(method: str | Backend, k_pool: int | None = None,
        max_size: int | None = None) -> Backend:
  """The backend ``method`` names (a Backend is returned as it is); ``auto`` resolves to what
  runs best here for a shortlist of ``k_pool`` and sets of ``max_size`` (UserError for an
  explicit backend that cannot run here)."""
  if isinstance(method, Backend):
    return method
  from hyset_jax.inference import enumeration
  return BACKENDS[enumeration.resolve_method(method, k_pool, max_size)]
