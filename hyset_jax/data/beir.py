"""The ``beir:PATH`` reader: a BEIR-layout folder (ToolLens is published this way).

Layout::

  PATH/corpus.jsonl        {"_id", "title", "text", "metadata"}  one tool a line
  PATH/queries.jsonl       {"_id", "text", "metadata"}           one query a line
  PATH/qrels/<split>.tsv   header ``query-id<TAB>corpus-id<TAB>score``

Every ``qrels/*.tsv`` file is a split named after its stem (ToolLens: ``train``,
``test``; ordered train, validation, test, then the rest). A row with
``score > 0`` marks the tool relevant; a query's gold set is the sorted
distinct corpus ids of its relevant rows. Queries keep the order in which a
split's qrels first name them. A query's source is its
``metadata.source`` when that is a string, else empty.

Tool text is ``title + " " + text`` (stripped, :func:`document_text`), the concatenation
BEIR's own dense retrievers use; ToolLens titles are empty, so its tool text is ``text``.
"""
from __future__ import annotations

import glob
import os
from typing import Any

from hyset_jax.data import files, splits
from hyset_jax.data.types import Dataset, Query, ToolLibrary
from hyset_jax.errors import UserError

QRELS_HEADER = ("query-id", "corpus-id", "score")
_EXAMPLES = 3  # how many offending rows an error message quotes


def load_beir(path: str, name: str | None = None) -> Dataset:
  """Reads a BEIR folder into a :class:`Dataset` (splits = the qrels files present)."""
  root = os.path.expanduser(path)
  if not os.path.isdir(root):
    what = "a file" if os.path.exists(root) else "missing"
    raise UserError(
        f"{root}: {what}; expected a BEIR folder with corpus.jsonl, queries.jsonl "
        f"and qrels/<split>.tsv")
  tools = _read_corpus(files.require_file(
      os.path.join(root, "corpus.jsonl"), "BEIR corpus (corpus.jsonl)"))
  queries = read_queries(files.require_file(
      os.path.join(root, "queries.jsonl"), "BEIR queries (queries.jsonl)"))
  qrels_dir = os.path.join(root, "qrels")
  by_split = {os.path.splitext(os.path.basename(f))[0]: f
              for f in glob.glob(os.path.join(qrels_dir, "*.tsv"))}
  split_files = [by_split[s] for s in splits.canonical_order(by_split)]
  if not split_files:
    raise UserError(f"{qrels_dir}: missing qrels; expected one <split>.tsv file per split "
                    f"(e.g. qrels/train.tsv, qrels/test.tsv)")

  tool_ids = set(tools.ids)
  split_queries: dict[str, tuple[Query, ...]] = {}
  notes: list[str] = []
  used: set[str] = set()
  for split_file in split_files:
    split = os.path.splitext(os.path.basename(split_file))[0]
    gold, dropped = _read_qrels(split_file, queries, tool_ids)
    split_queries[split] = tuple(
        Query(id=q, text=queries[q][0], gold=tuple(sorted(g)), source=queries[q][1])
        for q, g in gold.items())
    overlap = used & gold.keys()
    if overlap:
      notes.append(f"{split}: {len(overlap)} queries also appear in an earlier split "
                   f"(e.g. {min(overlap)!r})")
    used.update(gold)
    if dropped:
      notes.append(f"{split}: {dropped} queries have only score-0 qrels rows (no gold set); "
                   f"left out")
  unused = len(queries) - len(used)
  if unused:
    notes.append(f"{unused} queries in queries.jsonl appear in no qrels file; left out")
  return Dataset(name=name or os.path.basename(os.path.normpath(root)), tools=tools,
                 splits=split_queries, notes=tuple(notes))


def document_text(title: str | None, text: str) -> str:
  """The text a BEIR corpus row is embedded and matched by: title, a space, text, stripped.

  >>> document_text("weather", "")
  'weather'
  >>> document_text("", " get_forecast(city) ")
  'get_forecast(city)'
  """
  return f"{title or ''} {text}".strip()


