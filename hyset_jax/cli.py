"""The ``hyset`` console script: a thin dispatcher over ``hyset_jax.commands``.

Each sub-command lives in its own module under :mod:`hyset_jax.commands` and
exposes ``add_parser(subparsers)``, which registers its flags and sets
``func(args) -> int``. Modules are imported lazily so ``hyset --help`` stays fast.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from hyset_jax.errors import UserError

# Sub-command name -> module under hyset_jax.commands.
COMMANDS = ("predict", "encode", "data", "eval", "train", "export", "bench", "serve", "tools")


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="hyset", description="Set-level tool retrieval (HYSET) in JAX.")
  sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
  for name in COMMANDS:
    importlib.import_module(f"hyset_jax.commands.{name}").add_parser(sub)
  return parser


def main(argv: list[str] | None = None) -> int:
  return run(build_parser(), argv)


def run(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> int:
  """Parse, dispatch to ``args.func``, and turn :class:`UserError` into exit code 2.

  Shared by the ``hyset`` and ``toolscout`` console scripts.
  """
  args = parser.parse_args(argv)
  try:
    return int(args.func(args) or 0)
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  except KeyboardInterrupt:
    print("interrupted", file=sys.stderr)
    return 130


if __name__ == "__main__":
  sys.exit(main())
