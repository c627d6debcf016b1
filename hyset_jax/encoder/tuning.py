"""Trainable views of the BERT encoder: its top n layers, LoRA adapters, or all of it.

Each mode splits the encoder's parameters into a *frozen* part (an ``nnx.State``, passed to
every step as an argument and never differentiated) and a *trainable* pytree (what the
optimiser updates), and runs one pure function, :func:`forward`, over both:

- ``top_layers``: the top ``n`` transformer blocks are trainable; the embeddings and the
  lower ``L − n`` blocks are frozen. Their output never changes, so it is computed once per
  text set (:mod:`hyset_jax.encoder.layer_cache`) and a step runs only the top ``n`` blocks.
- ``lora``: everything is frozen; a rank-``r`` update ``(α / r) · A B`` is added to the
  query and value projections of every block (Hu et al., 2021). ``B`` starts at zero, so the
  encoder at step 0 is exactly the frozen one. The update is merged into the kernel before
  the block runs (``W + (α / r) A B``: the same product as ``x W + (α / r) (x A) B`` up to
  rounding, and an ``H × H`` add per block costs nothing beside the activations).
- ``full``: every parameter is trainable.

Shapes: ``B`` rows, ``S`` padded length, ``H`` hidden size, ``L`` blocks, ``r`` LoRA rank.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from hyset_jax.encoder.bert import BertModel, attention_bias
from hyset_jax.encoder.sentence import SentenceEncoder, pool_and_normalize

MODES = ("top_layers", "lora", "full")
# The projections LoRA adapts, as in the LoRA paper's main experiments.
LORA_TARGETS = ("query", "value")


@dataclasses.dataclass(frozen=True)
class EncoderSpec:
  """The static half of a trainable encoder (hashable: it is closed over by ``jax.jit``).

  Attributes:
    graphdef: the BERT module structure from ``nnx.split``.
    mode: one of :data:`MODES`.
    start_layer: the first block a step runs; ``L − n`` for ``top_layers`` (the blocks
      below come from the cache), else 0 (a step starts from the token ids).
    num_layers: L.
    pooling, normalize: the sentence-transformers pipeline after the blocks.
    lora_scale: α / r (``lora`` only).
  """
  graphdef: Any
  mode: str
  start_layer: int
  num_layers: int
  pooling: tuple[str, ...]
  normalize: bool
  lora_scale: float = 0.0

  @property
  def from_hidden(self) -> bool:
    """Whether a step's input is cached block-``start_layer`` states rather than token ids."""
    return self.start_layer > 0


def init_lora(model: BertModel, rank: int, key: jax.Array) -> dict:
  """LoRA factors for the query and value projections of every block.

  ``A`` is Gaussian with std 1/r (the LoRA paper's Kaiming-style init for the down
  projection); ``B`` is zero, so ``A B = 0`` and the adapted encoder starts exactly frozen.

  Returns:
    ``{"layers": {i: {"query": {"a": f32[H, r], "b": f32[r, H]}, "value": {...}}}}``.
  """
  h = model.config.hidden_size
  layers = {}
  for i in range(model.config.num_hidden_layers):
    layers[i] = {}
    for target in LORA_TARGETS:
      key, sub = jax.random.split(key)
      layers[i][target] = {"a": jax.random.normal(sub, (h, rank), jnp.float32) / rank,
                           "b": jnp.zeros((rank, h), jnp.float32)}
  return {"layers": layers}


