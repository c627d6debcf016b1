"""The model directory (docs/contracts.md): what ``hyset export`` writes and ``hyset predict
--model`` reads, also when another stack wrote it.

The current format (:data:`FORMAT`) is written: ``manifest.json`` lists the terms the model
carries beside the paper's core θ (``"terms": ["tower", "lexical", …]``,
:mod:`hyset_jax.model.terms`), and a reader refuses a term it does not know. Every tensor's name and shape is declared once, in
``model_schema.json``; reading and checking are :mod:`hyset_jax.io.model_format`'s (the module the
NumPy-only ``reference.py`` reads with too), which also reads every earlier version.

Layout::

  params.safetensors   tool_embeddings f32[N, d_z] (unit rows), projection f32[d_r, d_z],
                       interaction_2 … interaction_M f32[d_z, d_z] (symmetric), and each
                       carried term's tensors (model_schema.json)
  lexical.json         (the lexical term) {"tokenizer": "hyset-bm25/1", "k1": 1.5, "b": 0.75,
                        "tool_texts": [...N texts, row order...]}: its BM25 index
  manifest.json        {"format": FORMAT, "terms": [...], "tool_ids": [...N ids, row
                        order...], "max_set_size": M, "k1": K1, "k_pool": K_pool,
                        "query_encoder": "..." or null,
                        "ranking": "greedy"|"logit"|"set-first"|"set-mean"|"set-max",
                        "first_stage": "exact" | {"kind": "ann", ...} (optional: the
                        approximate first stage, hyset_jax/inference/ann.py; absent = exact),
                        "foreign": {"lexical_weight": β} (optional: what the model uses on
                        a library with none of its tools, hyset_jax/io/carry.py),
                        "fits": [...] (optional: what training chose after θ, a record)}

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

from hyset_jax.model import lexical as lexical_lib
from hyset_jax.io import model_format
from hyset_jax.model import terms
from hyset_jax.errors import UserError
from hyset_jax.inference.pipeline import DEFAULT_RANKING
from hyset_jax.model.query_inputs import QueryInputs
from hyset_jax.model.scoring import HysetParams

FORMAT = model_format.FORMAT
READABLE = model_format.FORMATS
PARAMS_FILE = model_format.PARAMS_FILE
MANIFEST_FILE = model_format.MANIFEST_FILE
LEXICAL_FILE = model_format.SCHEMA["terms"]["lexical"]["file"]
SYMMETRY_RTOL = model_format.SYMMETRY_RTOL
NORM_ATOL = model_format.NORM_ATOL


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
  # The lexical term's BM25 index (its file: the tool texts); set exactly when the term is.
  lexical: lexical_lib.LexicalIndex | None = None
  # What training chose after θ (hyset_jax.training.post_theta): per fitted term, each
  # candidate's validation score and the one chosen. A record for the reader, written as the
  # manifest's "fits"; not read back (a library edit makes it stale, so the edit drops it).
  fits: tuple[dict, ...] = ()
  # How stage 1 and the expansion find their candidates: None = the exact scan (the default),
  # else {"kind": "ann", ...parameters} (model_format.check_first_stage; read by
  # hyset_jax.inference.ann.settings). Written as the manifest's "first_stage".
  first_stage: dict | None = None
  # What the model uses on a library that lists none of its tools (hyset_jax.io.carry.foreign),
  # chosen by training after θ: None, or {"lexical_weight": β}. The manifest's "foreign".
  foreign: dict | None = None

  @property
  def default_ranking(self) -> str:
    """The ranking ``hyset predict`` uses without ``--ranking``: the recorded one, else
    inference.DEFAULT_RANKING."""
    return self.ranking or DEFAULT_RANKING

  @property
  def terms(self) -> tuple[str, ...]:
    """The names of the terms the model carries, in registry order."""
    return terms.names(self.params)

  def lexical_scores(self, queries) -> np.ndarray | None:
    """The lexical scores ``queries`` (texts) need under this model; None without the term."""
    return lexical_lib.query_scores(self.params.lexical_weight, self.lexical, queries)

  def query_inputs(self, embeddings, texts=None) -> QueryInputs:
    """What inference needs for these queries under this model: the embeddings f32[Q, d_r]
    and each term's input (the lexical term scores the query ``texts``)."""
    if self.lexical is not None and texts is None:
      raise ValueError("this model has a lexical term: it needs the query texts")
    return QueryInputs(embeddings, self.lexical_scores(texts) if self.lexical else None)

  def manifest(self) -> dict:
    return {"format": FORMAT, "terms": list(self.terms), "tool_ids": list(self.tool_ids),
            "max_set_size": self.max_set_size, "k1": self.k1, "k_pool": self.k_pool,
            "query_encoder": self.query_encoder, "ranking": self.default_ranking} | (
                {"first_stage": dict(self.first_stage)} if self.first_stage else {}) | (
                {"foreign": dict(self.foreign)} if self.foreign else {}) | (
                {"fits": list(self.fits)} if self.fits else {})


