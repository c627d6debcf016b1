"""This project's side of ``benchmarks.peer``'s training leg: ``hyset train``'s loop, timed per
step. ``benchmarks.peer`` runs it in its own process (``python -m benchmarks.peer_train``) so
that its peak memory is its own, beside ``peer_torch_train.py`` on the same inputs.

  python -m benchmarks.peer_train --tools z.npy --queries q.npy --gold gold.json \
      --max-size 5 --batch-size 32 --steps 10 --warmup 2 --out train.json

What a step of ``hyset_jax.training.train._train`` does, on one device: θ materialised,
``batches.make_batch`` (the gold set and K_neg − 1 negatives, 50/30/20 uniform / in-batch /
hard, the hard ones nearest neighbours of the gold tools under the current Z), the batch placed
on the mesh, the jitted ``make_step_fn`` step (InfoNCE over the pool, Adam, the constraints) and
the loss read back. ``--config paper``'s settings, with the authors' structural ones where they
differ: M, K_neg, batch and the hard-neighbour count (their ``--hard_neighbor_k`` 50; ours
re-finds them every step, theirs once per epoch). Output: JSON with seconds per step (the first
``--warmup`` steps, compilation included, excluded), the part spent building the batch, the
compile-and-first-step seconds and the process's peak RSS (VmHWM).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import numpy as np

PAPER_CONFIG = pathlib.Path(__file__).resolve().parents[1] / "configs" / "paper.py"


def peak_rss_bytes() -> int:
  """This process's peak resident set (VmHWM), the figure both sides report."""
  for line in pathlib.Path("/proc/self/status").read_text().splitlines():
    if line.startswith("VmHWM:"):
      return int(line.split()[1]) * 1024
  import resource
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def paper_config(max_size: int, batch_size: int, k_neg: int, hard_neighbors: int, steps: int):
  """``hyset train --config paper`` with the authors' structural settings."""
  from hyset_jax import config as config_lib
  return config_lib.resolve(str(PAPER_CONFIG), [
      f"model.max_set_size={max_size}", f"train.batch_size={batch_size}",
      f"train.k_neg={k_neg}", f"train.hard_neighbors={hard_neighbors}",
      f"train.num_steps={steps}"])


def run(tools: np.ndarray, queries: np.ndarray, gold, *, max_size: int, batch_size: int,
        steps: int, warmup: int, k_neg: int = 64, hard_neighbors: int = 50) -> dict:
  """Time ``warmup + steps`` steps of the training loop; the JSON-able result."""
  import jax
  from hyset_jax.model import parameters
  from hyset_jax.training import batches, sharding, train
  from hyset_jax.training.train_data import QuerySet
  config = paper_config(max_size, batch_size, k_neg, hard_neighbors, warmup + steps)
  tc, mc = config.train, config.model
  n = len(gold)
  split = QuerySet(tuple(str(i) for i in range(n)), ("",) * n, queries,
                   tuple(tuple(sorted(int(t) for t in g)) for g in gold))
  mesh = sharding.make_mesh(1)
  rows_sharding = sharding.batch_rows(mesh)
  rows = sharding.process_rows(rows_sharding, batch_size)
  optimizer = train.make_optimizer(tc)
  state = jax.device_put(train.init_state(tools, queries.shape[1], mc, tc, optimizer),
                         sharding.replicated(mesh))
  step_fn = train.make_step_fn(mesh, mc, tc, optimizer)
  times, pools, first_s = [], [], 0.0
  for step in range(warmup + steps):
    t0 = time.perf_counter()
    params = parameters.materialize(state.theta, mc)
    with jax.set_mesh(mesh):
      batch = batches.make_batch(step, params, split, rows, num_tools=tools.shape[0], mc=mc,
                                 tc=tc, rewards={})
    batch = batches.Batch(**sharding.global_batch(batch._asdict(), rows_sharding, batch_size))
    t1 = time.perf_counter()
    state, parts = step_fn(state, batch)
    float(parts["loss"])  # the loop reads the loss every step (the finiteness check)
    if step == 0:
      first_s = time.perf_counter() - t0
    if step >= warmup:
      times.append(time.perf_counter() - t0)
      pools.append(t1 - t0)
  return {"jax": jax.__version__, "backend": jax.default_backend(), "batch_size": batch_size,
          "k_neg": k_neg, "hard_neighbors": hard_neighbors, "max_size": max_size,
          "steps": steps, "warmup": warmup, "s_per_step": times, "pool_s_per_step": pools,
          "first_step_s": first_s, "peak_rss_bytes": peak_rss_bytes()}


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--tools", required=True, help="float32 [N, d] .npy: the starting Z")
  p.add_argument("--queries", required=True, help="float32 [Q, d_r] .npy")
  p.add_argument("--gold", required=True, help="JSON list of Q gold sets (tool rows)")
  p.add_argument("--max-size", type=int, required=True)
  p.add_argument("--batch-size", type=int, required=True)
  p.add_argument("--steps", type=int, required=True, help="timed steps")
  p.add_argument("--warmup", type=int, default=2, help="untimed steps before them (≥ 1)")
  p.add_argument("--k-neg", type=int, default=64)
  p.add_argument("--hard-neighbors", type=int, default=50)
  p.add_argument("--out", required=True)
  args = p.parse_args(argv)
  if args.warmup < 1 or args.steps < 1:
    raise SystemExit("error: --warmup and --steps must be at least 1 (step 0 compiles)")
  gold = json.loads(pathlib.Path(args.gold).read_text(encoding="utf-8"))
  doc = run(np.load(args.tools).astype(np.float32), np.load(args.queries).astype(np.float32),
            gold, max_size=args.max_size, batch_size=args.batch_size, steps=args.steps,
            warmup=args.warmup, k_neg=args.k_neg, hard_neighbors=args.hard_neighbors)
  pathlib.Path(args.out).write_text(json.dumps(doc) + "\n", encoding="utf-8")
  return 0


if __name__ == "__main__":
  sys.exit(main())
