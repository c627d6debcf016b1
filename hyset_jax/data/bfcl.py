"""The ``bfcl`` reader: the Berkeley Function-Calling Leaderboard data in ``bfcl-eval``.

``bfcl`` reads the data folder of the installed ``bfcl-eval`` package;
``bfcl:PATH`` reads a folder with the same layout. The package is never
imported (its import pulls torch and more): :func:`find_data_dir` locates it
with :func:`importlib.util.find_spec`, which does not run a top-level package.

Layout (checked on bfcl-eval 2026.3.23, ``BFCL_v4``)::

  data/BFCL_v<N>_<category>.json                  questions, JSON lines despite .json
  data/possible_answer/BFCL_v<N>_<category>.json  {"id", "ground_truth": [{fn: args}, ...]}

- Library: the union of the ``function`` lists of every question file, answered
  or not (the irrelevance categories still describe real functions),
  deduplicated by name; a name with differing definitions keeps its most
  frequent one and is counted in the notes.
- Queries: categories with answers and inline ``function`` lists. The gold
  set is the distinct function names of ``ground_truth`` (the key of each call
  object); the source is the category (``simple_python``, ``live_multiple``...).
- No-tool queries: the irrelevance categories (:data:`IRRELEVANT_CATEGORIES`:
  ``irrelevance``, 240 questions, and ``live_irrelevance``, 884, in bfcl-eval
  2026.3.23) ship no answers because every candidate function of a question is
  wrong: the right answer is no call. They are read as queries with an empty
  gold set ``()``, source = the category, into their own splits
  ``irrelevant_<split>`` (:data:`IRRELEVANT_PREFIX`), ``<split>`` being the hash
  split a relevant query with that id would get; the relevant splits are
  exactly what they were without them. These splits exist only where an
  irrelevance file does, and the notes count them. Retrieval metrics are
  undefined on them (:mod:`hyset_jax.evaluation.metrics` refuses an empty gold
  set): they are there to evaluate abstention.
- Skipped and counted in ``Dataset.notes``: ``live_relevance`` (16 questions
  whose candidate lists hold at least one right function, but no answer says
  which: BFCL only checks that some call is made; so neither a gold set nor
  "no tool"), categories whose questions carry no function list (multi_turn_*,
  memory, web_search: their functions live in per-class files and their answers
  are call strings or plain text), and files that are not question files
  (format_sensitivity, one JSON document). ``unused_datasets/`` is not read.
- Query text: the ``content`` of the user messages, joined by newlines (system
  prompts and assistant turns are context, not the request).
- Tool text (:func:`render_function`): name, description, parameters as JSON
  with sorted keys — :func:`hyset_jax.data.tooltext.render_tool`, shared with ``mcp:``,
  ``openai:`` and ``toolret:``.
- No split ships: queries get the hash split of :mod:`hyset_jax.data.splits`.
"""
from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import json
import os
import re
import sys
from typing import Any

from hyset_jax.data import files, splits
from hyset_jax.data.library import LibraryBuilder
from hyset_jax.data.tooltext import render_tool, schema_metadata
from hyset_jax.data.types import Dataset, Query
from hyset_jax.errors import UserError

_FILE = re.compile(r"^BFCL_v(\d+)_(.+)\.json$")
_PACKAGE = "bfcl_eval"
_INSTALL = "pip install --no-deps bfcl-eval"

# Categories whose every candidate function is wrong (BFCL's irrelevance detection): read as
# no-tool queries. live_relevance is not one: some function is right there, but not named.
IRRELEVANT_CATEGORIES = ("irrelevance", "live_irrelevance")
IRRELEVANT_PREFIX = "irrelevant_"


def find_data_dir() -> str:
  """The ``bfcl_eval/data`` folder of the installed package, without importing it."""
  candidates: list[str] = []
  try:
    spec = importlib.util.find_spec(_PACKAGE)
  except (ImportError, ValueError):
    spec = None
  if spec is not None and spec.submodule_search_locations:
    candidates.extend(spec.submodule_search_locations)
  # A namespace-less copy on sys.path that find_spec missed (e.g. a vendored tree).
  candidates.extend(os.path.join(p, _PACKAGE) for p in sys.path if p)
  for candidate in candidates:
    data = os.path.join(candidate, "data")
    if glob.glob(os.path.join(data, "BFCL_v*_*.json")):
      return data
  raise UserError(
      f"cannot find the BFCL data: the package bfcl-eval is not installed in this Python "
      f"({sys.executable}); install it with `{_INSTALL}` (its dependencies are not "
      f"needed), or name a data folder with bfcl:PATH")