def _user_errors(fn, *args):
  """``fn(*args)`` with model_format's errors raised as the CLI's UserError (exit 2)."""
  try:
    return fn(*args)
  except model_format.ModelError as e:
    raise UserError(str(e)) from None


def validate(model: ModelDir, where: pathlib.Path | str = "model",
             manifest_where: pathlib.Path | str | None = None) -> None:
  """Check ``model`` exactly as a reader checks a directory (shapes, finiteness, symmetry, unit
  rows, the terms' own rules, the sizes); UserError if not. ``where`` names the tensors'
  file, ``manifest_where`` the manifest's (default: ``where``)."""
  if (model.params.lexical_weight is None) != (model.lexical is None):
    raise UserError(f"{where}: " + (
        "tensor 'lexical_weight' (the lexical term's β) needs the tool texts of "
        f"{LEXICAL_FILE}" if model.lexical is None else
        f"{LEXICAL_FILE} (the lexical term) needs tensor 'lexical_weight'"))
  lexical = None if model.lexical is None else lexical_document(model.lexical)
  _user_errors(model_format.from_tensors, tensors(model.params, model.max_set_size),
               model.manifest() | {"ranking": model.ranking}, manifest_where or where, where,
               lexical)


def from_model(m: model_format.Model, path: pathlib.Path | None = None) -> ModelDir:
  """A :class:`ModelDir` (NumPy HysetParams, term values in their NamedTuples) from what
  :mod:`hyset_jax.io.model_format` read."""
  values = {t.field: t.unpack(getattr(m, t.field)) for t in terms.REGISTRY.values()
            if getattr(m, t.field) is not None}
  params = HysetParams(m.tool_embeddings, m.projection, m.interactions, **values)
  lexical = None if m.lexical is None else lexical_lib.LexicalIndex(
      tuple(m.lexical["tool_texts"]), k1=m.lexical["k1"], b=m.lexical["b"])
  return ModelDir(params, m.tool_ids, m.max_set_size, m.k1, m.k_pool, m.query_encoder, path,
                  m.ranking, lexical, first_stage=m.first_stage, foreign=m.foreign)


def load_model_dir(path: str | os.PathLike) -> ModelDir:
  """Read and validate a model directory (any version). Returns NumPy f32 parameters."""
  path = pathlib.Path(path)
  if not path.is_dir():
    raise UserError(f"model directory {path} does not exist (expected {PARAMS_FILE} and "
                    f"{MANIFEST_FILE} in it)")
  for f in (PARAMS_FILE, MANIFEST_FILE):
    if not (path / f).is_file():
      raise UserError(f"model directory {path} has no {f}")
  return from_model(_user_errors(model_format.read_dir, path), path)


def load_best(path: str | os.PathLike) -> tuple[pathlib.Path, ModelDir]:
  """(directory, model) of a model directory or a ``hyset train`` workdir (its best/)."""
  source = best_model_dir(path)
  return source, load_model_dir(source)


def lexical_document(index: lexical_lib.LexicalIndex) -> dict:
  """lexical.json's content (also what the exports carry)."""
  return {"tokenizer": lexical_lib.TOKENIZER, "k1": index.k1, "b": index.b,
          "tool_texts": list(index.tool_texts)}


def tensors(params: HysetParams, max_set_size: int) -> dict[str, np.ndarray]:
  """θ as the named tensors of params.safetensors (also the arrays of the npz export): the
  core's, then each carried term's (f32, tool rows int32)."""
  out = {"tool_embeddings": np.ascontiguousarray(params.tool_embeddings, np.float32),
         "projection": np.ascontiguousarray(params.projection, np.float32)}
  out.update({f"interaction_{m}": np.ascontiguousarray(params.interactions[m - 2], np.float32)
              for m in range(2, max_set_size + 1)})
  for term in terms.carried(params):
    out.update(term.pack(term.value(params)))
  return out


def save_model_dir(path: str | os.PathLike, model: ModelDir, *, force: bool = False) -> pathlib.Path:
  """Write ``model`` as a model directory of the current format. An existing non-empty
  ``path`` is replaced only with ``force=True``."""
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
