"""``hyset tools add|remove``: change a trained model's tool library without retraining.

  hyset tools add    --model DIR --tools SPEC --out NEW_DIR
  hyset tools remove --model DIR (--tools SPEC | --ids ID,ID,...) --out NEW_DIR

``add`` encodes each new tool's text (the library's rendering, e.g. mcp:/openai: schemas)
with the model's frozen encoder; its z is that embedding normalised, as at initialisation;
the rest of θ is unchanged. ``remove`` drops the tools' rows. A model's lexical term is
rebuilt over the edited library's texts; its seen-set prior keeps the training sets whose tools
all remain. NEW_DIR is a new model
directory (an existing non-empty one is replaced only with --force); the source is never
modified, and nothing derived from the old library (cached neighbour tables) is copied.
"""
from __future__ import annotations

import argparse
import pathlib

from hyset_jax.errors import UserError


def add_parser(sub: argparse._SubParsersAction) -> None:
  p = sub.add_parser("tools", help="add or remove tools of a trained model",
                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
  add = actions.add_parser("add", help="add a library's tools to a model")
  add.add_argument("--tools", required=True, metavar="SPEC",
                   help="library of the new tools (any data spec: mcp:, openai:, beir:, ...)")
  remove = actions.add_parser("remove", help="remove tools from a model")
  which = remove.add_mutually_exclusive_group(required=True)
  which.add_argument("--tools", metavar="SPEC", help="remove every tool of this library")
  which.add_argument("--ids", help="comma-separated tool ids to remove")
  for a in (add, remove):
    a.add_argument("--model", required=True, help="model directory or `hyset train` workdir")
    a.add_argument("--out", required=True, help="the new model directory")
    a.add_argument("--force", action="store_true", help="replace a non-empty --out")
    a.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  from hyset_jax import io_utils
  from hyset_jax.io import modeldir, tooledit
  from hyset_jax.io.modeldir import best_model_dir
  from hyset_jax.data.specs import load_dataset

  source = best_model_dir(args.model)
  out = pathlib.Path(args.out)
  if out.resolve() == source.resolve() or out.resolve() in source.resolve().parents:
    raise UserError(f"--out {out} would replace the model being edited ({source}); choose "
                    f"another directory")
  io_utils.check_target(out, args.force)
  model = modeldir.load_model_dir(source)
  if args.action == "add":
    from hyset_jax.io.carry import tool_encoder
    tools = load_dataset(args.tools).tools
    encode = tool_encoder(model)  # the one path that embeds new tools (also hyset_jax.io.carry)
    if encode is None:
      raise UserError(f"{source}: the manifest names no encoder (query_encoder is null), so "
                      f"new tools cannot be embedded the way the model's were")
    edited = tooledit.add_tools(model, tools.ids, encode(tools.texts), tools.texts)
    what = f"added {len(tools)} tools from {args.tools}"
  else:
    if args.ids is not None:
      ids = [t.strip() for t in args.ids.split(",") if t.strip()]
      if not ids:
        raise UserError("--ids names no tool id")
    else:
      ids = list(load_dataset(args.tools).tools.ids)
    edited = tooledit.remove_tools(model, ids)
    what = f"removed {len(ids)} tools"
  modeldir.save_model_dir(out, edited, force=args.force)
  print(f"wrote {out}: {what}; {len(edited.tool_ids)} tools (was {len(model.tool_ids)})")
  return 0
