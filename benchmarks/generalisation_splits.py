"""Split builders for the paper's generalisation settings (Table 3), reproducible from a seed.

  python -m benchmarks.generalisation_splits --kind tools      --data SPEC --seed 0 --out DIR
  python -m benchmarks.generalisation_splits --kind categories --data SPEC --seed 0 --out DIR
  python -m benchmarks.generalisation_splits --kind pairs      --data SPEC --seed 0 --out DIR
  python -m benchmarks.generalisation_splits --kind sets       --data SPEC --seed 0 --out DIR

Every query of the data set is pooled (every split; requests that need no tool are dropped)
and re-split:

- ``tools`` (UT, held-out tools): ``--fraction`` of the tools that some gold set names, drawn
  in a seeded order, leave the training library; every query that needs one is a test query.
- ``categories`` (UC, held-out categories): ``--categories`` of the library's categories, drawn
  the same way; a tool is held out when each of its categories is (UltraTool tools can belong to
  several domains), and the queries that need a held-out tool are split per category, in a
  seeded order: the first ``--adapt-fraction`` go to the ``adapt`` split, the rest to ``test``.
  ``adapt`` is what adaptation may learn from: the first k queries of each category in it (file
  order) are its k-shot set, all of it is full supervision of those categories. A tool's
  categories: ToolLens' ``category_name:`` in the tool text, Seal-Tools' ``field`` up to its
  first ``/`` (2,276 fields, 146 top-level ones), UltraTool's ``domain`` list, a ToolBench or
  BFCL ``category`` (:func:`categories_of`).
- ``pairs`` (unseen pairs): ``--pairs`` pairs of tools that occur together in some gold set,
  drawn in a seeded order; every gold set holding both tools of a held-out pair leaves
  training, and its queries are test queries. A pair is held out only if each tool of the sets it
  removes stays in some training set, so the test asks for a new pair of known tools.
  ``--validation-pairs`` more pairs are held out the same way for validation.
- ``sets`` (unseen sets): ``benchmarks/unseen_split.py`` (same options), here for one entry point.

Layout. ``tools`` and ``categories`` write two BEIR folders: ``DIR/train`` (the library without
the held-out tools; ``qrels/train.tsv``, validation carved from it when read) and ``DIR/test``
(the whole library; ``qrels/test.tsv`` and, for categories, ``qrels/adapt.tsv``). A model
trained on ``beir:DIR/train`` is scored on ``beir:DIR/test`` through the cross-library path of
``hyset eval --model M --data beir:DIR/test`` (the held-out tools get the encoder's embedding).
``pairs`` and ``sets`` write one folder (every tool is known). Each writes ``split.json`` (source,
seed, what was held out, counts, the checks made), is read back and checked before it is moved
into place, and an existing DIR is kept unless ``--force``.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import itertools
import json
import pathlib
import re
import sys
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from benchmarks import unseen_split
from hyset_jax.data.types import Dataset, Query, ToolLibrary
from hyset_jax.errors import UserError

KINDS = ("tools", "categories", "pairs", "sets")
DEFAULT_FRACTION = 0.1
DEFAULT_CATEGORIES = 3
DEFAULT_ADAPT_FRACTION = 0.5
DEFAULT_PAIRS = 30
DEFAULT_VALIDATION_PAIRS = 15
_TOOLLENS_CATEGORY = re.compile(r"category_name:([^,]*),")


def categories_of(text: str, metadata: Mapping | None) -> frozenset[str]:
  """A tool's categories: its metadata's ``domain`` list (UltraTool), else ``field`` up to the
  first ``/`` (Seal-Tools), else ``category`` (ToolBench, BFCL), else ToolLens' ``category_name:``
  in the text; empty when none of these is there.

  >>> sorted(categories_of("x", {"domain": ["Travel", "Train"], "category": "Travel, Train"}))
  ['Train', 'Travel']
  >>> sorted(categories_of("x", {"field": "Science/Physics", "category": "Science/Physics"}))
  ['Science']
  >>> sorted(categories_of("category_name:Food, tool_name:T, api_name:A", {}))
  ['Food']
  """
  meta = metadata or {}
  if meta.get("domain"):
    return frozenset(str(d).strip() for d in meta["domain"] if str(d).strip())
  for key, cut in (("field", "/"), ("category", None)):
    value = str(meta.get(key) or "").strip()
    if value:
      return frozenset({value.split(cut)[0].strip() if cut else value})
  found = _TOOLLENS_CATEGORY.match(text)
  return frozenset({found.group(1).strip()}) if found and found.group(1).strip() else frozenset()


def query_category(query: Query, held: set[str], cats: Mapping[str, frozenset[str]]) -> str:
  """A held-out-category query's category: the first (sorted) category of its held-out tools."""
  return min(c for t in query.gold if t in held for c in cats[t])


