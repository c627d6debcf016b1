"""The model-directory format, read and checked in one place (NumPy and the standard library only).

Every tensor's name, shape and dtype is declared once, in ``model_schema.json`` beside this file:
the core θ (Z, P, M_2..M_M) and each optional *term* (the query tower, the conditioned set term,
the seen-set prior, the lexical term). A ``hyset/5`` manifest lists the terms its model carries
(``"terms": [...]``) and a reader refuses a term it does not know; directories written before
(``hyset/1`` … ``hyset/4``, where the version number stood for a set of terms) are read through
:func:`model_terms`, the one converter, which infers the terms from the tensors and checks them
against what that version could hold (the schema's ``legacy`` table).

Both :mod:`hyset_jax.io.modeldir` (JAX side) and the standalone ``reference.py`` read models
through this module, so the two can never disagree on what a valid model is. It imports
nothing of ``hyset_jax``: copy ``model_format.py``, ``model_schema.json`` and ``reference.py``
together anywhere.

Errors are :class:`ModelError` with a message naming the file, tensor or field at fault.
"""
from __future__ import annotations

import json
import math
import pathlib
import struct
import zipfile
import zlib
from typing import NamedTuple

import numpy as np

SCHEMA_FILE = "model_schema.json"


class ModelError(ValueError):
  """A model directory, file or argument that cannot be used; the message says why."""


def _read_schema() -> dict:
  path = pathlib.Path(__file__).with_name(SCHEMA_FILE)
  try:
    return json.loads(path.read_text(encoding="utf-8"))
  except (OSError, ValueError) as e:
    raise SystemExit(f"error: {path}: the model schema is missing or unreadable ({e}); keep "
                     f"{SCHEMA_FILE} beside {pathlib.Path(__file__).name}") from None


SCHEMA = _read_schema()
FORMAT = SCHEMA["format"]                     # what every writer writes
FORMATS = tuple(SCHEMA["legacy"]) + (FORMAT,)  # what a reader reads
TERMS = tuple(SCHEMA["terms"])                 # canonical order
PARAMS_FILE = SCHEMA["files"]["params"]
MANIFEST_FILE = SCHEMA["files"]["manifest"]
RANKINGS = ("greedy", "logit", "set-first", "set-mean", "set-max")
# Symmetry and unit-norm tolerances: loose enough for f32 round-trips through other stacks,
# tight enough to catch a matrix that was never symmetrised or rows never normalised.
SYMMETRY_RTOL = 1e-4
NORM_ATOL = 1e-3
# npz exports keep the manifest fields (and the lexical term's file) beside the tensors.
NPZ_FIELDS = ("format", "terms", "tool_ids", "max_set_size", "k1", "k_pool", "query_encoder",
              "ranking", "lexical_tool_texts", "lexical_k1", "lexical_b", "lexical_tokenizer")
LEXICAL_TOKENIZER = "hyset-bm25/1"
# The manifest's optional "first_stage" (how stage 1 and the expansion find candidates; absent
# or "exact": the exact scan): "ann" or {"kind": "ann", <parameter>: value, ...} opts the model
# into the approximate first stage of hyset_jax/inference/ann.py. Each parameter: its allowed
# values (a tuple of strings) or its least integer value; absent ones take ann.Settings' defaults.
FIRST_STAGE_KINDS = ("exact", "ann")
FIRST_STAGE_PARAMETERS = {"index": ("hnsw_sq8", "hnsw", "ivf", "ivf_sq8", "flat"), "hnsw_m": 2,
                          "ef_construction": 1, "ef_search": 1, "nlist": 1, "nprobe": 1,
                          "expansion_effort": 0, "candidates": 1, "neighbors": 1,
                          "expansion": ("index", "lowrank"), "expansion_rank": 1,
                          "expansion_candidates": 1}