def load_bfcl(path: str | None = None, name: str = "bfcl") -> Dataset:
  """Reads BFCL question and answer files into a :class:`Dataset`."""
  data_dir = os.path.expanduser(path) if path else find_data_dir()
  categories = _category_files(data_dir)
  library = LibraryBuilder()
  seen = files.UniqueIds("query")
  queries: list[Query] = []
  irrelevant: list[Query] = []
  irrelevant_counts: dict[str, int] = {}
  skipped_unanswered: list[str] = []
  skipped_no_functions: list[str] = []
  skipped_not_questions: list[str] = []
  for category, question_file in categories.items():
    answer_file = os.path.join(data_dir, "possible_answer", os.path.basename(question_file))
    answered = os.path.isfile(answer_file)
    no_tool = category in IRRELEVANT_CATEGORIES
    if no_tool and answered:
      # An answer would contradict "every function is wrong": refuse rather than guess.
      raise UserError(f"{answer_file}: answers for the irrelevance category {category!r}; "
                      f"expected none (its questions have no right function)")
    records = _read_questions(question_file, strict=answered or no_tool)
    if records is None:
      skipped_not_questions.append(category)
      continue
    has_functions = _has_functions(question_file, records)
    if has_functions:
      for line, record in records:
        for k, fn in enumerate(files.get_field(record, "function", list,
                                               f"{question_file}:{line}")):
          _add_function(library, fn, f"{question_file}:{line} function[{k}]", category)
    if no_tool and has_functions:
      found = _no_tool_queries(question_file, category, records, seen)
      irrelevant.extend(found)
      irrelevant_counts[category] = len(found)
      continue
    if not answered:
      skipped_unanswered.append(category)
      continue
    if not has_functions:
      skipped_no_functions.append(category)
      continue
    answers = _read_answers(answer_file)
    queries.extend(_queries(question_file, answer_file, category, records, answers, seen))

  if not queries:
    raise UserError(f"{data_dir}: no answered BFCL queries; expected BFCL_v<N>_<category>.json "
                    f"files with answers under possible_answer/")
  tools = library.build()
  query_splits = splits.hash_split(queries)
  if irrelevant:
    # The same id hash as the relevant queries, so the two halves line up split by split.
    query_splits.update({IRRELEVANT_PREFIX + k: v
                         for k, v in splits.hash_split(irrelevant).items()})
  notes = [f"data: {data_dir}{_package_version()}"]
  if irrelevant:
    per_split = ", ".join(f"{k} {len(v)}" for k, v in query_splits.items()
                          if k.startswith(IRRELEVANT_PREFIX))
    notes.append(f"read {len(irrelevant)} no-tool queries (empty gold set) of the irrelevance "
                 f"categories: " + ", ".join(f"{c} {n}" for c, n in irrelevant_counts.items())
                 + f"; splits {per_split}")
  if skipped_unanswered:
    notes.append(f"skipped {_plural(len(skipped_unanswered), 'category')} without answers: "
                 f"{', '.join(skipped_unanswered)} (their functions are in the library)")
  if skipped_no_functions:
    notes.append(f"skipped {_plural(len(skipped_no_functions), 'category')} without inline "
                 f"function lists (multi-turn/agentic): {', '.join(skipped_no_functions)}")
  if skipped_not_questions:
    notes.append(f"skipped {_plural(len(skipped_not_questions), 'file')} that are not "
                 f"question files: {', '.join(skipped_not_questions)}")
  conflict = library.conflict_note("function")
  if conflict:
    notes.append(conflict)
  known = set(tools.ids)
  missing = [q.id for q in queries if not set(q.gold) <= known]
  if missing:
    notes.append(f"{len(missing)} queries have gold functions defined nowhere "
                 f"(e.g. {missing[0]!r})")
  return Dataset(name=name, tools=tools, splits=query_splits, notes=tuple(notes))


