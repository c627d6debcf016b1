"""Writes a (fine-tuned) BERT encoder as a sentence-transformers directory.

The directory is what ``SentenceTransformer(path)`` and :func:`hyset_jax.encoder.load_encoder`
both read::

  config.json                        the Hugging Face BERT config (the source's, unchanged)
  model.safetensors                  the weights under BertModel's names (``encoder.layer.0
                                     .attention.self.query.weight``, ...), linear kernels
                                     stored (out, in) as PyTorch keeps them; the source's
                                     pooler head, if it has one, copied unchanged
  tokenizer files                    copied from the source (vocab.txt, tokenizer.json, ...)
  modules.json                       Transformer -> Pooling -> Normalize (if the source had it)
  sentence_bert_config.json          max_seq_length, do_lower_case
  1_Pooling/config.json              the pooling modes (sentence-transformers' boolean keys)
  2_Normalize/                       (empty; sentence-transformers' own layout)
  config_sentence_transformers.json  cosine similarity, as the source model declares
  README.md                          where the weights came from

LoRA adapters are merged into the kernels before export (:func:`tuning.merged_model`), so
the directory is a plain BERT that needs no adapter code.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil

import numpy as np

from hyset_jax.encoder.bert import BertModel, _canonical_name, _param_at, checkpoint_names
from hyset_jax.encoder.sentence import _LEGACY_POOLING_KEYS, _TOKENIZER_FILES, SentenceEncoder

# Tokenizer side files AutoTokenizer reads beside the vocabulary.
_TOKENIZER_SIDE_FILES = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")


def state_tensors(model: BertModel) -> dict[str, np.ndarray]:
  """The model's weights under Hugging Face BertModel names, float32, kernels (out, in).

  The inverse of :func:`hyset_jax.encoder.bert.load_weights`.
  """
  tensors = {}
  for name, path, transpose in checkpoint_names(model.config):
    value = np.asarray(_param_at(model, path).get_value(), np.float32)
    tensors[name] = np.ascontiguousarray(value.T if transpose else value)
  return tensors


def _write_json(path: pathlib.Path, value) -> None:
  path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")


def save_sentence_transformer(model: BertModel, source: SentenceEncoder, out: str | os.PathLike,
                              force: bool = False) -> pathlib.Path:
  """Writes ``model`` with ``source``'s tokenizer and pipeline as a sentence-transformers dir.

  Args:
    model: the network to save (same config as ``source``'s, e.g. fine-tuned from it).
    source: the encoder it was fine-tuned from: tokenizer files, pooling, normalisation
      and ``max_seq_length`` are taken from it.
    out: the directory; written atomically (a temporary sibling renamed into place).
    force: replace an existing non-empty directory.

  Returns:
    ``out``.

  Raises:
    UserError: ``out`` exists (without ``force``) or cannot be written.
  """
  from safetensors.numpy import load_file, save_file

  from hyset_jax.io_utils import atomic_dir

  pipeline, tdir = source.pipeline, source.pipeline.transformer_dir
  with atomic_dir(out, force) as tmp:
    shutil.copyfile(tdir / "config.json", tmp / "config.json")
    tensors = state_tensors(model)
    # The pooler head (unused by sentence-transformers, not built here) is kept as the source
    # has it, so transformers' AutoModel finds a complete BertModel and warns about nothing.
    source_tensors = load_file(tdir / "model.safetensors")
    tensors.update({_canonical_name(k): v for k, v in source_tensors.items()
                    if _canonical_name(k).startswith("pooler.")})
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    for name in _TOKENIZER_FILES + _TOKENIZER_SIDE_FILES:
      if (tdir / name).is_file():
        shutil.copyfile(tdir / name, tmp / name)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"}]
    if pipeline.normalize:
      modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                      "type": "sentence_transformers.models.Normalize"})
      (tmp / "2_Normalize").mkdir()
    _write_json(tmp / "modules.json", modules)
    (tmp / "1_Pooling").mkdir()
    pooling = {"word_embedding_dimension": model.config.hidden_size}
    pooling.update({key: mode in pipeline.pooling for key, mode in _LEGACY_POOLING_KEYS.items()})
    _write_json(tmp / "1_Pooling" / "config.json", pooling)
    _write_json(tmp / "sentence_bert_config.json",
                {"max_seq_length": source.max_seq_length,
                 "do_lower_case": pipeline.do_lower_case})
    _write_json(tmp / "config_sentence_transformers.json", {"similarity_fn_name": "cosine"})
    # No "SentenceTransformer('org/name')" line: model_name() would read it back as the id of
    # the source model, and the embedding cache would mix both models' names.
    (tmp / "README.md").write_text(
        f"# Fine-tuned {source.name}\n\nA BERT sentence encoder fine-tuned by hyset-jax "
        f"(hyset_jax.training.finetune) from {source.name}. Load it with sentence-transformers or "
        "`hyset_jax.encoder.load_encoder(path)`.\n", encoding="utf-8")
  return pathlib.Path(out)