# The manifest's optional "foreign": what a model carried onto a library that lists none of its
# tools uses instead of its in-domain choices (hyset_jax/io/carry.py, foreign; chosen by
# training on its own validation re-scored as such a library, hyset_jax/training/post_theta.py).
# Each setting: its least value. "lexical_weight": β there (0: the lexical term left out).
FOREIGN_SETTINGS = {"lexical_weight": 0.0}
_SAFETENSORS_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4",
                       "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}


class Model(NamedTuple):
  """A validated model, as NumPy arrays. A term's field is None when the model lacks it."""
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
  prior: tuple[np.ndarray, ...] | None = None  # (members i64[S, M], w f32[S, d_r], b f32[S],
                                               #  weight f32[] λ, floor f32[] log τ)
  lexical_weight: float | None = None  # β of the lexical term
  lexical: dict | None = None  # lexical.json: {"tokenizer", "k1", "b", "tool_texts"}
  abstain: tuple[np.ndarray, ...] | None = None  # (w f32[d_r], b f32[], threshold f32[] τ)
  set_weight: float | None = None  # γ, the set term's weight in stage 2
  row_blend: tuple[np.ndarray, ...] | None = None  # (trained f32[N, d_z], alpha f32[] α)
  first_stage: dict | None = None  # None: exact; else {"kind": "ann", ...} (check_first_stage)
  foreign: dict | None = None  # None: none recorded; else {"lexical_weight": β} (check_foreign)

  @property
  def terms(self) -> tuple[str, ...]:
    return tuple(t for t in TERMS if getattr(self, term_field(t)) is not None)


def term_field(term: str) -> str:
  """The Model / HysetParams field that holds ``term``: its name, or its one tensor's name."""
  specs = SCHEMA["terms"][term]["tensors"]
  return specs[0]["name"] if len(specs) == 1 else term


def term_tensors(term: str) -> list[str]:
  return [s["name"] for s in SCHEMA["terms"][term]["tensors"]]


def allowed_rankings(terms) -> tuple[str, ...]:
  """The rankings a model carrying ``terms`` supports (each term may exclude some)."""
  excluded = {r for t in terms for r in SCHEMA["terms"][t].get("rankings_excluded", ())}
  return tuple(r for r in RANKINGS if r not in excluded)


# --------------------------------------------------------------------------- files

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
    if not 0 <= begin <= end <= len(body) or any(d < 0 for d in shape):
      raise ModelError(f"{path}: tensor {name!r} lies outside the file")
    raw = body[begin:end]
    if dtype == "BF16":  # the upper half of a float32
      if len(raw) % 2:
        raise ModelError(f"{path}: tensor {name!r} has an odd number of bytes for BF16")
      arr = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
    elif isinstance(dtype, str) and dtype in _SAFETENSORS_DTYPES:
      item = np.dtype(_SAFETENSORS_DTYPES[dtype]).itemsize
      if len(raw) % item:
        raise ModelError(f"{path}: tensor {name!r} has {len(raw)} bytes, not a multiple of "
                         f"{item} ({dtype})")
      arr = np.frombuffer(raw, _SAFETENSORS_DTYPES[dtype])
    else:
      raise ModelError(f"{path}: tensor {name!r} has unsupported dtype {dtype!r}")
    if arr.size != math.prod(shape):
      raise ModelError(f"{path}: tensor {name!r} holds {arr.size} values for shape {shape}")
    out[name] = arr.reshape(shape)
  return out


def read_json_object(path: pathlib.Path) -> dict:
  """The JSON object in ``path``, or a ModelError naming the file."""
  try:
    doc = json.loads(path.read_text(encoding="utf-8"))
  except (ValueError, UnicodeDecodeError, RecursionError) as e:  # RecursionError: deep nesting
    raise ModelError(f"{path}: not valid JSON ({e})") from None
  except OSError as e:
    raise ModelError(f"{path}: cannot read ({e.strerror or e})") from None
  if not isinstance(doc, dict):
    raise ModelError(f"{path}: expected a JSON object")
  return doc