def library_categories(library: ToolLibrary) -> dict[str, frozenset[str]]:
  """Each tool's :func:`categories_of`."""
  return {t: categories_of(text, meta)
          for t, text, meta in zip(library.ids, library.texts, library.metadata)}


@dataclasses.dataclass(frozen=True)
class HeldOut:
  """A split with held-out tools: train (over ``library`` minus ``tools``), test, adapt."""
  train: tuple[Query, ...]
  test: tuple[Query, ...]
  tools: tuple[str, ...]
  adapt: tuple[Query, ...] = ()
  categories: tuple[str, ...] = ()


def _permuted(items: Sequence, seed: int) -> list:
  items = sorted(items)
  return [items[i] for i in np.random.default_rng(seed).permutation(len(items))]


def _split_by_tools(queries: Sequence[Query], held: set[str]) -> tuple[tuple[Query, ...], ...]:
  test = tuple(q for q in queries if held & set(q.gold))
  train = tuple(q for q in queries if not held & set(q.gold))
  return train, test


def hold_out_tools(queries: Sequence[Query], fraction: float, seed: int) -> HeldOut:
  """UT: ``fraction`` of the gold-named tools (at least one), in a seeded order."""
  named = {t for q in queries for t in q.gold}
  n = max(1, round(fraction * len(named)))
  held = set(_permuted(named, seed)[:n])
  train, test = _split_by_tools(queries, held)
  return HeldOut(train, test, tuple(sorted(held)))


def hold_out_categories(queries: Sequence[Query], library: ToolLibrary, n_categories: int,
                        seed: int, adapt_fraction: float) -> HeldOut:
  """UC: ``n_categories`` categories drawn in a seeded order among those some gold set needs;
  their tools (every category held out) leave training; per category, ``adapt_fraction`` of the
  queries that need them (seeded, at least one) form the adaptation pool, the rest the test."""
  cats = library_categories(library)
  named = {t for q in queries for t in q.gold}
  candidates = {c for t in named for c in cats[t]}
  if n_categories > len(candidates):
    raise UserError(f"--categories {n_categories}: the gold sets need tools of only "
                    f"{len(candidates)} categories")
  chosen = set(_permuted(candidates, seed)[:n_categories])
  held = {t for t in named if cats[t] and cats[t] <= chosen}
  if not held:
    raise UserError(f"categories {sorted(chosen)} hold no tool whose every category is held out")
  train, needing = _split_by_tools(queries, held)
  by_category: dict[str, list[Query]] = collections.defaultdict(list)
  for q in needing:
    by_category[query_category(q, held, cats)].append(q)
  rng = np.random.default_rng(seed + 1)
  adapt: list[Query] = []
  for category in sorted(by_category):
    qs = by_category[category]
    n = min(len(qs) - 1, max(1, round(adapt_fraction * len(qs))))
    adapt += [qs[i] for i in rng.permutation(len(qs))[:n]]
  ids = {q.id for q in adapt}
  test = tuple(q for q in needing if q.id not in ids)
  return HeldOut(train, test, tuple(sorted(held)), tuple(adapt), tuple(sorted(chosen)))


@dataclasses.dataclass(frozen=True)
class HeldOutPairs:
  train: tuple[Query, ...]
  validation: tuple[Query, ...]
  test: tuple[Query, ...]
  pairs: tuple[tuple[str, str], ...]
  validation_pairs: tuple[tuple[str, str], ...]


