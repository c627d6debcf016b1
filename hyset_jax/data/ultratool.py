"""The ``ultratool:PATH`` reader: UltraTool as GNN4TaskPlan re-formatted it.

Layout (``PATH`` is a folder)::

  PATH/data.json        JSON lines despite .json, one request a line:
                        {"id", "user_request", "task_steps", "task_nodes": [{"task"}, ...],
                         "task_links", "n_tools", "type"}
  PATH/split_ids.json   {"test_ids": {"chain": [id, ...], ...}}
  PATH/tool_desc.json   {"nodes": [{"id", "desc", "domain": [...]}, ...]}

- Library: one tool per node of ``tool_desc.json``, in file order; the tool id is ``id``. There
  are no parameter schemas, so the tool text is :func:`hyset_jax.data.tooltext.render_tool` of
  the id and ``desc`` (``"<id>: <desc>"``). The metadata keeps ``domain`` (the list, for
  filtering and grouping) and ``category`` (the domains joined by ``", "``, what exports label
  tools by).
- Gold set: the distinct ``task`` names of ``task_nodes`` (sorted); every one must be a tool of
  the library (a request naming another is an error naming the request). A request with no
  task nodes has no gold set: it is left out and counted in the notes.
- Query text: ``user_request``, stripped. Source: ``type`` (``chain`` throughout GNN4TaskPlan's
  release).
- Splits: ``test`` = the ids of every list under ``test_ids`` (each must be a request of
  data.json), ``train`` = the other requests, both in data.json order. There is no validation
  split: training and ``--split validation`` carve one out of train by id hash
  (:func:`hyset_jax.data.splits.with_validation`).
"""
from __future__ import annotations

import os
from typing import Any

from hyset_jax.data import files
from hyset_jax.data.tooltext import render_tool, schema_metadata
from hyset_jax.data.types import Dataset, Query, ToolLibrary
from hyset_jax.errors import UserError

_LAYOUT = "data.json, split_ids.json and tool_desc.json"


def load_ultratool(path: str) -> Dataset:
  """Reads a GNN4TaskPlan UltraTool folder (see the module docstring) into a Dataset."""
  root = os.path.expanduser(path)
  if not os.path.isdir(root):
    what = "a file" if os.path.exists(root) else "missing"
    raise UserError(f"{root}: {what}; expected an UltraTool folder (GNN4TaskPlan's layout) "
                    f"with {_LAYOUT}")
  tools = read_tools(files.require_file(
      os.path.join(root, "tool_desc.json"), "UltraTool tool descriptions (tool_desc.json)"))
  test_ids = read_test_ids(files.require_file(
      os.path.join(root, "split_ids.json"), "UltraTool split ids (split_ids.json)"))
  data_path = files.require_file(os.path.join(root, "data.json"),
                                 "UltraTool requests (data.json, JSON lines)")
  queries, no_gold = read_requests(data_path, set(tools.ids))
  known = {q.id for q in queries} | set(no_gold)
  split_path = os.path.join(root, "split_ids.json")
  absent = [i for i in test_ids if i not in known]
  if absent:
    raise UserError(f"{split_path}: {len(absent)} test ids are not requests of {data_path}, "
                    f"e.g. {', '.join(repr(i) for i in absent[:3])}; expected ids from "
                    f"data.json")
  test = set(test_ids)
  split_queries = {"train": tuple(q for q in queries if q.id not in test),
                   "test": tuple(q for q in queries if q.id in test)}
  notes = []
  if no_gold:
    in_test = sum(1 for i in no_gold if i in test)
    notes.append(f"{len(no_gold)} requests have no task nodes (no gold set; {in_test} of them "
                 f"in test), e.g. {no_gold[0]!r}; left out")
  return Dataset(name=os.path.basename(os.path.normpath(root)), tools=tools,
                 splits=split_queries, notes=tuple(notes))


