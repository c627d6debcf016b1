"""A short joint fine-tune of θ and the query encoder, before vs after, and what a GPU run needs.

  python -m benchmarks.finetune_encoder --mode top_layers --n-layers 2 --steps 200 --out DIR
  python -m benchmarks.finetune_encoder --mode frozen --steps 200 --out DIR   # the control

Runs :func:`hyset_jax.training.finetune.finetune` on a config (default the ``toollens`` preset, official
split) and writes into DIR what it writes (encoder/, model/, metrics.json) plus:

- ``report.json`` / ``report.md``: validation and test metrics before (step 0 = the frozen
  dense start) and after, the wall time per step, and the step-cost micro-benchmark;
- the micro-benchmark (``--timing-repeats``, 0 skips it): one encoder update (forward,
  backward, AdamW) on the same batch of training queries for (a) the top n blocks over the
  cached lower-block states, (b) the same trainable blocks run from the token ids (no cache),
  (c) the whole encoder. Ratios are within this run, on this machine;
- a GPU sizing estimate for the full data set: FLOPs and memory of one step, from the model
  shape and the measured token counts (an estimate, labelled as such).

Compare a mode against ``--mode frozen`` with the same ``--steps``/``--batch-size``/``--set``:
the difference is the effect of tuning the encoder, not of the extra θ steps.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import logging
import pathlib
import os
import platform
import sys
import time

import numpy as np

from benchmarks import provenance

KEYS = ("recall@3", "recall@5", "comp@3", "comp@5", "set_f1", "set_exact")


def _encoder_update_time(spec, frozen, trainable, batch, repeats: int) -> float:
  """Median seconds of one jitted encoder-only update (forward, backward, AdamW)."""
  import jax
  import optax

  from hyset_jax.encoder import tuning

  optimizer = optax.adamw(1e-5)
  target = np.random.default_rng(0).normal(size=(batch["attention_mask"].shape[0], 1))

  def step(trainable, opt_state, frozen, batch):
    def loss(p):
      return (tuning.forward(spec, frozen, p, batch) * target).sum()
    grads = jax.grad(loss)(trainable)
    updates, opt_state = optimizer.update(grads, opt_state, trainable)
    return optax.apply_updates(trainable, updates), opt_state

  step = jax.jit(step)
  opt_state = optimizer.init(trainable)
  trainable, opt_state = jax.block_until_ready(step(trainable, opt_state, frozen, batch))  # compile
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    trainable, opt_state = jax.block_until_ready(step(trainable, opt_state, frozen, batch))
    times.append(time.perf_counter() - t0)
  return float(np.median(times))


def step_cost_benchmark(encoder, texts: list[str], n_layers: int, repeats: int) -> dict:
  """Seconds per encoder update for cached top-n, uncached top-n and full, on one batch."""
  from hyset_jax.encoder import layer_cache, tuning

  table = layer_cache.tokenize_table(encoder, texts)
  rows = np.arange(len(texts))
  spec, frozen, top = tuning.split_encoder(encoder, "top_layers", n_layers=n_layers)
  cached = layer_cache.with_lower_states(table, encoder, texts, spec.start_layer, progress=False)
  result = {"batch_rows": len(texts), "padded_length": int(table.batch(rows)["attention_mask"]
                                                            .shape[1]),
            "n_layers": n_layers, "repeats": repeats}
  result["top_cached_s"] = _encoder_update_time(spec, frozen, top, cached.batch(rows), repeats)
  uncached = dataclasses.replace(spec, start_layer=0)
  result["top_uncached_s"] = _encoder_update_time(uncached, frozen, top, table.batch(rows),
                                                  repeats)
  fspec, ffrozen, full = tuning.split_encoder(encoder, "full")
  result["full_s"] = _encoder_update_time(fspec, ffrozen, full, table.batch(rows), repeats)
  lspec, lfrozen, lora = tuning.split_encoder(encoder, "lora")
  result["lora_s"] = _encoder_update_time(lspec, lfrozen, lora, table.batch(rows), repeats)
  result["speedup_cache_vs_uncached"] = round(result["top_uncached_s"] / result["top_cached_s"], 2)
  result["speedup_cache_vs_full"] = round(result["full_s"] / result["top_cached_s"], 2)
  return result


def gpu_estimate(bert_config, mode: str, n_layers: int, lora_rank: int, batch: int,
                 mean_tokens: float, train_queries: int, epochs: float) -> dict:
  """FLOPs and memory of a joint step on the full data, from the model shape (an estimate).

  Per token and block, a forward costs ≈ 2·(4H² + 2HF) + 4·S·H multiply-adds·2 (projections,
  feed-forward, attention scores and mix); backward ≈ 2× forward over the blocks that need
  gradients. Memory: weights (f32), AdamW state and gradients of the trainable part, and
  ≈ (12·H + 2·F + 2·heads·S) floats per token per block kept for backward.
  """
  h, f, heads = bert_config.hidden_size, bert_config.intermediate_size, \
      bert_config.num_attention_heads
  layers = bert_config.num_hidden_layers
  s = mean_tokens
  per_block_params = 4 * h * h + 2 * h * f + 9 * h + f
  total_params = layers * per_block_params + (bert_config.vocab_size
                                              + bert_config.max_position_embeddings + 2) * h
  if mode == "top_layers":
    grad_blocks, trainable = n_layers, n_layers * per_block_params
  elif mode == "lora":
    grad_blocks, trainable = layers, layers * 2 * 2 * h * lora_rank
  else:
    grad_blocks, trainable = layers, total_params
  run_blocks = n_layers if mode == "top_layers" else layers
  fwd_token_block = 2 * (4 * h * h + 2 * h * f) + 4 * s * h
  tokens = batch * s
  flops = tokens * fwd_token_block * (run_blocks + 2 * grad_blocks)
  act_bytes = tokens * grad_blocks * (12 * h + 2 * f + 2 * heads * s) * 4
  mem = 4 * total_params + 12 * trainable + act_bytes
  steps = int(round(epochs * train_queries / batch))
  return {"note": "estimate from the model shape, not measured", "batch": batch,
          "mean_padded_tokens": round(s, 1), "flops_per_step": float(f"{flops:.3g}"),
          "memory_gb": round(mem / 1e9, 2), "steps_for_epochs": steps, "epochs": epochs,
          "total_pflop": round(flops * steps / 1e15, 2),
          "trainable_params": int(trainable), "encoder_params": int(total_params)}


def _md_table(report: dict) -> str:
  lines = ["| split | when | " + " | ".join(KEYS) + " |", "|---|---|" + "---|" * len(KEYS)]
  for split in ("validation", "test"):
    for when in ("before", "after"):
      if split in report[when]:
        m = report[when][split]
        lines.append(f"| {split} | {when} | " + " | ".join(f"{100 * m[k]:.2f}" for k in KEYS)
                     + " |")
  return "\n".join(lines)


def _parse(argv: list[str] | None) -> argparse.Namespace:
  """The command line's arguments."""
  from hyset_jax.training.finetune import TUNE_MODES

  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--mode", choices=TUNE_MODES, required=True)
  parser.add_argument("--steps", type=int, required=True, help="training steps (θ and encoder)")
  parser.add_argument("--out", required=True, help="output directory")
  parser.add_argument("--config", default="toollens", help="preset (default toollens)")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="config override, e.g. data.max_train_queries=4000")
  parser.add_argument("--batch-size", type=int, default=64, help="queries per step (64)")
  parser.add_argument("--n-layers", type=int, default=2)
  parser.add_argument("--lora-rank", type=int, default=8)
  parser.add_argument("--encoder-lr", type=float, default=5e-5)
  parser.add_argument("--timing-repeats", type=int, default=5,
                      help="repeats of the step-cost micro-benchmark (0 skips it)")
  parser.add_argument("--epochs-estimate", type=float, default=24.0,
                      help="epochs the GPU estimate sizes (24 ≈ the toollens preset's θ run)")
  parser.add_argument("--init-model", help="start θ from this model directory (e.g. the best/ "
                      "of a hyset train run) instead of the dense start")
  parser.add_argument("--force", action="store_true", help="replace a non-empty --out")
  return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
  from hyset_jax import config as config_lib
  from hyset_jax.training.finetune import EncoderTuneConfig, finetune

  args = _parse(argv)
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

  config = config_lib.resolve(args.config, args.set + [f"train.num_steps={args.steps}",
                                                       f"train.batch_size={args.batch_size}"])
  tune = EncoderTuneConfig(mode=args.mode, n_layers=args.n_layers, lora_rank=args.lora_rank,
                           learning_rate=args.encoder_lr)
  from hyset_jax.training.train_data import prepare_data
  t0 = time.time()
  data = prepare_data(config)
  summary = finetune(config, tune, args.out, data=data, init_model=args.init_model,
                     force=args.force)
  report = dict(summary, wall_s=round(time.time() - t0, 1),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
                machine=f"{platform.machine()}, {os.cpu_count()} CPUs",
                command="python -m benchmarks.finetune_encoder " + " ".join(
                    sys.argv[1:] if argv is None else argv))
  report.update(_sizing(args, config, data))
  out = pathlib.Path(args.out)
  provenance.write_json(out / "report.json", report, report.get("command"))
  md = _markdown(args, summary, report)
  (out / "report.md").write_text("\n".join(md) + "\n")
  print("\n".join(md))
  return report


