"""``hyset import``: a model of another implementation as a model directory.

  hyset import --from hyset-pytorch CKPT --tools SPEC --out DIR [--force]

hyset-pytorch: CKPT is a checkpoint of the HYSET authors' PyTorch implementation (their
``HYSETModel.save``: a torch.save payload with format_version 2). It is read without torch,
and a file whose pickle names anything but tensors and plain containers is refused (nothing
in it is run). As their load does, Z's rows are renormalised and each interaction matrix
symmetrised, so that ``hyset predict`` scores what their scorer scores. SPEC is the tool
library (any data spec): its tool ids must be the checkpoint's func_names (or, for a ToolBench
library, their ToolBench function names ``api_for_tool``), all of them and no others; the
model directory keeps the library's ids in the checkpoint's row order. K1 and K_pool: the
flags, else the checkpoint's train_config, else the authors' defaults 15 and 20. The ranking
recorded is greedy, the authors' ranking. See docs/export.md.
"""
from __future__ import annotations

import argparse

from hyset_jax.commands import int_at_least

SOURCES = ("hyset-pytorch",)


def add_parser(sub: argparse._SubParsersAction) -> None:
  p = sub.add_parser("import", help="read another implementation's model into a model directory",
                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--from", dest="source", required=True, choices=SOURCES,
                 help="the implementation that wrote CKPT")
  p.add_argument("checkpoint", metavar="CKPT", help="the checkpoint file")
  p.add_argument("--tools", required=True, metavar="SPEC",
                 help="the tool library (data spec) whose ids the checkpoint's rows name")
  p.add_argument("--out", required=True, metavar="DIR", help="the new model directory")
  p.add_argument("--k1", type=int_at_least(1), metavar="N",
                 help="stage-1 size K1 (default: the checkpoint's train_config, else 15)")
  p.add_argument("--k-pool", type=int_at_least(2), metavar="N",
                 help="shortlist size K_pool (default: the checkpoint's train_config, else 20)")
  p.add_argument("--query-encoder", metavar="NAME",
                 help="the query encoder the manifest names (default none: bring query "
                      "embeddings, e.g. hyset predict --query-embeddings)")
  p.add_argument("--force", action="store_true",
                 help="replace a non-empty --out that holds an earlier model directory")
  p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  from hyset_jax.io import export
  from hyset_jax.data.specs import input_paths, load_dataset
  from hyset_jax.io.modeldir import ModelDir, save_model_dir
  from hyset_jax.io.peer import convert, torch_format

  out = export.check_out(args.out, args.force, "hyset",
                         inputs=(args.checkpoint, *input_paths(args.tools)),
                         what="model directory")
  authors = convert.from_payload(torch_format.read_checkpoint(args.checkpoint), args.checkpoint)
  library = load_dataset(args.tools).tools
  ids = convert.match_tools(authors.func_names, library.ids, args.checkpoint, args.tools)
  k1 = args.k1 or authors.k1 or convert.DEFAULT_K1
  k_pool = args.k_pool or authors.k_pool or convert.DEFAULT_K_POOL
  model = ModelDir(authors.params, ids, authors.max_set_size, k1, k_pool, args.query_encoder,
                   ranking="greedy")
  save_model_dir(out, model, force=args.force)
  print(f"wrote {out} from {args.checkpoint} ({len(ids)} tools, d_z = "
        f"{authors.params.tool_embeddings.shape[1]}, M = {authors.max_set_size}, K1 = {k1}, "
        f"K_pool = {k_pool}; Z renormalised and the interactions symmetrised as the authors' "
        f"load does)")
  return 0