def hold_out_pairs(queries: Sequence[Query], n_pairs: int, n_validation: int,
                   seed: int) -> HeldOutPairs:
  """Unseen pairs: co-occurring tool pairs drawn in a seeded order; a pair is held out (every
  gold set holding it leaves training) when each tool of those sets stays in a training set."""
  by_set: dict[tuple[str, ...], list[Query]] = collections.defaultdict(list)
  for q in queries:
    by_set[tuple(sorted(q.gold))].append(q)
  training = set(by_set)
  covering = collections.Counter(t for s in training for t in s)
  phases: list[list[tuple[str, str]]] = [[], []]
  removed: list[set[tuple[str, ...]]] = [set(), set()]
  pairs = {p for s in by_set for p in itertools.combinations(s, 2)}
  for pair in _permuted(pairs, seed):
    phase = 0 if len(phases[0]) < n_pairs else 1
    if phase == 1 and len(phases[1]) == n_validation:
      break
    leaving = {s for s in training if pair[0] in s and pair[1] in s}
    lost = collections.Counter(t for s in leaving for t in s)
    if not leaving or any(covering[t] - k < 1 for t, k in lost.items()):
      continue
    training -= leaving
    covering.subtract(lost)
    phases[phase].append(pair)
    removed[phase] |= leaving
  if len(phases[0]) < n_pairs or len(phases[1]) < n_validation:
    raise UserError(f"only {len(phases[0]) + len(phases[1])} of {len(pairs)} co-occurring pairs "
                    f"can be held out with every tool still in a training set; asked for "
                    f"--pairs {n_pairs} + --validation-pairs {n_validation}")
  key = lambda q: tuple(sorted(q.gold))
  pick = lambda sets: tuple(q for q in queries if key(q) in sets)
  return HeldOutPairs(pick(training), pick(removed[1]), pick(removed[0]), tuple(phases[0]),
                      tuple(phases[1]))


def library_without(library: ToolLibrary, held: Iterable[str]) -> ToolLibrary:
  """``library`` less the tools ``held``, in its order."""
  held = set(held)
  keep = [i for i, t in enumerate(library.ids) if t not in held]
  return ToolLibrary(tuple(library.ids[i] for i in keep), tuple(library.texts[i] for i in keep),
                     tuple(library.metadata[i] for i in keep))


def _write(root: pathlib.Path, library: ToolLibrary, splits: Mapping[str, Sequence[Query]]
           ) -> None:
  root.mkdir(parents=True, exist_ok=True)
  unseen_split.write_beir(root, Dataset("split", library, {}), splits)


def _read(root: pathlib.Path) -> Dataset:
  from hyset_jax.data.specs import load_dataset
  return load_dataset(f"beir:{root}")


def check_held_out_tools(out: pathlib.Path, held: Sequence[str]) -> dict[str, int]:
  """Reads DIR/train and DIR/test back: no held-out tool in the training library or a training
  gold set; every test (and adapt) query needs one; returns the counts."""
  train, test = _read(out / "train"), _read(out / "test")
  held = set(held)
  leaked = held & set(train.tools.ids)
  in_gold = [q.id for q in train.split("train") if held & set(q.gold)]
  needless = [q.id for name in test.splits for q in test.split(name) if not held & set(q.gold)]
  if leaked or in_gold or needless:
    raise RuntimeError(f"split {out} is broken: {len(leaked)} held-out tools in the training "
                       f"library, {len(in_gold)} training queries need one, {len(needless)} test "
                       f"queries need none")
  return {"train": len(train.split("train")), "test": len(test.split("test")),
          "adapt": len(test.splits.get("adapt", ())), "train_tools": len(train.tools.ids),
          "test_tools": len(test.tools.ids), "held_out_tools": len(held)}


def check_pairs(out: pathlib.Path, pairs: Sequence[tuple[str, str]]) -> dict[str, int]:
  """Reads DIR back: no training gold set holds a held-out pair, every held-out query holds one
  and needs only tools that training sets name."""
  data = _read(out)
  train = data.split("train")
  train_tools = {t for q in train for t in q.gold}
  together = lambda q, p: p[0] in q.gold and p[1] in q.gold
  seen = [q.id for q in train if any(together(q, p) for p in pairs)]
  held = [q for name in ("validation", "test") for q in data.splits.get(name, ())]
  unknown = sorted({t for q in held for t in q.gold} - train_tools)
  if seen or unknown:
    raise RuntimeError(f"split {out} is broken: {len(seen)} training queries hold a held-out "
                       f"pair, {len(unknown)} held-out tools are in no training set")
  return {name: len(data.splits.get(name, ())) for name in ("train", "validation", "test")}


