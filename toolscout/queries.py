"""Reading request files: BEIR ``queries.jsonl`` lines, ``{"_id", "text", ...}``."""
from __future__ import annotations

from hyset_jax.data import beir, files


def read_queries(path: str, what: str = "query file") -> tuple[list[str], list[str]]:
  """Query ids and texts of a BEIR-format JSON-lines file, in file order.

  The checks are those of :func:`hyset_jax.data.beir.read_queries` (malformed lines, a missing
  or empty ``_id``/``text``, a duplicate id, no queries at all), plus a clear error naming
  ``what`` when the file is missing.
  """
  queries = beir.read_queries(files.require_file(path, what))
  return list(queries), [text for text, _ in queries.values()]
