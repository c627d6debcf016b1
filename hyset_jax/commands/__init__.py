"""Sub-commands of the ``hyset`` console script, one module each (see :mod:`hyset_jax.cli`)."""
import argparse


def add_config_args(p: argparse.ArgumentParser) -> None:
  """``--config``, ``--data`` and ``--set``: the config a command runs, as ``hyset train``
  takes it (resolved by :func:`hyset_jax.config.resolve`)."""
  from hyset_jax.config import presets  # light: no JAX
  p.add_argument("--config", required=True, metavar="NAME|FILE.py",
                 help=f"a preset ({', '.join(presets())}) or a .py file defining get_config()")
  p.add_argument("--data", metavar="SPEC", help="data spec; shorthand for --set data.spec=SPEC")
  p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                 help="override a config field, e.g. --set train.batch_size=64 or "
                      "--set model.encoder=DIR (repeatable)")


def int_at_least(minimum: int):
  """An argparse ``type`` accepting integers ≥ ``minimum``, with a message that says so.

  >>> int_at_least(1)("3")
  3
  """
  def parse(text: str) -> int:
    try:
      value = int(text)
    except ValueError:
      raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < minimum:
      raise argparse.ArgumentTypeError(f"expected an integer ≥ {minimum}, got {value}")
    return value
  return parse


def float_in_open_unit(text: str) -> float:
  """An argparse ``type`` accepting a fraction strictly between 0 and 1.

  >>> float_in_open_unit("0.1")
  0.1
  """
  try:
    value = float(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}") from None
  if not 0.0 < value < 1.0:
    raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {value}")
  return value
