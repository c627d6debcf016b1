"""How far training depends on the device and process count: the same run on 1 device, on 2 and
8 (fake CPU) devices as meshes (2, 1), (8, 1) and (2, 4), and as 2 processes of 1 device
(launch/local.py over 127.0.0.1); per θ leaf the largest |difference| from the 1-device run
after 2 steps and where the run ended (after N steps, or at an early stop: both steps are
reported), and the test metrics' difference (R@5, COMP@5 of best/ and final/).

    python -m benchmarks.determinism [--steps N] [--presets tiny synthetic ...] [--runs ...]
    python -m benchmarks.determinism --grads [--presets tiny]   # why: the first steps' gradients

Every run is a subprocess (XLA's device count is fixed when JAX starts), one at a time. Presets:
every shipped one as shipped (``bfcl``, ``toollens``, …; ``tiny``: ToolLens, its query tower
and conditioned set term on), ``tiny-plain`` (tiny with both off),
``synthetic`` (hyset_jax.testing: what tests/test_sharding.py trains) and ``synthetic-extras``
(the same with the tower and the conditioned term on). ``--set KEY=VALUE`` applies to every run
(e.g. ``--set train.adam_eps=1e-4``). Results: benchmarks/results/determinism.json (+ .md);
``--grads`` writes determinism_grads.json.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
# name: (processes, devices per process, mesh.data, mesh.tools)
RUNS = {"1": (1, 1, -1, 1), "2x1": (1, 2, -1, 1), "8x1": (1, 8, -1, 1), "2x4": (1, 8, 2, 4),
        "2proc": (2, 1, -1, 1)}
# Besides these, every shipped preset (``hyset train --config NAME``), run as shipped.
EXTRA_PRESETS = ("tiny-plain", "synthetic", "synthetic-extras")
EXTRAS = ["model.tower_depth=1", "model.conditioned=true", "model.conditioned_rank=8"]
PLAIN = ["model.tower_depth=0", "model.conditioned=false"]
METRICS = ("recall@5", "comp@5")
# Leaves that start at exactly 0 (model.py: the natural start), where Adam's first steps move
# by ±lr whatever the size of the gradient.
ZERO_INIT = ("m", "conditioned/w", "conditioned/v", "conditioned/b", "tower/w_out",
             "tower/b_out", "tower/b_in")


def preset_config(preset: str, steps: int | None, overrides: list[str]):
  from hyset_jax import config as config_lib
  from hyset_jax.testing import small_config
  if preset.startswith("synthetic"):
    base, extra = small_config(), EXTRAS if preset == "synthetic-extras" else []
  else:
    base = config_lib.load_preset("tiny" if preset == "tiny-plain" else preset)
    extra = PLAIN if preset == "tiny-plain" else []
  steps_override = [f"train.num_steps={steps}"] if steps else []
  return config_lib.validate(config_lib.apply_overrides(base, extra + steps_override + overrides))


def preset_data(preset: str, config):
  from hyset_jax.testing import synthetic_data
  from hyset_jax.training.train_data import prepare_data
  return synthetic_data() if preset.startswith("synthetic") else prepare_data(config)


def leaf_dict(theta) -> dict[str, np.ndarray]:
  """θ's leaves by path (``conditioned/w``), as NumPy."""
  import jax
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(theta)[0]:
    name = "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))))
                    for k in path)
    out[name] = np.asarray(leaf)
  return out


# ------------------------------------------------------------------ one training run (a worker)

