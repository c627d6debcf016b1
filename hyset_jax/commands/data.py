"""``hyset data``: prepare a data set as TFDS array_record, or print its statistics.

  hyset data prepare SPEC --out DIR [--force] [--max-size N] [--validation-fraction F]
  hyset data stats SPEC [--json FILE [--force]] [--max-size N] [--validation-fraction F]

SPEC is a data spec (``beir:PATH``, ``ultratool:PATH``, ``seal:PATH``, ``bfcl[:PATH]``, …,
``tfds:DIR``; every scheme: :data:`hyset_jax.data.specs.SCHEMES`).
"""
from __future__ import annotations

import argparse
import json
import os

from hyset_jax.commands import float_in_open_unit, int_at_least


def add_parser(subparsers: argparse._SubParsersAction) -> None:
  """Registers ``data`` and its actions ``prepare`` and ``stats``."""
  parser = subparsers.add_parser(
      "data", help="prepare data sets (TFDS) and print their statistics",
      description="Prepare a data set as a TFDS array_record data set, or print its "
                  "statistics. SPEC: beir:PATH, toolbench:PATH, bfcl[:PATH] or tfds:DIR.")
  actions = parser.add_subparsers(dest="data_command", required=True, metavar="ACTION")

  prepare = actions.add_parser(
      "prepare", help="write SPEC as a TFDS data set readable with tfds.data_source",
      description="Write SPEC under DIR as the TFDS builder hyset_data (configs queries "
                  "and tools, array_record). Read it with tfds.data_source("
                  "'hyset_data/queries', data_dir=DIR) or the data spec tfds:DIR.")
  prepare.add_argument("spec", metavar="SPEC", help="data spec")
  prepare.add_argument("--out", required=True, metavar="DIR", help="output folder")
  prepare.add_argument("--force", action="store_true",
                       help="replace the prepared data of an earlier run in DIR (only "
                            "DIR/hyset_data is replaced)")
  _common(prepare)
  prepare.set_defaults(func=run_prepare)

  stats = actions.add_parser(
      "stats", help="print tools, queries per split, set sizes, unused and missing tools",
      description="Print the statistics of SPEC.")
  stats.add_argument("spec", metavar="SPEC", help="data spec")
  stats.add_argument("--json", metavar="FILE", help="also write the statistics as JSON")
  stats.add_argument("--force", action="store_true", help="overwrite the --json FILE if it exists")
  _common(stats)
  stats.set_defaults(func=run_stats)


def _common(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--max-size", type=int_at_least(1), default=None, metavar="N",
                      help="fail if any gold set has more than N tools")
  parser.add_argument("--validation-fraction", type=float_in_open_unit, default=None, metavar="F",
                      help="carve a validation split of fraction F out of train (by "
                           "query-id hash) when the data set has none")


def _load(args: argparse.Namespace):
  from hyset_jax.data import splits
  from hyset_jax.data.specs import load_dataset
  dataset = load_dataset(args.spec, max_set_size=args.max_size, size_knob="--max-size")
  if args.validation_fraction is not None:
    dataset = splits.with_validation(dataset, args.validation_fraction)
  return dataset


def run_prepare(args: argparse.Namespace) -> int:
  from hyset_jax.data import specs, tfds_builder
  out = os.path.abspath(os.path.expanduser(args.out))
  # Refuse before reading the data: the check is cheap, the reading is not.
  tfds_builder.check_output(out, args.force, inputs=specs.input_paths(args.spec))
  dataset = _load(args)
  builder_dir = tfds_builder.prepare(dataset, out, spec=args.spec, force=args.force)
  counts = ", ".join(f"{s} {len(q)}" for s, q in dataset.splits.items())
  print(f"wrote {builder_dir}: {len(dataset.tools)} tools; queries: {counts}")
  print(f"read with tfds.data_source('{tfds_builder.BUILDER_NAME}/{tfds_builder.QUERIES}', "
        f"data_dir={out!r}) or the data spec tfds:{out}")
  return 0


def run_stats(args: argparse.Namespace) -> int:
  from hyset_jax import io_utils
  from hyset_jax.data import specs
  from hyset_jax.data.stats import compute_stats, format_stats
  if args.json:
    io_utils.output_file(args.json, args.force, inputs=specs.input_paths(args.spec),
                         flag="--json")
  stats = compute_stats(_load(args))
  stats["spec"] = args.spec
  print(format_stats(stats))
  if args.json:
    with io_utils.atomic_write(args.json) as f:
      json.dump(stats, f, indent=2, ensure_ascii=False)
      f.write("\n")
  return 0
