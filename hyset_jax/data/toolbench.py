"""The ``toolbench:PATH`` reader: ToolBench instruction files (G1/G2/G3 *_query.json).

``PATH`` is one instruction file or a folder of them (``*.json``, read in name
order). Each file is a JSON list of::

  {"query": str, "query_id": int|str,
   "api_list": [{"category_name", "tool_name", "api_name", "api_description",
                 "required_parameters", "optional_parameters", ...}, ...],
   "relevant APIs": [[tool_name, api_name], ...]}

- Tools are identified as ``tool_name::api_name`` and deduplicated across all
  queries and files (see :class:`~hyset_jax.data.library.LibraryBuilder`).
- Tool text (:func:`render_api`) follows the flattening ToolLens (COLT) uses for
  the same ToolBench APIs, so models move between the two data sets unchanged.
- A query's gold set is the sorted distinct ids of its ``relevant APIs``; its
  source is the file stem (``G1_query``) and its id ``<stem>:<query_id>``, as
  ToolBench numbers queries per file.
- The files carry no split: queries get the hash split of
  :mod:`hyset_jax.data.splits`.

``PATH`` may also be a ToolBench release root — a folder holding ``data/``, or ``data/``
itself — laid out as ToolBench ships it::

  data/instruction/G1_query.json, G2_query.json, G3_query.json     training queries
  data/test_instruction/G1_instruction.json, G1_category.json, G1_tool.json,
                        G2_instruction.json, G2_category.json, G3_instruction.json
  data/test_query_ids/<the same six names>.json                    {"<query_id>": 0, ...}

With ``test_instruction/`` present, each of its files is a split named after it (the six
official test sets, as ToolBench's retriever evaluates them; ids ``<set>:<query_id>``), keeping
the queries its ``test_query_ids/`` file lists when there is one. ``instruction/`` then gives
the split ``train``: every query except those whose id is in a test set of the same group
(G1, G2, G3) — ToolBench's own train/test separation (``preprocess_retriever_data.py``).
Without ``test_instruction/``, ``instruction/`` is read as an instruction folder (hash split).
The library is the union of every api_list read.
"""
from __future__ import annotations

import glob
import json
import os
from typing import Any

from hyset_jax.data import files, splits
from hyset_jax.data.library import LibraryBuilder
from hyset_jax.data.types import Dataset, Query
from hyset_jax.errors import UserError

_PARAM_KEYS = ("name", "type", "description")


TEST_DIR, TEST_IDS_DIR, TRAIN_DIR = "test_instruction", "test_query_ids", "instruction"
# ToolBench's six test sets, in the order its papers report them; other files follow by name.
OFFICIAL_TEST_SETS = ("G1_instruction", "G1_category", "G1_tool", "G2_instruction",
                      "G2_category", "G3_instruction")


def load_toolbench(path: str, name: str | None = None) -> Dataset:
  """Reads ToolBench instruction JSON (a file, a folder of files, or a release root)."""
  root = os.path.expanduser(path)
  release = release_dir(root)
  if release is not None and os.path.isdir(os.path.join(release, TEST_DIR)):
    return _load_release(release, name or _default_name(root))
  if release is not None:
    root = os.path.join(release, TRAIN_DIR)
  library = LibraryBuilder()
  seen = files.UniqueIds("query")
  queries = [q for file_path in _instruction_files(root)
             for q in _read_file(file_path, library, seen)]
  _check_read(root, library, queries)
  tools = library.build()
  return Dataset(name=name or _default_name(root), tools=tools,
                 splits=splits.hash_split(queries), notes=_notes(library, tools, queries))


def release_dir(root: str) -> str | None:
  """The ``data/`` folder of a ToolBench release at ``root`` (``root`` or ``root/data``)."""
  for candidate in (os.path.join(root, "data"), root):
    if any(os.path.isdir(os.path.join(candidate, d)) for d in (TEST_DIR, TRAIN_DIR)):
      return candidate
  return None


def _group(stem: str) -> str:
  """``G1_query`` / ``G1_category`` -> ``G1`` (ToolBench numbers queries per group)."""
  return stem.split("_", 1)[0]


