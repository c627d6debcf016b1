"""A BERT-family encoder in Flax NNX that loads Hugging Face ``model.safetensors``.

transformers 5 ships no Flax models, so the frozen sentence encoder is written
here: token + position + token-type embeddings, LayerNorm, then
``num_hidden_layers`` post-LayerNorm blocks of multi-head self-attention and a GELU
feed-forward network, exactly as ``transformers.BertModel`` computes them. The
pooler head is not built: sentence-transformers pools the token states itself.

Shapes: ``B`` batch rows, ``S`` sequence length, ``H`` hidden size, ``N`` heads,
``D = H // N`` per-head size, ``F`` intermediate (feed-forward) size.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hyset_jax.errors import UserError

# float32 parity with the PyTorch reference needs full-precision matmuls; the
# default on GPU/TPU would round operands to bf16/tf32.
_PRECISION = jax.lax.Precision.HIGHEST

# Tensors a checkpoint may carry that this encoder does not use: the pooler and
# masked-LM heads, and the position-id buffer older exports saved with the weights.
_IGNORED_PREFIXES = ("pooler.", "cls.", "embeddings.position_ids")

# The exact-erf GELU; "gelu_new"/"gelu_pytorch_tanh" are the tanh approximation.
_ACTIVATIONS = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
}


@dataclasses.dataclass(frozen=True)
class BertConfig:
  """The fields of a Hugging Face BERT ``config.json`` that define the network."""
  vocab_size: int
  hidden_size: int
  num_hidden_layers: int
  num_attention_heads: int
  intermediate_size: int
  max_position_embeddings: int
  type_vocab_size: int = 2
  layer_norm_eps: float = 1e-12
  hidden_act: str = "gelu"

  @classmethod
  def from_json(cls, path: str | os.PathLike) -> "BertConfig":
    """Reads ``config.json``; raises :class:`UserError` naming a missing or bad field."""
    path = pathlib.Path(path)
    try:
      raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
      raise UserError(f"{path}: missing; a model directory needs a Hugging Face config.json") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
      raise UserError(f"{path}: not valid UTF-8 JSON ({e})") from None
    if not isinstance(raw, dict):
      raise UserError(f"{path}: expected a JSON object")
    return cls.from_dict(raw, source=str(path))

  @classmethod
  def from_dict(cls, raw: Mapping[str, Any], source: str = "config") -> "BertConfig":
    """Builds a config from a parsed ``config.json`` dict, checking every field."""
    # RoBERTa-style models offset their position ids and MPNet adds relative
    # attention bias: same tensor names, different numbers, so refuse them.
    model_type = raw.get("model_type", "bert")
    if model_type != "bert":
      raise UserError(f"{source}: model_type {model_type!r} is not supported; "
                      "the encoder implements model_type 'bert'")
    if raw.get("position_embedding_type", "absolute") != "absolute":
      raise UserError(f"{source}: position_embedding_type "
                      f"{raw['position_embedding_type']!r} is not supported (only 'absolute')")
    values = {}
    for field in dataclasses.fields(cls):
      if field.name in raw:
        values[field.name] = raw[field.name]
      elif field.default is dataclasses.MISSING:
        raise UserError(f"{source}: missing field {field.name!r}")
    config = cls(**values)
    if config.hidden_act not in _ACTIVATIONS:
      raise UserError(f"{source}: hidden_act {config.hidden_act!r} is not supported; "
                      f"expected one of {sorted(_ACTIVATIONS)}")
    if config.hidden_size % config.num_attention_heads:
      raise UserError(f"{source}: hidden_size {config.hidden_size} is not divisible by "
                      f"num_attention_heads {config.num_attention_heads}")
    return config


class BertEmbeddings(nnx.Module):
  """Sum of token, position and token-type embeddings, then LayerNorm."""

  def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
    h = config.hidden_size
    self.word_embeddings = nnx.Embed(config.vocab_size, h, rngs=rngs)
    self.position_embeddings = nnx.Embed(config.max_position_embeddings, h, rngs=rngs)
    self.token_type_embeddings = nnx.Embed(config.type_vocab_size, h, rngs=rngs)
    self.norm = nnx.LayerNorm(h, epsilon=config.layer_norm_eps, rngs=rngs)

  def __call__(self, input_ids: jax.Array, token_type_ids: jax.Array) -> jax.Array:
    """int [B, S] ids and token types -> float [B, S, H]."""
    positions = jnp.arange(input_ids.shape[1])[None, :]
    x = (self.word_embeddings(input_ids) + self.position_embeddings(positions)
         + self.token_type_embeddings(token_type_ids))
    return self.norm(x)


class SelfAttention(nnx.Module):
  """Multi-head scaled dot-product self-attention with its output projection."""

  def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
    h = config.hidden_size
    self.num_heads = config.num_attention_heads
    self.query = nnx.Linear(h, h, precision=_PRECISION, rngs=rngs)
    self.key = nnx.Linear(h, h, precision=_PRECISION, rngs=rngs)
    self.value = nnx.Linear(h, h, precision=_PRECISION, rngs=rngs)
    self.out = nnx.Linear(h, h, precision=_PRECISION, rngs=rngs)

  def __call__(self, x: jax.Array, key_bias: jax.Array) -> jax.Array:
    """float [B, S, H] and additive key bias [B, 1, 1, S] -> float [B, S, H]."""
    b, s, h = x.shape
    split = lambda t: t.reshape(b, s, self.num_heads, h // self.num_heads)  # [B, S, N, D]
    q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
    logits = jnp.einsum("bqnd,bknd->bnqk", q, k, precision=_PRECISION)
    logits = logits / np.sqrt(h // self.num_heads) + key_bias  # [B, N, S, S]
    weights = jax.nn.softmax(logits, axis=-1)
    context = jnp.einsum("bnqk,bknd->bqnd", weights, v, precision=_PRECISION)
    return self.out(context.reshape(b, s, h))


class BertLayer(nnx.Module):
  """One post-LayerNorm transformer block: attention, then feed-forward, each residual."""

  def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
    h, f, eps = config.hidden_size, config.intermediate_size, config.layer_norm_eps
    self.attention = SelfAttention(config, rngs=rngs)
    self.attention_norm = nnx.LayerNorm(h, epsilon=eps, rngs=rngs)
    self.ffn_in = nnx.Linear(h, f, precision=_PRECISION, rngs=rngs)
    self.ffn_out = nnx.Linear(f, h, precision=_PRECISION, rngs=rngs)
    self.ffn_norm = nnx.LayerNorm(h, epsilon=eps, rngs=rngs)
    self.activation = config.hidden_act  # a string, so the module stays a plain pytree

  def __call__(self, x: jax.Array, key_bias: jax.Array) -> jax.Array:
    """float [B, S, H] -> float [B, S, H]."""
    x = self.attention_norm(x + self.attention(x, key_bias))
    hidden = _ACTIVATIONS[self.activation](self.ffn_in(x))  # [B, S, F]
    return self.ffn_norm(x + self.ffn_out(hidden))


class BertModel(nnx.Module):
  """Embeddings plus ``num_hidden_layers`` blocks; returns the last hidden states."""

  def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
    self.config = config
    self.embeddings = BertEmbeddings(config, rngs=rngs)
    self.layers = nnx.List([BertLayer(config, rngs=rngs) for _ in range(config.num_hidden_layers)])

  def __call__(self, input_ids: jax.Array, attention_mask: jax.Array,
               token_type_ids: jax.Array | None = None) -> jax.Array:
    """Encodes a padded batch.

    Args:
      input_ids: int [B, S] word-piece ids.
      attention_mask: int or bool [B, S], 1 for real tokens, 0 for padding.
      token_type_ids: int [B, S] segment ids; zeros when None.

    Returns:
      float32 [B, S, H] last-layer token states (padding rows hold garbage that
      pooling masks out).
    """
    x = self.embed(input_ids, token_type_ids)
    return self.run_layers(x, attention_bias(attention_mask, x.dtype))

  def embed(self, input_ids: jax.Array, token_type_ids: jax.Array | None = None) -> jax.Array:
    """The input of layer 0: int [B, S] ids (and segment ids, zeros when None) -> float [B, S, H]."""
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)
    return self.embeddings(input_ids, token_type_ids)

  def run_layers(self, x: jax.Array, key_bias: jax.Array, start: int = 0,
                 stop: int | None = None) -> jax.Array:
    """Layers ``start .. stop - 1`` (default: all) on float [B, S, H] states -> float [B, S, H].

    ``key_bias`` is :func:`attention_bias` of the mask, float [B, 1, 1, S]. Running
    ``[0, L - n)`` once and ``[L - n, L)`` later equals running all ``L`` layers: the
    fine-tuning of the top ``n`` layers caches the first half (hyset_jax.encoder.tuning).
    """
    for layer in list(self.layers)[start:stop]:
      x = layer(x, key_bias)
    return x


def attention_bias(attention_mask: jax.Array, dtype=jnp.float32) -> jax.Array:
  """Additive key bias from an int or bool [B, S] mask -> float [B, 1, 1, S].

  Padding keys get the most negative float, as transformers does, so they
  receive exactly zero attention weight after the softmax.
  """
  return jnp.where(attention_mask[:, None, None, :] > 0, 0.0, jnp.finfo(dtype).min).astype(dtype)


# --- Loading Hugging Face weights ------------------------------------------------


def checkpoint_names(config: BertConfig) -> Iterator[tuple[str, tuple[str | int, ...], bool]]:
  """Yields ``(hf_name, path_in_BertModel, transpose)`` for every parameter.

  ``hf_name`` is the tensor name in a ``BertModel`` checkpoint without the
  ``bert.`` prefix; ``transpose`` is set for linear kernels, which PyTorch stores
  (out, in) and ``nnx.Linear`` keeps (in, out).
  """
  for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
    yield f"embeddings.{name}.weight", ("embeddings", name, "embedding"), False
  yield "embeddings.LayerNorm.weight", ("embeddings", "norm", "scale"), False
  yield "embeddings.LayerNorm.bias", ("embeddings", "norm", "bias"), False
  linears = {"attention.self.query": ("attention", "query"),
             "attention.self.key": ("attention", "key"),
             "attention.self.value": ("attention", "value"),
             "attention.output.dense": ("attention", "out"),
             "intermediate.dense": ("ffn_in",),
             "output.dense": ("ffn_out",)}
  norms = {"attention.output.LayerNorm": ("attention_norm",), "output.LayerNorm": ("ffn_norm",)}
  for i in range(config.num_hidden_layers):
    prefix, path = f"encoder.layer.{i}", ("layers", i)
    for hf, sub in linears.items():
      yield f"{prefix}.{hf}.weight", path + sub + ("kernel",), True
      yield f"{prefix}.{hf}.bias", path + sub + ("bias",), False
    for hf, sub in norms.items():
      yield f"{prefix}.{hf}.weight", path + sub + ("scale",), False
      yield f"{prefix}.{hf}.bias", path + sub + ("bias",), False


def _canonical_name(name: str) -> str:
  """Strips a ``bert.`` prefix and maps old TF-era LayerNorm names (gamma/beta)."""
  if name.startswith("bert."):
    name = name[len("bert."):]
  if ".LayerNorm." in name:
    name = name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta",
                                                                       "LayerNorm.bias")
  return name


def _param_at(model: nnx.Module, path: tuple[str | int, ...]) -> nnx.Param:
  node: Any = model
  for step in path:
    node = node[step] if isinstance(step, int) else getattr(node, step)
  return node


def load_weights(model: BertModel, tensors: Mapping[str, np.ndarray], source: str) -> None:
  """Copies Hugging Face tensors into ``model`` in place, checking names and shapes.

  Args:
    model: a (possibly abstract, see :func:`load_bert`) :class:`BertModel`.
    tensors: checkpoint name -> array, as ``safetensors.numpy.load_file`` returns.
    source: the file name, for error messages.

  Raises:
    UserError: naming every missing or unexpected tensor, or the first tensor
      whose shape differs from what ``config.json`` implies.
  """
  by_name: dict[str, np.ndarray] = {}
  for raw_name, array in tensors.items():
    name = _canonical_name(raw_name)
    if not name.startswith(_IGNORED_PREFIXES):
      by_name[name] = array
  expected = list(checkpoint_names(model.config))
  missing = [name for name, _, _ in expected if name not in by_name]
  unexpected = sorted(set(by_name) - {name for name, _, _ in expected})
  if missing or unexpected:
    parts = []
    if missing:
      parts.append(f"missing {len(missing)} tensor(s): {', '.join(missing[:5])}"
                   + (" ..." if len(missing) > 5 else ""))
    if unexpected:
      parts.append(f"unexpected {len(unexpected)} tensor(s): {', '.join(unexpected[:5])}"
                   + (" ..." if len(unexpected) > 5 else ""))
    raise UserError(f"{source}: does not match config.json of a BERT model: {'; '.join(parts)}")
  for name, path, transpose in expected:
    array = by_name[name]
    param = _param_at(model, path)
    want = tuple(param.get_value().shape)
    got = tuple(array.shape[::-1] if transpose else array.shape)
    if got != want:
      shown = f"{tuple(array.shape)}" + (" (stored out,in)" if transpose else "")
      raise UserError(f"{source}: tensor {name!r} has shape {shown}, but config.json implies "
                      f"{want[::-1] if transpose else want}")
    value = np.asarray(array, dtype=np.float32)
    param.set_value(jnp.asarray(value.T if transpose else value))


def load_bert(model_dir: str | os.PathLike) -> BertModel:
  """Builds a :class:`BertModel` from ``config.json`` and ``model.safetensors`` in a directory.

  The module tree is first built abstractly (``nnx.eval_shape``: shapes only, no
  random initialisation), then every parameter is filled from the checkpoint.
  """
  from safetensors.numpy import load_file  # deferred: only loading needs it

  model_dir = pathlib.Path(model_dir)
  config = BertConfig.from_json(model_dir / "config.json")
  weights = model_dir / "model.safetensors"
  if not weights.is_file():
    raise UserError(f"{model_dir}: no model.safetensors; the encoder loads only safetensors "
                    "weights (convert pytorch_model.bin with the safetensors package)")
  try:
    tensors = load_file(weights)
  except Exception as e:  # safetensors raises its own SafetensorError on a bad header
    raise UserError(f"{weights}: cannot read safetensors file ({e})") from None
  model = nnx.eval_shape(lambda: BertModel(config, rngs=nnx.Rngs(0)))
  load_weights(model, tensors, str(weights))
  return model