def worker(args) -> int:
  """Train ``args.preset`` here (this process's devices, or a launch/local.py rank) and write θ
  after every step of ``args.dump`` plus the test metrics to ``args.out``."""
  import jax
  import optax
  from hyset_jax.io import modeldir
  from hyset_jax.training import sharding, step_cost, train
  from hyset_jax.evaluation.evaluator import evaluate_split
  sharding.maybe_initialize_distributed()  # before the encoder touches JAX (prepare_data)
  if args.adam_eps is not None:
    # Measurement only: the candidate fix, Adam with a larger ε, in this worker process.
    adam = optax.adam
    optax.adam = lambda *a, **k: adam(*a, **dict(k, eps=args.adam_eps))
  config = preset_config(args.preset, args.steps, args.overrides)
  data = preset_data(args.preset, config)
  dumps: dict[str, np.ndarray] = {}
  last = [None]
  compile_step = step_cost.compile_step

  # The loop's compiled step, wrapped to copy θ out after the steps we compare; it calls the
  # same executable, so the run is the one `hyset train` does.
  def compile_and_watch(*a, **k):
    step_fn, report = compile_step(*a, **k)
    done = [0]

    def step(state, batch):
      state, parts = step_fn(state, batch)
      done[0] += 1
      last[0] = state  # the next step donates it; the last one is θ where the run ended
      if done[0] in args.dump:
        for name, x in leaf_dict(sharding.to_host(state.theta)).items():  # every process
          dumps[f"{done[0]}:{name}"] = x
      return state, parts
    return step, report
  step_cost.compile_step = compile_and_watch
  # One workdir for every rank: a multi-process run checkpoints and exports into one place.
  summary = train.train_and_evaluate(config, args.out + "-work", data=data, progress=False)
  # θ where the run ended: the last step, or an early stop's (a preset with patience).
  for name, x in leaf_dict(sharding.to_host(last[0].theta)).items():
    dumps[f"final:{name}"] = x
  if jax.process_index() == 0:
    # best/ is what `hyset eval` reads; final/ (θ after the last step) shows the drift best/
    # may hide when validation keeps an early step.
    final = modeldir.load_model_dir(pathlib.Path(args.out + "-work") / "final")
    final_test = evaluate_split(final.params, data.splits[config.data.test_split],
                                data.tool_ids, config.model, config.train.eval_batch_size,
                                ranking=final.ranking)
    np.savez(args.out + ".npz", **dumps)
    pathlib.Path(args.out + ".json").write_text(json.dumps(
        {"test": summary.get("test", {}), "final_test": final_test, "steps": summary["steps"],
         "best_step": summary["best_step"],
         "devices": jax.device_count(), "processes": jax.process_count(),
         "seconds": summary["train_seconds_this_run"]}))
  return 0


def launch(preset: str, run: str, steps: int | None, overrides: list[str], out: str,
           adam_eps: float | None) -> float:
  if os.path.exists(out + ".json"):  # --keep: this run is done
    return 0.0
  procs, devices, data, tools = RUNS[run]
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO),
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  cmd = [sys.executable, "-m", "benchmarks.determinism", "--worker", "--preset", preset,
         "--out", out, "--dump", "2", str(steps or 0), "--set", f"mesh.data={data}", "--set",
         f"mesh.tools={tools}"] + [x for o in overrides for x in ("--set", o)]
  if steps:
    cmd += ["--steps", str(steps)]
  if adam_eps is not None:
    cmd += ["--adam-eps", str(adam_eps)]
  if procs > 1:
    cmd = [sys.executable, str(REPO / "launch" / "local.py"), "-n", str(procs),
           "--devices-per-process", str(devices), "--"] + cmd
  t0 = time.time()
  done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True,
                        timeout=4 * 3600)  # a full preset run on a loaded 2-core CPU
  if done.returncode:
    print(f"{preset}/{run} failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
          f"{done.stderr[-3000:]}", file=sys.stderr, flush=True)
    lines = [x for x in (done.stderr or done.stdout).strip().splitlines() if x.strip()]
    raise RunFailed(lines[-1] if lines else f"exit {done.returncode}")
  return time.time() - t0


class RunFailed(Exception):
  """A run that could not train (e.g. a mesh whose tools axis does not divide the library's
  tool count): reported in the results, the other runs go on."""


def compare(ref: dict, other: dict, step: int | str) -> dict[str, float]:
  """Largest |Δ| per θ leaf between two runs' dumps after ``step`` (a step, or "final")."""
  prefix = f"{step}:"
  return {k[len(prefix):]: float(np.max(np.abs(ref[k] - other[k])))
          for k in sorted(ref) if k.startswith(prefix)}


def measure(args) -> dict:
  rows, failed = [], []
  with tempfile.TemporaryDirectory() as tmp:
    keep = args.keep or tmp
    os.makedirs(keep, exist_ok=True)
    for preset in args.presets:
      steps = args.steps or preset_config(preset, None, args.overrides).train.num_steps
      got = {}
      for run in args.runs:
        tag = "-".join([preset, run, str(steps), *args.overrides] +
                       ([f"eps{args.adam_eps}"] if args.adam_eps is not None else []))
        out = os.path.join(keep, tag.replace("/", "_").replace("=", "_"))
        try:
          secs = launch(preset, run, steps, args.overrides, out, args.adam_eps)
        except RunFailed as e:
          failed.append({"preset": preset, "run": run, "reason": str(e)})
          print(f"{preset} {run}: not run: {e}", flush=True)
          continue
        got[run] = (dict(np.load(out + ".npz")), json.loads(pathlib.Path(out + ".json")
                                                             .read_text()))
        print(f"{preset} {run}: {secs:.0f}s test {got[run][1]['test']}", flush=True)
      if args.runs[0] not in got:
        continue
      ref_params, ref = got[args.runs[0]]
      for run in [r for r in args.runs[1:] if r in got]:
        params, res = got[run]
        # θ where each run ended ("final:", an early stop's too); runs kept from before that
        # dump have θ after the last configured step only.
        final = "final" if all(any(k.startswith("final:") for k in p)
                               for p in (ref_params, params)) else steps
        row = {"preset": preset, "steps": steps, "reference": args.runs[0], "run": run,
               "steps_run": res["steps"], "reference_steps_run": ref["steps"],
               "max_abs_diff_step2": compare(ref_params, params, 2),
               "max_abs_diff_final": compare(ref_params, params, final),
               "best_step": res["best_step"], "reference_best_step": ref["best_step"],
               "test": res["test"], "reference_test": ref["test"],
               "test_diff": {m: res["test"].get(m, np.nan) - ref["test"].get(m, np.nan)
                             for m in METRICS},
               "final_test": res["final_test"], "reference_final_test": ref["final_test"],
               "final_test_diff": {m: res["final_test"][m] - ref["final_test"][m]
                                   for m in METRICS}}
        row["largest_step2"] = max(row["max_abs_diff_step2"].values())
        row["largest_final"] = max(row["max_abs_diff_final"].values())
        rows.append(row)
        print(f"  {run} vs {args.runs[0]}: step 2 {row['largest_step2']:.2e}, where the runs "
              f"ended (steps {ref['steps']} / {res['steps']}) {row['largest_final']:.2e}, "
              f"test diff {row['test_diff']}", flush=True)
  return {"overrides": args.overrides, "adam_eps": args.adam_eps, "rows": rows,
          "failed": failed}


