"""The model directory (docs/contracts.md): what ``hyset export`` writes and ``hyset predict
--model`` reads, also when another stack wrote it. Format ``hyset/2`` is written, ``hyset/3``
when the model has a seen-set prior (so that a reader that predates the prior refuses it
instead of scoring without it), ``hyset/4`` when it has the lexical term (with or without a
prior); ``hyset/1`` (no tower, no ranking field) is still read.

Layout::

  params.safetensors   tool_embeddings f32[N, d_z]   (unit rows)
                       projection      f32[d_r, d_z]
                       interaction_2 … interaction_M f32[d_z, d_z]  (symmetric)
                       tower_w_in f32[L, d_r, H], tower_b_in f32[L, H],      (hyset/2, only
                       tower_w_out f32[L, H, d_r], tower_b_out f32[L, d_r]    when L ≥ 1)
                       conditioned_u f32[M-1, d_z, R], conditioned_w f32[M-1, d_r, R],
                       conditioned_v f32[M-1, d_r], conditioned_b f32[M-1]   (hyset/2, when
                                                                      the term is on)
                       prior_members i32[S, M] (tool rows, ascending, -1 padding),
                       prior_w f32[S, d_r], prior_b f32[S], prior_weight f32[] (λ ≥ 0),
                       prior_floor f32[] (log τ ≤ 0)                        (hyset/3, /4)
                       lexical_weight f32[] (β ≥ 0)                         (hyset/4 only)
  lexical.json         (hyset/4 only) {"tokenizer": "hyset-bm25/1", "k1": 1.5, "b": 0.75,
                        "tool_texts": [...N texts, row order...]}: the lexical term's BM25
                        index (hyset_jax.lexical)
  manifest.json        {"format": "hyset/2", "/3" or "/4", "tool_ids": [...N ids, row order...],
                        "max_set_size": M, "k1": K1, "k_pool": K_pool,
                        "query_encoder": "..." or null,
                        "ranking": "greedy"|"logit"|"set-first"|"set-mean"|"set-max"}

Loading validates everything and raises :class:`UserError` naming the tensor or field at fault.
Writing goes to a temporary directory renamed into place, so a killed export never leaves a
half-written directory that looks complete, and never replaces an existing one unless asked.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib

import numpy as np

from hyset_jax import lexical as lexical_lib
from hyset_jax.errors import UserError
from hyset_jax.inference import DEFAULT_RANKING, RANKINGS
from hyset_jax.scoring import HysetParams, QueryInteraction, QueryTower, SetPrior

FORMAT = "hyset/2"
PRIOR_FORMAT = "hyset/3"  # hyset/2 plus the seen-set prior's tensors
LEXICAL_FORMAT = "hyset/4"  # the lexical term's β and lexical.json (a prior optional)
READABLE = ("hyset/1", "hyset/2", "hyset/3", "hyset/4")
# Optional tensor groups: all of a group or none. The prior's only in (and always in) hyset/3.
GROUPS = {"tower": QueryTower, "conditioned": QueryInteraction, "prior": SetPrior}
INT_TENSORS = ("prior_members",)  # tool rows; every other tensor is f32
PARAMS_FILE = "params.safetensors"
MANIFEST_FILE = "manifest.json"
LEXICAL_FILE = "lexical.json"
# Symmetry and unit-norm tolerances: loose enough for f32 round-trips through other stacks,
# tight enough to catch a matrix that was never symmetrised or rows never normalised.
SYMMETRY_RTOL = 1e-4
NORM_ATOL = 1e-3


@dataclasses.dataclass(frozen=True)
class ModelDir:
  params: HysetParams          # NumPy arrays
  tool_ids: tuple[str, ...]
  max_set_size: int
  k1: int
  k_pool: int
  query_encoder: str | None    # None: the writer names no query encoder (bring embeddings)
  path: pathlib.Path | None = None
  ranking: str | None = None   # the default ranking method; None = inference.DEFAULT_RANKING
  # The lexical term's BM25 index (tool texts); set exactly when params.lexical_weight is.
  lexical: lexical_lib.LexicalIndex | None = None

  @property
  def default_ranking(self) -> str:
    """The ranking ``hyset predict`` uses without ``--ranking``: the recorded one, else
    inference.DEFAULT_RANKING."""
    return self.ranking or DEFAULT_RANKING

  def lexical_scores(self, queries) -> np.ndarray | None:
    """The lexical scores ``queries`` (texts) need under this model; None without the term."""
    return lexical_lib.query_scores(self.params.lexical_weight, self.lexical, queries)

  def manifest(self) -> dict:
    fmt = (LEXICAL_FORMAT if self.params.lexical_weight is not None
           else FORMAT if self.params.prior is None else PRIOR_FORMAT)
    return {"format": fmt, "tool_ids": list(self.tool_ids), "max_set_size": self.max_set_size,
            "k1": self.k1, "k_pool": self.k_pool, "query_encoder": self.query_encoder,
            "ranking": self.default_ranking}


def _int_field(manifest: dict, name: str, where: pathlib.Path) -> int:
  value = manifest.get(name)
  if not isinstance(value, int) or isinstance(value, bool):
    raise UserError(f"{where}: field {name!r} must be an integer, got {value!r}")
  return value


def _validate_tower(tower: QueryTower, d_r: int, where) -> None:
  w_in, b_in, w_out, b_out = tower
  depth = w_in.shape[0] if w_in.ndim == 3 else -1
  hidden = w_in.shape[2] if w_in.ndim == 3 else -1
  want = {"w_in": (depth, d_r, hidden), "b_in": (depth, hidden), "w_out": (depth, hidden, d_r),
          "b_out": (depth, d_r)}
  for name, a in tower._asdict().items():
    if depth < 1 or a.shape != want[name]:
      raise UserError(f"{where}: tensor 'tower_{name}' must be {list(want[name])} (L, d_r, H "
                      f"from tower_w_in and projection), got shape {list(a.shape)}")
    if not np.all(np.isfinite(a)):
      raise UserError(f"{where}: tensor 'tower_{name}' contains NaN or inf")


def _validate_conditioned(qi: QueryInteraction, d_r: int, d_z: int, max_size: int,
                          where) -> None:
  k = max_size - 1
  rank = qi.u.shape[2] if qi.u.ndim == 3 else -1
  want = {"u": (k, d_z, rank), "w": (k, d_r, rank), "v": (k, d_r), "b": (k,)}
  for name, a in qi._asdict().items():
    if rank < 0 or a.shape != want[name]:
      raise UserError(f"{where}: tensor 'conditioned_{name}' must be {list(want[name])} "
                      f"(M-1, d_z or d_r, R), got shape {list(a.shape)}")
    if not np.all(np.isfinite(a)):
      raise UserError(f"{where}: tensor 'conditioned_{name}' contains NaN or inf")


def _validate_prior(prior: SetPrior, num_tools: int, d_r: int, max_size: int, where) -> None:
  members = prior.members
  s = members.shape[0] if members.ndim == 2 else -1
  want = {"members": (s, max_size), "w": (s, d_r), "b": (s,), "weight": (), "floor": ()}
  for name, a in prior._asdict().items():
    if s < 1 or a.shape != want[name]:
      raise UserError(f"{where}: tensor 'prior_{name}' must be {list(want[name])} (S sets, "
                      f"max_set_size, d_r), got shape {list(a.shape)}")
    if name != "members" and not np.all(np.isfinite(a)):
      raise UserError(f"{where}: tensor 'prior_{name}' contains NaN or inf")
  real, first = members >= 0, {}
  for i, row in enumerate(members):
    j = first.setdefault(tuple(row.tolist()), i)
    if j != i:
      raise UserError(f"{where}: tensor 'prior_members' row {i} repeats row {j}; the prior's "
                      f"sets must be distinct")
    n = int(real[i].sum())
    ok = (n >= 1 and real[i, :n].all() and (row[n:] == -1).all()
          and (row[:n] < num_tools).all() and (np.diff(row[:n]) > 0).all())
    if not ok:
      raise UserError(f"{where}: tensor 'prior_members' row {i} is {row.tolist()}; expected "
                      f"1..{max_size} distinct tool rows in [0, {num_tools}) ascending, then -1")
  if float(prior.weight) < 0 or float(prior.floor) > 0:
    raise UserError(f"{where}: tensors 'prior_weight' (λ = {float(prior.weight):g}) and "
                    f"'prior_floor' (log τ = {float(prior.floor):g}) must be ≥ 0 and ≤ 0")


def validate(model: ModelDir, where: pathlib.Path | str = "model",
             manifest_where: pathlib.Path | str | None = None) -> None:
  """Check shapes, finiteness, symmetry, unit rows and the shortlist sizes; UserError if not.

  ``where`` names the tensors' file, ``manifest_where`` the manifest's (default: ``where``).
  """
  from hyset_jax.enumeration import validate_sizes
  mwhere = manifest_where or where
  z, p, ms, tower, cond, prior, lexical_weight = model.params
  if z.ndim != 2:
    raise UserError(f"{where}: tensor 'tool_embeddings' must be [N, d_z], got shape {z.shape}")
  n, d_z = z.shape
  if p.ndim != 2 or p.shape[1] != d_z:
    raise UserError(f"{where}: tensor 'projection' must be [d_r, {d_z}] (d_z from "
                    f"tool_embeddings), got shape {p.shape}")
  for m in range(2, model.max_set_size + 1):
    if ms[m - 2].shape != (d_z, d_z):
      raise UserError(f"{where}: tensor 'interaction_{m}' must be [{d_z}, {d_z}], "
                      f"got shape {ms[m - 2].shape}")
  if tower is not None:
    _validate_tower(tower, p.shape[0], where)
  if cond is not None:
    _validate_conditioned(cond, p.shape[0], d_z, model.max_set_size, where)
  if prior is not None:
    _validate_prior(prior, n, p.shape[0], model.max_set_size, where)
  if (lexical_weight is None) != (model.lexical is None):
    raise UserError(f"{where}: " + (
        "tensor 'lexical_weight' (the lexical term's β) needs the tool texts of "
        f"{LEXICAL_FILE}" if model.lexical is None else
        f"{LEXICAL_FILE} (the lexical term) needs tensor 'lexical_weight'"))
  if lexical_weight is not None:
    beta = np.asarray(lexical_weight)
    if beta.shape != () or not np.isfinite(beta) or beta < 0:
      raise UserError(f"{where}: tensor 'lexical_weight' must be one finite number ≥ 0 (β), "
                      f"got {beta.tolist()!r}")
    if len(model.lexical.tool_texts) != n:
      raise UserError(f"{LEXICAL_FILE}: field 'tool_texts' has {len(model.lexical.tool_texts)} "
                      f"texts but tensor 'tool_embeddings' has {n} rows")
  if len(model.tool_ids) != n:
    raise UserError(f"{mwhere}: field 'tool_ids' has {len(model.tool_ids)} ids but tensor "
                    f"'tool_embeddings' in {where} has {n} rows")
  if len(set(model.tool_ids)) != n:
    seen = set()
    dup = next(t for t in model.tool_ids if t in seen or seen.add(t))
    raise UserError(f"{mwhere}: field 'tool_ids' repeats id {dup!r}; ids must be distinct")
  if model.ranking is not None and model.ranking not in RANKINGS:
    raise UserError(f"{mwhere}: field 'ranking' is {model.ranking!r}; expected one of "
                    f"{', '.join(RANKINGS)}")
  if prior is not None and model.default_ranking == "greedy":
    raise UserError(f"{mwhere}: field 'ranking' is {model.ranking!r} (greedy when absent); a "
                    f"model with a seen-set prior needs logit, set-first, set-mean or set-max")
  for name, a in (("tool_embeddings", z), ("projection", p)):
    if not np.all(np.isfinite(a)):
      raise UserError(f"{where}: tensor {name!r} contains NaN or inf")
  for m in range(2, model.max_set_size + 1):
    a = ms[m - 2]
    if not np.all(np.isfinite(a)):
      raise UserError(f"{where}: tensor 'interaction_{m}' contains NaN or inf")
    err = float(np.max(np.abs(a - a.T))) if a.size else 0.0
    if err > SYMMETRY_RTOL * max(1.0, float(np.max(np.abs(a)))):
      raise UserError(f"{where}: tensor 'interaction_{m}' is not symmetric (max |M - Mᵀ| = "
                      f"{err:.3g}); HYSET interaction matrices must be symmetric")
  norms = np.linalg.norm(z, axis=1)
  bad = np.flatnonzero(np.abs(norms - 1.0) > NORM_ATOL)
  if bad.size:
    i = int(bad[0])
    raise UserError(f"{where}: tensor 'tool_embeddings' row {i} (tool {model.tool_ids[i]!r}) "
                    f"has norm {norms[i]:.4g}; the model format requires unit rows ({bad.size} rows off)")
  try:
    validate_sizes(model.k_pool, model.max_set_size, k1=model.k1, num_tools=n)
  except UserError as e:
    raise UserError(f"{mwhere}: fields 'k1', 'k_pool', 'max_set_size': {e}") from None


def load_model_dir(path: str | os.PathLike) -> ModelDir:
  """Read and validate a ``hyset/2`` (or ``hyset/1``) directory. Returns NumPy f32 parameters."""
  from safetensors import SafetensorError
  from safetensors.numpy import load_file

  path = pathlib.Path(path)
  if not path.is_dir():
    raise UserError(f"model directory {path} does not exist (expected {PARAMS_FILE} and "
                    f"{MANIFEST_FILE} in it)")
  for f in (PARAMS_FILE, MANIFEST_FILE):
    if not (path / f).is_file():
      raise UserError(f"model directory {path} has no {f}")
  mpath = path / MANIFEST_FILE
  manifest = _read_json_object(mpath)
  fmt = manifest.get("format")
  if fmt not in READABLE:
    raise UserError(f"{mpath}: field 'format' is {fmt!r}; this version reads "
                    f"{' and '.join(map(repr, READABLE))}")
  tool_ids = manifest.get("tool_ids")
  if not isinstance(tool_ids, list) or not all(isinstance(t, str) for t in tool_ids):
    raise UserError(f"{mpath}: field 'tool_ids' must be a list of strings")
  max_set_size = _int_field(manifest, "max_set_size", mpath)
  k1 = _int_field(manifest, "k1", mpath)
  k_pool = _int_field(manifest, "k_pool", mpath)
  query_encoder = manifest.get("query_encoder")
  if query_encoder is not None and not isinstance(query_encoder, str):
    raise UserError(f"{mpath}: field 'query_encoder' must be a string or null, got "
                    f"{query_encoder!r}")
  ranking = manifest.get("ranking") if fmt != "hyset/1" else None
  if ranking is not None and not isinstance(ranking, str):
    raise UserError(f"{mpath}: field 'ranking' must be a string, got {ranking!r}")
  if max_set_size < 2:
    raise UserError(f"{mpath}: field 'max_set_size' must be ≥ 2, got {max_set_size}")

  ppath = path / PARAMS_FILE
  try:
    tensors = load_file(str(ppath))
  except (SafetensorError, OSError, ValueError) as e:
    raise UserError(f"{ppath}: cannot read safetensors file ({e})") from None
  expected = ["tool_embeddings", "projection"] + [
      f"interaction_{m}" for m in range(2, max_set_size + 1)]
  for name in expected:
    if name not in tensors:
      raise UserError(f"{ppath}: missing tensor {name!r} (max_set_size = {max_set_size} needs "
                      f"{', '.join(expected)})")
  present = {}
  for group, cls in GROUPS.items():
    names = [f"{group}_{f}" for f in cls._fields]
    have = [t for t in names if t in tensors]
    if have and fmt == "hyset/1":
      raise UserError(f"{ppath}: tensor {have[0]!r} belongs to format 'hyset/2' ({group}); "
                      f"the manifest says 'hyset/1'")
    if group == "prior" and fmt != LEXICAL_FORMAT and (fmt == PRIOR_FORMAT) != bool(have):
      raise UserError(f"{ppath}: " + (
          f"tensor {have[0]!r} belongs to format {PRIOR_FORMAT!r} (the seen-set prior); the "
          f"manifest says {fmt!r}" if have else
          f"format {PRIOR_FORMAT!r} (in {mpath}) needs the seen-set prior's tensors "
          f"{', '.join(names)}"))
    if have and len(have) != len(names):
      missing = [t for t in names if t not in tensors]
      raise UserError(f"{ppath}: missing tensor {missing[0]!r} (the {group} needs all of "
                      f"{', '.join(names)})")
    if have:
      present[group] = names
      expected += names
  lexical = None
  if fmt == LEXICAL_FORMAT:
    if "lexical_weight" not in tensors:
      raise UserError(f"{ppath}: format {LEXICAL_FORMAT!r} (in {mpath}) needs tensor "
                      f"'lexical_weight' (the lexical term's β)")
    expected.append("lexical_weight")
    lexical = _load_lexical(path / LEXICAL_FILE)
  elif "lexical_weight" in tensors:
    raise UserError(f"{ppath}: tensor 'lexical_weight' belongs to format {LEXICAL_FORMAT!r} "
                    f"(the lexical term); the manifest says {fmt!r}")
  extra = sorted(set(tensors) - set(expected))
  if extra:
    raise UserError(f"{ppath}: unexpected tensor(s) {', '.join(map(repr, extra))} for "
                    f"max_set_size = {max_set_size}")
  for name in expected:
    kind = np.integer if name in INT_TENSORS else np.floating
    if not np.issubdtype(tensors[name].dtype, kind):
      raise UserError(f"{ppath}: tensor {name!r} must be "
                      f"{'integer' if kind is np.integer else 'floating point'}, got "
                      f"{tensors[name].dtype}")
  f32 = {k: np.asarray(v, np.int32 if k in INT_TENSORS else np.float32)
         for k, v in tensors.items()}
  if f32["tool_embeddings"].ndim != 2:
    raise UserError(f"{ppath}: tensor 'tool_embeddings' must be [N, d_z], "
                    f"got shape {f32['tool_embeddings'].shape}")
  d_z = f32["tool_embeddings"].shape[1]
  for m in range(2, max_set_size + 1):
    if f32[f"interaction_{m}"].shape != (d_z, d_z):
      raise UserError(f"{ppath}: tensor 'interaction_{m}' must be [{d_z}, {d_z}], "
                      f"got shape {f32[f'interaction_{m}'].shape}")
  groups = {g: GROUPS[g](*(f32[t] for t in names)) for g, names in present.items()}
  params = HysetParams(
      f32["tool_embeddings"], f32["projection"],
      np.stack([f32[f"interaction_{m}"] for m in range(2, max_set_size + 1)]), **groups,
      lexical_weight=f32.get("lexical_weight"))
  model = ModelDir(params, tuple(tool_ids), max_set_size, k1, k_pool, query_encoder, path,
                   ranking, lexical)
  validate(model, ppath, mpath)
  return model


def _read_json_object(path: pathlib.Path) -> dict:
  """The JSON object in `path`, or a UserError naming the file."""
  try:
    doc = json.loads(path.read_text(encoding="utf-8"))
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise UserError(f"{path}: not valid JSON ({e})") from None
  if not isinstance(doc, dict):
    raise UserError(f"{path}: expected a JSON object")
  return doc


def _load_lexical(lpath: pathlib.Path) -> lexical_lib.LexicalIndex:
  """lexical.json of a hyset/4 directory, validated."""
  if not lpath.is_file():
    raise UserError(f"model directory {lpath.parent} (format {LEXICAL_FORMAT!r}) has no "
                    f"{LEXICAL_FILE}")
  doc = _read_json_object(lpath)
  if doc.get("tokenizer") != lexical_lib.TOKENIZER:
    raise UserError(f"{lpath}: field 'tokenizer' is {doc.get('tokenizer')!r}; this version "
                    f"reads {lexical_lib.TOKENIZER!r}")
  texts = doc.get("tool_texts")
  if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
    raise UserError(f"{lpath}: field 'tool_texts' must be a list of strings")
  for name in ("k1", "b"):
    v = doc.get(name)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
      raise UserError(f"{lpath}: field {name!r} must be a number ≥ 0 (BM25's {name}), got {v!r}")
  if not texts:
    raise UserError(f"{lpath}: field 'tool_texts' is empty")
  return lexical_lib.LexicalIndex(tuple(texts), k1=float(doc["k1"]), b=float(doc["b"]))


def lexical_document(index: lexical_lib.LexicalIndex) -> dict:
  """lexical.json's content (also what the exports carry)."""
  return {"tokenizer": lexical_lib.TOKENIZER, "k1": index.k1, "b": index.b,
          "tool_texts": list(index.tool_texts)}


