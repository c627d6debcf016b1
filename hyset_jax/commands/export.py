"""``hyset export``: a training workdir's best model for other stacks.

Formats (see :mod:`hyset_jax.io.export` and docs/export.md):

  hyset       the model directory (params.safetensors + manifest.json, which lists the model's
              terms; lexical.json with the lexical term)
  npz         model.npz: the same arrays, tool_ids and the manifest fields
  projector   TensorBoard Embedding Projector TSVs of the tool embeddings
  stablehlo   jax.export artifacts of stage 1, stage 2 and both, with signature.json
  onnx        stage1.onnx and stage2.onnx (fixed batch, --onnx-batch) with signature.json
  hyset-pytorch  best.pt: the HYSET authors' PyTorch checkpoint (format_version 2), written
              without torch; only a model of the paper's configuration (no query tower,
              conditioned set term, seen-set prior or lexical term; d_z = d_r)

--out is a directory; one that exists and is not empty is replaced only with --force, and
only if it holds an earlier export of the same format.
"""
from __future__ import annotations

import argparse

from hyset_jax.errors import UserError

# hyset_jax.io.export.FORMATS, not imported here: it would load JAX for ``hyset --help``.
FORMATS = ("hyset", "npz", "projector", "stablehlo", "onnx")
# Formats of other implementations, written by hyset_jax.io.peer (not hyset_jax.io.export).
PEER_FORMATS = ("hyset-pytorch",)


def add_parser(sub: argparse._SubParsersAction) -> None:
  p = sub.add_parser("export", help="export a trained model", description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--workdir", required=True, metavar="DIR",
                 help="a hyset train workdir (its best/ model) or a model directory")
  p.add_argument("--out", required=True, metavar="DIR", help="output directory")
  p.add_argument("--format", choices=FORMATS + PEER_FORMATS, default="hyset",
                 help="what to write (default hyset; see above)")
  p.add_argument("--data", metavar="SPEC",
                 help="projector: data spec for tool categories and names "
                      "(default: the workdir's config.json data.spec)")
  p.add_argument("--platforms", default="cpu,cuda,tpu",
                 help="stablehlo: comma-separated platforms to lower for (default cpu,cuda,tpu)")
  p.add_argument("--onnx-batch", type=int, default=1,
                 help="onnx: the fixed batch size of the exported models (default 1)")
  p.add_argument("--force", action="store_true",
                 help="replace a non-empty --out that holds an earlier export of this format")
  p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  from hyset_jax.io import export, modeldir
  from hyset_jax.io.peer import convert
  source = modeldir.best_model_dir(args.workdir)
  # Before loading or compiling anything.
  out = export.check_out(args.out, args.force, args.format, inputs=(source, args.workdir))
  model = modeldir.load_model_dir(source)
  if args.format == "hyset":
    modeldir.save_model_dir(out, model, force=args.force)
    what = f"format {modeldir.FORMAT}, terms: {', '.join(model.terms) or 'none'}"
  elif args.format == "npz":
    export.write_npz(out, model, force=args.force)
    what = f"{export.NPZ_FILE}"
  elif args.format == "projector":
    spec = modeldir.data_spec(source, args.data)
    labels, origin = export.tool_labels(model.tool_ids, spec)
    export.write_projector(out, model, labels, force=args.force)
    what = f"Embedding Projector TSVs; categories and names {origin}"
  elif args.format == "hyset-pytorch":
    convert.write_export(out, model, force=args.force, where=source)
    what = (f"the authors' PyTorch checkpoint {convert.CHECKPOINT_FILE} (format_version 2, "
            f"K1 = {model.k1} and K_pool = {model.k_pool} in its train_config)")
  elif args.format == "onnx":
    from hyset_jax.io.export_onnx import write_onnx
    write_onnx(out, model, batch=args.onnx_batch, force=args.force)
    what = f"ONNX stage 1 and stage 2 (jax2onnx), batch {args.onnx_batch}"
  else:
    platforms = tuple(p.strip() for p in args.platforms.split(",") if p.strip())
    if not platforms:
      raise UserError("--platforms names no platform; e.g. --platforms cpu,cuda,tpu")
    export.write_stablehlo(out, model, force=args.force, platforms=platforms)
    what = f"StableHLO (jax.export) for {', '.join(platforms)}, symbolic batch dimension"
  print(f"wrote {out} from {source} ({len(model.tool_ids)} tools; {what})")
  return 0