def check_lexical(doc: dict, where) -> dict:
  """lexical.json's fields (or an npz export's lexical_* arrays), checked."""
  if doc.get("tokenizer") != LEXICAL_TOKENIZER:
    raise ModelError(f"{where}: field 'tokenizer' is {doc.get('tokenizer')!r}; this version "
                     f"reads {LEXICAL_TOKENIZER!r}")
  texts = doc.get("tool_texts")
  if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
    raise ModelError(f"{where}: field 'tool_texts' must be a list of strings")
  if not texts:
    raise ModelError(f"{where}: field 'tool_texts' is empty")
  for name in ("k1", "b"):
    v = doc.get(name)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
      raise ModelError(f"{where}: field {name!r} must be a number ≥ 0 (BM25's {name}), got {v!r}")
  return {"tokenizer": LEXICAL_TOKENIZER, "k1": float(doc["k1"]), "b": float(doc["b"]),
          "tool_texts": list(texts)}


# --------------------------------------------------------------------------- the converter

def model_terms(manifest: dict, tensors: dict, where, tensors_where) -> tuple[str, ...]:
  """The terms a model carries, in canonical order: a ``hyset/5`` manifest lists them; for
  ``hyset/1`` … ``hyset/4`` they are the terms whose tensors are present, each checked against
  what that version could hold (the schema's ``legacy`` table)."""
  fmt = manifest.get("format")
  if fmt not in FORMATS:
    raise ModelError(f"{where}: field 'format' is {fmt!r}; this version reads "
                     f"{', '.join(map(repr, FORMATS))}")
  if fmt == FORMAT:
    listed = manifest.get("terms")
    if not isinstance(listed, list) or not all(isinstance(t, str) for t in listed):
      raise ModelError(f"{where}: field 'terms' must be a list of term names, got {listed!r}")
    for t in listed:
      if t not in TERMS:
        raise ModelError(f"{where}: field 'terms' names {t!r}, a term this version does not "
                         f"know (it knows {', '.join(TERMS)}); a newer hyset wrote this model")
    if len(set(listed)) != len(listed):
      raise ModelError(f"{where}: field 'terms' lists a term twice: {listed}")
    return tuple(t for t in TERMS if t in listed)
  legacy = SCHEMA["legacy"][fmt]
  present = tuple(t for t in TERMS if any(n in tensors for n in term_tensors(t)))
  for t in present:
    if t not in legacy["terms"]:
      # A term no legacy version holds (abstain) came with the current format.
      first = next((f for f, v in SCHEMA["legacy"].items() if t in v["terms"]), FORMAT)
      name = next(n for n in term_tensors(t) if n in tensors)
      raise ModelError(f"{tensors_where}: tensor {name!r} belongs to the {t} term (format "
                       f"{first!r} on); the manifest says {fmt!r}")
  for t in legacy["required"]:
    if t not in present:
      raise ModelError(f"{tensors_where}: format {fmt!r} (in {where}) needs the {t} term's "
                       f"tensors {', '.join(term_tensors(t))}")
  return present


# --------------------------------------------------------------------------- tensors

def _specs(terms, max_size: int) -> list[tuple[dict, str | None]]:
  """(tensor spec, its term or None for the core), interaction_{m} expanded for m = 2..M."""
  out = []
  for spec in SCHEMA["core"]:
    if "for_m" in spec:
      out += [(dict(spec, name=spec["name"].format(m=m)), None) for m in range(2, max_size + 1)]
    else:
      out.append((spec, None))
  return out + [(s, t) for t in terms for s in SCHEMA["terms"][t]["tensors"]]


def _dim(symbol: str) -> tuple[str, int]:
  """'M-1' -> ('M', -1); 'd_z' -> ('d_z', 0)."""
  base, _, off = symbol.partition("-")
  return base, -int(off) if off else 0