def candidate_functions(path: str | None = None) -> dict[str, tuple[str, ...]]:
  """Question id -> the names of the functions BFCL offers with that question (its inline
  ``function`` list, in order), for every question :func:`load_bfcl` reads, relevant or not.

  BFCL poses each question with its own candidates; irrelevance is defined against them (all
  wrong), not against the union library ``load_bfcl`` builds, where another category's function
  may answer an "irrelevant" question. Used as a per-request allow list to measure in BFCL's own
  setting (benchmarks/abstention.py ``--within-candidates``)."""
  data_dir = os.path.expanduser(path) if path else find_data_dir()
  out: dict[str, tuple[str, ...]] = {}
  for question_file in _category_files(data_dir).values():
    records = _read_questions(question_file, strict=False)
    if records is None or not _has_functions(question_file, records):
      continue
    for line, record in records:
      where = f"{question_file}:{line}"
      names = []
      for k, fn in enumerate(files.get_field(record, "function", list, where)):
        if not isinstance(fn, dict):
          raise UserError(f"{where} function[{k}]: expected a function object, found "
                          f"{type(fn).__name__}")
        names.append(files.get_field(fn, "name", str, f"{where} function[{k}]"))
      out[files.get_id(record, "id", where)] = tuple(names)
  return out


def _plural(n: int, word: str) -> str:
  if n == 1:
    return f"1 {word}"
  return f"{n} {word[:-1]}ies" if word.endswith("y") else f"{n} {word}s"


def _package_version() -> str:
  try:
    return f" (bfcl-eval {importlib.metadata.version('bfcl-eval')})"
  except importlib.metadata.PackageNotFoundError:
    return ""


def _category_files(data_dir: str) -> dict[str, str]:
  """Category -> question file, the newest BFCL version of each, in category order."""
  if not os.path.isdir(data_dir):
    raise UserError(f"{data_dir}: missing; expected a BFCL data folder with "
                    f"BFCL_v<N>_<category>.json files and possible_answer/")
  newest: dict[str, tuple[int, str]] = {}
  for file_path in glob.glob(os.path.join(data_dir, "BFCL_v*_*.json")):
    match = _FILE.match(os.path.basename(file_path))
    if match:
      version, category = int(match.group(1)), match.group(2)
      if category not in newest or version > newest[category][0]:
        newest[category] = (version, file_path)
  if not newest:
    raise UserError(f"{data_dir}: no BFCL_v<N>_<category>.json files; expected the data "
                    f"folder of bfcl-eval")
  return {c: newest[c][1] for c in sorted(newest)}


def _read_questions(path: str, strict: bool) -> list[tuple[int, dict[str, Any]]] | None:
  """Question records, or None for a file that is one JSON document, not JSON lines.

  Only unanswered files may be such documents (format_sensitivity is a map of
  categories to ids); a file that is neither fails with its first bad line.
  """
  try:
    return list(files.read_jsonl(path))
  except UserError as line_error:
    if strict:
      raise
    try:
      files.read_json(path)
    except UserError:
      raise line_error from None
    return None


def _has_functions(path: str, records: list[tuple[int, dict[str, Any]]]) -> bool:
  with_functions = [line for line, r in records if "function" in r]
  if with_functions and len(with_functions) != len(records):
    line = next(line for line, r in records if "function" not in r)
    raise UserError(f"{path}:{line}: missing field 'function'; other questions in this "
                    f"file have one")
  return bool(with_functions)


def _add_function(library: LibraryBuilder, fn: Any, where: str, category: str) -> None:
  if not isinstance(fn, dict):
    raise UserError(f"{where}: expected a function object, found {type(fn).__name__}")
  name = files.get_field(fn, "name", str, where)
  if not name.strip():
    raise UserError(f"{where}: function has an empty name")
  description, parameters = _description_and_parameters(fn, where)
  library.add(name, render_tool(name, description, parameters),
              schema_metadata(name, description, parameters, category=category))


