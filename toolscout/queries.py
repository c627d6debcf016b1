"""Reading request files: BEIR ``queries.jsonl`` lines, ``{"_id", "text", ...}``."""
from __future__ import annotations

from hyset_jax.data import files
from hyset_jax.errors import UserError


def read_queries(path: str, what: str = "query file") -> tuple[list[str], list[str]]:
  """Query ids and texts of a BEIR-format JSON-lines file, in file order.

  Raises:
    UserError: missing or unreadable file, malformed lines, a missing or empty
      ``_id``/``text``, a duplicate id, or no queries at all.
  """
  files.require_file(path, what)
  ids: list[str] = []
  texts: list[str] = []
  seen = files.UniqueIds("query")
  for line, obj in files.read_jsonl(path):
    where = f"{path}:{line}"
    query_id = files.get_id(obj, "_id", where)
    text = files.get_field(obj, "text", str, where)
    if not text.strip():
      raise UserError(f"{where}: query {query_id!r} has empty text; expected the request")
    seen.add(query_id, where)
    ids.append(query_id)
    texts.append(text)
  if not ids:
    raise UserError(f"{path}: no queries; expected one JSON object a line, "
                    f'{{"_id": ..., "text": ...}} (BEIR queries.jsonl format)')
  return ids, texts