def _sizing(args: argparse.Namespace, config, data) -> dict:
  """The report's ``gpu_estimate`` (per batch size) and ``step_cost`` entries, each only
  where the arguments ask for it (none for mode frozen)."""
  from hyset_jax.encoder import layer_cache, load_encoder
  from hyset_jax.training.train_data import prepare_data
  report = {}
  encoder = load_encoder(config.model.encoder or None)
  train_texts = list(data.splits[config.data.train_split].texts)
  lengths = layer_cache.tokenize_table(encoder, train_texts[:2048]).lengths
  mean_padded = float(np.mean([next(b for b in encoder.buckets if b >= n) for n in lengths]))
  n_full = len(train_texts)
  if config.data.max_train_queries:  # size the estimate for the whole training split
    full = dataclasses.replace(config, data=dataclasses.replace(config.data, max_train_queries=0))
    n_full = len(prepare_data(full).splits[config.data.train_split].ids)
  if args.mode != "frozen":
    report["gpu_estimate"] = {
        str(batch): gpu_estimate(encoder.config, args.mode, args.n_layers, args.lora_rank, batch,
                                 mean_padded, n_full, args.epochs_estimate) for batch in (64, 256)}
  if args.timing_repeats and args.mode != "frozen":
    rng = np.random.default_rng(0)
    sample = [train_texts[i] for i in rng.choice(len(train_texts), args.batch_size,
                                                 replace=False)]
    report["step_cost"] = step_cost_benchmark(encoder, sample, args.n_layers, args.timing_repeats)
  return report