def _load_release(data_dir: str, name: str) -> Dataset:
  library = LibraryBuilder()
  seen = files.UniqueIds("query")
  out: dict[str, tuple[Query, ...]] = {}
  notes: list[str] = []
  test_ids: dict[str, set[str]] = {}  # group -> raw query ids held out for testing
  test_dir = os.path.join(data_dir, TEST_DIR)
  rank = {n: i for i, n in enumerate(OFFICIAL_TEST_SETS)}
  test_files = sorted(_instruction_files(test_dir), key=lambda f: (
      rank.get(os.path.splitext(os.path.basename(f))[0], len(rank)), f))
  for file_path in test_files:
    stem = os.path.splitext(os.path.basename(file_path))[0]
    listed = _listed_ids(os.path.join(data_dir, TEST_IDS_DIR, f"{stem}.json"))
    queries = _read_file(file_path, library, seen)
    if listed is not None:
      kept = [q for q in queries if q.id.split(":", 1)[1] in listed]
      if len(kept) < len(queries):
        notes.append(f"{stem}: {len(queries) - len(kept)} queries of {TEST_DIR}/ are not in "
                     f"{TEST_IDS_DIR}/{stem}.json; left out")
      absent = len(listed) - len(kept)
      if absent:
        notes.append(f"{stem}: {absent} ids of {TEST_IDS_DIR}/{stem}.json have no query in "
                     f"{TEST_DIR}/{stem}.json")
      queries = kept
    out[stem] = tuple(queries)
    ids = listed if listed is not None else {q.id.split(":", 1)[1] for q in queries}
    test_ids.setdefault(_group(stem), set()).update(ids)
  train_dir = os.path.join(data_dir, TRAIN_DIR)
  if os.path.isdir(train_dir):
    train, held = [], 0
    for file_path in _instruction_files(train_dir):
      stem = os.path.splitext(os.path.basename(file_path))[0]
      held_out = test_ids.get(_group(stem), set())
      for q in _read_file(file_path, library, seen):
        if q.id.split(":", 1)[1] in held_out:
          held += 1
        else:
          train.append(q)
    out = {"train": tuple(train), **out}
    notes.append(f"train: {len(train)} queries of {TRAIN_DIR}/; {held} left out because a "
                 f"test set of their group holds them")
  all_queries = [q for qs in out.values() for q in qs]
  _check_read(data_dir, library, all_queries)
  tools = library.build()
  return Dataset(name=name, tools=tools, splits=out,
                 notes=tuple(notes) + _notes(library, tools, all_queries))


def _listed_ids(path: str) -> set[str] | None:
  """The query ids of a ``test_query_ids/<set>.json`` (``{"<id>": 0, ...}``), if present."""
  if not os.path.exists(path):
    return None
  data = files.read_json(files.require_file(path, "ToolBench test query ids"))
  if isinstance(data, dict):
    return {str(k) for k in data}
  if isinstance(data, list) and all(isinstance(k, (str, int)) and not isinstance(k, bool)
                                    for k in data):
    return {str(k) for k in data}
  raise UserError(f"{path}: expected a JSON object keyed by query id ({{\"<query_id>\": 0, "
                  f"...}}), found {type(data).__name__}")


def _read_file(file_path: str, library: LibraryBuilder, seen: files.UniqueIds) -> list[Query]:
  stem = os.path.splitext(os.path.basename(file_path))[0]
  entries = files.read_json(file_path)
  if not isinstance(entries, list):
    raise UserError(f"{file_path}: expected a JSON list of ToolBench queries, found "
                    f"{type(entries).__name__}")
  out = []
  for position, entry in enumerate(entries):
    query = _read_query(file_path, stem, position, entry, library)
    seen.add(query.id, f"{file_path} entry #{position}")
    out.append(query)
  return out


def _check_read(root: str, library: LibraryBuilder, queries: list[Query]) -> None:
  if not len(library):
    raise UserError(f"{root}: no tools; expected queries with a non-empty api_list")
  if not queries:
    raise UserError(f"{root}: no queries; expected a JSON list of ToolBench queries")


def _notes(library: LibraryBuilder, tools, queries: list[Query]) -> tuple[str, ...]:
  notes = [n for n in [library.conflict_note("tool::api")] if n]
  known = set(tools.ids)
  missing = [q.id for q in queries if not set(q.gold) <= known]
  if missing:
    notes.append(f"{len(missing)} queries name relevant APIs missing from every api_list "
                 f"(e.g. {missing[0]!r}); their gold tools are not in the library")
  return tuple(notes)