def markdown(doc: dict) -> str:
  prov = doc["provenance"]
  lines = [f"# Determinism across devices and processes ({prov['date'][:10]})", "",
           f"`{prov['command']}` — {prov['machine']}; overrides: {doc['overrides'] or 'none'}",
           f"Adam ε: {doc.get('adam_eps') or 'optax default (1e-8)'}", "",
           "| preset | run vs ref | steps | max abs Δθ step 2 | max abs Δθ final (leaf) | "
           "ΔR@5, ΔCOMP@5 best/ (best step) | ΔR@5, ΔCOMP@5 final/ |",
           "|---|---|---:|---:|---:|---:|---:|"]
  for r in doc["rows"]:
    leaf = max(r["max_abs_diff_final"], key=r["max_abs_diff_final"].get)
    ran = {r.get("steps_run", r["steps"]), r.get("reference_steps_run", r["steps"])}
    steps = (r["steps"] if ran == {r["steps"]} else
             f"{r['steps']} (ran {'/'.join(map(str, sorted(ran)))})")
    lines.append(f"| {r['preset']} | {r['run']} vs {r['reference']} | {steps} | "
                 f"{r['largest_step2']:.1e} | {r['largest_final']:.1e} (`{leaf}`) | "
                 f"{100 * r['test_diff']['recall@5']:+.2f}, "
                 f"{100 * r['test_diff']['comp@5']:+.2f} ({r['best_step']} vs "
                 f"{r['reference_best_step']}) | {100 * r['final_test_diff']['recall@5']:+.2f}, "
                 f"{100 * r['final_test_diff']['comp@5']:+.2f} |")
  lines += ["", "| preset | run | R@5 best/ | COMP@5 best/ | R@5 final/ | COMP@5 final/ |",
            "|---|---|---:|---:|---:|---:|"]
  for r in doc["rows"]:
    for name, t, f in ((r["reference"], r["reference_test"], r["reference_final_test"]),
                       (r["run"], r["test"], r["final_test"])):
      lines.append(f"| {r['preset']} | {name} | {100 * t['recall@5']:.2f} | "
                   f"{100 * t['comp@5']:.2f} | {100 * f['recall@5']:.2f} | "
                   f"{100 * f['comp@5']:.2f} |")
  if doc.get("failed"):
    lines += ["", "Failed (the other runs went on):", ""]
    lines += [f"- {f['preset']} {f['run']}: {f['reason']}" for f in doc["failed"]]
  return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ the first steps' gradients