def _build(args: argparse.Namespace, dataset: Dataset, queries: list[Query], tmp: pathlib.Path
           ) -> dict:
  """Writes the split's folders under ``tmp``; returns split.json's kind-specific part."""
  lib = dataset.tools
  if args.kind == "pairs":
    split = hold_out_pairs(queries, args.pairs, args.validation_pairs, args.seed)
    _write(tmp, lib, {"train": split.train, "validation": split.validation, "test": split.test})
    return {"pairs": [list(p) for p in split.pairs],
            "validation_pairs": [list(p) for p in split.validation_pairs],
            "counts": check_pairs(tmp, split.pairs),
            "checks": "no training gold set holds both tools of a held-out pair; every tool of a "
                      "held-out query occurs in a training set"}
  if args.kind == "tools":
    split = hold_out_tools(queries, args.fraction, args.seed)
  else:
    split = hold_out_categories(queries, lib, args.categories, args.seed, args.adapt_fraction)
  _write(tmp / "train", library_without(lib, split.tools), {"train": split.train})
  _write(tmp / "test", lib, {"test": split.test, **({"adapt": split.adapt} if split.adapt
                                                      else {})})
  return {"held_out_tools": list(split.tools), "held_out_categories": list(split.categories),
          "adapt_fraction": args.adapt_fraction if args.kind == "categories" else None,
          "counts": check_held_out_tools(tmp, split.tools),
          "checks": "the training library and training gold sets hold no held-out tool; every "
                    "test query needs one"}


def run(args: argparse.Namespace) -> int:
  from hyset_jax import io_utils
  from hyset_jax.data.specs import load_dataset
  checks = {"fraction": 0 < args.fraction < 1, "categories": args.categories >= 1,
            "adapt_fraction": 0 < args.adapt_fraction < 1, "pairs": args.pairs >= 1,
            "validation_pairs": args.validation_pairs >= 0}
  for name, ok in checks.items():
    if not ok:
      raise UserError(f"--{name.replace('_', '-')} is out of range: "
                      f"{getattr(args, name)} (fractions in (0, 1), counts >= 1)")
  out = pathlib.Path(args.out)
  if out.exists() and not out.is_dir():
    raise UserError(f"--out {out} is a file; this script writes a directory")
  io_utils.check_target(out, args.force)  # before reading anything
  dataset = load_dataset(args.data)
  queries = unseen_split.pooled_queries(dataset)
  with io_utils.atomic_dir(out, args.force) as tmp:
    manifest = {"kind": args.kind, "source": args.data, "seed": args.seed,
                "pooled_queries": len(queries), **_build(args, dataset, queries, tmp)}
    (tmp / "split.json").write_text(json.dumps(manifest, indent=1) + "\n")
  counts = manifest["counts"]
  print(f"{args.data}: {args.kind} split, seed {args.seed}, pooled {len(queries)} queries: "
        + ", ".join(f"{k} {v}" for k, v in counts.items()))
  print(f"checked: {manifest['checks']}")
  if args.kind == "pairs":
    print(f"wrote {out} (read it as beir:{out})")
  else:
    print(f"wrote {out}/train and {out}/test (train on beir:{out}/train, score the model on "
          f"beir:{out}/test: hyset eval --model M --data beir:{out}/test --split test)")
  return 0


def main(argv: list[str] | None = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  kind = argparse.ArgumentParser(add_help=False)
  kind.add_argument("--kind")
  known, rest = kind.parse_known_args(argv)
  if known.kind == "sets":  # one entry point; unseen_split.py owns that split
    return unseen_split.main(rest)
  from hyset_jax import cli
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--kind", required=True, choices=KINDS, help="which setting")
  parser.add_argument("--data", required=True, metavar="SPEC", help="source data set (data spec)")
  parser.add_argument("--seed", type=int, default=0, help="draw order of what is held out")
  parser.add_argument("--fraction", type=float, default=DEFAULT_FRACTION,
                      help=f"tools: share of the gold-named tools held out "
                           f"(default {DEFAULT_FRACTION})")
  parser.add_argument("--categories", type=int, default=DEFAULT_CATEGORIES,
                      help=f"categories: how many to hold out (default {DEFAULT_CATEGORIES})")
  parser.add_argument("--adapt-fraction", type=float, default=DEFAULT_ADAPT_FRACTION,
                      help=f"categories: share of each held-out category's queries in the adapt "
                           f"split (k-shot and full supervision); the rest is the test "
                           f"(default {DEFAULT_ADAPT_FRACTION})")
  parser.add_argument("--pairs", type=int, default=DEFAULT_PAIRS,
                      help=f"pairs: held-out pairs for test (default {DEFAULT_PAIRS})")
  parser.add_argument("--validation-pairs", type=int, default=DEFAULT_VALIDATION_PAIRS,
                      help=f"pairs: further held-out pairs for validation "
                           f"(default {DEFAULT_VALIDATION_PAIRS})")
  parser.add_argument("--out", required=True, metavar="DIR", help="directory to write")
  parser.add_argument("--force", action="store_true", help="replace an existing --out")
  parser.set_defaults(func=run)
  return cli.run(parser, argv)


if __name__ == "__main__":
  sys.exit(main())
