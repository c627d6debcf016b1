"""Strict readers for the text files data sets come in (JSON, JSON lines, TSV).

Every problem a user can fix becomes a :class:`~hyset_jax.errors.UserError` that
names the file and the line (and, for bad bytes, the byte offset) and says what
was expected: a truncated download or a hand-edited file must never surface as
a traceback, be skipped silently or turn into a wrong answer downstream.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Iterator

from hyset_jax.errors import UserError

_BOM = "\ufeff"
# A JSON escape of a UTF-16 surrogate; only a file holding one can decode to a lone surrogate.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def require_file(path: str | os.PathLike, what: str) -> str:
  """Returns ``path`` as a string if it is a readable file, else a UserError."""
  path = os.fspath(path)
  if not os.path.exists(path):
    raise UserError(f"{path}: missing {what}")
  if not os.path.isfile(path):
    raise UserError(f"{path}: expected {what} to be a file, found a directory")
  return path


def read_text(path: str) -> str:
  """Reads a whole file as strict UTF-8 (a leading byte-order mark is dropped).

  Decoding the file in one go is fast; only on failure do we go back to the
  bytes to tell the user where the bad byte is.
  """
  try:
    with open(path, "rb") as f:
      data = f.read()
  except OSError as e:
    raise UserError(f"{path}: cannot read ({e.strerror})") from None
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    line = data.count(b"\n", 0, e.start) + 1
    column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
    raise UserError(
        f"{path}:{line}: invalid UTF-8 byte 0x{data[e.start]:02x} at byte offset "
        f"{e.start} (column {column}); expected UTF-8 text, re-encode the file "
        f"(e.g. iconv -t UTF-8)") from None
  return text[1:] if text.startswith(_BOM) else text


def iter_lines(path: str) -> Iterator[tuple[int, str]]:
  """Yields ``(line_number, line)`` for each non-blank line, numbered from 1.

  Lines are split on ``\\n`` only: ``str.splitlines`` would also split on
  U+2028 and friends, which JSON allows unescaped inside strings.
  """
  yield from _lines(read_text(path))


def _lines(text: str) -> Iterator[tuple[int, str]]:
  for number, line in enumerate(text.split("\n"), start=1):
    line = line.rstrip("\r")
    if line.strip():
      yield number, line


def loads(text: str, where: str, expected: str, *, at_end: bool = True,
          line: int | None = None) -> Any:
  """``json.loads`` whose every failure is a UserError naming ``where`` (a file; ``line``: the
  line ``text`` is, for JSON lines): malformed JSON (with
  line and column), an integer over Python's 4300-digit limit and nesting too deep to parse
  (both ValueError / RecursionError from the json module), and a lone UTF-16 surrogate
  (``"\\ud800"``), valid JSON but not text: encoding it as UTF-8, which the encoder's
  tokenizer and every output file do, would fail far from the file at fault."""
  loc = where if line is None else f"{where}:{line}"
  try:
    obj = json.loads(text)
  except json.JSONDecodeError as e:
    raise _json_error(where, e.lineno if line is None else line, e, expected,
                      at_end=at_end) from None
  except ValueError as e:  # "Exceeds the limit (4300 digits) for integer string conversion"
    raise UserError(f"{loc}: {str(e).split(';')[0]}; expected {expected}") from None
  except RecursionError:
    raise UserError(f"{loc}: JSON nested too deeply to read; expected {expected}") from None
  if _SURROGATE_ESCAPE.search(text):
    check_unicode(obj, loc)
  return obj


def check_unicode(obj: Any, where: str) -> None:
  """UserError for a lone surrogate in any string (key or value) of a parsed JSON value."""
  stack = [obj]
  while stack:  # iterative: the value may be nested as deep as the parser allowed
    item = stack.pop()
    if isinstance(item, dict):
      stack.extend(item.keys())
      stack.extend(item.values())
    elif isinstance(item, list):
      stack.extend(item)
    elif isinstance(item, str):
      try:
        item.encode("utf-8")
      except UnicodeEncodeError as e:
        raise UserError(f"{where}: a string holds a lone UTF-16 surrogate "
                        f"(\\u{ord(item[e.start]):04x}, in {item[:40]!r}); expected valid "
                        f"Unicode text (surrogates only in pairs)") from None


def _json_error(path: str, line: int, e: json.JSONDecodeError, expected: str,
                at_end: bool) -> UserError:
  # json's messages either end in "at" (the position follows) or stand alone.
  where = f"column {e.colno}" if e.msg.endswith(" at") else f"at column {e.colno}"
  truncated = at_end and (e.msg.startswith("Unterminated") or not e.doc[e.pos:].strip())
  hint = " (the file looks truncated)" if truncated else ""
  return UserError(f"{path}:{line}: malformed JSON: {e.msg} {where}{hint}; "
                   f"expected {expected}")


def read_jsonl(path: str) -> Iterator[tuple[int, dict[str, Any]]]:
  """Yields ``(line_number, object)`` for each line of a JSON-lines file."""
  lines = list(iter_lines(path))
  for i, (number, line) in enumerate(lines):
    obj = loads(line, path, "one JSON object per line",
                at_end=i == len(lines) - 1, line=number)
    if not isinstance(obj, dict):
      raise UserError(
          f"{path}:{number}: expected a JSON object, found {type(obj).__name__}")
    yield number, obj


def read_json(path: str) -> Any:
  """Parses a whole-file JSON document, reporting errors by line and column."""
  return loads(read_text(path), path, "a JSON document")


def read_tsv(path: str, header: tuple[str, ...]) -> Iterator[tuple[int, list[str]]]:
  """Yields ``(line_number, fields)`` for each row after the required header."""
  rows = iter_lines(path)
  first = next(rows, None)
  if first is None:
    raise UserError(f"{path}: empty file; expected the header {'<TAB>'.join(header)}")
  number, line = first
  if tuple(f.strip() for f in line.split("\t")) != header:
    raise UserError(
        f"{path}:{number}: unexpected header {line!r}; expected the tab-separated "
        f"header {'<TAB>'.join(header)}")
  for number, line in rows:
    fields = line.split("\t")
    if len(fields) != len(header):
      raise UserError(
          f"{path}:{number}: expected {len(header)} tab-separated fields "
          f"({', '.join(header)}), found {len(fields)}: {line[:80]!r}")
    yield number, [f.strip() for f in fields]


def get_field(obj: dict[str, Any], key: str, types: type | tuple[type, ...],
              where: str, *, default: Any = ...) -> Any:
  """``obj[key]`` checked against ``types``; ``where`` names file and line."""
  if key not in obj:
    if default is not ...:
      return default
    raise UserError(f"{where}: missing field {key!r}")
  value = obj[key]
  # bool is an int subclass; a boolean id or count is always a mistake.
  if not isinstance(value, types) or (isinstance(value, bool) and bool not in _as_tuple(types)):
    names = " or ".join(t.__name__ for t in _as_tuple(types))
    raise UserError(
        f"{where}: field {key!r} should be {names}, found {type(value).__name__}")
  return value


def get_id(obj: dict[str, Any], key: str, where: str) -> str:
  """An identifier field: a non-empty string, or an integer (read as its decimal text)."""
  value = get_field(obj, key, (str, int), where)
  value = str(value)
  if not value.strip():
    raise UserError(f"{where}: field {key!r} is empty; expected an identifier")
  return value


def _as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
  return types if isinstance(types, tuple) else (types,)


class UniqueIds:
  """Collects ids and reports the first duplicate with both of its locations."""

  def __init__(self, what: str):
    self._what = what
    self._seen: dict[str, str] = {}

  def add(self, id_: str, where: str) -> None:
    first = self._seen.get(id_)
    if first is None:
      self._seen[id_] = where
      return
    raise UserError(
        f"duplicate {self._what} id {id_!r}: first at {first}, again at {where}; "
        f"ids must be unique")

  def __contains__(self, id_: str) -> bool:
    return id_ in self._seen

  def __len__(self) -> int:
    return len(self._seen)