def grads_report(preset: str, overrides: list[str], eps_values: list[float]) -> dict:
  """Gradients and Adam updates of the first two steps on 1 device, mesh (8, 1) and (2, 4),
  from the same θ and the same batches (built once, on the reference)."""
  import jax
  import optax
  from hyset_jax.model import parameters
  from hyset_jax.training import batches, sharding, train
  config = preset_config(preset, None, overrides)
  data = preset_data(preset, config)
  mc, tc = config.model, config.train
  qs = data.splits[config.data.train_split]
  meshes = {"1": sharding.make_mesh(1), "8x1": sharding.make_mesh(8, data=8, tools=1),
            "2x4": sharding.make_mesh(8, data=2, tools=4)}
  optimizer = train.make_optimizer(tc)
  theta0 = parameters.init_theta(data.tool_embeddings, qs.embeddings.shape[1], mc, tc.seed)
  rows = list(range(tc.batch_size))
  # Step 0's update is 0 (the warm-up starts at lr 0) and θ only passes through constrain,
  # so both batches are built from θ0.
  params0 = parameters.materialize(theta0, mc)
  bs = [batches.make_batch(s, params0, qs, rows, num_tools=len(data.tool_ids), mc=mc, tc=tc,
                           rewards={}) for s in range(2)]
  grads, updates = {}, {}
  for name, mesh in meshes.items():
    def loss_grad(theta, batch):
      return jax.grad(lambda t: train.objective(t, batch.query, batch.members, batch.mask,
                                                batch.selected, batch.reward, batch.shortlist,
                                                mc=mc, tc=tc)[0])(theta)
    shard = sharding.state_shardings(theta0, mesh)
    g_fn = jax.jit(loss_grad, in_shardings=(shard, sharding.batch_rows(mesh)),
                   out_shardings=shard)
    theta = jax.device_put(theta0, shard)
    grads[name] = [leaf_dict(jax.device_get(g_fn(theta, b))) for b in bs]
  # Adam with the run's schedule, on the host, from each mesh's gradients: the unit update
  # m̂/(√v̂+ε) of step 2 is what multiplies lr.
  out = {"preset": preset, "leaves": {}, "eps": {}}
  ref = grads["1"]
  for leaf in ref[0]:
    g1 = ref[0][leaf]
    entry = {"shape": list(g1.shape), "zero_init": leaf in ZERO_INIT,
             "grad_abs_max": float(np.max(np.abs(g1))),
             "grad_abs_median": float(np.median(np.abs(g1)))}
    for name in ("8x1", "2x4"):
      g = grads[name][0][leaf]
      diff = np.abs(g - g1)
      entry[name] = {"grad_max_abs_diff": float(diff.max()),
                     "grad_rel_diff": float(diff.max() / max(np.abs(g1).max(), 1e-30)),
                     "sign_flips": int(np.sum(np.sign(g) != np.sign(g1))),
                     "sign_flips_of": int(g.size)}
    out["leaves"][leaf] = entry
  for eps in eps_values:
    unit = {}
    for name in meshes:
      # lr 1: the update in units of lr (after the run's clipping)
      opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1.0, eps=eps))
      state = opt.init(grads[name][0])
      for g in grads[name]:
        u, state = opt.update(g, state)
      unit[name] = u
    out["eps"][str(eps)] = {
        leaf: {"unit_update_abs_median": float(np.median(np.abs(unit["1"][leaf]))),
               **{f"unit_update_max_abs_diff_{n}": float(np.max(np.abs(unit[n][leaf] -
                                                                       unit["1"][leaf])))
                  for n in ("8x1", "2x4")}}
        for leaf in unit["1"]}
  return out


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--steps", type=int, help="training steps (default: the preset's)")
  from hyset_jax import config as config_lib
  p.add_argument("--presets", nargs="+", default=["tiny"],
                 choices=[*config_lib.presets(), *EXTRA_PRESETS])
  p.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS),
                 help="the first is the reference")
  p.add_argument("--set", dest="overrides", action="append", default=[])
  p.add_argument("--grads", action="store_true", help="the first steps' gradients instead")
  p.add_argument("--eps", nargs="+", type=float, default=[1e-8, 1e-6, 1e-4],
                 help="--grads: the Adam ε values to compare")
  p.add_argument("--adam-eps", type=float,
                 help="train with this Adam ε instead of optax's 1e-8 (measures the fix)")
  p.add_argument("--keep", help="keep each run's θ and metrics here; reruns reuse them")
  p.add_argument("--tag", default="", help="suffix of the result files' names")
  p.add_argument("--out", help=argparse.SUPPRESS)
  p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--preset", help=argparse.SUPPRESS)
  p.add_argument("--dump", nargs="+", type=int, default=[2], help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.worker:
    return worker(args)
  from benchmarks.provenance import command, write_json
  # --keep names a scratch folder of this machine: not part of the result's command.
  argv = sys.argv[1:] if argv is None else argv
  line = command([a for i, a in enumerate(argv)
                  if a != "--keep" and (i == 0 or argv[i - 1] != "--keep")])
  RESULTS.mkdir(parents=True, exist_ok=True)
  if args.grads:
    if "--xla_force_host_platform_device_count=8" not in os.environ.get("XLA_FLAGS", ""):
      os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
      os.environ.setdefault("JAX_PLATFORMS", "cpu")
    doc = {"overrides": args.overrides,
           "presets": [grads_report(pr, args.overrides, args.eps) for pr in args.presets]}
    print(write_json(RESULTS / "determinism_grads.json", doc, line))
    return 0
  doc = measure(args)
  path = write_json(RESULTS / f"determinism{args.tag}.json", doc, line)
  path.with_suffix(".md").write_text(markdown(json.loads(path.read_text())), encoding="utf-8")
  print(path)
  return 1 if doc["failed"] else 0


if __name__ == "__main__":
  sys.exit(main())
