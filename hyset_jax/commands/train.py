"""``hyset train``: train HYSET on a data set; resumes automatically from the workdir."""
from __future__ import annotations

import argparse
import json
import logging
import pathlib

from hyset_jax.errors import UserError


def add_parser(sub: argparse._SubParsersAction) -> None:
  p = sub.add_parser("train", help="train HYSET (resumes from --workdir)", description=__doc__)
  from hyset_jax.config import presets  # light: no JAX
  p.add_argument("--config", required=True, metavar="NAME|FILE.py",
                 help=f"a preset ({', '.join(presets())}) or a .py file defining get_config()")
  p.add_argument("--data", metavar="SPEC", help="data spec; shorthand for --set data.spec=SPEC")
  p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                 help="override a config field, e.g. --set train.batch_size=64 (repeatable)")
  p.add_argument("--workdir", required=True, metavar="DIR",
                 help="where config.json, checkpoints/, best/, final/ and metrics.jsonl go; "
                      "a rerun on the same DIR resumes")
  p.add_argument("--no-progress", action="store_true",
                 help="no progress bar (log lines only), e.g. for batch jobs")
  p.set_defaults(func=run)


def check_workdir(workdir: str) -> None:
  """Refuse a --workdir that is part of another run or a model directory (a likely slip)."""
  from hyset_jax.commands.export import enclosing_workdir
  path = pathlib.Path(workdir)
  if path.exists() and not path.is_dir():
    raise UserError(f"--workdir {path} is a file; expected a directory")
  outer = enclosing_workdir(path)
  if outer is not None:
    raise UserError(f"--workdir {path} is inside the training workdir {outer}; to resume that "
                    f"run pass --workdir {outer}, for a new run choose a folder outside it")
  if (path / "manifest.json").is_file() and not (path / "config.json").is_file():
    raise UserError(f"--workdir {path} is a model directory (it has manifest.json), not a "
                    f"training workdir; choose a new folder")


def run(args: argparse.Namespace) -> int:
  from hyset_jax import config as config_lib
  overrides = list(args.overrides) + ([f"data.spec={args.data}"] if args.data else [])
  check_workdir(args.workdir)
  config = config_lib.resolve(args.config, overrides)  # fails before any device work
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
  for noisy in ("absl", "orbax", "jax"):  # Orbax logs every save at INFO
    logging.getLogger(noisy).setLevel(logging.WARNING)
  from hyset_jax.train import train_and_evaluate
  summary = train_and_evaluate(config, args.workdir, progress=not args.no_progress)
  print(json.dumps(summary, indent=1))
  return 0
