"""A dependency-free NumPy reference of ``hyset predict`` (NumPy and the standard library only).

It reproduces the two-stage path of :func:`hyset_jax.inference.predict` (paper Eq. 12-14,
design.md §3) from exported files alone, so other stacks can check their port against it, or
simply use it. This file imports neither JAX nor ``hyset_jax`` nor ``safetensors``: copy it
anywhere and run::

    python reference.py --model DIR --query-embeddings queries.npy --out predictions.jsonl

DIR is a ``hyset/1`` model directory (``params.safetensors`` is parsed here: an 8-byte
little-endian header length, a JSON header, raw little-endian tensors), an ``npz`` export
(``model.npz`` or its directory) or a ``hyset train`` workdir (its ``best/``). The output has
the lines ``hyset predict --query-embeddings`` writes: ``query_id`` (the row), ``set``,
``set_score``, ``ranking``, ``shortlist``.

The rules, float32 throughout as in JAX:

- Stage 1: ℓ = (r P) Zᵀ; S0 = the K1 largest ℓ, ties to the lower row.
- Expansion: g(t) = max_{i∈S0} z_tᵀ M_M z_i for t ∉ S0; the K_pool − K1 tools first by
  descending g, then descending ℓ, then ascending row; shortlist = S0 (by ℓ) then these (by g).
- Stage 2: every subset of the shortlist of size 1..M, sizes ascending and colex order within a
  size; F = Σ_{a<b} G_m[a, b] + softmax-weighted mean of ℓ with G_m = Z_S M_m Z_Sᵀ; the first
  maximum in that order wins (so the smallest set on an exact tie). The set's tools are listed in
  ascending shortlist position.
- Ranking: M greedy picks (A_k = A_{k−1} ∪ argmax_t F(A_{k−1} ∪ {t}), ties to the earlier
  shortlist position), then the rest of the shortlist by descending ℓ (ties: earlier position).
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import struct
import sys
from typing import NamedTuple

import numpy as np

FORMAT = "hyset/1"
_SAFETENSORS_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4",
                       "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}


class ModelError(ValueError):
  """A model directory or file this reference cannot use; the message says why."""


class Model(NamedTuple):
  tool_embeddings: np.ndarray   # f32[N, d_z]
  projection: np.ndarray        # f32[d_r, d_z]
  interactions: np.ndarray      # f32[M - 1, d_z, d_z]; interactions[m - 2] is M_m
  tool_ids: tuple[str, ...]
  max_set_size: int
  k1: int
  k_pool: int
  query_encoder: str


# --------------------------------------------------------------------------- reading

def read_safetensors(path: str | pathlib.Path) -> dict[str, np.ndarray]:
  """All tensors of a ``.safetensors`` file, parsed by hand (no ``safetensors`` package)."""
  data = pathlib.Path(path).read_bytes()
  if len(data) < 8:
    raise ModelError(f"{path}: too short for a safetensors file")
  (n,) = struct.unpack("<Q", data[:8])
  if 8 + n > len(data):
    raise ModelError(f"{path}: header length {n} exceeds the file size {len(data)}")
  try:
    header = json.loads(data[8:8 + n].decode("utf-8"))
  except (UnicodeDecodeError, ValueError) as e:
    raise ModelError(f"{path}: unreadable safetensors header ({e})") from None
  body = data[8 + n:]
  out = {}
  for name, info in header.items():
    if name == "__metadata__":
      continue
    begin, end = info["data_offsets"]
    shape = tuple(info["shape"])
    if not 0 <= begin <= end <= len(body):
      raise ModelError(f"{path}: tensor {name!r} lies outside the file")
    raw = body[begin:end]
    if info["dtype"] == "BF16":  # the upper half of a float32
      arr = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
    elif info["dtype"] in _SAFETENSORS_DTYPES:
      arr = np.frombuffer(raw, _SAFETENSORS_DTYPES[info["dtype"]])
    else:
      raise ModelError(f"{path}: tensor {name!r} has unsupported dtype {info['dtype']}")
    if arr.size != math.prod(shape):
      raise ModelError(f"{path}: tensor {name!r} holds {arr.size} values for shape {shape}")
    out[name] = arr.reshape(shape)
  return out


def _model(tensors: dict, manifest: dict, where: str) -> Model:
  m = int(manifest["max_set_size"])
  try:
    inter = np.stack([np.asarray(tensors[f"interaction_{k}"], np.float32)
                      for k in range(2, m + 1)])
    model = Model(np.asarray(tensors["tool_embeddings"], np.float32),
                  np.asarray(tensors["projection"], np.float32), inter,
                  tuple(str(t) for t in manifest["tool_ids"]), m, int(manifest["k1"]),
                  int(manifest["k_pool"]), str(manifest.get("query_encoder", "")))
  except KeyError as e:
    raise ModelError(f"{where}: missing {e}") from None
  n, d = model.tool_embeddings.shape
  if len(model.tool_ids) != n or model.projection.shape[1] != d or inter.shape[1:] != (d, d):
    raise ModelError(f"{where}: inconsistent shapes (tool_embeddings {n}x{d}, "
                     f"{len(model.tool_ids)} tool ids, projection {model.projection.shape})")
  return model


def load_model(path: str | pathlib.Path) -> Model:
  """A hyset/1 directory, an npz export (file or directory) or a training workdir's best/."""
  path = pathlib.Path(path)
  if path.is_dir() and (path / "model.npz").is_file():
    path = path / "model.npz"
  if path.is_file() and path.suffix == ".npz":
    with np.load(path, allow_pickle=False) as z:
      arrays = {k: z[k] for k in z.files}
    manifest = {k: arrays[k].item() for k in ("max_set_size", "k1", "k_pool", "query_encoder")
                if k in arrays}
    manifest["tool_ids"] = arrays.get("tool_ids", np.asarray([])).tolist()
    return _model(arrays, manifest, str(path))
  if path.is_dir() and not (path / "manifest.json").is_file() and (path / "best").is_dir():
    path = path / "best"
  if not (path / "manifest.json").is_file() or not (path / "params.safetensors").is_file():
    raise ModelError(f"{path}: expected manifest.json and params.safetensors (hyset/1), "
                     f"model.npz, or a training workdir with best/")
  manifest = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
  if manifest.get("format") != FORMAT:
    raise ModelError(f"{path}/manifest.json: format {manifest.get('format')!r}, expected {FORMAT!r}")
  return _model(read_safetensors(path / "params.safetensors"), manifest, str(path))