def _read_corpus(path: str) -> ToolLibrary:
  ids, texts, metadata = [], [], []
  seen = files.UniqueIds("tool")
  for line, obj in files.read_jsonl(path):
    where = f"{path}:{line}"
    tool_id = files.get_id(obj, "_id", where)
    title = files.get_field(obj, "title", str, where, default="") or ""
    text = files.get_field(obj, "text", str, where)
    meta = files.get_field(obj, "metadata", (dict, type(None)), where, default={}) or {}
    body = document_text(title, text)
    if not body:
      raise UserError(f"{where}: tool {tool_id!r} has empty title and text; expected a "
                      f"description to retrieve it by")
    seen.add(tool_id, where)
    ids.append(tool_id)
    texts.append(body)
    metadata.append(meta)
  if not ids:
    raise UserError(f"{path}: empty corpus; expected one tool a line "
                    f'({{"_id", "title", "text", "metadata"}})')
  return ToolLibrary(tuple(ids), tuple(texts), tuple(metadata))


def read_queries(path: str) -> dict[str, tuple[str, str]]:
  """Query id -> (text, source), the source taken from ``metadata.source`` if any."""
  queries: dict[str, tuple[str, str]] = {}
  seen = files.UniqueIds("query")
  for line, obj in files.read_jsonl(path):
    where = f"{path}:{line}"
    query_id = files.get_id(obj, "_id", where)
    text = files.get_field(obj, "text", str, where)
    if not text.strip():
      raise UserError(f"{where}: query {query_id!r} has empty text; expected the request")
    meta = files.get_field(obj, "metadata", (dict, type(None)), where, default={}) or {}
    source = meta.get("source")
    seen.add(query_id, where)
    queries[query_id] = (text, source if isinstance(source, str) else "")
  if not queries:
    raise UserError(f"{path}: no queries; expected one query a line ({{\"_id\", \"text\"}})")
  return queries


def _stripped_aliases(ids) -> dict[str, str]:
  """stripped id -> id, for the ids that change when stripped and whose stripped form is
  neither another id nor shared."""
  out: dict[str, str | None] = {}
  for i in ids:
    if i != i.strip() and i.strip() not in ids:
      out[i.strip()] = None if i.strip() in out else i
  return {k: v for k, v in out.items() if v is not None}


def _read_qrels(path: str, queries: dict[str, Any],
                tool_ids: set[str]) -> tuple[dict[str, set[str]], int]:
  """Gold sets of one split, and how many queries had only score-0 rows."""
  gold: dict[str, set[str]] = {}
  zero_only: dict[str, None] = {}
  unknown_queries: dict[str, int] = {}  # id -> first line
  unknown_tools: dict[str, int] = {}
  # TSV fields are read stripped, so an id with surrounding spaces in corpus.jsonl or
  # queries.jsonl (ToolBench has tool names like " Quotes API") is matched by its stripped
  # form when that names exactly one.
  tool_alias = _stripped_aliases(tool_ids)
  query_alias = _stripped_aliases(queries)
  for line, (query_id, tool_id, score_text) in files.read_tsv(path, QRELS_HEADER):
    query_id = query_id if query_id in queries else query_alias.get(query_id, query_id)
    tool_id = tool_id if tool_id in tool_ids else tool_alias.get(tool_id, tool_id)
    try:
      score = int(score_text)
    except ValueError:
      raise UserError(f"{path}:{line}: score {score_text!r} is not an integer; expected "
                      f"0 (not relevant) or a positive relevance grade") from None
    if query_id not in queries:
      unknown_queries.setdefault(query_id, line)
    if tool_id not in tool_ids:
      unknown_tools.setdefault(tool_id, line)
    if score > 0:
      gold.setdefault(query_id, set()).add(tool_id)
    else:
      zero_only.setdefault(query_id, None)
  problems = []
  for what, source, unknown in (("query", "queries.jsonl", unknown_queries),
                                ("corpus", "corpus.jsonl", unknown_tools)):
    if unknown:
      examples = ", ".join(f"{i!r} (line {n})" for i, n in list(unknown.items())[:_EXAMPLES])
      problems.append(f"{len(unknown)} {what} ids not in {source}, e.g. {examples}")
  if problems:
    raise UserError(f"{path}: qrels name unknown ids: {'; '.join(problems)}; every "
                    f"query-id and corpus-id must exist in the BEIR folder")
  if not gold:
    raise UserError(f"{path}: no relevant rows (score > 0); expected at least one "
                    f"query-id<TAB>corpus-id<TAB>score row")
  dropped = sum(1 for q in zero_only if q not in gold)
  return gold, dropped