def tensors(params: HysetParams, max_set_size: int) -> dict[str, np.ndarray]:
  """θ as the named tensors of params.safetensors (also the arrays of the npz export): f32, but
  the prior's members int32."""
  out = {"tool_embeddings": np.ascontiguousarray(params.tool_embeddings, np.float32),
         "projection": np.ascontiguousarray(params.projection, np.float32)}
  out.update({f"interaction_{m}": np.ascontiguousarray(params.interactions[m - 2], np.float32)
              for m in range(2, max_set_size + 1)})
  for group in GROUPS:
    values = getattr(params, group)
    if values is not None:
      # np.asarray(order="C"), not ascontiguousarray: λ and log τ stay 0-d.
      out.update({f"{group}_{k}": np.asarray(
          v, np.int32 if f"{group}_{k}" in INT_TENSORS else np.float32, order="C")
                  for k, v in values._asdict().items()})
  if params.lexical_weight is not None:
    out["lexical_weight"] = np.asarray(params.lexical_weight, np.float32, order="C")
  return out


def save_model_dir(path: str | os.PathLike, model: ModelDir, *, force: bool = False) -> pathlib.Path:
  """Write ``model`` as a ``hyset/2`` directory (``hyset/3`` with a seen-set prior, ``hyset/4``
  with the lexical term).

  An existing non-empty ``path`` is replaced only with ``force=True``.
  """
  from safetensors.numpy import save_file

  from hyset_jax.io_utils import atomic_dir

  path = pathlib.Path(path)
  validate(model, path)
  with atomic_dir(path, force) as tmp:
    save_file(tensors(model.params, model.max_set_size), str(tmp / PARAMS_FILE))
    (tmp / MANIFEST_FILE).write_text(json.dumps(model.manifest(), indent=1) + "\n",
                                     encoding="utf-8")
    if model.lexical is not None:
      (tmp / LEXICAL_FILE).write_text(json.dumps(lexical_document(model.lexical),
                                                 ensure_ascii=False) + "\n", encoding="utf-8")
  return path


