"""Tokenised text sets for encoder training, optionally with cached lower-block states.

A :class:`TextTable` holds one text set (the training queries, the validation queries, ...)
tokenised once; :meth:`TextTable.batch` pads any subset of its rows to a length bucket, which
is what a training step feeds :func:`hyset_jax.encoder.tuning.forward`.

For ``top_layers`` fine-tuning, :func:`with_lower_states` runs the frozen embeddings and
blocks ``0 .. L − n − 1`` over the whole set once and keeps their output (the input of block
``L − n``), ragged: each text's real tokens only, float32 ``[T, H]`` for ``T`` tokens in all
(ToolLens' 18,770 queries: 649k tokens, 1.0 GB for MiniLM's H = 384). A step then runs only
the top ``n`` blocks on rows gathered from it. Padding positions are filled with zeros: the
attention bias masks them as keys and pooling ignores them, so their value never reaches a
real token (tests/test_encoder_tuning.py checks the result equals the full forward).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx

from hyset_jax.encoder.bert import attention_bias
from hyset_jax.encoder.sentence import SentenceEncoder, _bucket


@dataclasses.dataclass(frozen=True)
class TextTable:
  """A tokenised text set.

  Attributes:
    input_ids, token_type_ids: int32[n, L] word pieces, right-padded to the longest text.
    lengths: int32[n] real tokens per text ([CLS] and [SEP] included).
    buckets: the padded lengths batches are cut to (the encoder's length buckets).
    hidden: f32[T, H] the input of block ``layer`` for every real token, texts
      concatenated in row order (``offsets`` delimits them), or None.
    offsets: int64[n + 1] with text i at ``hidden[offsets[i]:offsets[i + 1]]``, or None.
    layer: the block ``hidden`` feeds (0 when there is no cache).
  """
  input_ids: np.ndarray
  token_type_ids: np.ndarray
  lengths: np.ndarray
  buckets: tuple[int, ...]
  hidden: np.ndarray | None = None
  offsets: np.ndarray | None = None
  layer: int = 0

  def __len__(self) -> int:
    return len(self.lengths)

  def batch(self, rows: Sequence[int] | np.ndarray) -> dict[str, np.ndarray]:
    """Rows padded to the smallest length bucket that holds the longest of them.

    Returns:
      ``attention_mask`` int32[b, S] and either ``hidden`` f32[b, S, H] (with a cache) or
      ``input_ids``/``token_type_ids`` int32[b, S].
    """
    rows = np.asarray(rows, np.int64)
    lengths = self.lengths[rows]
    s = _bucket(int(lengths.max()), self.buckets)
    mask = (np.arange(s)[None, :] < lengths[:, None]).astype(np.int32)
    if self.hidden is None:
      width = min(s, self.input_ids.shape[1])
      out = {}
      for key in ("input_ids", "token_type_ids"):
        array = np.zeros((len(rows), s), np.int32)
        array[:, :width] = getattr(self, key)[rows, :width]
        out[key] = np.where(mask > 0, array, 0).astype(np.int32)
      return dict(out, attention_mask=mask)
    hidden = np.zeros((len(rows), s, self.hidden.shape[1]), self.hidden.dtype)
    for i, row in enumerate(rows):
      start, stop = self.offsets[row], self.offsets[row + 1]
      hidden[i, :stop - start] = self.hidden[start:stop]
    return {"hidden": hidden, "attention_mask": mask}


def tokenize_table(encoder: SentenceEncoder, texts: Sequence[str]) -> TextTable:
  """Tokenises ``texts`` once (truncated to the encoder's ``max_seq_length``)."""
  texts = list(texts)
  if not texts:
    raise ValueError("tokenize_table needs at least one text")
  tokens = encoder.tokenize(texts)
  mask = tokens["attention_mask"]
  types = tokens.get("token_type_ids", np.zeros_like(tokens["input_ids"]))
  return TextTable(np.asarray(tokens["input_ids"], np.int32), np.asarray(types, np.int32),
                   mask.sum(axis=1).astype(np.int32), encoder.buckets)


def _lower_fn(graphdef, stop: int):
  """jit: (state, ids [B, S], types [B, S], mask [B, S]) -> f32[B, S, H], block ``stop``'s input."""

  def lower(state, input_ids, token_type_ids, attention_mask):
    model = nnx.merge(graphdef, state)
    x = model.embed(input_ids, token_type_ids)
    return model.run_layers(x, attention_bias(attention_mask, x.dtype), 0, stop)

  return jax.jit(lower)


def with_lower_states(table: TextTable, encoder: SentenceEncoder, texts: Sequence[str],
                      layer: int, batch_size: int = 64, progress: bool | None = None
                      ) -> TextTable:
  """``table`` plus the frozen encoder's input to block ``layer`` for every text.

  Args:
    table: :func:`tokenize_table` of ``texts`` with the same encoder.
    encoder: the frozen encoder; its embeddings and blocks ``0 .. layer − 1`` are run.
    texts: the n texts of ``table``, in its row order.
    layer: 1 ≤ layer < L (the first trainable block).
    batch_size, progress: as :meth:`SentenceEncoder.encode`.

  Returns:
    A :class:`TextTable` with ``hidden``/``offsets`` filled and ``layer`` set.
  """
  from tqdm.auto import tqdm  # deferred: only building a cache needs it

  texts = list(texts)
  if len(texts) != len(table):
    raise ValueError(f"{len(texts)} texts for a table of {len(table)} rows")
  graphdef, state = nnx.split(encoder.model())
  lower = _lower_fn(graphdef, layer)
  offsets = np.zeros(len(texts) + 1, np.int64)
  offsets[1:] = np.cumsum(table.lengths)
  hidden = np.zeros((int(offsets[-1]), encoder.config.hidden_size), np.float32)
  show = len(texts) >= 1000 if progress is None else progress
  with tqdm(total=len(texts), disable=not show, unit="text", leave=False,
            desc=f"caching block-{layer} inputs") as bar:
    for rows, padded in encoder.padded_batches(texts, batch_size):
      states = np.asarray(lower(state, padded["input_ids"], padded["token_type_ids"],
                                padded["attention_mask"]))
      for i, row in enumerate(rows):
        n = int(table.lengths[row])
        hidden[offsets[row]:offsets[row] + n] = states[i, :n]
      bar.update(len(rows))
  return dataclasses.replace(table, hidden=hidden, offsets=offsets, layer=layer)
