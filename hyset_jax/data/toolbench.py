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


def load_toolbench(path: str, name: str | None = None) -> Dataset:
  """Reads ToolBench instruction JSON (a file or a folder of files) into a Dataset."""
  root = os.path.expanduser(path)
  paths = _instruction_files(root)
  library = LibraryBuilder()
  queries: list[Query] = []
  seen = files.UniqueIds("query")
  for file_path in paths:
    stem = os.path.splitext(os.path.basename(file_path))[0]
    entries = files.read_json(file_path)
    if not isinstance(entries, list):
      raise UserError(f"{file_path}: expected a JSON list of ToolBench queries, found "
                      f"{type(entries).__name__}")
    for position, entry in enumerate(entries):
      query = _read_query(file_path, stem, position, entry, library)
      seen.add(query.id, f"{file_path} entry #{position}")
      queries.append(query)
  if not len(library):
    raise UserError(f"{root}: no tools; expected queries with a non-empty api_list")
  if not queries:
    raise UserError(f"{root}: no queries; expected a JSON list of ToolBench queries")

  tools = library.build()
  notes = [n for n in [library.conflict_note("tool::api")] if n]
  known = set(tools.ids)
  missing = [q.id for q in queries if not set(q.gold) <= known]
  if missing:
    notes.append(f"{len(missing)} queries name relevant APIs missing from every api_list "
                 f"(e.g. {missing[0]!r}); their gold tools are not in the library")
  return Dataset(name=name or _default_name(root), tools=tools,
                 splits=splits.hash_split(queries), notes=tuple(notes))


def _default_name(root: str) -> str:
  """The folder (or file) name; ToolBench's own ``.../<name>/instruction`` gives <name>."""
  path = os.path.normpath(os.path.abspath(root))
  if os.path.isfile(path):
    return os.path.splitext(os.path.basename(path))[0]
  if os.path.basename(path) == "instruction":
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
          f"api_description:{(api.get('api_description') or '').strip()}, "
          f"required_params: {params('required_parameters')}, "
          f"optional_params: {params('optional_parameters')}")
