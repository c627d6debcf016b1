"""A 10⁶-tool library on 8 fake CPU devices: per-device memory for mesh.tools = 1, 2, 4, 8 from
compile-time memory analysis, and a few real training steps with Z sharded 8 ways.

    python -m benchmarks.sharded_scale [--tools 1000000] [--dim 256] [--steps 3] [--out benchmarks/results]

Writes ``sharded_scale.{json,md,png}`` to ``--out``. The memory table compiles the train step
from shapes only (hyset_jax.training.dry_run, as ``hyset train --dry-run`` does), so nothing of size N is
allocated for it. The training part builds the synthetic library of hyset_jax.testing (N unit
rows, queries near their gold tools), places Z on mesh (data=1, tools=8), and runs ``--steps``
steps of the real loop body (batches.make_batch with the per-shard top-k for hard negatives,
then the AOT-compiled step); it checks that each device holds 1/8 of Z and that the losses are
finite. Heavy (about 5 GB of host memory at the defaults): a benchmark, not a test.

The fake devices share this machine's cores and memory, so the step times say only that it
runs, not how fast a real 8-device host would be.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import sys
import time

from benchmarks import provenance


def _config(args):
  from hyset_jax import config as config_lib
  c = config_lib.Config(name="sharded-scale")
  c.model = config_lib.ModelConfig(max_set_size=3, k1=8, k_pool=16)
  c.train = config_lib.TrainConfig(batch_size=args.batch, num_steps=max(args.steps, 2),
                                   warmup_steps=1, k_neg=16, hard_neighbors=8)
  return config_lib.validate(c)


def memory_table(args, config) -> list[dict]:
  from hyset_jax import config as config_lib
  from hyset_jax.training import dry_run
  rows = []
  for t in (1, 2, 4, 8):
    c = dataclasses.replace(config, mesh=config_lib.MeshConfig(data=-1, tools=t))
    t0 = time.time()
    report = dry_run.dry_run(c, num_tools=args.tools, tool_dim=args.dim, query_dim=args.dim)
    rows.append(dict(report.to_json(), compile_s=round(time.time() - t0, 1)))
    print(f"tools={t}: params+opt {(report.parameters + report.optimizer_state) / 2**20:.1f} MiB"
          f" per device, temporaries {report.temporaries / 2**20:.1f} MiB", flush=True)
  return rows


def train_steps(args, config) -> dict:
  import jax
  import numpy as np
  from hyset_jax.model import parameters
  from hyset_jax.training import batches, sharding, step_cost, train
  from hyset_jax import config as config_lib
  from hyset_jax.testing import synthetic_data
  c = dataclasses.replace(config, mesh=config_lib.MeshConfig(data=1, tools=8))
  mc, tc = c.model, c.train
  t0 = time.time()
  data = synthetic_data(n_tools=args.tools, dim=args.dim, n_queries=4 * args.batch,
                        max_size=mc.max_set_size)
  build_s = time.time() - t0
  mesh = train.training_mesh(c)
  optimizer = train.make_optimizer(tc)
  train_qs = data.splits["train"]
  t0 = time.time()
  state = train.create_train_state(data, args.dim, mc, tc, optimizer, mesh)
  init_s = time.time() - t0
  del data  # the host copy of the encoder output is no longer needed
  z = state.theta["z"]
  shard_rows = {s.data.shape[0] for s in z.addressable_shards}
  t0 = time.time()
  step_fn, report = step_cost.compile_step(
      train.make_step_fn(mesh, mc, tc, optimizer, jax.tree.map(lambda x: x.sharding, state)),
      state, step_cost.abstract_batch(tc, mc, args.dim, mesh), mesh)
  compile_s = time.time() - t0
  rows_sharding = sharding.batch_rows(mesh)
  local_rows = sharding.process_rows(rows_sharding, tc.batch_size)
  losses, step_s = [], []
  for step in range(args.steps):
    t0 = time.time()
    params = parameters.materialize(state.theta, mc)
    with jax.set_mesh(mesh):
      batch = batches.make_batch(step, params, train_qs, local_rows, num_tools=args.tools, mc=mc,
                                 tc=tc, rewards={})
    batch = batches.Batch(**sharding.global_batch(batch._asdict(), rows_sharding, tc.batch_size))
    state, parts = step_fn(state, batch)
    losses.append(float(parts["loss"]))
    step_s.append(round(time.time() - t0, 2))
    print(f"step {step + 1}/{args.steps}: loss {losses[-1]:.4f} ({step_s[-1]} s)", flush=True)
  z = state.theta["z"]
  held = [s.data.nbytes for s in z.addressable_shards]
  return {"mesh": {"data": 1, "tools": 8}, "num_tools": args.tools, "dim": args.dim,
          "batch_size": tc.batch_size, "z_rows_per_device": sorted(shard_rows),
          "z_bytes_per_device_measured": held[0], "z_devices": len(z.sharding.device_set),
          "compiled_parameters_bytes": report.parameters,
          "compiled_temporaries_bytes": report.temporaries,
          "losses": losses, "finite": all(np.isfinite(losses)), "step_s": step_s,
          "build_library_s": round(build_s, 1), "init_s": round(init_s, 1),
          "compile_s": round(compile_s, 1)}


def sizing_table(out: pathlib.Path) -> None:
  """docs/sharding.md's sizing table: the toolbench preset's train step (batch 256, K_neg 64,
  M 5) for library size × d_z × devices, from compile-time memory analysis (as --dry-run)."""
  from hyset_jax import config as config_lib
  from hyset_jax.training import dry_run
  rows = []
  for n in (10_000, 100_000, 1_000_000):
    for d in (384, 768):
      for t in (1, 8):
        c = config_lib.resolve("toolbench", [f"mesh.tools={t}"])
        r = dry_run.dry_run(c, num_tools=n, tool_dim=d, query_dim=d)
        rows.append(r.to_json())
        print(f"N={n} d={d} tools={t}: total {r.total / 2**30:.2f} GiB", flush=True)
  provenance.write_json(out / "sharding_sizing.json", rows)
  gib = lambda b: f"{b / 2**30:.2f}"  # noqa: E731
  lines = ["| N tools | d_z | mesh (data × tools) | parameters | optimiser state | temporaries "
           "| total per device (GiB) |", "|---:|---:|---|---:|---:|---:|---:|"]
  for r in rows:
    lines.append(f"| {r['num_tools']:,} | {r['tool_dim']} | {r['mesh']['data']} × "
                 f"{r['mesh']['tools']} | {gib(r['parameters'])} | {gib(r['optimizer_state'])} | "
                 f"{gib(r['temporaries'])} | {gib(r['total'])} |")
  (out / "sharding_sizing.md").write_text("\n".join(lines) + "\n")


def write_results(out: pathlib.Path, table: list[dict], run: dict | None, meta: dict) -> None:
  out.mkdir(parents=True, exist_ok=True)
  provenance.write_json(out / "sharded_scale.json", {"meta": meta, "memory": table, "train": run})
  mib = lambda b: f"{b / 2**20:,.1f}"  # noqa: E731
  base = table[0]["parameters"] + table[0]["optimizer_state"]
  lines = [f"# Tool-parallel sharding at N = {meta['num_tools']:,}, d_z = {meta['dim']}",
           "",
           f"Measured {meta['date']} on {meta['machine']} with "
           f"`python -m benchmarks.sharded_scale` (8 fake CPU devices; XLA compile-time memory "
           f"analysis of the train step, global batch {meta['batch']}, K_neg 16, M 3). "
           "MiB per device.",
           "",
           "| mesh (data × tools) | parameters | optimiser state | params + opt | vs tools=1 "
           "| batch | temporaries | total | FLOPs/step/device |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for r in table:
    po = r["parameters"] + r["optimizer_state"]
    lines.append(f"| {r['mesh']['data']} × {r['mesh']['tools']} | {mib(r['parameters'])} | "
                 f"{mib(r['optimizer_state'])} | {mib(po)} | {po / base:.3f} | {mib(r['batch'])}"
                 f" | {mib(r['temporaries'])} | {mib(r['total'])} | "
                 f"{r['flops_per_device']:.3g} |")
  if run:
    lines += ["", f"Training on mesh 1 × 8: {len(run['losses'])} steps, losses "
              f"{', '.join(f'{x:.4f}' for x in run['losses'])} (finite: {run['finite']}); each "
              f"device holds {run['z_rows_per_device']} rows of Z = "
              f"{mib(run['z_bytes_per_device_measured'])} MiB (measured on the arrays); "
              f"compile {run['compile_s']} s, steps {run['step_s']} s (fake devices share 2 "
              f"cores: not a speed)."]
  (out / "sharded_scale.md").write_text("\n".join(lines) + "\n")
  import matplotlib
  import matplotlib.ticker
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  ts = [r["mesh"]["tools"] for r in table]
  fig, ax = plt.subplots(figsize=(6.4, 4))
  for key, label in (("parameters", "parameters"), ("optimizer_state", "optimiser state"),
                     ("temporaries", "temporaries"), ("total", "total")):
    ax.plot(ts, [r[key] / 2**20 for r in table], marker="o", label=label)
  ax.plot(ts, [base / 2**20 / t for t in ts], "k:", label="(params + opt at tools=1) / T")
  ax.set(xscale="log", yscale="log", xlabel="mesh.tools (of 8 devices)", ylabel="MiB per device",
         title=f"per-device memory, N = {meta['num_tools']:,}, d_z = {meta['dim']}")
  ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(ts))
  ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
  ax.xaxis.set_major_formatter(matplotlib.ticker.FixedFormatter([str(t) for t in ts]))
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(out / "sharded_scale.png", dpi=110)
  plt.close(fig)


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--tools", type=int, default=1_000_000)
  p.add_argument("--dim", type=int, default=256)
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--steps", type=int, default=3)
  p.add_argument("--no-train", action="store_true", help="only the compile-time memory table")
  p.add_argument("--sizing", action="store_true",
                 help="instead: the sizing table (toolbench preset, N x d_z x tools) only")
  p.add_argument("--out", default="benchmarks/results")
  args = p.parse_args(argv)
  flags = os.environ.get("XLA_FLAGS", "")
  if "xla_force_host_platform_device_count" not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count=8".strip()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jax
  if jax.device_count() != 8:
    print(f"needs 8 devices, found {jax.device_count()}", file=sys.stderr)
    return 2
  import platform
  if args.sizing:
    sizing_table(pathlib.Path(args.out))
    return 0
  config = _config(args)
  table = memory_table(args, config)
  run = None if args.no_train else train_steps(args, config)
  meta = {"num_tools": args.tools, "dim": args.dim, "batch": args.batch,
          "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
          "machine": f"{platform.machine()} CPU, {os.cpu_count()} cores, jax {jax.__version__}"}
  write_results(pathlib.Path(args.out), table, run, meta)
  print(f"wrote {args.out}/sharded_scale.{{json,md,png}}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
