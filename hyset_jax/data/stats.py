"""Summary statistics of a :class:`Dataset` (what ``hyset data stats`` prints).

The numbers a user checks before training: how big the library and splits
are, how large the gold sets get (it bounds ``max_set_size``), which tools no
query ever needs, and which gold tools the library lacks (those queries can
never be answered completely).

No-tool queries (an empty gold set: BFCL's ``irrelevant_*`` splits) are counted
per split apart from the rest, and left out of the all-splits size histogram, so
its shares describe the gold sets there are; each split's own histogram still
shows them as size 0.
"""
from __future__ import annotations

import collections
from typing import Any

from hyset_jax.data.types import Dataset

_EXAMPLES = 5


def compute_stats(dataset: Dataset) -> dict[str, Any]:
  """A JSON-ready summary; set sizes and counts are keyed by strings."""
  known = set(dataset.tools.ids)
  used: set[str] = set()
  sizes: dict[str, dict[str, int]] = {}
  all_sizes: collections.Counter[int] = collections.Counter()
  sources: dict[str, dict[str, int]] = {}
  missing: list[dict[str, Any]] = []
  no_tool: dict[str, int] = {}
  for split, queries in dataset.splits.items():
    counter = collections.Counter(len(q.gold) for q in queries)
    if counter[0]:
      no_tool[split] = counter[0]
    all_sizes.update({k: v for k, v in counter.items() if k})
    sizes[split] = {str(k): v for k, v in sorted(counter.items())}
    for q in queries:
      used.update(q.gold)
      per_source = sources.setdefault(q.source or "(none)", {})
      per_source[split] = per_source.get(split, 0) + 1
      absent = [t for t in q.gold if t not in known]
      if absent:
        missing.append({"split": split, "id": q.id, "missing": absent})
  unused = [t for t in dataset.tools.ids if t not in used]
  return {
      "name": dataset.name,
      "tools": len(dataset.tools),
      "queries": {split: len(qs) for split, qs in dataset.splits.items()},
      "set_sizes": sizes,
      "set_sizes_all": {str(k): v for k, v in sorted(all_sizes.items())},
      "max_set_size": max(all_sizes, default=0),
      "no_tool_queries": no_tool,
      "unused_tools": {"count": len(unused), "examples": unused[:_EXAMPLES]},
      "queries_missing_gold": {"count": len(missing), "examples": missing[:_EXAMPLES]},
      "sources": dict(sorted(sources.items())),
      "notes": list(dataset.notes),
  }


def format_stats(stats: dict[str, Any]) -> str:
  """The human-readable report of :func:`compute_stats`."""
  total = sum(stats["queries"].values())
  no_tool = stats.get("no_tool_queries") or {}
  n_no_tool = sum(no_tool.values())
  lines = [f"data set: {stats['name']}",
           f"tools: {stats['tools']}",
           f"queries: {total} ("
           + ", ".join(f"{s} {n}" for s, n in stats["queries"].items()) + ")"]
  if n_no_tool:
    lines.append(f"no-tool queries (empty gold set): {n_no_tool} ("
                 + ", ".join(f"{s} {n}" for s, n in no_tool.items()) + ")")
  lines.append("gold set sizes (all splits" + (", no-tool queries aside" if n_no_tool else "")
               + "): " + _histogram(stats["set_sizes_all"], total - n_no_tool))
  for split, hist in stats["set_sizes"].items():
    lines.append(f"  {split}: " + _histogram(hist, stats["queries"][split]))
  unused = stats["unused_tools"]
  lines.append(f"tools never used as gold: {unused['count']}"
               + (f" (e.g. {', '.join(repr(t) for t in unused['examples'])})"
                  if unused["count"] else ""))
  missing = stats["queries_missing_gold"]
  lines.append(f"queries whose gold tools are missing from the library: {missing['count']}")
  for example in missing["examples"]:
    lines.append(f"  {example['split']} {example['id']!r}: {', '.join(example['missing'])}")
  lines.append(f"sources: {len(stats['sources'])}")
  for source, per_split in stats["sources"].items():
    lines.append(f"  {source}: {sum(per_split.values())} ("
                 + ", ".join(f"{s} {n}" for s, n in per_split.items()) + ")")
  if stats["notes"]:
    lines.append("notes:")
    lines.extend(f"  - {note}" for note in stats["notes"])
  return "\n".join(lines)


def _histogram(hist: dict[str, int], total: int) -> str:
  if not hist:
    return "(no queries)"
  return ", ".join(f"{size}: {n} ({100.0 * n / max(total, 1):.1f}%)"
                   for size, n in hist.items())
