"""The multi-source suite the experiment runs on: several source styles, one tool corpus.

- Tool corpus (fixed across sources, as in the paper): the union of BFCL's
  functions and ToolLens's tools, ids prefixed ``bfcl/`` and ``toollens/``.
- Sources:
  - each BFCL category (``simple_python``, ``live_multiple``, ...) — a real
    multi-source case: different generators and annotators over shared functions.
    BFCL ships no split; queries get a 60/40 train/test id-hash split here (salt
    ``toolscout``) so small categories still have test queries to measure.
  - ``toollens``: ToolLens's own (natural, ToolBench-style task) queries.
  - ``toollens_api``: a paired synthetic API-template style over the same tools
    (paper Table 30): for half of the ToolLens query ids (by id hash, disjoint
    from ``toollens``) the request is rendered from the query's gold tool
    schemas by :func:`render_api_request`. Gold sets and splits are ToolLens's.
- Caps: at most ``max_train`` / ``max_test`` queries per source and split,
  chosen by id hash (stable, order-free) and kept in file order.
"""
from __future__ import annotations

import dataclasses
import os

from hyset_jax.data import splits
from hyset_jax.data.specs import load_dataset
from hyset_jax.data.types import Query, ToolLibrary
from hyset_jax.errors import UserError
from toolscout.tooltext import parse_tool

TOOLLENS = "toollens"
TOOLLENS_API = "toollens_api"
BFCL_SPLIT = (("train", 0.6), ("test", 0.4))


@dataclasses.dataclass(frozen=True)
class Source:
  name: str
  train: tuple[Query, ...]
  test: tuple[Query, ...]


@dataclasses.dataclass(frozen=True)
class Suite:
  """One tool library and the sources over it (ordered by name, reference first)."""
  tools: ToolLibrary
  sources: dict[str, Source]
  notes: tuple[str, ...] = ()


# --- The synthetic API-template style ---------------------------------------------

_TEMPLATES = (
    "Call {api} from {tool} with {args}.",
    "{tool}.{api}({args})",
    "Use the {api} endpoint of {tool}; args: {args}.",
)
_JOINERS = (" Then ", "; ", " Then ")


def _api_call(text: str, template: str) -> str:
  fields = parse_tool(text)
  args = ", ".join(f"{p.name}=<{p.type or 'value'}>" for p in fields.params if p.required)
  return template.format(api=fields.name or "api", tool=fields.group or fields.name or "tool",
                         args=args or "no arguments")


def render_api_request(query_id: str, gold_texts: list[str]) -> str:
  """A compact API-template request naming the gold APIs and their required arguments.

  The template (one of three) is picked by a hash of the query id, so the
  rendering is deterministic and the style is not a single fixed string.

  >>> text = ('category_name:Food, tool_name:Recipes, api_name:Suggestions, '
  ...         'api_description:Get, required_params: [{"name": "q", "type": "STRING"}], '
  ...         'optional_params: [], return_schema: {}')
  >>> render_api_request("7", [text, text])
  'Recipes.Suggestions(q=<string>); Recipes.Suggestions(q=<string>)'
  """
  k = int(splits.unit_hash(query_id, "toolscout-template") * len(_TEMPLATES))
  return _JOINERS[k].join(_api_call(t, _TEMPLATES[k]) for t in gold_texts)


# --- Assembly ------------------------------------------------------------------------


def _cap(queries: list[Query], limit: int | None) -> tuple[Query, ...]:
  if limit is None or len(queries) <= limit:
    return tuple(queries)
  keep = set(sorted((q.id for q in queries),
                    key=lambda i: splits.unit_hash(i, "toolscout-cap"))[:limit])
  return tuple(q for q in queries if q.id in keep)


def _resolve_beir(spec: str) -> str:
  scheme, _, path = spec.partition(":")
  if scheme == "beir" and path and not os.path.isdir(os.path.expanduser(path)):
    raise UserError(f"ToolLens folder {path!r} not found (spec {spec!r}); pass "
                    f"--set toollens_spec=beir:PATH with the BEIR folder of ToolLens, or set "
                    f"HYSET_DATA to the data root that holds toollens/")
  return spec


Tools = list[tuple[str, str, dict]]  # (id, text, metadata) of library rows
BySource = dict[str, dict[str, list[Query]]]  # [source][split] -> queries


