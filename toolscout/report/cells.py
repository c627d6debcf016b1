"""Formatting report numbers into Markdown cells and tables (``None`` = not measured, a dash)."""
from __future__ import annotations


def pct(x: float | None) -> str:
  """A share as a percentage with one decimal.

  >>> pct(0.1234), pct(None)
  ('12.3%', '—')
  """
  return "—" if x is None else f"{100 * x:.1f}%"


def num(x: float | None, digits: int = 3) -> str:
  """A number with ``digits`` decimals.

  >>> num(0.12345), num(-0.5, 2), num(None)
  ('0.123', '-0.50', '—')
  """
  return "—" if x is None else f"{x:.{digits}f}"


def table(header: list[str], rows: list[list[str]]) -> str:
  """A Markdown table, newline-terminated.

  >>> print(table(["a", "b"], [["1", "2"]]), end="")
  | a | b |
  |---|---|
  | 1 | 2 |
  """
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(r) + " |" for r in rows]
  return "\n".join(lines) + "\n"
