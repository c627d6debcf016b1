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
  """
  name: str
  expand: Callable | None = None
  pair_matrices: Callable | None = None
  greedy: Callable | None = None
  top_k: Callable | None = None


def _native_expand(table, logits, s0, n_ext):
  from hyset_jax.inference import native, neighbors
  return neighbors.Expansion(*native.expand(table.ids, table.scores, logits, s0, n_ext))


def _native_pair_matrices(keyed, z, tools):
  from hyset_jax.inference import native
  return native.pair_matrices(keyed, z, tools)


def _native_greedy(logits, pairs):
  from hyset_jax.inference import native
  return native.greedy_ranking(logits, pairs)


def _native_top_k(logits, k):
  from hyset_jax.inference import native
  if k > min(native.MAX_TOP_K, logits.shape[-1]):     # beyond the kernel: XLA's, same answer
    return jax.lax.top_k(logits, k)[1]
  return native.top_k(logits, k)


BACKENDS: dict[str, Backend] = {name: Backend(name) for name in choices.ENUMERATION_METHODS}
BACKENDS["native"] = Backend("native", expand=_native_expand,
                             pair_matrices=_native_pair_matrices, greedy=_native_greedy,
                             top_k=_native_top_k)


def get(method: str | Backend, k_pool: int | None = None,
        max_size: int | None = None) -> Backend:
  """The backend ``method`` names (a Backend is returned as it is); ``auto`` resolves to what
  runs best here for a shortlist of ``k_pool`` and sets of ``max_size`` (UserError for an
  explicit backend that cannot run here)."""
  if isinstance(method, Backend):
    return method
  from hyset_jax.inference import enumeration
  return BACKENDS[enumeration.resolve_method(method, k_pool, max_size)]