def check_tensors(tensors: dict, terms, max_size: int, where) -> dict[str, np.ndarray]:
  """Every tensor the schema lists for the core and ``terms``, checked (present, nothing else,
  dtype, shape against the symbols, finite, range) and cast: f32, or int64 for tool rows."""
  specs = _specs(terms, max_size)
  names = {s["name"] for s, _ in specs}
  for spec, term in specs:
    if spec["name"] not in tensors:
      owner = f"the {term} term needs all of {', '.join(term_tensors(term))}" if term else (
          f"max_set_size = {max_size} needs interaction_2 … interaction_{max_size}"
          if spec["name"].startswith("interaction_") else "every model has it")
      raise ModelError(f"{where}: missing tensor {spec['name']!r} ({owner})")
  extra = sorted(k for k in tensors if k not in names and k not in NPZ_FIELDS)
  if extra:
    owner = next((t for t in TERMS if extra[0] in term_tensors(t)), None)
    why = (f"it belongs to the {owner} term, which the manifest does not list" if owner else
           f"not a tensor of this format for max_set_size = {max_size}")
    raise ModelError(f"{where}: unexpected tensor(s) {', '.join(map(repr, extra))} ({why})")
  dims: dict[str, int] = {"M": max_size}
  out = {}
  for spec, _ in specs:
    name, a = spec["name"], np.asarray(tensors[spec["name"]])
    kind = np.integer if spec["dtype"] == "int" else np.floating
    if not np.issubdtype(a.dtype, kind):
      raise ModelError(f"{where}: tensor {name!r} must be "
                       f"{'integer' if kind is np.integer else 'floating point'}, got {a.dtype}")
    shape = spec["shape"]
    want = [dims[_dim(s)[0]] + _dim(s)[1] if _dim(s)[0] in dims else None for s in shape]
    ok = a.ndim == len(shape) and all(w is None or w == g for w, g in zip(want, a.shape))
    if ok:
      for s, g in zip(shape, a.shape):
        base, off = _dim(s)
        if base not in dims:
          dims[base] = g - off
          least = SCHEMA["symbols_at_least"].get(base, 0)
          if dims[base] < least:
            raise ModelError(f"{where}: tensor {name!r} has {base} = {dims[base]} (shape "
                             f"{list(a.shape)}); {base} must be ≥ {least}")
    if not ok:
      shown = [str(w) if w is not None else s for w, s in zip(want, shape)]
      raise ModelError(f"{where}: tensor {name!r} must be [{', '.join(shown)}] "
                       f"([{', '.join(shape)}]), got shape {list(a.shape)}")
    if kind is np.floating:
      a = a.astype(np.float32)
      if not np.all(np.isfinite(a)):
        raise ModelError(f"{where}: tensor {name!r} contains NaN or inf")
    else:
      a = a.astype(np.int64)
    if "at_least" in spec and not np.all(a >= spec["at_least"]):
      raise ModelError(f"{where}: tensor {name!r} must be ≥ {spec['at_least']}, got {a.tolist()}")
    if "at_most" in spec and not np.all(a <= spec["at_most"]):
      raise ModelError(f"{where}: tensor {name!r} must be ≤ {spec['at_most']}, got {a.tolist()}")
    out[name] = a
  return out


def _int_field(manifest: dict, name: str, where) -> int:
  value = manifest.get(name)
  if isinstance(value, np.integer):
    value = int(value)
  if not isinstance(value, int) or isinstance(value, bool):
    raise ModelError(f"{where}: field {name!r} must be an integer, got {value!r}")
  return value