# --------------------------------------------------------------------------- paths

def enclosing_workdir(path: pathlib.Path) -> pathlib.Path | None:
  """The training workdir ``path`` lies inside (a checkpoint step, checkpoints/), if any."""
  for parent in path.resolve().parents:
    if (parent / "config.json").is_file() and (parent / "checkpoints").is_dir():
      return parent
  return None


def best_model_dir(workdir: str | pathlib.Path) -> pathlib.Path:
  """The model directory of a workdir's best model, or the path itself if it is one."""
  path = pathlib.Path(workdir)
  if not path.is_dir():
    raise UserError(f"{path} does not exist or is not a directory; expected a hyset train "
                    f"workdir or a model directory")
  if (path / "manifest.json").is_file():
    return path
  if (path / "best" / "manifest.json").is_file():
    return path / "best"
  outer = enclosing_workdir(path)
  if outer is not None:
    raise UserError(f"{path} is inside the training workdir {outer} (an Orbax checkpoint, not a "
                    f"model directory); pass the workdir itself ({outer}), whose best/ model "
                    f"is used")
  if not (path / "config.json").is_file() and not (path / "checkpoints").is_dir():
    raise UserError(f"{path} is neither a model directory (no manifest.json) nor a hyset "
                    f"train workdir (no config.json, checkpoints/ or best/)")
  steps = sorted(int(p.name) for p in (path / "checkpoints").glob("*") if p.name.isdigit())
  why = (f"it has checkpoints up to step {steps[-1]} but no evaluation has finished yet"
         if steps else "it has no checkpoints either")
  raise UserError(f"{path} holds no trained model (no best/manifest.json; {why}); run "
                  f"hyset train --workdir {path} until its first evaluation")


def data_spec(source: pathlib.Path, explicit: str | None) -> str | None:
  """--data, else data.spec of the training run's config.json (beside best/)."""
  if explicit:
    return explicit
  for config in (source / "config.json", source.parent / "config.json"):
    if config.is_file():
      try:
        return json.loads(config.read_text(encoding="utf-8"))["data"]["spec"]
      except (ValueError, KeyError, TypeError):
        return None
  return None
