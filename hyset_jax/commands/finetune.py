"""``hyset finetune``: fine-tune the query encoder; θ is then trained over it.

Objective ``labels`` (the default): the encoder trains under a per-tool softmax head and a
softmax over the training gold sets (``--set-weight 0``: tool head only), the heads are thrown
away and the encoder is written to OUT/encoder as a sentence-transformers directory; then

  hyset train --config NAME --set model.encoder=OUT/encoder --workdir DIR

trains HYSET over its embeddings (queries and tools), and ``hyset predict`` on DIR/best embeds
with it. One validation pass per epoch; the encoder with the lowest validation loss is kept.

Objective ``joint``: θ and the encoder train together under HYSET's objective
(``--init-model`` starts θ from a trained model directory); OUT/model is then the model to
predict with. See docs/encoder_finetuning.md for the modes, costs and measurements.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math

from hyset_jax.commands import add_config_args
from hyset_jax.errors import UserError

OBJECTIVES = ("labels", "joint")


def add_parser(sub: argparse._SubParsersAction) -> None:
  p = sub.add_parser("finetune", help="fine-tune the query encoder (then hyset train over it)",
                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  add_config_args(p)
  p.add_argument("--out", required=True, metavar="DIR",
                 help="output directory: encoder/ (labels), model/ (joint), the metrics")
  p.add_argument("--objective", choices=OBJECTIVES, default="labels",
                 help="labels: tool and set heads, encoder only (default); joint: HYSET's "
                      "objective, θ and encoder together")
  p.add_argument("--mode", choices=("top_layers", "lora", "full"), default="top_layers",
                 help="what trains: the top --n-layers blocks over cached lower-block states "
                      "(default), LoRA adapters, or every weight")
  p.add_argument("--n-layers", type=int, default=2, metavar="N",
                 help="trainable top blocks for --mode top_layers (default 2)")
  p.add_argument("--lora-rank", type=int, default=8, metavar="R", help="LoRA rank (default 8)")
  p.add_argument("--encoder-lr", type=float, default=1e-4, metavar="LR",
                 help="the encoder's peak learning rate (default 1e-4)")
  # 3: on ToolLens the third epoch still lowered the validation loss (1.80 -> 1.57) and lifted
  # HYSET over the encoder (docs/results.md); the lowest-validation-loss epoch is kept, so an
  # encoder that starts to memorise earlier (the unseen-set split: epoch 1) is not the one
  # exported.
  p.add_argument("--epochs", type=float, default=3.0, metavar="E",
                 help="passes over the training queries (default 3; the epoch with the lowest "
                      "validation loss is kept); --steps overrides")
  p.add_argument("--steps", type=int, metavar="N", help="update steps instead of --epochs")
  p.add_argument("--batch-size", type=int, default=64, metavar="B",
                 help="queries per step (default 64)")
  p.add_argument("--set-weight", type=float, default=1.0, metavar="W",
                 help="labels: weight of the set head (default 1; 0 = tool head only)")
  p.add_argument("--temperature", type=float, default=0.05, metavar="T",
                 help="labels: the heads' softmax temperature (default 0.05)")
  p.add_argument("--init-model", metavar="DIR",
                 help="joint: start θ from this model directory (e.g. a run's best/)")
  p.add_argument("--force", action="store_true",
                 help="replace an earlier output of this command in --out")
  p.add_argument("--no-progress", action="store_true", help="log lines only, no progress bar")
  p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
  for noisy in ("absl", "orbax", "jax"):
    logging.getLogger(noisy).setLevel(logging.WARNING)
  from hyset_jax import config as config_lib
  from hyset_jax.training import finetune, label_tuning
  from hyset_jax.data.specs import input_paths
  from hyset_jax.io_utils import output_dir
  from hyset_jax.training.train_data import prepare_data

  if args.init_model is not None and args.objective != "joint":
    raise UserError("--init-model starts θ, which only --objective joint trains")
  if args.steps is not None and args.steps < 1:
    raise UserError(f"--steps must be ≥ 1, got {args.steps}")
  if not args.epochs > 0 or args.batch_size < 1:
    raise UserError("--epochs must be > 0 and --batch-size ≥ 1")
  overrides = list(args.overrides) + ([f"data.spec={args.data}"] if args.data else [])
  config = config_lib.resolve(args.config, overrides)
  tune = finetune.EncoderTuneConfig(
      mode=args.mode, n_layers=args.n_layers, lora_rank=args.lora_rank,
      learning_rate=args.encoder_lr, temperature=args.temperature, set_weight=args.set_weight)
  config_lib.validate(config)
  # The data set's files, the starting encoder and θ's model are inputs: never under --out.
  inputs = (*input_paths(config.data.spec), config.model.encoder or None, args.init_model)
  if args.objective == "labels":
    label_tuning.validate(tune, config)
    output_dir(args.out, args.force, marker=label_tuning.MARKER, inputs=inputs,
               what="label-tuning output")
  else:
    finetune.validate_tune(tune, config)
    output_dir(args.out, args.force, marker="metrics.json", inputs=inputs,
               what="fine-tuning output")
  data = prepare_data(config)
  n_train = len(data.splits[config.data.train_split].ids)
  per_epoch = math.ceil(n_train / args.batch_size)
  steps = args.steps or max(1, math.ceil(args.epochs * per_epoch))
  config = dataclasses.replace(config, train=dataclasses.replace(
      config.train, num_steps=steps, batch_size=args.batch_size,
      eval_every=min(per_epoch, steps)))
  if args.objective == "labels":
    summary = label_tuning.tune_on_labels(config, tune, args.out, data=data, force=args.force,
                                          progress=not args.no_progress)
    best = next(e for e in summary["validation"] if e["step"] == summary["best_step"])
    print(json.dumps({"encoder": f"{args.out}/encoder", "best_step": summary["best_step"],
                      "validation": best, "timing": summary["timing"]}, indent=1))
    # θ overfits query vectors the encoder was tuned on: the noise and step budget chosen on
    # ToolLens' validation split (docs/results.md). Measured with the set head on only.
    noise = ("--set train.query_noise=0.6 --set train.num_steps=1500 " if tune.set_weight
             else "")
    print(f"next: hyset train --config {args.config} --set model.encoder={args.out}/encoder "
          f"{noise}--workdir DIR")
    return 0
  summary = finetune.finetune(config, tune, args.out, data=data, init_model=args.init_model,
                              force=args.force, progress=not args.no_progress)
  print(json.dumps({"model": f"{args.out}/model", "before": summary["before"],
                    "after": summary["after"], "timing": summary["timing"]}, indent=1))
  return 0
