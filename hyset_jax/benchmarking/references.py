"""Implementations of the subset scores outside JAX, for comparison in the same run.

Each returns f32[Q, n] in :class:`subsets.SubsetTable` order with the shortlist in its given
order (so every implementation can be checked against every other). Inputs are ℓ and G_m,
and, when the workload has ``dim > 0``, they are first built from the embeddings.

- :func:`numpy_gather`: the NumPy reference — what a careful user writes from Eq. 2-6: per
  set size, fancy-index the members' ℓ and pair scores, a max-shifted softmax, sum; in query
  chunks so the [chunk, n_m, C(m,2)] temporaries stay in cache-sized memory.
- :func:`numpy_matmul`: the incidence-matmul form in NumPy (BLAS), for comparison.
- :func:`naive`: a per-query, per-subset Python loop.
- :func:`torch_gather`: the NumPy reference's algorithm in PyTorch, when torch is installed.
"""
from __future__ import annotations

import math

import numpy as np

from hyset_jax.inference import subsets
from hyset_jax.benchmarking.workload import Workload


def numpy_inputs(w: Workload) -> tuple[np.ndarray, np.ndarray]:
  """(ℓ, G_m) for the workload, built from embeddings when it has them."""
  if w.dim == 0:
    return w.logits, w.pairs
  q, k, d = w.tools.shape
  logits = np.einsum("qkd,qd->qk", w.tools, w.query)
  # One BLAS matmul per M_m over all Q·K rows (a broadcast np.matmul would loop per matrix).
  flat = w.tools.reshape(q * k, d)
  keyed = np.stack([(flat @ m).reshape(q, k, d) for m in w.interactions], axis=1)  # [Q, M−1, K, d]
  return logits, np.matmul(keyed, np.swapaxes(w.tools, 1, 2)[:, None])        # [Q, M−1, K, K]


def numpy_gather(w: Workload, chunk: int = 64) -> np.ndarray:
  logits, pairs = numpy_inputs(w)
  table = subsets.subset_table(w.k_pool, w.max_size)
  q, k = logits.shape
  out = np.empty((q, len(table)), np.float32)
  for start in range(0, q, chunk):
    ell, g = logits[start:start + chunk], pairs[start:start + chunk]
    rows = ell.shape[0]
    for m in range(1, w.max_size + 1):
      lo, hi = table.offsets[m - 1], table.offsets[m]
      idx = table.members[lo:hi, :m]                                  # [n_m, m]
      member_logits = ell[:, idx]                                     # [rows, n_m, m]
      wts = np.exp(member_logits - member_logits.max(-1, keepdims=True))
      f = (wts * member_logits).sum(-1) / wts.sum(-1)
      if m >= 2:
        a, b = np.triu_indices(m, 1)
        flat = idx[:, a] * k + idx[:, b]                              # [n_m, C(m,2)]
        f += g[:, m - 2].reshape(rows, k * k)[:, flat].sum(-1)
      out[start:start + rows, lo:hi] = f
  return out


def numpy_matmul(w: Workload) -> np.ndarray:
  logits, pairs = numpy_inputs(w)
  table = subsets.subset_table(w.k_pool, w.max_size)
  q, k = logits.shape
  wts = np.exp(logits - logits.max(1, keepdims=True))
  iu = np.triu_indices(k, 1)
  out = np.empty((q, len(table)), np.float32)
  out[:, :k] = logits
  for m, (a, ap) in enumerate(subsets.incidence(k, w.max_size), start=1):
    if m == 1:
      continue
    lo, hi = table.offsets[m - 1], table.offsets[m]
    out[:, lo:hi] = (pairs[:, m - 2][:, iu[0], iu[1]] @ ap) + ((wts * logits) @ a) / (wts @ a)
  return out


def naive(w: Workload) -> np.ndarray:
  logits, pairs = numpy_inputs(w)
  table = subsets.subset_table(w.k_pool, w.max_size)
  out = np.empty((logits.shape[0], len(table)), np.float32)
  for q in range(logits.shape[0]):
    ell, g = logits[q].tolist(), pairs[q].tolist()
    for i in range(len(table)):
      members = table.members[i, :table.sizes[i]].tolist()
      top = max(ell[j] for j in members)
      wts = [math.exp(ell[j] - top) for j in members]
      f = sum(wt * ell[j] for wt, j in zip(wts, members)) / sum(wts)
      if len(members) >= 2:
        gm = g[len(members) - 2]
        f += sum(gm[a][b] for ai, a in enumerate(members) for b in members[ai + 1:])
      out[q, i] = f
  return out


def torch_available() -> bool:
  try:
    import torch  # noqa: F401
  except ImportError:
    return False
  return True


def torch_gather(w: Workload, device: str = "cpu", chunk: int = 64):
  """The NumPy reference's algorithm in PyTorch (eager). Returns a torch tensor."""
  import torch

  table = subsets.subset_table(w.k_pool, w.max_size)
  if w.dim == 0:
    logits = torch.as_tensor(w.logits, device=device)
    pairs = torch.as_tensor(w.pairs, device=device)
  else:
    tools = torch.as_tensor(w.tools, device=device)
    logits = torch.einsum("qkd,qd->qk", tools, torch.as_tensor(w.query, device=device))
    keyed = torch.matmul(tools[:, None], torch.as_tensor(w.interactions, device=device)[None])
    pairs = torch.matmul(keyed, tools.transpose(1, 2)[:, None])
  q, k = logits.shape
  out = torch.empty((q, len(table)), dtype=torch.float32, device=device)
  blocks = []
  for m in range(1, w.max_size + 1):
    lo, hi = table.offsets[m - 1], table.offsets[m]
    idx = torch.as_tensor(table.members[lo:hi, :m], dtype=torch.long, device=device)
    flat = None
    if m >= 2:
      a, b = np.triu_indices(m, 1)
      flat = idx[:, a] * k + idx[:, b]
    blocks.append((lo, hi, idx, flat))
  with torch.no_grad():
    for start in range(0, q, chunk):
      ell, g = logits[start:start + chunk], pairs[start:start + chunk]
      rows = ell.shape[0]
      for m, (lo, hi, idx, flat) in enumerate(blocks, start=1):
        member_logits = ell[:, idx]
        f = (torch.softmax(member_logits, dim=-1) * member_logits).sum(-1)
        if flat is not None:
          f = f + g[:, m - 2].reshape(rows, k * k)[:, flat].sum(-1)
        out[start:start + rows, lo:hi] = f
  return out
