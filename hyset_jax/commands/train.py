"""``hyset train``: train HYSET on a data set; resumes automatically from the workdir.

``--dry-run`` compiles the train step ahead of time for the configured mesh and prints what each
device would hold (parameters, optimiser state, temporaries) and the FLOPs of one step, without
encoding, training or writing anything (docs/sharding.md).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib

from hyset_jax.commands import add_config_args
from hyset_jax.errors import UserError


def add_parser(sub: argparse._SubParsersAction) -> None:
  p = sub.add_parser("train", help="train HYSET (resumes from --workdir)", description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
  add_config_args(p)
  p.add_argument("--workdir", metavar="DIR",
                 help="where config.json, checkpoints/, best/, final/ and metrics.jsonl go; a "
                      "rerun on the same DIR resumes (required unless --dry-run)")
  p.add_argument("--no-progress", action="store_true",
                 help="no progress bar (log lines only), e.g. for batch jobs")
  p.add_argument("--dry-run", action="store_true",
                 help="compile the train step for the configured mesh, print per-device memory "
                      "and FLOPs, and exit (0; 2 if it exceeds mesh.memory_per_device_gb)")
  p.add_argument("--devices", type=int, metavar="N",
                 help="with --dry-run: compile for N CPU devices instead of this machine's "
                      "(XLA's host-platform device count)")
  p.add_argument("--topology", metavar="tpu:NAME",
                 help="with --dry-run: compile for a TPU slice, e.g. tpu:v5e:4x4, from any "
                      "machine (needs the TPU runtime: pip install libtpu)")
  p.add_argument("--num-tools", type=int, metavar="N",
                 help="with --dry-run: size the library as N tools instead of reading the data "
                      "set (what-if sizing)")
  p.add_argument("--json", action="store_true", help="with --dry-run: print the report as JSON")
  p.set_defaults(func=run)


def _use_cpu_devices(n: int) -> None:
  """N fake CPU devices; only possible before JAX has started a backend."""
  import jax
  from jax._src import xla_bridge
  if xla_bridge.backends_are_initialized():
    raise UserError("--devices must be given before JAX has started (it is read at start-up)")
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  os.environ["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={n}"])
  jax.config.update("jax_platforms", "cpu")


def check_workdir(workdir: str | None) -> None:
  """Refuse a --workdir that is part of another run or a model directory (a likely slip)."""
  from hyset_jax.io.modeldir import enclosing_workdir
  if workdir is None:
    return
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
  if not args.dry_run:
    if args.workdir is None:
      raise UserError("hyset train needs --workdir (or --dry-run to only check the step)")
    if any(v is not None for v in (args.devices, args.topology, args.num_tools)) or args.json:
      raise UserError("--devices, --topology, --num-tools and --json go with --dry-run")
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
  for noisy in ("absl", "orbax", "jax"):  # Orbax logs every save at INFO
    logging.getLogger(noisy).setLevel(logging.WARNING)
  if args.dry_run:
    return _dry_run(config, args)
  from hyset_jax.training.train import train_and_evaluate
  summary = train_and_evaluate(config, args.workdir, progress=not args.no_progress)
  print(json.dumps(summary, indent=1))
  return 0


def _dry_run(config, args) -> int:
  if args.devices is not None and args.topology is not None:
    raise UserError("give --devices (CPU devices) or --topology (a TPU slice), not both")
  if args.devices is not None:
    if args.devices < 1:
      raise UserError(f"--devices must be ≥ 1, got {args.devices}")
    _use_cpu_devices(args.devices)
  if args.num_tools is not None and args.num_tools < config.model.k_pool:
    raise UserError(f"--num-tools must be ≥ model.k_pool = {config.model.k_pool}")
  from hyset_jax.training import dry_run
  num_tools = args.num_tools
  dims = {}
  if num_tools is not None:  # the encoder's width still comes from its files
    dims = dict(tool_dim=dry_run.encoder_dim(config.model.encoder))
    dims["query_dim"] = dims["tool_dim"]
  devices = dry_run.topology_devices(args.topology) if args.topology else None
  report = dry_run.dry_run(config, num_tools=num_tools, devices=devices, **dims)
  import jax
  if jax.process_index() == 0:  # every process of a multi-host job compiles the same step
    print(json.dumps(report.to_json(), indent=1) if args.json else "\n".join(report.lines()))
  dry_run.check_fits(report, config.mesh.memory_per_device_gb)
  budget = config.mesh.memory_per_device_gb
  if budget and not args.json and jax.process_index() == 0:
    print(f"fits mesh.memory_per_device_gb={budget:g}")
  return 0
