"""An on-disk embedding cache, so a corpus is encoded once per model.

Layout: one SQLite file per model under ``<cache_dir>/embeddings/``, named
``<model name>-<fingerprint>.sqlite``, with one row per distinct text:
``(sha256 of the UTF-8 text, float32 vector bytes)``.

Model identity (:func:`model_fingerprint`) is a sha256 over the *contents* of every
file the encoder reads (config.json, model.safetensors, tokenizer files,
modules.json) plus the pooling, normalisation and truncation it applies and a
code version, :data:`CACHE_VERSION`. Content rather than size/mtime: reinstalling
the same model keeps its cache, and a changed file with the same size and
time cannot be served stale vectors. Hashing 90 MB of weights takes ~0.1 s, once
per encoder instance.

Crash safety: new vectors are written in one SQLite transaction, which is atomic
on disk (rollback journal), so a killed process leaves either all of a call's
new rows or none, never a half-written vector. SQLite's file locking lets
several processes share a cache directory.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import sqlite3
import sys
import weakref
from collections.abc import Sequence

import numpy as np

from hyset_jax.encoder.sentence import _TOKENIZER_FILES, SentenceEncoder
from hyset_jax.errors import UserError

# Bump when a code change alters the vectors an unchanged model produces.
CACHE_VERSION = 1
# Small files that shape tokenisation or the network, besides _TOKENIZER_FILES.
_HASHED_FILES = ("config.json", "model.safetensors", "tokenizer_config.json",
                 "special_tokens_map.json", "added_tokens.json")
# Keys per SELECT ... IN (...): below SQLite's oldest limit of 999 host parameters.
_QUERY_CHUNK = 900

_fingerprints: "weakref.WeakKeyDictionary[SentenceEncoder, str]" = weakref.WeakKeyDictionary()


def default_cache_dir() -> pathlib.Path:
  """``$HYSET_CACHE`` when set, else ``~/.cache/hyset_jax``."""
  return pathlib.Path(os.environ.get("HYSET_CACHE") or "~/.cache/hyset_jax").expanduser()


def _hash_file(digest: "hashlib._Hash", path: pathlib.Path) -> None:
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)


def model_fingerprint(encoder: SentenceEncoder) -> str:
  """A hex sha256 identifying what ``encoder`` computes (see the module docstring)."""
  if encoder in _fingerprints:
    return _fingerprints[encoder]
  pipeline = encoder.pipeline
  digest = hashlib.sha256()
  settings = {"cache_version": CACHE_VERSION, "name": encoder.name,
              "pooling": list(pipeline.pooling), "normalize": pipeline.normalize,
              "max_seq_length": encoder.max_seq_length, "do_lower_case": pipeline.do_lower_case}
  digest.update(json.dumps(settings, sort_keys=True).encode())
  tdir = pipeline.transformer_dir
  for name in _HASHED_FILES + _TOKENIZER_FILES:
    if (tdir / name).is_file():
      digest.update(f"\0{name}\0".encode())  # file boundaries, so contents cannot alias
      _hash_file(digest, tdir / name)
  fingerprint = digest.hexdigest()
  _fingerprints[encoder] = fingerprint
  return fingerprint


def text_key(text: str) -> bytes:
  """sha256 of the text's UTF-8 bytes (lone surrogates kept, so no text is unhashable)."""
  return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def cache_path(encoder: SentenceEncoder, cache_dir: str | os.PathLike | None = None) -> pathlib.Path:
  """The SQLite file holding ``encoder``'s vectors."""
  root = pathlib.Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
  safe_name = re.sub(r"[^\w.-]+", "_", encoder.name).strip("_") or "model"
  return root / "embeddings" / f"{safe_name}-{model_fingerprint(encoder)[:16]}.sqlite"


def _connect(path: pathlib.Path, dim: int) -> sqlite3.Connection:
  path.parent.mkdir(parents=True, exist_ok=True)
  conn = sqlite3.connect(path, timeout=60)  # wait for other processes' writes
  with conn:
    conn.execute("CREATE TABLE IF NOT EXISTS vectors (key BLOB PRIMARY KEY, vector BLOB NOT NULL)")
    conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("INSERT OR IGNORE INTO meta VALUES ('dim', ?)", (str(dim),))
  stored = conn.execute("SELECT value FROM meta WHERE key = 'dim'").fetchone()[0]
  if int(stored) != dim:
    conn.close()
    raise UserError(f"{path}: cache holds {stored}-dim vectors, the encoder makes {dim}; "
                       "delete the file")
  return conn


def _lookup(conn: sqlite3.Connection, keys: Sequence[bytes], dim: int) -> dict[bytes, np.ndarray]:
  found = {}
  for start in range(0, len(keys), _QUERY_CHUNK):
    chunk = keys[start:start + _QUERY_CHUNK]
    rows = conn.execute(
        f"SELECT key, vector FROM vectors WHERE key IN ({','.join('?' * len(chunk))})", chunk)
    for key, blob in rows:
      if len(blob) == 4 * dim:  # anything else is not ours: re-encode it
        found[bytes(key)] = np.frombuffer(blob, np.float32)
  return found


def encode_cached(encoder: SentenceEncoder, texts: Sequence[str],
                  cache_dir: str | os.PathLike | None = None, batch_size: int = 64,
                  progress: bool | None = None) -> np.ndarray:
  """``encoder.encode(texts)``, reading and filling the on-disk cache.

  Only texts not cached yet for this model are encoded (each distinct text once).
  If the cache directory cannot be used (read-only, full disk), a warning goes to
  stderr and the texts are encoded without it. Any other object with
  ``encode(texts)`` (a test double) is called directly: without files to
  fingerprint, its vectors are never cached.

  Args:
    encoder: from :func:`hyset_jax.encoder.load_encoder`.
    texts: n strings.
    cache_dir: default :func:`default_cache_dir`.
    batch_size, progress: passed to :meth:`SentenceEncoder.encode`.

  Returns:
    float32 [n, encoder.dim] in input order.
  """
  texts = list(texts)
  if not isinstance(encoder, SentenceEncoder):
    return np.asarray(encoder.encode(texts), np.float32)
  keys = [text_key(t) for t in texts]
  first: dict[bytes, int] = {}
  for i, key in enumerate(keys):
    first.setdefault(key, i)
  unique = list(first)
  path = cache_path(encoder, cache_dir)
  try:
    conn = _connect(path, encoder.dim)
  except (OSError, sqlite3.Error) as e:
    print(f"warning: embedding cache {path} unusable ({e}); encoding without it", file=sys.stderr)
    return encoder.encode(texts, batch_size=batch_size, progress=progress)
  try:
    found = _lookup(conn, unique, encoder.dim)
    missing = [key for key in unique if key not in found]
    if missing:
      vectors = encoder.encode([texts[first[k]] for k in missing], batch_size=batch_size,
                               progress=progress)
      found.update(zip(missing, vectors))
      try:
        with conn:  # one transaction: all new rows land, or none
          conn.executemany("INSERT OR REPLACE INTO vectors VALUES (?, ?)",
                           [(k, v.astype(np.float32).tobytes()) for k, v in zip(missing, vectors)])
      except sqlite3.Error as e:
        print(f"warning: could not write embedding cache {path} ({e})", file=sys.stderr)
  finally:
    conn.close()
  out = np.zeros((len(texts), encoder.dim), np.float32)
  for i, key in enumerate(keys):
    out[i] = found[key]
  return out
