"""The ``hyset`` console script: a thin dispatcher over ``hyset_jax.commands``.

Each sub-command lives in its own module under :mod:`hyset_jax.commands` and
exposes ``add_parser(subparsers)``, which registers its flags and sets
``func(args) -> int``. Modules are imported lazily so ``hyset --help`` stays fast.
"""
from __future__ import annotations

import argparse
import importlib
import re
import sys

from hyset_jax.errors import UserError

# Sub-command name -> module under hyset_jax.commands.
COMMANDS = ("predict", "encode", "data", "eval", "compare", "train", "finetune", "export", "bench",
            "serve", "tools", "import_")  # import_: `hyset import` (import is a keyword)


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="hyset", description="Set-level tool retrieval (HYSET) in JAX.")
  sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
  for name in COMMANDS:
    importlib.import_module(f"hyset_jax.commands.{name}").add_parser(sub)
  return parser


def main(argv: list[str] | None = None) -> int:
  """The ``hyset`` program (``argv`` None: the command line, after asking for huge pages,
  :mod:`hyset_jax.allocator`), or one call with ``argv`` in this process (tests, benchmarks)."""
  if argv is None:
    from hyset_jax import allocator
    allocator.reexec()
  return run(build_parser(), argv)


def plain(text: str) -> str:
  """reST markup of module docstrings (``x``, :mod:`x`) and help strings (`x`) as plain text.

  >>> plain("see :mod:`hyset_jax.io.export` and ``--out``")
  'see hyset_jax.io.export and --out'
  """
  return re.sub(r":(?:mod|func|class|data|meth|attr|exc):", "", text).replace("`", "")


class _Help:
  """Help text rules for every parser: each option shows its default, and reST markup from
  module docstrings or help strings is shown as plain text (:func:`plain`)."""

  def _get_help_string(self, action: argparse.Action) -> str:
    text = plain(action.help or "")
    shown = action.default not in (None, False, argparse.SUPPRESS) and action.option_strings
    if shown and "default" not in text and not isinstance(action.default, list):
      text += " (default: %(default)s)"
    return text

  def _fill_text(self, text: str, width: int, indent: str) -> str:
    return super()._fill_text(plain(text), width, indent)


class HelpFormatter(_Help, argparse.HelpFormatter):
  """The default layout (wrapped descriptions)."""


class RawHelpFormatter(_Help, argparse.RawDescriptionHelpFormatter):
  """For descriptions laid out by hand (usage blocks, tables)."""


def subparsers_of(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
  """``parser`` and every sub-command parser below it, depth first."""
  found = [parser]
  for action in parser._actions:
    if isinstance(action, argparse._SubParsersAction):
      for sub in dict.fromkeys(action.choices.values()):  # aliases map to the same parser
        found.extend(subparsers_of(sub))
  return found


def apply_help_rules(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
  """Give ``parser`` and all its sub-command parsers :class:`HelpFormatter` (or
  :class:`RawHelpFormatter` where they asked for a raw description)."""
  for p in subparsers_of(parser):
    raw = issubclass(p.formatter_class, argparse.RawDescriptionHelpFormatter)
    p.formatter_class = RawHelpFormatter if raw else HelpFormatter
  return parser


def run(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> int:
  """Parse, dispatch to ``args.func``, and turn :class:`UserError` into exit code 2.

  Shared by the ``hyset`` and ``toolscout`` console scripts.
  """
  args = apply_help_rules(parser).parse_args(argv)
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