def _markdown(args: argparse.Namespace, summary: dict, report: dict) -> list[str]:
  """The lines of ``report.md``."""
  md = [f"# finetune_encoder: mode {args.mode}", "", f"`{report['command']}`, {report['date']}, "
        f"{report['machine']}; {summary['steps']} steps × {summary['batch_size']} queries "
        f"over {summary['train_queries']} training queries; encoder trainable parameters "
        f"{summary['encoder_trainable_params']:,}; θ from "
        f"{summary['init_model'] or 'the dense start'}.", "", _md_table(summary), "",
        f"Timing: cache {summary['timing']['cache_s']} s, "
        f"training {summary['timing']['train_s']} s, "
        f"median step {summary['timing']['median_step_s']} s; whole run {report['wall_s']} s."]
  if "step_cost" in report:
    c = report["step_cost"]
    md += ["", f"Encoder update on one batch ({c['batch_rows']} rows × {c['padded_length']} "
           f"tokens), median of {c['repeats']}: top-{c['n_layers']} cached "
           f"{c['top_cached_s']:.3f} s,"
           f" top-{c['n_layers']} uncached {c['top_uncached_s']:.3f} s, LoRA {c['lora_s']:.3f} s,"
           f" full {c['full_s']:.3f} s (cache speed-up {c['speedup_cache_vs_uncached']}× vs "
           f"uncached, {c['speedup_cache_vs_full']}× vs full)."]
  if "gpu_estimate" in report:
    md += ["", "GPU sizing (estimate from the model shape, not measured): " + "; ".join(
        f"batch {b}: {e['flops_per_step']:.3g} FLOP/step, ~{e['memory_gb']} GB, "
        f"{e['steps_for_epochs']} steps for {e['epochs']:g} epochs ({e['total_pflop']} PFLOP)"
        for b, e in report["gpu_estimate"].items())]
  return md


if __name__ == "__main__":
  main()