def _toollens(spec: str) -> tuple[Tools, BySource, list[str]]:
  """ToolLens tools and queries, each query in one of the two styles by a hash of its id."""
  lens = load_dataset(_resolve_beir(spec))
  tools = [(f"toollens/{tid}", text, {**m, "corpus": "toollens"})
           for tid, text, m in zip(lens.tools.ids, lens.tools.texts, lens.tools.metadata)]
  lens_text = dict(zip(lens.tools.ids, lens.tools.texts))
  by_source: BySource = {}
  for split in ("train", "test"):
    for q in lens.split(split):
      gold = tuple(f"toollens/{g}" for g in q.gold)
      if splits.unit_hash(q.id, "toolscout-style") < 0.5:
        name, text = TOOLLENS, q.text
      else:
        name, text = TOOLLENS_API, render_api_request(q.id, [lens_text[g] for g in q.gold])
      by_source.setdefault(name, {"train": [], "test": []})[split].append(
          Query(f"toollens/{q.id}", text, gold, name))
  return tools, by_source, list(lens.notes)


def _bfcl(spec: str, categories: tuple[str, ...] | None) -> tuple[Tools, BySource, list[str]]:
  """BFCL functions and queries, one source per category, split by a hash of the query id."""
  bfcl = load_dataset(spec)
  tools = [(f"bfcl/{tid}", text, {**m, "corpus": "bfcl"})
           for tid, text, m in zip(bfcl.tools.ids, bfcl.tools.texts, bfcl.tools.metadata)]
  known = set(bfcl.tools.ids)
  wanted = None if categories is None else set(categories)
  by_source: BySource = {}
  dropped = 0
  for queries in bfcl.splits.values():
    for q in queries:
      if (wanted is not None and q.source not in wanted) or not q.gold:
        continue  # not asked for, or a request that needs no tool (nothing to route to)
      gold = tuple(f"bfcl/{g}" for g in q.gold if g in known)
      if not gold:
        dropped += 1
        continue
      split = splits.assign(q.id, BFCL_SPLIT, salt="toolscout")
      by_source.setdefault(q.source, {"train": [], "test": []})[split].append(
          Query(f"bfcl/{q.id}", q.text, gold, q.source))
  if wanted is not None and wanted - by_source.keys():
    raise UserError(f"unknown BFCL categories {sorted(wanted - by_source.keys())}; "
                    f"available: {sorted(by_source)}")
  notes = [f"bfcl: {dropped} queries whose gold functions are defined nowhere; left out"
           ] if dropped else []
  return tools, by_source, notes


def build_suite(toollens_spec: str, bfcl_spec: str | None = "bfcl",
                bfcl_categories: tuple[str, ...] | None = None, reference: str = TOOLLENS,
                max_train: int | None = None, max_test: int | None = None) -> Suite:
  """Loads ToolLens and BFCL into one :class:`Suite` (see the module docstring).

  Args:
    toollens_spec: ``beir:PATH`` of ToolLens.
    bfcl_spec: ``bfcl`` or ``bfcl:PATH``; None leaves BFCL out.
    bfcl_categories: categories to keep (None: all with answers).
    reference: the source listed first (the specialist's training source).
    max_train, max_test: per-source caps.
  """
  tools, by_source, notes = _toollens(toollens_spec)
  if bfcl_spec is not None:
    bfcl_tools, bfcl_sources, bfcl_notes = _bfcl(bfcl_spec, bfcl_categories)
    tools, notes = tools + bfcl_tools, notes + bfcl_notes
    by_source.update(bfcl_sources)
  if reference not in by_source:
    raise UserError(f"reference source {reference!r} not among the sources "
                    f"{sorted(by_source)}")
  order = [reference] + sorted(s for s in by_source if s != reference)
  sources = {}
  for name in order:
    train, test = _cap(by_source[name]["train"], max_train), _cap(by_source[name]["test"], max_test)
    if not test:
      notes.append(f"{name}: no test queries after the split; left out")
      continue
    sources[name] = Source(name, train, test)
  ids, texts, meta = zip(*tools)
  return Suite(ToolLibrary(tuple(ids), tuple(texts), tuple(meta)), sources, tuple(notes))