def render_function(fn: dict[str, Any], where: str = "function") -> str:
  """Deterministic tool text of a BFCL function (:func:`hyset_jax.data.tooltext.render_tool`).

  >>> render_function({"name": "f", "description": "Add.", "parameters":
  ...                  {"type": "dict", "properties": {"b": {}, "a": {}}}})
  'f: Add. parameters: {"properties": {"a": {}, "b": {}}, "type": "dict"}'
  """
  description, parameters = _description_and_parameters(fn, where)
  return render_tool(fn["name"], description, parameters)


def _description_and_parameters(fn: dict[str, Any], where: str) -> tuple[str, dict | None]:
  description = files.get_field(fn, "description", str, where, default="").strip()
  parameters = files.get_field(fn, "parameters", (dict, type(None)), where, default=None)
  return description, parameters


def _read_answers(path: str) -> dict[str, tuple[int, tuple[str, ...]]]:
  """Query id -> (line, sorted distinct function names of its ground truth)."""
  answers: dict[str, tuple[int, tuple[str, ...]]] = {}
  seen = files.UniqueIds("answer")
  for line, record in files.read_jsonl(path):
    where = f"{path}:{line}"
    query_id = files.get_id(record, "id", where)
    seen.add(query_id, where)
    calls = files.get_field(record, "ground_truth", list, where)
    names: set[str] = set()
    for call in calls:
      if not isinstance(call, dict) or not call:
        raise UserError(f"{where}: ground_truth holds {json.dumps(call)[:60]}; expected "
                        f"a list of {{function_name: arguments}} objects")
      names.update(call)
    if not names:
      raise UserError(f"{where}: ground_truth is empty; expected at least one call")
    answers[query_id] = (line, tuple(sorted(names)))
  return answers


def _queries(question_file: str, answer_file: str, category: str,
             records: list[tuple[int, dict[str, Any]]],
             answers: dict[str, tuple[int, tuple[str, ...]]],
             seen: files.UniqueIds) -> list[Query]:
  out: list[Query] = []
  unanswered: list[str] = []
  for line, record in records:
    where = f"{question_file}:{line}"
    query_id = files.get_id(record, "id", where)
    seen.add(query_id, where)
    text = _user_text(record, where)
    if query_id not in answers:
      unanswered.append(f"{query_id!r} (line {line})")
      continue
    out.append(Query(id=query_id, text=text, gold=answers[query_id][1], source=category))
  if unanswered:
    raise UserError(f"{answer_file}: no answer for {len(unanswered)} questions of "
                    f"{os.path.basename(question_file)}, e.g. {', '.join(unanswered[:3])}; "
                    f"expected one answer line per question")
  asked = {q.id for q in out}
  extra = [f"{i!r} (line {n})" for i, (n, _) in answers.items() if i not in asked]
  if extra:
    raise UserError(f"{answer_file}: {len(extra)} answers name unknown question ids, e.g. "
                    f"{', '.join(extra[:3])}; expected ids from "
                    f"{os.path.basename(question_file)}")
  return out


def _no_tool_queries(question_file: str, category: str,
                     records: list[tuple[int, dict[str, Any]]],
                     seen: files.UniqueIds) -> list[Query]:
  """The questions of an irrelevance category as queries whose gold set is empty."""
  out: list[Query] = []
  for line, record in records:
    where = f"{question_file}:{line}"
    query_id = files.get_id(record, "id", where)
    seen.add(query_id, where)  # shared with the relevant queries: ids never collide
    out.append(Query(id=query_id, text=_user_text(record, where), gold=(), source=category))
  return out


def _user_text(record: dict[str, Any], where: str) -> str:
  turns = files.get_field(record, "question", list, where)
  parts = []
  for turn in turns:
    messages = turn if isinstance(turn, list) else [turn]
    for message in messages:
      if not isinstance(message, dict):
        raise UserError(f"{where}: question holds {json.dumps(message)[:60]}; expected "
                        f"{{\"role\", \"content\"}} messages")
      if message.get("role") == "user" and isinstance(message.get("content"), str):
        if message["content"].strip():
          parts.append(message["content"].strip())
  if not parts:
    raise UserError(f"{where}: query has empty text (no user message); expected the request")
  return "\n".join(parts)