def read_tools(path: str) -> ToolLibrary:
  """``tool_desc.json`` -> the library (row order = file order)."""
  data = files.read_json(path)
  nodes = data.get("nodes") if isinstance(data, dict) else None
  if not isinstance(nodes, list):
    raise UserError(f"{path}: expected {{\"nodes\": [{{\"id\", \"desc\", \"domain\"}}, ...]}}, "
                    f"found a JSON {type(data).__name__} without a 'nodes' list")
  if not nodes:
    raise UserError(f"{path}: 'nodes' is empty; expected at least one tool")
  seen = files.UniqueIds("tool")
  ids, texts, metadata = [], [], []
  for i, node in enumerate(nodes):
    where = f"{path}: nodes[{i}]"
    if not isinstance(node, dict):
      raise UserError(f"{where}: expected a tool object {{\"id\", \"desc\", \"domain\"}}, found "
                      f"{type(node).__name__}")
    tool_id = files.get_id(node, "id", where)
    where = f"{path}: nodes[{i}] ({tool_id!r})"
    desc = files.get_field(node, "desc", str, where).strip()
    domain = files.get_field(node, "domain", list, where, default=[])
    if not all(isinstance(d, str) for d in domain):
      raise UserError(f"{where}: field 'domain' should be a list of strings, found "
                      f"{domain!r:.80}")
    seen.add(tool_id, where)
    ids.append(tool_id)
    texts.append(render_tool(tool_id, desc, None))
    metadata.append(schema_metadata(tool_id, desc, None, domain=list(domain),
                                    category=", ".join(domain)))
  return ToolLibrary(tuple(ids), tuple(texts), tuple(metadata))


def read_test_ids(path: str) -> tuple[str, ...]:
  """The ids of every list under ``test_ids`` in ``split_ids.json``, in file order."""
  data = files.read_json(path)
  groups = data.get("test_ids") if isinstance(data, dict) else None
  if not isinstance(groups, dict):
    raise UserError(f"{path}: expected {{\"test_ids\": {{\"chain\": [id, ...]}}}}, found a JSON "
                    f"{type(data).__name__} without a 'test_ids' object")
  out: list[str] = []
  seen = files.UniqueIds("test")
  for group, ids in groups.items():
    if not isinstance(ids, list):
      raise UserError(f"{path}: test_ids[{group!r}] should be a list of request ids, found "
                      f"{type(ids).__name__}")
    for k, value in enumerate(ids):
      where = f"{path}: test_ids[{group!r}][{k}]"
      if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
        raise UserError(f"{where}: expected a request id (a non-empty string), found "
                        f"{value!r:.60}")
      seen.add(str(value), where)
      out.append(str(value))
  if not out:
    raise UserError(f"{path}: test_ids lists no request; expected the test split's ids")
  return tuple(out)


def read_requests(path: str, known: set[str]) -> tuple[list[Query], list[str]]:
  """``data.json`` -> (queries with a gold set, ids of requests without task nodes)."""
  out: list[Query] = []
  no_gold: list[str] = []
  seen = files.UniqueIds("request")
  for line, obj in files.read_jsonl(path):
    where = f"{path}:{line}"
    request_id = files.get_id(obj, "id", where)
    where = f"{path}:{line} (request {request_id!r})"
    seen.add(request_id, where)
    text = files.get_field(obj, "user_request", str, where).strip()
    if not text:
      raise UserError(f"{where}: field 'user_request' is empty; expected the request")
    gold = _tasks(files.get_field(obj, "task_nodes", list, where), where, known)
    if not gold:
      no_gold.append(request_id)
      continue
    source = obj.get("type")
    out.append(Query(id=request_id, text=text, gold=gold,
                     source=source if isinstance(source, str) else ""))
  if not out and not no_gold:
    raise UserError(f"{path}: no requests; expected one {{\"id\", \"user_request\", "
                    f"\"task_nodes\"}} object a line")
  return out, no_gold


def _tasks(nodes: list[Any], where: str, known: set[str]) -> tuple[str, ...]:
  """The sorted distinct ``task`` names of ``task_nodes``, each a tool of the library."""
  names: set[str] = set()
  for k, node in enumerate(nodes):
    nwhere = f"{where} task_nodes[{k}]"
    if not isinstance(node, dict):
      raise UserError(f"{nwhere}: expected {{\"task\": tool id}}, found {type(node).__name__}")
    task = files.get_id(node, "task", nwhere)
    if task not in known:
      raise UserError(f"{nwhere}: tool {task!r} is not in tool_desc.json; every task must "
                      f"name a tool of the library")
    names.add(task)
  return tuple(sorted(names))
