"""``hyset export``: a training workdir's best model as a ``hyset/1`` model directory."""
from __future__ import annotations

import argparse
import pathlib

from hyset_jax.errors import UserError


def add_parser(sub: argparse._SubParsersAction) -> None:
  p = sub.add_parser("export", help="export a trained model", description=__doc__)
  p.add_argument("--workdir", required=True, help="a `hyset train` workdir")
  p.add_argument("--out", required=True, help="output directory")
  p.add_argument("--format", choices=("hyset",), default="hyset")
  p.add_argument("--force", action="store_true", help="replace a non-empty --out")
  p.set_defaults(func=run)


def best_model_dir(workdir: str | pathlib.Path) -> pathlib.Path:
  """The hyset/1 directory of a workdir's best model, or the path itself if it is one."""
  path = pathlib.Path(workdir)
  if (path / "manifest.json").is_file():
    return path
  if (path / "best" / "manifest.json").is_file():
    return path / "best"
  raise UserError(f"{path} holds no trained model (no best/manifest.json); run "
                  f"`hyset train --workdir {path}` until its first evaluation")


def run(args: argparse.Namespace) -> int:
  from hyset_jax import modeldir
  model = modeldir.load_model_dir(best_model_dir(args.workdir))
  out = modeldir.save_model_dir(args.out, model, force=args.force)
  print(f"wrote {out} ({len(model.tool_ids)} tools, format {modeldir.FORMAT})")
  return 0
