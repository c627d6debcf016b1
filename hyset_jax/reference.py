"""A dependency-free NumPy reference of ``hyset predict`` (NumPy and the standard library only).

It reproduces the two-stage path of :func:`hyset_jax.inference.predict` (paper Eq. 12-14;
the contracts are in docs/contracts.md) from exported files alone, so other stacks can check
their port against it, or simply use it. This file imports neither JAX nor ``hyset_jax`` nor
``safetensors``: copy it anywhere and run::

    python reference.py --model DIR --query-embeddings queries.npy --out predictions.jsonl [--force]

DIR is a ``hyset/4``, ``hyset/3``, ``hyset/2`` or ``hyset/1`` model directory (``params.safetensors`` is parsed here: an
8-byte little-endian header length, a JSON header, raw little-endian tensors), an ``npz`` export
(``model.npz`` or its directory) or a ``hyset train`` workdir (its ``best/``). The output has
the lines ``hyset predict --query-embeddings`` writes: ``query_id`` (the row), ``set``,
``set_score``, ``ranking``, ``shortlist``.

It checks what ``hyset predict`` checks (shapes, ``len(tool_ids) = N`` and distinct ids,
finite values, symmetric interaction matrices, unit rows of Z, manifest field types, the sizes
1 ≤ K1 < K_pool ≤ N and 2 ≤ M ≤ K_pool, finite query embeddings of the right width) with the
same tolerances, and the output rules of the ``hyset`` commands: an existing ``--out`` is replaced only
with ``--force``, never one of its inputs, never into a missing folder. Errors print
``error: …`` and exit 2.

The rules, float32 throughout as in JAX:

- Query tower (hyset/2, depth L ≥ 1): q(r) = h_L with h_0 = r and
  h_{l+1} = h_l + relu(h_l W_l + b_l) U_l + c_l; without one q(r) = r.
- Stage 1: ℓ = (q(r) P) Zᵀ; S0 = the K1 largest ℓ, ties to the lower row.
- Lexical term (hyset/4, tensor ``lexical_weight`` β): ℓ' = ℓ + β · b replaces ℓ everywhere,
  b f32[Q, N] given with ``--lexical-scores`` (the query's BM25 scores over the tool texts
  divided by its largest, as ``lexical.json`` describes; this file does not tokenise text).
- Expansion: g(t) = max_{i∈S0} z_tᵀ M_M z_i for t ∉ S0; the K_pool − K1 tools first by
  descending g, then descending ℓ, then ascending row; shortlist = S0 (by ℓ) then these (by g).
- Stage 2: every subset of the shortlist of size 1..M, sizes ascending and colex order within a
  size; F = Σ_{a<b} G_m[a, b] + softmax-weighted mean of ℓ with G_m = Z_S M_m Z_Sᵀ (plus, for a
  hyset/2 model with ``conditioned_*`` tensors, the query-conditioned term of
  :func:`conditioned_pairs`); the first
  maximum in that order wins (so the smallest set on an exact tie). The set's tools are listed in
  ascending shortlist position.
- Seen-set prior (hyset/3, ``prior_*`` tensors): F' = F + λ · max(0, log p(s | r) − log τ) for
  each subset that is one of the prior's sets s (p = softmax(r wᵀ + b) over them, r the query
  embedding itself), F' = F for the others; the best set is the first maximum of F' in the
  order above (``hyset predict`` keeps the argmax of F unless a prior set is strictly above it:
  the two differ only on exact ties). ``set-mean`` and ``set-max`` use F'; ``greedy`` is refused.
- Ranking (``--ranking``, default the manifest's ``ranking``, else ``greedy``): ``greedy`` is M
  greedy picks (A_k = A_{k−1} ∪ argmax_t F(A_{k−1} ∪ {t}), ties to the earlier shortlist
  position), then the rest of the shortlist by descending ℓ (ties: earlier position); ``logit``
  is the shortlist order itself; ``set-first`` is the best set, then the rest, each by
  descending ℓ (ties: earlier position); ``set-mean`` is the shortlist by the mean F of the
  subsets above that contain each tool, descending (ties: higher ℓ, then earlier position);
  ``set-max`` the same by the largest F of those subsets.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import pathlib
import stat
import struct
import sys
import tempfile
from typing import NamedTuple

import numpy as np

# hyset/2 adds the query tower, the conditioned term and the ranking field; hyset/3 the prior.
FORMATS = ("hyset/1", "hyset/2", "hyset/3", "hyset/4")  # hyset/4: the lexical term
RANKINGS = ("greedy", "logit", "set-first", "set-mean", "set-max")
# hyset/2's optional tensor groups, stored as "<group>_<field>".
GROUPS = {"tower": ("w_in", "b_in", "w_out", "b_out"), "conditioned": ("u", "w", "v", "b"),
          "prior": ("members", "w", "b", "weight", "floor")}
_SAFETENSORS_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4",
                       "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}
# The tolerances of hyset_jax.modeldir (copied: this file imports nothing of hyset_jax; a test
# checks they agree).
SYMMETRY_RTOL = 1e-4
NORM_ATOL = 1e-3


class ModelError(ValueError):
  """A model directory, file or argument this reference cannot use; the message says why."""


class Model(NamedTuple):
  tool_embeddings: np.ndarray   # f32[N, d_z]
  projection: np.ndarray        # f32[d_r, d_z]
  interactions: np.ndarray      # f32[M - 1, d_z, d_z]; interactions[m - 2] is M_m
  tool_ids: tuple[str, ...]
  max_set_size: int
  k1: int
  k_pool: int
  query_encoder: str | None
  tower: tuple[np.ndarray, ...] | None = None  # (w_in f32[L, d_r, H], b_in f32[L, H],
                                               #  w_out f32[L, H, d_r], b_out f32[L, d_r])
  ranking: str | None = None
  conditioned: tuple[np.ndarray, ...] | None = None  # (u f32[M-1, d_z, R], w f32[M-1, d_r, R],
                                                     #  v f32[M-1, d_r], b f32[M-1])
  prior: tuple[np.ndarray, ...] | None = None  # (members i32[S, M], w f32[S, d_r], b f32[S],
                                               #  weight f32[] λ, floor f32[] log τ)
  lexical_weight: float | None = None  # β of the lexical term (hyset/4)


# --------------------------------------------------------------------------- reading

def read_safetensors(path: str | pathlib.Path) -> dict[str, np.ndarray]:
  """All tensors of a ``.safetensors`` file, parsed by hand (no ``safetensors`` package)."""
  try:
    data = pathlib.Path(path).read_bytes()
  except OSError as e:
    raise ModelError(f"{path}: cannot read ({e.strerror or e})") from None
  if len(data) < 8:
    raise ModelError(f"{path}: too short for a safetensors file")
  (n,) = struct.unpack("<Q", data[:8])
  if 8 + n > len(data):
    raise ModelError(f"{path}: header length {n} exceeds the file size {len(data)}")
  try:
    header = json.loads(data[8:8 + n].decode("utf-8"))
  except (UnicodeDecodeError, ValueError) as e:
    raise ModelError(f"{path}: unreadable safetensors header ({e})") from None
  if not isinstance(header, dict):
    raise ModelError(f"{path}: the safetensors header is not a JSON object")
  body = data[8 + n:]
  out = {}
  for name, info in header.items():
    if name == "__metadata__":
      continue
    try:
      begin, end = (int(x) for x in info["data_offsets"])
      shape = tuple(int(x) for x in info["shape"])
      dtype = info["dtype"]
    except (KeyError, TypeError, ValueError):
      raise ModelError(f"{path}: tensor {name!r} has a malformed header entry {info!r}") from None
    if not 0 <= begin <= end <= len(body):
      raise ModelError(f"{path}: tensor {name!r} lies outside the file")
    raw = body[begin:end]
    if dtype == "BF16":  # the upper half of a float32
      if len(raw) % 2:
        raise ModelError(f"{path}: tensor {name!r} has an odd number of bytes for BF16")
      arr = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
    elif dtype in _SAFETENSORS_DTYPES:
      item = np.dtype(_SAFETENSORS_DTYPES[dtype]).itemsize
      if len(raw) % item:
        raise ModelError(f"{path}: tensor {name!r} has {len(raw)} bytes, not a multiple of "
                         f"{item} ({dtype})")
      arr = np.frombuffer(raw, _SAFETENSORS_DTYPES[dtype])
    else:
      raise ModelError(f"{path}: tensor {name!r} has unsupported dtype {dtype}")
    if arr.size != math.prod(shape):
      raise ModelError(f"{path}: tensor {name!r} holds {arr.size} values for shape {shape}")
    out[name] = arr.reshape(shape)
  return out


def _int_field(manifest: dict, name: str, where: str) -> int:
  value = manifest.get(name)
  if isinstance(value, np.integer):
    value = int(value)
  if not isinstance(value, int) or isinstance(value, bool):
    raise ModelError(f"{where}: field {name!r} must be an integer, got {value!r}")
  return value


def _float_tensor(tensors: dict, name: str, where: str) -> np.ndarray:
  if name not in tensors:
    raise ModelError(f"{where}: missing tensor {name!r}")
  a = np.asarray(tensors[name])
  if not np.issubdtype(a.dtype, np.floating):
    raise ModelError(f"{where}: tensor {name!r} must be floating point, got {a.dtype}")
  return a.astype(np.float32)


def _validate_tower(tower: tuple[np.ndarray, ...], d_r: int, where: str) -> None:
  w_in = tower[0]
  depth, hidden = (w_in.shape[0], w_in.shape[2]) if w_in.ndim == 3 else (-1, -1)
  want = {"w_in": (depth, d_r, hidden), "b_in": (depth, hidden), "w_out": (depth, hidden, d_r),
          "b_out": (depth, d_r)}
  for name, a in zip(GROUPS["tower"], tower):
    if depth < 1 or a.shape != want[name]:
      raise ModelError(f"{where}: tensor 'tower_{name}' must be {list(want[name])} (L, d_r, H "
                       f"from tower_w_in and projection), got shape {list(a.shape)}")
    if not np.all(np.isfinite(a)):
      raise ModelError(f"{where}: tensor 'tower_{name}' contains NaN or inf")


def _validate_conditioned(cond: tuple[np.ndarray, ...], d_r: int, d_z: int, max_size: int,
                          where: str) -> None:
  k = max_size - 1
  rank = cond[0].shape[2] if cond[0].ndim == 3 else -1
  want = {"u": (k, d_z, rank), "w": (k, d_r, rank), "v": (k, d_r), "b": (k,)}
  for name, a in zip(GROUPS["conditioned"], cond):
    if rank < 0 or a.shape != want[name]:
      raise ModelError(f"{where}: tensor 'conditioned_{name}' must be {list(want[name])} "
                       f"(M-1, d_z or d_r, R), got shape {list(a.shape)}")
    if not np.all(np.isfinite(a)):
      raise ModelError(f"{where}: tensor 'conditioned_{name}' contains NaN or inf")


def _validate_prior(prior: tuple[np.ndarray, ...], n: int, d_r: int, max_size: int,
                    where: str) -> None:
  members = prior[0]
  s = members.shape[0] if members.ndim == 2 else -1
  want = {"members": (s, max_size), "w": (s, d_r), "b": (s,), "weight": (), "floor": ()}
  for name, a in zip(GROUPS["prior"], prior):
    if s < 1 or a.shape != want[name]:
      raise ModelError(f"{where}: tensor 'prior_{name}' must be {list(want[name])} (S sets, "
                       f"max_set_size, d_r), got shape {list(a.shape)}")
    if name != "members" and not np.all(np.isfinite(a)):
      raise ModelError(f"{where}: tensor 'prior_{name}' contains NaN or inf")
  first: dict = {}
  for i, row in enumerate(members):
    j = first.setdefault(tuple(row.tolist()), i)
    if j != i:
      raise ModelError(f"{where}: tensor 'prior_members' row {i} repeats row {j}; the prior's "
                       f"sets must be distinct")
    k = int((row >= 0).sum())
    if not (k >= 1 and (row[:k] >= 0).all() and (row[k:] == -1).all() and (row[:k] < n).all()
            and (np.diff(row[:k]) > 0).all()):
      raise ModelError(f"{where}: tensor 'prior_members' row {i} is {row.tolist()}; expected "
                       f"1..{max_size} distinct tool rows in [0, {n}) ascending, then -1")
  if float(prior[3]) < 0 or float(prior[4]) > 0:
    raise ModelError(f"{where}: tensors 'prior_weight' and 'prior_floor' must be ≥ 0 and ≤ 0")


def query_tower(model: Model, queries: np.ndarray) -> np.ndarray:
  """q(r) = h_L, h_0 = r, h_{l+1} = h_l + relu(h_l W_l + b_l) U_l + c_l: f32[Q, d_r]."""
  h = queries.astype(np.float32)
  if model.tower is None:
    return h
  w_in, b_in, w_out, b_out = model.tower
  for layer in range(w_in.shape[0]):
    h = h + np.maximum(h @ w_in[layer] + b_in[layer], 0) @ w_out[layer] + b_out[layer]
  return h


def validate(model: Model, where: str) -> None:
  """The checks of ``hyset predict`` (hyset_jax.modeldir.validate); ModelError naming the fault."""
  z, p, inter = model.tool_embeddings, model.projection, model.interactions
  if z.ndim != 2:
    raise ModelError(f"{where}: tensor 'tool_embeddings' must be [N, d_z], got shape {z.shape}")
  n, d = z.shape
  if p.ndim != 2 or p.shape[1] != d:
    raise ModelError(f"{where}: tensor 'projection' must be [d_r, {d}] (d_z from "
                     f"tool_embeddings), got shape {p.shape}")
  for m in range(2, model.max_set_size + 1):
    if inter[m - 2].shape != (d, d):
      raise ModelError(f"{where}: tensor 'interaction_{m}' must be [{d}, {d}], got shape "
                       f"{inter[m - 2].shape}")
  if model.tower is not None:
    _validate_tower(model.tower, p.shape[0], where)
  if model.conditioned is not None:
    _validate_conditioned(model.conditioned, p.shape[0], d, model.max_set_size, where)
  if model.prior is not None:
    _validate_prior(model.prior, n, p.shape[0], model.max_set_size, where)
    if (model.ranking or "greedy") == "greedy":
      raise ModelError(f"{where}: manifest field 'ranking' is {model.ranking!r} (greedy when "
                       f"absent); a model with a seen-set prior needs logit, set-first, "
                       f"set-mean or set-max")
  if len(model.tool_ids) != n:
    raise ModelError(f"{where}: manifest 'tool_ids' has {len(model.tool_ids)} ids but "
                     f"'tool_embeddings' has {n} rows")
  seen: set[str] = set()
  for t in model.tool_ids:
    if t in seen:
      raise ModelError(f"{where}: manifest 'tool_ids' repeats id {t!r}; ids must be distinct")
    seen.add(t)
  for name, a in (("tool_embeddings", z), ("projection", p)):
    if not np.all(np.isfinite(a)):
      raise ModelError(f"{where}: tensor {name!r} contains NaN or inf")
  for m in range(2, model.max_set_size + 1):
    a = inter[m - 2]
    if not np.all(np.isfinite(a)):
      raise ModelError(f"{where}: tensor 'interaction_{m}' contains NaN or inf")
    err = float(np.max(np.abs(a - a.T))) if a.size else 0.0
    if err > SYMMETRY_RTOL * max(1.0, float(np.max(np.abs(a))) if a.size else 1.0):
      raise ModelError(f"{where}: tensor 'interaction_{m}' is not symmetric (max |M - Mᵀ| = "
                       f"{err:.3g}); HYSET interaction matrices must be symmetric")
  norms = np.linalg.norm(z, axis=1)
  bad = np.flatnonzero(np.abs(norms - 1.0) > NORM_ATOL)
  if bad.size:
    i = int(bad[0])
    raise ModelError(f"{where}: tensor 'tool_embeddings' row {i} (tool {model.tool_ids[i]!r}) "
                     f"has norm {norms[i]:.4g}; hyset/1 requires unit rows ({bad.size} rows off)")
  try:
    check_sizes(model, model.k1, model.k_pool, model.max_set_size, _MANIFEST_KNOBS)
  except ModelError as e:
    raise ModelError(f"{where}: manifest {e}") from None


_MANIFEST_KNOBS = ("field 'k1'", "field 'k_pool'", "field 'max_set_size'")
_FLAG_KNOBS = ("--k1", "--k-pool", "--max-size")


def check_sizes(model: Model, k1: int, k_pool: int, max_size: int,
                knobs: tuple[str, str, str] = _FLAG_KNOBS) -> None:
  """1 ≤ K1 < K_pool ≤ N and 2 ≤ M ≤ min(K_pool, the model's M); the message names ``knobs``
  (how the caller sets K1, K_pool, M)."""
  n = len(model.tool_ids)
  if not 2 <= max_size <= k_pool:
    raise ModelError(f"{knobs[2]} = {max_size}: need 2 ≤ M ≤ k_pool ({k_pool})")
  if max_size > model.max_set_size:
    raise ModelError(f"{knobs[2]} = {max_size} exceeds the model's max_set_size "
                     f"{model.max_set_size}")
  if not 1 <= k1 < k_pool:
    raise ModelError(f"{knobs[0]} = {k1}: need 1 ≤ k1 < k_pool ({k_pool})")
  if k_pool > n:
    raise ModelError(f"{knobs[1]} = {k_pool}: the model has only {n} tools")


def _model(tensors: dict, manifest: dict, where: str, tensors_where: str) -> Model:
  tool_ids = manifest.get("tool_ids")
  if not isinstance(tool_ids, list) or not all(isinstance(t, str) for t in tool_ids):
    raise ModelError(f"{where}: field 'tool_ids' must be a list of strings")
  m = _int_field(manifest, "max_set_size", where)
  k1 = _int_field(manifest, "k1", where)
  k_pool = _int_field(manifest, "k_pool", where)
  if m < 2:
    raise ModelError(f"{where}: field 'max_set_size' must be ≥ 2, got {m}")
  encoder = manifest.get("query_encoder")
  if encoder is not None and not isinstance(encoder, str):
    raise ModelError(f"{where}: field 'query_encoder' must be a string or null")
  fmt = manifest.get("format")
  ranking = manifest.get("ranking") if fmt != "hyset/1" else None
  if ranking is not None and ranking not in RANKINGS:
    raise ModelError(f"{where}: field 'ranking' is {ranking!r}; expected one of "
                     f"{', '.join(RANKINGS)}")
  expected = ["tool_embeddings", "projection"] + [f"interaction_{k}" for k in range(2, m + 1)]
  groups = {}
  for group, fields in GROUPS.items():
    names = [f"{group}_{f}" for f in fields]
    present = [t for t in names if t in tensors]
    if present and fmt == "hyset/1":
      raise ModelError(f"{tensors_where}: tensor {present[0]!r} belongs to hyset/2 ({group}), "
                       f"which format 'hyset/1' does not have")
    if group == "prior" and fmt != "hyset/4" and (fmt == "hyset/3") != bool(present):
      raise ModelError(f"{tensors_where}: " + (
          f"tensor {present[0]!r} belongs to format 'hyset/3' (the seen-set prior); the "
          f"manifest says {fmt!r}" if present else
          f"format 'hyset/3' needs the seen-set prior's tensors {', '.join(names)}"))
    if present and len(present) != len(names):
      missing = [t for t in names if t not in tensors]
      raise ModelError(f"{tensors_where}: missing tensor {missing[0]!r} ({group} needs all of "
                       f"{', '.join(names)})")
    groups[group] = present
    expected += present
  if (fmt == "hyset/4") != ("lexical_weight" in tensors):
    raise ModelError(f"{tensors_where}: " + (
        f"tensor 'lexical_weight' belongs to format 'hyset/4' (the lexical term); the manifest "
        f"says {fmt!r}" if fmt != "hyset/4" else
        "format 'hyset/4' needs tensor 'lexical_weight' (the lexical term's β)"))
  lexical_weight = None
  if fmt == "hyset/4":
    expected.append("lexical_weight")
    beta = _float_tensor(tensors, "lexical_weight", tensors_where)
    if beta.shape != () or not np.isfinite(beta) or beta < 0:
      raise ModelError(f"{tensors_where}: tensor 'lexical_weight' must be one finite number "
                       f"≥ 0 (β), got {beta.tolist()!r}")
    lexical_weight = float(beta)
  extra = sorted(k for k in tensors if k not in expected and k not in _NPZ_FIELDS)
  if extra:
    raise ModelError(f"{tensors_where}: unexpected tensor(s) {', '.join(map(repr, extra))} for "
                     f"max_set_size = {m}")
  z = _float_tensor(tensors, "tool_embeddings", tensors_where)
  p = _float_tensor(tensors, "projection", tensors_where)
  inter = [_float_tensor(tensors, f"interaction_{k}", tensors_where) for k in range(2, m + 1)]
  for k, a in enumerate(inter, start=2):
    if a.ndim != 2 or a.shape != inter[0].shape:
      raise ModelError(f"{tensors_where}: tensor 'interaction_{k}' must be [d_z, d_z], got "
                       f"shape {a.shape}")
  tower, cond = (tuple(_float_tensor(tensors, t, tensors_where) for t in groups[g]) or None
                 for g in ("tower", "conditioned"))
  prior = None
  if groups["prior"]:
    members = np.asarray(tensors["prior_members"])
    if not np.issubdtype(members.dtype, np.integer):
      raise ModelError(f"{tensors_where}: tensor 'prior_members' must be integer, got "
                       f"{members.dtype}")
    prior = (members.astype(np.int64),) + tuple(
        _float_tensor(tensors, t, tensors_where) for t in groups["prior"][1:])
  model = Model(z, p, np.stack(inter), tuple(tool_ids), m, k1, k_pool, encoder, tower, ranking,
                cond, prior, lexical_weight)
  validate(model, tensors_where)
  return model


# npz exports keep the manifest fields beside the tensors.
_NPZ_FIELDS = ("format", "tool_ids", "max_set_size", "k1", "k_pool", "query_encoder", "ranking",
               "lexical_tool_texts", "lexical_k1", "lexical_b", "lexical_tokenizer")


def _load_npz(path: pathlib.Path) -> Model:
  try:
    with np.load(path, allow_pickle=False) as z:
      arrays = {k: z[k] for k in z.files}
  except (OSError, ValueError, EOFError) as e:
    raise ModelError(f"{path}: not a readable .npz file ({e})") from None
  manifest: dict = {}
  for k in _NPZ_FIELDS:
    if k in arrays:
      a = arrays[k]
      manifest[k] = a.tolist() if k == "tool_ids" else (a.item() if a.ndim == 0 else a.tolist())
  if manifest.get("format") not in FORMATS:
    raise ModelError(f"{path}: field 'format' is {manifest.get('format')!r}, expected one of "
                     f"{', '.join(FORMATS)}")
  return _model(arrays, manifest, str(path), str(path))


def load_model(path: str | pathlib.Path) -> Model:
  """A hyset/1 directory, an npz export (file or directory) or a training workdir's best/."""
  path = pathlib.Path(path)
  if not path.exists():
    raise ModelError(f"model {path} does not exist; expected a hyset/1 directory, an npz "
                     f"export or a training workdir")
  if path.is_dir() and (path / "model.npz").is_file():
    path = path / "model.npz"
  if path.is_file():
    if path.suffix != ".npz":
      raise ModelError(f"model {path} is a file but not an .npz export; expected a hyset/1 "
                       f"directory, an npz export or a training workdir")
    return _load_npz(path)
  if not (path / "manifest.json").is_file() and (path / "best").is_dir():
    path = path / "best"
  if not (path / "manifest.json").is_file() or not (path / "params.safetensors").is_file():
    raise ModelError(f"{path}: expected manifest.json and params.safetensors (hyset/1), "
                     f"model.npz, or a training workdir with best/")
  mpath = path / "manifest.json"
  try:
    manifest = json.loads(mpath.read_text(encoding="utf-8"))
  except (ValueError, UnicodeDecodeError) as e:
    raise ModelError(f"{mpath}: not valid JSON ({e})") from None
  if not isinstance(manifest, dict):
    raise ModelError(f"{mpath}: expected a JSON object")
  if manifest.get("format") not in FORMATS:
    raise ModelError(f"{mpath}: field 'format' is {manifest.get('format')!r}, expected one of "
                     f"{', '.join(FORMATS)}")
  ppath = path / "params.safetensors"
  return _model(read_safetensors(ppath), manifest, str(mpath), str(ppath))


def load_queries(path: str | pathlib.Path, dim: int) -> np.ndarray:
  """A float [Q, dim] .npy of finite values, as float32 (the checks of ``hyset predict``)."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise ModelError(f"query embeddings file {path} does not exist")
  try:
    x = np.load(path, allow_pickle=False)
  except (ValueError, OSError, EOFError) as e:
    raise ModelError(f"{path}: not a readable .npy array ({e})") from None
  if not isinstance(x, np.ndarray) or x.ndim != 2 or not np.issubdtype(x.dtype, np.floating):
    raise ModelError(f"{path}: expected a float array [Q, {dim}], got "
                     f"{getattr(x, 'dtype', type(x).__name__)} {getattr(x, 'shape', '')}")
  if x.shape[1] != dim:
    raise ModelError(f"{path}: query embeddings have dimension {x.shape[1]}, the model's "
                     f"projection expects d_r = {dim}")
  if x.shape[0] == 0:
    raise ModelError(f"{path}: no query embeddings (0 rows)")
  bad = np.flatnonzero(~np.all(np.isfinite(x), axis=1))
  if bad.size:
    raise ModelError(f"{path}: row {int(bad[0])} contains NaN or inf ({bad.size} bad rows)")
  return x.astype(np.float32)


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


def shortlist(model: Model, queries: np.ndarray, k1: int, k_pool: int, max_size: int,
              lexical: np.ndarray | None = None):
  """Stage 1 and expansion: (tools int[Q, K_pool], their ℓ f32[Q, K_pool]); ℓ' with the
  lexical term (``lexical``: b f32[Q, N], required for a hyset/4 model)."""
  z, p = model.tool_embeddings, model.projection
  logits = (query_tower(model, queries) @ p) @ z.T                     # [Q, N]
  if model.lexical_weight is not None:
    if lexical is None:
      raise ModelError("this model has a lexical term (hyset/4): pass its lexical scores "
                       "(--lexical-scores)")
    logits = logits + np.float32(model.lexical_weight) * np.asarray(lexical, np.float32)
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
  scores, members = subset_scores(logits, pairs, max_size)
  best = np.argmax(scores, axis=1)                                     # first maximum
  return [members[i] for i in best], scores[np.arange(len(scores)), best]


def subset_scores(logits: np.ndarray, pairs: np.ndarray, max_size: int):
  """F of every subset of the shortlist: (f32[Q, n] in table order, the n position lists)."""
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
  return np.concatenate(scores, axis=1), members


def set_mean(logits: np.ndarray, pairs: np.ndarray, max_size: int) -> np.ndarray:
  """f32[Q, K]: the mean F of the shortlist subsets that contain each shortlist position."""
  scores, members = subset_scores(logits, pairs, max_size)
  return _mean_per_tool(scores, members, logits.shape[1])


def _incidence(members: list, k: int) -> np.ndarray:
  """bool[n, K]: whether subset i (table order) contains shortlist position t."""
  incidence = np.zeros((len(members), k), bool)
  for i, positions in enumerate(members):
    incidence[i, positions] = True
  return incidence


def _mean_per_tool(scores: np.ndarray, members: list, k: int) -> np.ndarray:
  """f32[Q, K]: the mean score of the subsets that contain each shortlist position."""
  incidence = _incidence(members, k).astype(np.float32)
  return (scores @ incidence) / incidence[:, 0].sum()


def _max_per_tool(scores: np.ndarray, members: list, k: int) -> np.ndarray:
  """f32[Q, K]: the largest score of the subsets that contain each shortlist position."""
  incidence = _incidence(members, k)
  return np.stack([np.max(scores[:, incidence[:, t]], axis=1) for t in range(k)], axis=1)


def prior_bonus(model: Model, queries: np.ndarray, tools: np.ndarray,
                max_size: int) -> np.ndarray:
  """The seen-set prior's bonus on every subset of each shortlist, f32[Q, n] in table order
  (0 for the subsets that are none of the prior's sets)."""
  members, w, b, weight, floor = model.prior
  logits = queries @ w.T + b                                           # [Q, S]
  logits = logits - logits.max(1, keepdims=True)
  logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
  bonus = (weight * np.maximum(logp - floor, 0)).astype(np.float32)
  k = tools.shape[1]
  index, offset = {}, 0
  for m in range(1, max_size + 1):
    for row, subset in enumerate(colex_subsets(k, m).tolist()):
      index[tuple(subset)] = offset + row
    offset += math.comb(k, m)
  out = np.zeros((len(tools), offset), np.float32)
  for qi, row in enumerate(tools.tolist()):
    where = {t: i for i, t in enumerate(row)}
    for s, tools_s in enumerate(members.tolist()):
      real = [t for t in tools_s if t >= 0]
      if len(real) <= max_size and all(t in where for t in real):
        out[qi, index[tuple(sorted(where[t] for t in real))]] += bonus[qi, s]
  return out


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


def conditioned_pairs(model: Model, queries: np.ndarray, member_emb: np.ndarray,
                      max_size: int) -> np.ndarray:
  """The query-conditioned set term (hyset/2 ``conditioned_*``) as pair matrices added to G_m:
  Σ_r c_{m,r} (z_a·u_{m,r})(z_b·u_{m,r}) + β_m / C(m, 2) with c_m = q W_m, β_m = q·v_m + b_m,
  q = q(r). f32[Q, M − 1, K, K]."""
  u, w, v, b = (a[:max_size - 1] for a in model.conditioned)
  q = query_tower(model, queries)
  c = np.einsum("qd,mdr->qmr", q, w)
  beta = q @ v.T + b                                                    # [Q, M-1]
  proj = np.einsum("qid,mdr->qmir", member_emb, u)
  n_pairs = np.asarray([m * (m - 1) // 2 for m in range(2, max_size + 1)], np.float32)
  return np.einsum("qmir,qmr,qmjr->qmij", proj, c, proj) + (beta / n_pairs)[..., None, None]


def _first_then_by_logit(first: np.ndarray, logits: np.ndarray) -> np.ndarray:
  """Shortlist positions int[Q, K]: those marked in ``first`` by descending ℓ, then the others
  by descending ℓ; equal ℓ keeps shortlist order."""
  k = logits.shape[1]
  pos = np.broadcast_to(np.arange(k), logits.shape)
  return _order(~first, -logits, pos)


def stage2(model: Model, tools: np.ndarray, logits: np.ndarray, max_size: int,
           queries: np.ndarray | None = None, ranking: str | None = None):
  """Stage 2 and the ranking for given shortlists (from :func:`shortlist`, or from a vector
  index such as FAISS).

  Args:
    tools: int[Q, K] tool rows in shortlist order; logits: f32[Q, K] their ℓ.
    queries: f32[Q, d_r], needed only by a model with the query-conditioned set term.
    ranking: ``greedy`` (M greedy picks under F, then the rest by ℓ), ``logit`` (the shortlist
      order), ``set-first`` (the best set, then the rest, each by ℓ) or ``set-mean`` (by the
      mean F of the subsets containing each tool); default: the model's
      manifest field, else greedy.

  Returns:
    (best sets as lists of tool rows in shortlist order, their scores f32[Q],
     rankings int[Q, K] of tool rows).
  """
  ranking = ranking or model.ranking or "greedy"
  if ranking not in RANKINGS:
    raise ModelError(f"ranking {ranking!r}: expected one of {', '.join(RANKINGS)}")
  q, k = tools.shape
  logits = np.asarray(logits, np.float32)
  emb = model.tool_embeddings[tools]
  pairs = pair_matrices(emb, model.interactions[:max_size - 1])
  if model.conditioned is not None:
    if queries is None:
      raise ModelError("this model has a query-conditioned set term: stage2 needs the queries")
    pairs = pairs + conditioned_pairs(model, np.asarray(queries, np.float32), emb, max_size)
  if model.prior is not None:
    if queries is None:
      raise ModelError("this model has a seen-set prior: stage2 needs the queries")
    if ranking == "greedy":
      raise ModelError("the greedy ranking does not support a seen-set prior; use logit, "
                       "set-first, set-mean or set-max")
    every, members = subset_scores(logits, pairs, max_size)
    every = every + prior_bonus(model, np.asarray(queries, np.float32), tools, max_size)
    best = np.argmax(every, axis=1)                                    # first maximum
    sets, scores = [members[i] for i in best], every[np.arange(q), best]
  else:
    sets, scores = best_sets(logits, pairs, max_size)
  if ranking == "logit":
    order = np.broadcast_to(np.arange(k), (q, k))
  elif ranking == "set-first":
    in_set = np.zeros((q, k), bool)
    for i, s in enumerate(sets):
      in_set[i, s] = True
    order = _first_then_by_logit(in_set, logits)
  elif ranking in ("set-mean", "set-max"):
    if model.prior is None:
      every, members = subset_scores(logits, pairs, max_size)
    per_tool = (_mean_per_tool if ranking == "set-mean" else _max_per_tool)(every, members, k)
    order = _order(-per_tool, -logits, np.broadcast_to(np.arange(k), (q, k)))
  else:
    picks = greedy_ranking(logits, pairs, max_size)
    picked = np.zeros((q, k), bool)
    np.put_along_axis(picked, picks, True, axis=1)
    order = np.concatenate([picks, _first_then_by_logit(~picked, logits)[:, :k - max_size]],
                           axis=1)
  ranking_rows = np.take_along_axis(tools, order, axis=1)
  return [[int(tools[i, pos]) for pos in s] for i, s in enumerate(sets)], scores, ranking_rows


def predict(model: Model, queries: np.ndarray, *, k1: int | None = None,
            k_pool: int | None = None, max_size: int | None = None,
            query_ids: list[str] | None = None, ranking: str | None = None,
            lexical: np.ndarray | None = None) -> list[dict]:
  """``hyset predict`` rows for f32[Q, d_r] query embeddings (``lexical``: f32[Q, N] b for a
  hyset/4 model)."""
  k1 = model.k1 if k1 is None else k1
  k_pool = model.k_pool if k_pool is None else k_pool
  max_size = model.max_set_size if max_size is None else max_size
  check_sizes(model, k1, k_pool, max_size)
  queries = np.asarray(queries, np.float32)
  tools, logits = shortlist(model, queries, k1, k_pool, max_size, lexical)
  sets, scores, ranking = stage2(model, tools, logits, max_size, queries, ranking)
  ids = model.tool_ids
  query_ids = query_ids or [str(i) for i in range(len(queries))]
  return [{"query_id": qid,
           "set": [ids[t] for t in sets[i]],
           "set_score": float(scores[i]),
           "ranking": [ids[t] for t in ranking[i]],
           "shortlist": [ids[t] for t in tools[i]]} for i, qid in enumerate(query_ids)]


# --------------------------------------------------------------------------- command line

def check_output(out: str, force: bool, inputs: tuple[str, ...]) -> pathlib.Path:
  """The output rules of hyset_jax.io_utils.output_file, restated here because this file
  imports nothing of hyset_jax: not a directory, not an input, not existing without ``force``,
  in an existing writable folder."""
  path = pathlib.Path(out)
  if path.is_dir():
    raise ModelError(f"--out {path} is a directory; --out takes a file name")
  for given in inputs:
    source = pathlib.Path(given)
    if source.exists() and (path.resolve() == source.resolve() or (
        source.is_dir() and source.resolve() in path.resolve().parents and path.exists())):
      raise ModelError(f"--out {path} is (inside) one of this command's inputs ({source}); "
                       f"refusing to overwrite it (also with --force)")
  if path.exists() and not force:
    raise ModelError(f"--out {path} already exists; pass --force to overwrite it")
  parent = path.parent
  if not parent.is_dir():
    raise ModelError(f"--out {path}: folder {parent} does not exist or is not a folder")
  if not os.access(parent, os.W_OK | os.X_OK):
    raise ModelError(f"--out {path}: folder {parent} is not writable")
  return path


def write_atomic(path: pathlib.Path, text: str) -> None:
  """Write via a temporary file and a rename, with the umask's permissions (or the replaced
  file's)."""
  try:
    mode = stat.S_IMODE(path.stat().st_mode)
  except OSError:
    mask = os.umask(0o022)
    os.umask(mask)
    mode = 0o666 & ~mask
  fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
  try:
    os.fchmod(fd, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      f.write(text)
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.unlink(tmp)
    raise


def _positive(text: str) -> int:
  try:
    value = int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
  if value < 1:
    raise argparse.ArgumentTypeError(f"expected an integer ≥ 1, got {value}")
  return value


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="reference.py", description=__doc__.split("\n\n")[0])
  p.add_argument("--model", required=True, metavar="DIR",
                 help="hyset/1 directory, npz export (model.npz or its folder), or a hyset "
                      "train workdir (its best/)")
  p.add_argument("--query-embeddings", required=True, metavar="FILE.npy",
                 help="float [Q, d_r] .npy; query_id = row index")
  p.add_argument("--out", required=True, metavar="FILE.jsonl",
                 help="output JSONL ('-' for stdout)")
  p.add_argument("--k1", type=_positive, metavar="N", help="stage-1 size K1 (default: the model's)")
  p.add_argument("--k-pool", type=_positive, metavar="N",
                 help="shortlist size K_pool (default: the model's)")
  p.add_argument("--max-size", type=_positive, metavar="N",
                 help="largest set size M, at most the model's (default: the model's)")
  p.add_argument("--ranking", choices=RANKINGS, default=None,
                 help="how the shortlist is ranked (default: the model's, else greedy)")
  p.add_argument("--lexical-scores", metavar="FILE.npy",
                 help="float [Q, N] lexical scores b, needed for a hyset/4 model (lexical term)")
  p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
  args = p.parse_args(argv)
  try:
    out = None if args.out == "-" else check_output(
        args.out, args.force, (args.model, args.query_embeddings))
    model = load_model(args.model)
    queries = load_queries(args.query_embeddings, model.projection.shape[0])
    lexical = None
    if args.lexical_scores:
      lexical = load_queries(args.lexical_scores, len(model.tool_ids))
      if len(lexical) != len(queries):
        raise ModelError(f"{args.lexical_scores}: {len(lexical)} rows of lexical scores for "
                         f"{len(queries)} queries")
    elif model.lexical_weight is not None:
      raise ModelError(f"{args.model}: this model has a lexical term (hyset/4); pass "
                       f"--lexical-scores FILE.npy (f32[Q, {len(model.tool_ids)}])")
    rows = predict(model, queries, k1=args.k1, k_pool=args.k_pool, max_size=args.max_size,
                   ranking=args.ranking, lexical=lexical)
    # allow_nan=False: NaN is not JSON; validated inputs never produce it, so this is a bug.
    text = "".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in rows)
    if out is None:
      sys.stdout.write(text)
    else:
      write_atomic(out, text)
  except ModelError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  except OSError as e:
    print(f"error: {e.filename or args.out}: {e.strerror or e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