# --------------------------------------------------------------------------- the maths

def colex_subsets(k_pool: int, size: int) -> np.ndarray:
  """int[C(K, size), size]: the size-subsets of range(K), colex order, members ascending."""
  level = [(c,) for c in range(k_pool)]
  for k in range(2, size + 1):
    level = [p + (c,) for c in range(k - 1, k_pool) for p in level[:math.comb(c, k - 1)]]
  return np.asarray(level, np.int64).reshape(-1, size)


def align_scores(logits: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
  """F_align: Σ softmax(ℓ)·ℓ over the last axis (members where ``mask``), max-shifted."""
  if mask is None:
    mask = np.ones(logits.shape, bool)
  shifted_max = np.max(np.where(mask, logits, np.finfo(logits.dtype).min), -1, keepdims=True)
  w = np.where(mask, np.exp(np.where(mask, logits - shifted_max, 0)), 0).astype(logits.dtype)
  return np.sum(w * np.where(mask, logits, 0), -1) / np.sum(w, -1)


def _order(*keys: np.ndarray) -> np.ndarray:
  """Row-wise argsort by several keys, the first key most significant, each ascending."""
  return np.lexsort(tuple(reversed(keys)), axis=-1)


def shortlist(model: Model, queries: np.ndarray, k1: int, k_pool: int, max_size: int):
  """Stage 1 and expansion: (tools int[Q, K_pool], their ℓ f32[Q, K_pool])."""
  z, p = model.tool_embeddings, model.projection
  logits = (queries.astype(np.float32) @ p) @ z.T                      # [Q, N]
  q, n = logits.shape
  rows = np.broadcast_to(np.arange(n), (q, n))
  s0 = _order(-logits, rows)[:, :k1]                                   # [Q, K1]
  keyed = z[s0] @ model.interactions[max_size - 2]                     # [Q, K1, d]
  g = np.max(np.einsum("nd,qkd->qnk", z, keyed), axis=-1)              # [Q, N]
  np.put_along_axis(g, s0, -np.inf, axis=1)
  extra = _order(-g, -logits, rows)[:, :k_pool - k1]
  tools = np.concatenate([s0, extra], axis=1)
  return tools, np.take_along_axis(logits, tools, axis=1)


def pair_matrices(member_emb: np.ndarray, interactions: np.ndarray) -> np.ndarray:
  """G_m = Z_S M_m Z_Sᵀ: f32[Q, M - 1, K, K]."""
  keyed = np.einsum("qid,mde->qmie", member_emb, interactions)
  return np.einsum("qmie,qje->qmij", keyed, member_emb)


def best_sets(logits: np.ndarray, pairs: np.ndarray, max_size: int):
  """Exhaustive stage 2: (positions list per query, best score f32[Q])."""
  q, k = logits.shape
  scores, members = [], []
  for m in range(1, max_size + 1):
    idx = colex_subsets(k, m)                                          # [n_m, m]
    f = align_scores(logits[:, idx])                                   # [Q, n_m]
    if m >= 2:
      a, b = np.triu_indices(m, 1)
      flat = idx[:, a] * k + idx[:, b]
      f = f + np.sum(pairs[:, m - 2].reshape(q, k * k)[:, flat], axis=-1)
    scores.append(f)
    members.extend(idx.tolist())
  scores = np.concatenate(scores, axis=1)
  best = np.argmax(scores, axis=1)                                     # first maximum
  return [members[i] for i in best], scores[np.arange(q), best]


def greedy_ranking(logits: np.ndarray, pairs: np.ndarray, steps: int) -> np.ndarray:
  """Greedy marginal gain under F: int[Q, steps] shortlist positions in pick order."""
  q, k = logits.shape
  chosen = np.zeros((q, k), bool)
  eye = np.eye(k, dtype=bool)
  picks = []
  for size in range(1, steps + 1):
    cand = chosen[:, None, :] | eye[None]                              # [Q, K(t), K]
    f = align_scores(np.broadcast_to(logits[:, None, :], cand.shape), cand)
    if size >= 2:
      gm = np.where(eye, 0, pairs[:, size - 2]).astype(logits.dtype)
      c = cand.astype(logits.dtype)
      f = f + 0.5 * np.einsum("qti,qij,qtj->qt", c, gm, c)
    pick = np.argmax(np.where(chosen, -np.inf, f), axis=1)
    picks.append(pick)
    chosen[np.arange(q), pick] = True
  return np.stack(picks, axis=1)


def stage2(model: Model, tools: np.ndarray, logits: np.ndarray, max_size: int):
  """Stage 2 and the ranking for given shortlists (from :func:`shortlist`, or from a vector
  index such as FAISS).

  Args:
    tools: int[Q, K] tool rows in shortlist order; logits: f32[Q, K] their ℓ.

  Returns:
    (best sets as lists of tool rows in shortlist order, their scores f32[Q],
     rankings int[Q, K] of tool rows).
  """
  k = tools.shape[1]
  logits = np.asarray(logits, np.float32)
  pairs = pair_matrices(model.tool_embeddings[tools], model.interactions[:max_size - 1])
  sets, scores = best_sets(logits, pairs, max_size)
  picks = greedy_ranking(logits, pairs, max_size)
  picked = np.zeros(tools.shape, bool)
  np.put_along_axis(picked, picks, True, axis=1)
  rest = np.argsort(np.where(picked, np.inf, -logits), axis=1, kind="stable")[:, :k - max_size]
  ranking = np.take_along_axis(tools, np.concatenate([picks, rest], axis=1), axis=1)
  return [[int(tools[i, pos]) for pos in s] for i, s in enumerate(sets)], scores, ranking


def predict(model: Model, queries: np.ndarray, *, k1: int | None = None,
            k_pool: int | None = None, max_size: int | None = None,
            query_ids: list[str] | None = None) -> list[dict]:
  """``hyset predict`` rows for f32[Q, d_r] query embeddings."""
  k1 = model.k1 if k1 is None else k1
  k_pool = model.k_pool if k_pool is None else k_pool
  max_size = model.max_set_size if max_size is None else max_size
  if not (1 <= k1 < k_pool <= len(model.tool_ids) and 2 <= max_size <= min(
      k_pool, model.max_set_size)):
    raise ModelError(f"need 1 ≤ k1 < k_pool ≤ N and 2 ≤ M ≤ min(k_pool, {model.max_set_size}); "
                     f"got k1={k1}, k_pool={k_pool}, M={max_size}, N={len(model.tool_ids)}")
  queries = np.asarray(queries, np.float32)
  tools, logits = shortlist(model, queries, k1, k_pool, max_size)
  sets, scores, ranking = stage2(model, tools, logits, max_size)
  ids = model.tool_ids
  query_ids = query_ids or [str(i) for i in range(len(queries))]
  return [{"query_id": qid,
           "set": [ids[t] for t in sets[i]],
           "set_score": float(scores[i]),
           "ranking": [ids[t] for t in ranking[i]],
           "shortlist": [ids[t] for t in tools[i]]} for i, qid in enumerate(query_ids)]


# --------------------------------------------------------------------------- command line

def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--model", required=True, help="hyset/1 directory, npz export, or workdir")
  p.add_argument("--query-embeddings", required=True, help="float [Q, d_r] .npy")
  p.add_argument("--out", required=True, help="output JSONL ('-' for stdout)")
  p.add_argument("--k1", type=int)
  p.add_argument("--k-pool", type=int)
  p.add_argument("--max-size", type=int)
  args = p.parse_args(argv)
  try:
    model = load_model(args.model)
    queries = np.load(args.query_embeddings, allow_pickle=False)
    if queries.ndim != 2 or queries.shape[1] != model.projection.shape[0]:
      raise ModelError(f"{args.query_embeddings}: expected [Q, {model.projection.shape[0]}], "
                       f"got {queries.shape}")
    rows = predict(model, queries, k1=args.k1, k_pool=args.k_pool, max_size=args.max_size)
  except (ModelError, OSError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
  if args.out == "-":
    sys.stdout.write(text)
  else:
    pathlib.Path(args.out).write_text(text, encoding="utf-8")
  return 0


if __name__ == "__main__":
  sys.exit(main())