def check_first_stage(value, where) -> dict | None:
  """The manifest's ``first_stage`` field, validated: None for the exact first stage (absent,
  null, ``"exact"`` or ``{"kind": "exact"}``), else ``{"kind": "ann", ...the parameters given}``.
  ModelError naming the field and the fault."""
  field = "field 'first_stage'"
  if value is None or value == "exact":
    return None
  if value == "ann":
    return {"kind": "ann"}
  if not isinstance(value, dict):
    raise ModelError(f"{where}: {field} must be \"exact\", \"ann\" or an object "
                     f"{{\"kind\": \"ann\", ...}}, got {value!r}")
  kind = value.get("kind")
  if kind not in FIRST_STAGE_KINDS:
    raise ModelError(f"{where}: {field} has kind {kind!r}; expected one of "
                     f"{', '.join(FIRST_STAGE_KINDS)}")
  unknown = sorted(set(value) - {"kind"} - set(FIRST_STAGE_PARAMETERS))
  if unknown:
    raise ModelError(f"{where}: {field} has unknown parameter(s) {', '.join(map(repr, unknown))}; "
                     f"known: {', '.join(FIRST_STAGE_PARAMETERS)}")
  if kind == "exact":
    if len(value) > 1:
      raise ModelError(f"{where}: {field} is exact but sets ANN parameters "
                       f"{', '.join(sorted(set(value) - {'kind'}))}; use kind \"ann\"")
    return None
  for name, rule in FIRST_STAGE_PARAMETERS.items():
    if name not in value:
      continue
    v = value[name]
    if isinstance(rule, tuple):
      if v not in rule:
        raise ModelError(f"{where}: {field} parameter {name!r} is {v!r}; expected one of "
                         f"{', '.join(rule)}")
    elif not isinstance(v, int) or isinstance(v, bool) or v < rule:
      raise ModelError(f"{where}: {field} parameter {name!r} must be an integer ≥ {rule}, "
                       f"got {v!r}")
  return dict(value)


def check_foreign(value, where, terms: tuple[str, ...]) -> dict | None:
  """The manifest's ``foreign`` field, validated: None when absent or null, else the settings
  (:data:`FOREIGN_SETTINGS`; ``lexical_weight`` only beside the lexical term). ModelError
  naming the field and the fault."""
  field = "field 'foreign'"
  if value is None:
    return None
  if not isinstance(value, dict):
    raise ModelError(f"{where}: {field} must be an object such as {{\"lexical_weight\": 4}}, "
                     f"got {value!r}")
  unknown = sorted(set(value) - set(FOREIGN_SETTINGS))
  if unknown:
    raise ModelError(f"{where}: {field} has unknown setting(s) {', '.join(map(repr, unknown))}; "
                     f"known: {', '.join(FOREIGN_SETTINGS)}")
  for name, least in FOREIGN_SETTINGS.items():
    v = value.get(name)
    if name in value and (isinstance(v, bool) or not isinstance(v, (int, float))
                          or not np.isfinite(v) or v < least):
      raise ModelError(f"{where}: {field} setting {name!r} must be a number ≥ {least:g}, "
                       f"got {v!r}")
  if "lexical_weight" in value and "lexical" not in terms:
    raise ModelError(f"{where}: {field} sets 'lexical_weight' but the model has no lexical term")
  return {k: float(v) for k, v in value.items()}