def split_encoder(encoder: SentenceEncoder, mode: str, *, n_layers: int = 2, lora_rank: int = 8,
                  lora_alpha: float = 16.0, seed: int = 0
                  ) -> tuple[EncoderSpec, nnx.State, Any]:
  """``(spec, frozen, trainable)`` for one of :data:`MODES`.

  Args:
    encoder: a loaded :class:`SentenceEncoder` (its weights are copied, not shared).
    mode: ``top_layers``, ``lora`` or ``full``.
    n_layers: trainable top blocks (``top_layers``), 1 ≤ n ≤ L.
    lora_rank, lora_alpha: r and α (``lora``).
    seed: for the LoRA ``A`` factors.

  Returns:
    The spec, the frozen ``nnx.State`` (empty for ``full``) and the trainable pytree: an
    ``nnx.State`` of the top blocks or of the whole model, or :func:`init_lora`'s dict.
  """
  if mode not in MODES:
    raise ValueError(f"unknown encoder tuning mode {mode!r}; expected one of {MODES}")
  model = encoder.model()
  num_layers = model.config.num_hidden_layers
  pipeline = encoder.pipeline
  common = dict(num_layers=num_layers, pooling=tuple(pipeline.pooling),
                normalize=pipeline.normalize)
  if mode == "top_layers":
    if not 1 <= n_layers <= num_layers:
      raise ValueError(f"n_layers must be in [1, {num_layers}], got {n_layers}")
    start = num_layers - n_layers
    is_top = lambda path, _: len(path) > 1 and path[0] == "layers" and path[1] >= start
    graphdef, trainable, frozen = nnx.split(model, is_top, ...)
    return EncoderSpec(graphdef, mode, start, **common), frozen, trainable
  if mode == "full":
    graphdef, trainable, frozen = nnx.split(model, nnx.Param, ...)
    return EncoderSpec(graphdef, mode, 0, **common), frozen, trainable
  if lora_rank < 1:
    raise ValueError(f"lora_rank must be ≥ 1, got {lora_rank}")
  graphdef, frozen = nnx.split(model)
  lora = init_lora(model, lora_rank, jax.random.key(seed))
  return EncoderSpec(graphdef, mode, 0, **common, lora_scale=lora_alpha / lora_rank), frozen, lora


def merged_model(spec: EncoderSpec, frozen: nnx.State, trainable: Any) -> BertModel:
  """The whole encoder with the trainable part (LoRA merged into its kernels) in place.

  Traceable: :func:`forward` calls it under ``jax.jit``; export calls it eagerly.
  """
  if spec.mode != "lora":
    return nnx.merge(spec.graphdef, frozen, trainable)
  # Fresh Variables (a tree copy) at the caller's trace level: the ones inside ``frozen``
  # belong to the enclosing jit trace, and NNX refuses to mutate them under jax.grad.
  model = nnx.merge(spec.graphdef, jax.tree.map(lambda x: x, frozen))
  for i, targets in trainable["layers"].items():
    attention = model.layers[int(i)].attention
    for target, ab in targets.items():
      kernel = getattr(attention, target).kernel
      kernel.set_value(kernel.get_value() + spec.lora_scale * (ab["a"] @ ab["b"]))
  return model


def forward(spec: EncoderSpec, frozen: nnx.State, trainable: Any,
            batch: dict[str, jax.Array]) -> jax.Array:
  """Sentence embeddings from the trainable encoder.

  Args:
    spec, frozen, trainable: from :func:`split_encoder`.
    batch: ``attention_mask`` int[B, S] and, when ``spec.from_hidden``, ``hidden``
      f32[B, S, H] (block-``start_layer`` inputs from the layer cache), else ``input_ids``
      and ``token_type_ids`` int[B, S].

  Returns:
    f32[B, dim], pooled (and normalised) as the sentence-transformers pipeline does.
  """
  model = merged_model(spec, frozen, trainable)
  mask = batch["attention_mask"]
  if spec.from_hidden:
    x = batch["hidden"]
  else:
    x = model.embed(batch["input_ids"], batch["token_type_ids"])
  x = model.run_layers(x, attention_bias(mask, x.dtype), spec.start_layer)
  return pool_and_normalize(x, mask, spec.pooling, spec.normalize)


def count_params(tree: Any) -> int:
  """Number of scalars in a pytree."""
  return sum(int(x.size) for x in jax.tree.leaves(tree))