def _default_name(root: str) -> str:
  """The folder (or file) name; ToolBench's own ``.../<name>/instruction`` gives <name>."""
  path = os.path.normpath(os.path.abspath(root))
  if os.path.isfile(path):
    return os.path.splitext(os.path.basename(path))[0]
  if os.path.basename(path) == "instruction":
    path = os.path.dirname(path)
  if os.path.basename(path) == "data" and release_dir(path) == path:
    path = os.path.dirname(path)
  return os.path.basename(path)


def _instruction_files(root: str) -> list[str]:
  if os.path.isfile(root):
    return [root]
  if not os.path.isdir(root):
    raise UserError(f"{root}: missing; expected a ToolBench instruction file "
                    f"(e.g. G1_query.json) or a folder of them")
  paths = sorted(glob.glob(os.path.join(root, "*.json")))
  if not paths:
    raise UserError(f"{root}: no *.json files; expected ToolBench instruction files "
                    f"(G1_query.json, G2_query.json, ...)")
  return paths


def _read_query(path: str, stem: str, position: int, entry: Any,
                library: LibraryBuilder) -> Query:
  where = f"{path} entry #{position}"
  if not isinstance(entry, dict):
    raise UserError(f"{where}: expected a JSON object, found {type(entry).__name__}")
  query_id = f"{stem}:{files.get_id(entry, 'query_id', where)}"
  where = f"{path} entry #{position} (query_id {query_id!r})"
  text = files.get_field(entry, "query", str, where)
  if not text.strip():
    raise UserError(f"{where}: query has empty text; expected the request")
  api_list = files.get_field(entry, "api_list", list, where)
  for k, api in enumerate(api_list):
    api_where = f"{where} api_list[{k}]"
    if not isinstance(api, dict):
      raise UserError(f"{api_where}: expected an API object, found {type(api).__name__}")
    tool_id = api_id(files.get_field(api, "tool_name", str, api_where),
                     files.get_field(api, "api_name", str, api_where))
    library.add(tool_id, render_api(api, api_where), {
        "category": str(api.get("category_name") or ""),
        "tool_name": api["tool_name"], "api_name": api["api_name"],
        "method": str(api.get("method") or "")})
  gold = set()
  for k, pair in enumerate(files.get_field(entry, "relevant APIs", list, where)):
    if (not isinstance(pair, list) or len(pair) != 2
        or not all(isinstance(p, str) for p in pair)):
      raise UserError(f"{where}: 'relevant APIs'[{k}] is {json.dumps(pair)[:80]}; "
                      f"expected a [tool_name, api_name] pair of strings")
    gold.add(api_id(*pair))
  if not gold:
    raise UserError(f"{where}: 'relevant APIs' is empty; expected the APIs the query needs")
  return Query(id=query_id, text=text, gold=tuple(sorted(gold)), source=stem)


def api_id(tool_name: str, api_name: str) -> str:
  """The tool id of one ToolBench API.

  >>> api_id("The Cocktail DB", "List of Cocktails")
  'The Cocktail DB::List of Cocktails'
  """
  return f"{tool_name}::{api_name}"


def render_api(api: dict[str, Any], where: str = "api") -> str:
  """Deterministic tool text, in ToolLens's flattening of a ToolBench API.

  Parameters keep only name, type and description (ToolLens drops defaults,
  which are example values, not documentation).

  >>> render_api({"category_name": "Food", "tool_name": "T", "api_name": "A",
  ...             "api_description": "Get it.", "required_parameters":
  ...             [{"name": "q", "type": "STRING", "description": "", "default": "x"}]})
  'category_name:Food, tool_name:T, api_name:A, api_description:Get it., required_params: [{"name": "q", "type": "STRING", "description": ""}], optional_params: []'
  """
  def params(key: str) -> str:
    value = api.get(key) or []
    if not isinstance(value, list) or not all(isinstance(p, dict) for p in value):
      raise UserError(f"{where}: {key!r} should be a list of parameter objects")
    kept = [{k: p[k] for k in _PARAM_KEYS if k in p} for p in value]
    return json.dumps(kept, ensure_ascii=False)

  return (f"category_name:{api.get('category_name') or ''}, "
          f"tool_name:{api['tool_name']}, api_name:{api['api_name']}, "
          # str(): a non-string description (a number in a hand-edited file) is text too, as
          # category_name is; .strip() on it would raise AttributeError.
          f"api_description:{str(api.get('api_description') or '').strip()}, "
          f"required_params: {params('required_parameters')}, "
          f"optional_params: {params('optional_parameters')}")