def from_tensors(tensors: dict, manifest: dict, where, tensors_where,
                 lexical: dict | None = None) -> Model:
  """A validated :class:`Model` from its tensors and manifest (and lexical.json's content for a
  model with the lexical term). ``where`` names the manifest, ``tensors_where`` the tensors."""
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
    raise ModelError(f"{where}: field 'query_encoder' must be a string or null, got {encoder!r}")
  terms = model_terms(manifest, tensors, where, tensors_where)
  has_ranking = SCHEMA["legacy"].get(manifest["format"], {}).get("ranking_field", True)
  ranking = manifest.get("ranking") if has_ranking else None
  if ranking is not None and ranking not in RANKINGS:
    raise ModelError(f"{where}: field 'ranking' is {ranking!r}; expected one of "
                     f"{', '.join(RANKINGS)}")
  first_stage = check_first_stage(manifest.get("first_stage"), where)
  foreign = check_foreign(manifest.get("foreign"), where, terms)
  t = check_tensors(tensors, terms, m, tensors_where)
  groups = {term_field(term): tuple(t[n] for n in term_tensors(term)) for term in terms}
  if "lexical" in terms:
    if lexical is None:
      name = SCHEMA["terms"]["lexical"]["file"]
      raise ModelError(f"{where}: the lexical term needs its file {name} (the tool texts its "
                       f"BM25 index is built from)")
  for term in terms:  # a term of one scalar tensor is held as a float
    specs = SCHEMA["terms"][term]["tensors"]
    if len(specs) == 1 and not specs[0]["shape"]:
      groups[term_field(term)] = float(groups[term_field(term)][0])
  model = Model(t["tool_embeddings"], t["projection"],
                np.stack([t[f"interaction_{k}"] for k in range(2, m + 1)]), tuple(tool_ids), m,
                k1, k_pool, encoder, ranking=ranking, lexical=lexical if "lexical" in terms
                else None, first_stage=first_stage, foreign=foreign, **groups)
  validate(model, tensors_where, where)
  return model


def validate(model: Model, where, manifest_where=None) -> None:
  """What shapes alone do not say: ids, unit rows, symmetry, the prior's sets, the lexical
  file's rows, the sizes and the ranking. ModelError naming the fault."""
  mwhere = manifest_where or where
  z, n = model.tool_embeddings, model.tool_embeddings.shape[0]
  if len(model.tool_ids) != n:
    raise ModelError(f"{mwhere}: field 'tool_ids' has {len(model.tool_ids)} ids but tensor "
                     f"'tool_embeddings' in {where} has {n} rows")
  seen: set[str] = set()
  for t in model.tool_ids:
    if t in seen:
      raise ModelError(f"{mwhere}: field 'tool_ids' repeats id {t!r}; ids must be distinct")
    seen.add(t)
  for m in range(2, model.max_set_size + 1):
    a = model.interactions[m - 2]
    err = float(np.max(np.abs(a - a.T))) if a.size else 0.0
    if err > SYMMETRY_RTOL * max(1.0, float(np.max(np.abs(a))) if a.size else 1.0):
      raise ModelError(f"{where}: tensor 'interaction_{m}' is not symmetric (max |M - Mᵀ| = "
                       f"{err:.3g}); HYSET interaction matrices must be symmetric")
  norms = np.linalg.norm(z, axis=1)
  bad = np.flatnonzero(np.abs(norms - 1.0) > NORM_ATOL)
  if bad.size:
    i = int(bad[0])
    raise ModelError(f"{where}: tensor 'tool_embeddings' row {i} (tool {model.tool_ids[i]!r}) "
                     f"has norm {norms[i]:.4g}; the model format requires unit rows "
                     f"({bad.size} rows off)")
  if model.prior is not None:
    _check_prior_members(model.prior[0], n, model.max_set_size, where)
  if model.lexical is not None and len(model.lexical["tool_texts"]) != n:
    raise ModelError(f"{mwhere}: the lexical term's field 'tool_texts' has "
                     f"{len(model.lexical['tool_texts'])} texts but tensor 'tool_embeddings' "
                     f"has {n} rows")
  ranking = model.ranking or "greedy"
  allowed = allowed_rankings(model.terms)
  if ranking not in allowed:
    culprits = [t for t in model.terms
                if ranking in SCHEMA["terms"][t].get("rankings_excluded", ())]
    raise ModelError(f"{mwhere}: field 'ranking' is {model.ranking!r} (greedy when absent); "
                     f"a model with the {', '.join(culprits)} term needs one of "
                     f"{', '.join(allowed)}")
  try:
    check_sizes(model, model.k1, model.k_pool, model.max_set_size, _MANIFEST_KNOBS)
  except ModelError as e:
    raise ModelError(f"{mwhere}: manifest {e}") from None


def _check_prior_members(members: np.ndarray, n: int, max_size: int, where) -> None:
  """Each row: 1..M distinct tool rows in [0, N) ascending, then -1; rows distinct."""
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


_MANIFEST_KNOBS = ("field 'k1'", "field 'k_pool'", "field 'max_set_size'")
FLAG_KNOBS = ("--k1", "--k-pool", "--max-size")


def check_sizes(model: Model, k1: int, k_pool: int, max_size: int,
                knobs: tuple[str, str, str] = FLAG_KNOBS) -> None:
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


# --------------------------------------------------------------------------- loading

def read_dir(path: pathlib.Path) -> Model:
  """A model directory: manifest.json, params.safetensors and each term's file."""
  mpath, ppath = path / MANIFEST_FILE, path / PARAMS_FILE
  manifest = read_json_object(mpath)
  tensors = read_safetensors(ppath)
  terms = model_terms(manifest, tensors, mpath, ppath)
  lexical = None
  if "lexical" in terms:
    lpath = path / SCHEMA["terms"]["lexical"]["file"]
    if not lpath.is_file():
      raise ModelError(f"model directory {path} has the lexical term but no {lpath.name}")
    lexical = check_lexical(read_json_object(lpath), lpath)
  return from_tensors(tensors, manifest, mpath, ppath, lexical)


# What np.load raises for a damaged .npz beyond OSError/ValueError: it is a zip archive, and
# zipfile fails on a bad entry with its own error, the decompressor's, or a refusal (a flipped
# compression method or encryption flag).
_ZIP_ERRORS: tuple[type[BaseException], ...] = (zipfile.BadZipFile, NotImplementedError,
                                                RuntimeError, zlib.error)
try:
  import lzma
  _ZIP_ERRORS += (lzma.LZMAError,)
except ImportError:  # a Python built without lzma cannot be asked to decompress it either
  pass


def read_npz(path: pathlib.Path) -> Model:
  """An npz export: the tensors with the manifest fields (and lexical_*) beside them."""
  try:
    with np.load(path, allow_pickle=False) as z:
      arrays = {k: z[k] for k in z.files}
  except (OSError, ValueError, EOFError, *_ZIP_ERRORS) as e:
    raise ModelError(f"{path}: not a readable .npz file ({e})") from None
  manifest: dict = {}
  for k in NPZ_FIELDS:
    if k in arrays:
      a = arrays[k]
      manifest[k] = a.tolist() if k in ("tool_ids", "terms") or a.ndim else a.item()
  lexical = None
  if "lexical_tool_texts" in manifest:
    lexical = check_lexical({k[len("lexical_"):]: manifest[k] for k in manifest
                             if k.startswith("lexical_")}, path)
  return from_tensors(arrays, manifest, path, path, lexical)


def load_model(path: str | pathlib.Path) -> Model:
  """A model directory, an npz export (file or directory) or a training workdir's best/."""
  path = pathlib.Path(path)
  if not path.exists():
    raise ModelError(f"model {path} does not exist; expected a model directory, an npz "
                     f"export or a training workdir")
  if path.is_dir() and (path / "model.npz").is_file():
    path = path / "model.npz"
  if path.is_file():
    if path.suffix != ".npz":
      raise ModelError(f"model {path} is a file but not an .npz export; expected a model "
                       f"directory, an npz export or a training workdir")
    return read_npz(path)
  if not (path / MANIFEST_FILE).is_file() and (path / "best").is_dir():
    path = path / "best"
  if not (path / MANIFEST_FILE).is_file() or not (path / PARAMS_FILE).is_file():
    raise ModelError(f"{path}: expected {MANIFEST_FILE} and {PARAMS_FILE} (a model "
                     f"directory), model.npz, or a training workdir with best/")
  return read_dir(path)
