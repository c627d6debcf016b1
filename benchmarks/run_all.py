"""The full benchmark suite: ``python -m benchmarks.run_all`` (``make bench``).

Sections (each measured in this one run, so ratios compare like with like):
  1. machine: CPU, cores, load; the f32 matmul peak and the time to write the score matrix;
  2. main table: every implementation at K_pool = 20, M = 5, batch 1024, both outputs
     (``best``: the best set per query; ``scores``: every subset's score);
  3. allocator: the default JAX method and NumPy with glibc's default allocator (subprocess);
  4. sweeps: batch 1 → 16k, K_pool 10 → 30, M 2 → 6, embedding dim 0 → 768;
  5. end to end at the paper's scale (N = 13,860, d = 768): the prepared path against a dense
     pass and against the reference path, encoder excluded and included;
  6. library size N = 10³ → 10⁶ at d = 256 (benchmarks/library_size.py);
  7. training-step throughput on 1 and 8 fake devices (subprocess).
Writes benchmarks/results/speed.{md,json} and speed_*.png. ``--quick`` shrinks everything
for a smoke run (a few minutes).

Large score matrices (≥ 32 MB) are mmapped afresh by glibc on every call, and the page faults
then cost more than the arithmetic (measured in section 3). The suite therefore re-executes
itself with MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_ raised, unless
``--default-allocator`` is given; the setting is recorded in the results.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import subprocess
import sys
import time
from typing import NamedTuple

from benchmarks import provenance

_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "8589934592"}
ROOT = pathlib.Path(__file__).resolve().parents[1]

# Implementation names come from hyset_jax.benchmarking.runners (built from hyset_jax.choices).
BEST_IMPLS = ["jax", "jax-gather", "jax-colex", "jax-matmul", "numpy", "numpy-matmul", "torch"]


def _parse(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
  p.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
  p.add_argument("--skip", default="",
                 help="comma list of: allocator,sweeps,e2e,library,training")
  p.add_argument("--default-allocator", action="store_true",
                 help="do not raise glibc's mmap threshold (see the module docstring)")
  return p.parse_args(argv)


def _reexec_with_allocator(args, argv) -> None:
  if args.default_allocator or all(os.environ.get(k) for k in _MALLOC_ENV):
    return
  env = dict(os.environ, **_MALLOC_ENV)
  os.execve(sys.executable, [sys.executable, "-m", "benchmarks.run_all", *argv], env)


def _subprocess_json(cmd, env_drop=(), timeout=900, json_file=None) -> dict:
  """Run ``cmd``; its result is the JSON in ``json_file``, else the last line of its stdout."""
  env = {k: v for k, v in os.environ.items() if k not in env_drop}
  try:
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=timeout, check=True)
  except subprocess.CalledProcessError as e:
    return {"status": f"not run: exit {e.returncode}: {e.stderr.strip()[-300:]}"}
  except subprocess.TimeoutExpired:
    return {"status": f"not run: over {timeout} s"}
  if json_file is not None:
    result = json.loads(pathlib.Path(json_file).read_text())
    pathlib.Path(json_file).unlink()
    return result
  return json.loads(out.stdout.strip().splitlines()[-1])


class _Sizes(NamedTuple):
  """The suite's sizes (smaller with ``--quick``): the main table's batch and repeats, the
  sweeps' repeats, and the subsets per query at K_pool = 20, M = 5."""
  quick: bool
  main_batch: int
  repeats: int
  sweep_repeats: int
  n_subsets: int


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  args = _parse(argv)
  _reexec_with_allocator(args, argv)
  skip = set(filter(None, args.skip.split(",")))
  out_dir = pathlib.Path(args.out)
  out_dir.mkdir(parents=True, exist_ok=True)
  started = time.time()

  def log(msg):
    print(f"[{time.time() - started:6.0f} s] {msg}", flush=True)

  # Every module the sections use is imported before the first measurement, so that no
  # import lands inside a timed section.
  import jax  # noqa: F401

  from benchmarks import end_to_end, enumeration_suite as es, library_size, report  # noqa: F401
  from hyset_jax.inference import enumeration, subsets
  from hyset_jax.benchmarking import hardware, runners, workload  # noqa: F401

  quick = args.quick
  sizes = _Sizes(quick, 64 if quick else 1024, 2 if quick else 5, 2 if quick else 3,
                 subsets.count_subsets(20, 5))
  results = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             "command": "python -m benchmarks.run_all " + " ".join(argv),
             "machine": hardware.describe(),
             "allocator": {k: os.environ.get(k) for k in _MALLOC_ENV},
             "default_method": enumeration.DEFAULT_METHOD}

  peak, floor = _machine(results, sizes, log)                         # 1.
  ref = _main_tables(results, sizes, log)                             # 2.
  if "allocator" not in skip:                                         # 3.
    results["allocator_default"] = _allocator_rows(out_dir, sizes, log)
  if "sweeps" not in skip:                                            # 4.
    results["sweeps"] = _sweeps(sizes, log)
  if "e2e" not in skip:                                               # 5.
    _end_to_end(results, sizes, log)
  if "library" not in skip:                                           # 6.
    log("library size: N = 10³ … 10⁶, d = 256")
    lib_sizes = (1_000, 10_000) if quick else library_size.SIZES
    results["library_size"] = library_size.rows((1, 64), lib_sizes, 2 if quick else 3, log)
  if "training" not in skip:                                          # 7.
    results["training"] = _training(log)

  results["wall_s"] = time.time() - started
  results["load_avg_end"] = round(os.getloadavg()[0], 2)
  provenance.write_json(out_dir / "speed.json", results)
  write_report(results, out_dir, ref, peak, floor)
  log(f"wrote {out_dir}/speed.md, speed.json and speed_*.png")
  return 0


def _machine(results: dict, sizes: _Sizes, log) -> tuple[float, float]:
  """1. The machine, measured now: records and returns (f32 matmul peak GFLOP/s, seconds to
  write the main batch's score matrix)."""
  from hyset_jax.benchmarking import hardware
  log(f"machine: {results['machine']}")
  peak = max(hardware.matmul_peak_gflops(1024 if sizes.quick else 2048) for _ in range(2))
  floor = hardware.write_floor_s(sizes.main_batch, sizes.n_subsets)
  results["matmul_peak_gflops"] = peak
  results["write_floor_s"] = {"batch": sizes.main_batch, "n_subsets": sizes.n_subsets,
                              "seconds": floor}
  log(f"f32 matmul peak {peak:.1f} GFLOP/s; writing f32[{sizes.main_batch}, {sizes.n_subsets}] "
      f"takes {floor * 1e3:.1f} ms")
  return peak, floor


def _main_tables(results: dict, sizes: _Sizes, log) -> float:
  """2. The main table, both outputs: records the rows and returns the NumPy reference's
  queries/s (the × NumPy column's base)."""
  from benchmarks import enumeration_suite as es
  from hyset_jax.benchmarking import runners, workload
  main_batch = sizes.main_batch
  log(f"main table: K_pool = 20, M = 5, batch {main_batch}, output best")
  best_rows = es.main_table(BEST_IMPLS, main_batch, 2, sizes.repeats, log, output="best")
  log(f"main table: K_pool = 20, M = 5, batch {main_batch}, output scores")
  main_rows = es.main_table(list(runners.IMPLS), main_batch, 2, sizes.repeats, log,
                            output="scores")
  for r in main_rows:
    r["batch_for_floor"] = main_batch if r["batch"] == main_batch else None
  ref = next(r for r in main_rows if r["impl"] == "numpy")["queries_per_s"]
  results["main"] = main_rows
  results["main_best"] = best_rows
  results["min_flops_per_query"] = workload.min_flops_per_query(20, 5)
  results["matmul_flops_per_query"] = workload.matmul_flops_per_query(20, 5)
  return ref


def _allocator_rows(out_dir: pathlib.Path, sizes: _Sizes, log) -> list[dict]:
  """3. The allocator's share: the same runs with glibc's defaults, in fresh processes.
  Returns one result per implementation."""
  log("allocator: default glibc thresholds (subprocesses)")
  alloc = []
  for impl in ("jax", "numpy"):
    tmp = out_dir / f".alloc_{impl}.json"
    r = _subprocess_json([sys.executable, "-m", "hyset_jax.cli", "bench", "enumerate",
                          "--batch", str(sizes.main_batch), "--impl", impl,
                          "--repeats", str(sizes.repeats), "--json", str(tmp)],
                         env_drop=tuple(_MALLOC_ENV), json_file=tmp)
    alloc.append(r)
    log(f"  {impl}: {r.get('queries_per_s', 0):,.0f} q/s with the default allocator")
  return alloc


def _sweeps(sizes: _Sizes, log) -> list[dict]:
  """4. The sweeps over batch, K_pool, M and embedding dim. Returns their rows."""
  from benchmarks import enumeration_suite as es
  from hyset_jax.benchmarking import workload
  quick, sweep_repeats = sizes.quick, sizes.sweep_repeats
  default = "jax"
  sw = []
  batches = [1, 16, 256] if quick else [1, 16, 64, 256, 1024, 4096]
  sw += es.sweep("batch", batches, [default, "jax-matmul", "numpy", "numpy-matmul"],
                 lambda b: workload.make_workload(20, 5, b), sweep_repeats, log,
                 limit=lambda impl, b: not impl.startswith("numpy") or b <= 1024)
  best = es.sweep("batch", batches, [default], lambda b: workload.make_workload(20, 5, b),
                  sweep_repeats, log, output="best")
  for r in best:
    r["impl"] = "jax (best)"
  sw += best
  sb = 32 if quick else 256
  sw += es.sweep("k_pool", [10, 15, 20] if quick else [10, 15, 20, 25],
                 [default, "jax-matmul", "numpy"], lambda k: workload.make_workload(k, 5, sb),
                 sweep_repeats, log)
  sw += es.sweep("max_size", [2, 3, 4, 5, 6], [default, "jax-matmul", "numpy"],
                 lambda m: workload.make_workload(20, m, sb), sweep_repeats, log)
  sw += es.sweep("dim", [0, 64] if quick else [0, 256, 768], [default, "jax-matmul", "numpy"],
                 lambda d: workload.make_workload(20, 5, sb, dim=d), sweep_repeats, log)
  return sw


def _end_to_end(results: dict, sizes: _Sizes, log) -> None:
  """5. End to end at the paper's scale: records the prepared, reference and
  encoder-included rows."""
  from benchmarks import end_to_end
  from hyset_jax.inference import enumeration
  quick = sizes.quick
  log("end to end: N = 13,860, d = 768, K1 = 15, K_pool = 20, M = 5")
  batches = [1, 16] if quick else [1, 64, 256]
  e2e = end_to_end.prepared_rows(batches, [enumeration.DEFAULT_METHOD], 3 if quick else 5, log)
  results["end_to_end"] = e2e
  results["reference"] = end_to_end.reference_rows([1, 16] if quick else [1, 64], 3, log)
  enc = end_to_end.encoder_rows([1, 16] if quick else [1, 64], 3, log)
  results["encoder_included"] = enc
  if isinstance(enc, str):
    log(f"  encoder included: {enc}")


def _training(log) -> dict:
  """7. Training-step throughput on 1 and 8 fake devices (subprocess). Returns its result."""
  log("training step: 1 vs 8 fake devices (subprocess)")
  tr = _subprocess_json([sys.executable, "-m", "benchmarks.training"])
  log(f"  {tr.get('status')}: " + ", ".join(
      f"{r['devices']} device(s) {r['examples_per_s']:,.0f} ex/s" for r in tr.get("rows", [])))
  return tr


def write_report(results, out_dir: pathlib.Path, ref: float, peak: float, floor: float) -> None:
  from benchmarks import report

  md = _report_head(results, ref, peak, floor)
  report.plot_main(results["main"], ref, out_dir / "speed_main.png")
  md.append("![main](speed_main.png)\n")
  if "allocator_default" in results:
    md.append("With glibc's default allocator (fresh process, same batch): " + "; ".join(
        f"{r.get('impl', '?')} {r.get('queries_per_s', 0):,.0f} q/s"
        for r in results["allocator_default"]) + ".\n")
  if "sweeps" in results:
    md += _sweeps_md(results["sweeps"], out_dir)
  if "end_to_end" in results:
    md += _end_to_end_md(results)
  if "library_size" in results:
    rows = results["library_size"]
    md += ["## Cost against library size (d = 256, K1 = 15, K_pool = 20, M = 5)\n",
           "Stage 1 is itself a dense pass, so *beyond stage 1* = HYSET's ms/query minus the "
           "dense pass's in the same run: the expansion (neighbour table), G_m and stage 2. "
           "Tables up to N = 30,000 are built (`prepare s` includes the N²·d build); above, "
           "the rows are random (the query path costs the same; the build would take ~1 h at "
           "N = 10⁶ on this CPU).\n",
           report.library_md(rows), "", "![library](speed_library_size.png)\n"]
    report.plot_library(rows, out_dir / "speed_library_size.png")
  if "training" in results:
    md += _training_md(results["training"])
  (out_dir / "speed.md").write_text("\n".join(md) + "\n")


def _report_head(results, ref: float, peak: float, floor: float) -> list[str]:
  """speed.md's lines up to the main tables: the run and machine, and both main tables."""
  from benchmarks import report

  m = results["machine"]
  return [f"# hyset-jax speed: subset enumeration, end to end, training step\n",
          f"`{results['command']}` — {results['date']}, {m['cpu']}, {m['nproc']} cores, "
          f"JAX {m['jax']} ({m['backend']}, {m['devices']}), NumPy {m['numpy']}, load average "
          f"{m.get('load_avg_1m', '?')} at start and {results.get('load_avg_end', '?')} at the "
          f"end (1-minute load average, 2 cores: above ~2 other work shared the machine); run "
          f"took {results['wall_s'] / 60:.1f} min. Allocator: {results['allocator']}.\n",
          ("**GPU:** not run in this run (CPU backend); `benchmarks/gpu.sh OUT_DIR` is the "
           "prepared script.\n" if m["backend"] == "cpu" else ""),
          "Throughput here is only comparable as ratios within this run. The JAX rows score "
          "queries in cache-sized chunks on one core, so they slow down more than NumPy when "
          "other work shares the machine (benchmarks/README.md, *Caches*).\n",
          f"Measured in this run: f32 matmul peak **{peak:.1f} GFLOP/s**; writing the "
          f"f32[{results['write_floor_s']['batch']}, {results['write_floor_s']['n_subsets']}] "
          f"score matrix once takes **{floor * 1e3:.1f} ms** (the write floor). Minimal work: "
          f"{results['min_flops_per_query']:,} flops per query (colex recurrence; the matmul "
          f"form does {results['matmul_flops_per_query']:,}).\n",
          "## Best set per query, K_pool = 20, M = 5 (`--output best`, what predict runs)\n",
          "Each call scores every subset of every query and returns the best one. NumPy and "
          "PyTorch: their scores, then an argmax. × NumPy: queries/s over the NumPy "
          "reference's (gather form + argmax) in this run; × NumPy-matmul: over the incidence-"
          "matmul NumPy form + argmax.\n",
          report.best_table_md(results["main_best"], results["min_flops_per_query"], peak), "",
          "## Every subset's score, K_pool = 20, M = 5 (`--output scores`, 21,699 per query)\n",
          "Each call scores every subset of every query and returns f32[Q, 21699]. × NumPy: "
          "queries/s over the NumPy reference's in this run. % arithmetic bound: minimal flops "
          "× queries/s over the matmul peak. % write floor: the write floor's time over this "
          f"time. Default method: `{results['default_method']}`.\n",
          report.main_table_md(results["main"], ref, peak, floor), ""]


def _sweeps_md(sweeps: list[dict], out_dir: pathlib.Path) -> list[str]:
  """speed.md's sweep sections (one per swept quantity measured); draws their plots."""
  from benchmarks import report

  md = []
  for name, label, logx in (("batch", "batch (queries per call)", True),
                            ("k_pool", "K_pool (M = 5)", False),
                            ("max_size", "M (K_pool = 20)", False),
                            ("dim", "embedding dim (0: ℓ and G_m given)", False)):
    rows = [r for r in sweeps if r["sweep"] == name]
    if not rows:
      continue
    md += [f"## Sweep: {name}\n", report.sweep_md(rows, name), ""]
    report.plot_sweep(rows, name, out_dir / f"speed_sweep_{name}.png", label, logx)
    md.append(f"![{name}](speed_sweep_{name}.png)\n")
  return md


def _end_to_end_md(results) -> list[str]:
  """speed.md's end-to-end section: prepared, reference and encoder-included rows."""
  prep_s = results["end_to_end"][0]["prepare_s"]
  md = ["## End to end (N = 13,860, d = 768, K1 = 15, K_pool = 20, M = 5)\n",
        "Encoder excluded, from query embeddings. `prepared` is what `hyset predict` runs "
        "(`hyset bench e2e`); the dense pass is a top-K_pool of ℓ over the same library, "
        "timed interleaved with it; `reference` is `pipeline.predict` from θ (full "
        f"expansion scan, G_m per query). Preparing the library (P Zᵀ, Z M_m and the "
        f"neighbour table, once per model) took {prep_s:.1f} s.\n",
        "| kind | batch | ms / query | dense ms / query | × dense | queries/s | compile s |",
        "|---|---:|---:|---:|---:|---:|---:|"]
  for r in results["end_to_end"]:
    md.append(f"| {r['kind']} | {r['batch']} | {r['ms_per_query']:.3f} | "
              f"{r['dense_ms_per_query']:.3f} | {r['ratio_to_dense']:.2f} | "
              f"{r['queries_per_s']:,.0f} | {r['compile_s']:.1f} |")
  for r in results.get("reference", []):
    md.append(f"| {r['kind']} | {r['batch']} | {r['ms_per_query']:.3f} | | | "
              f"{r['queries_per_s']:,.0f} | |")
  enc = results["encoder_included"]
  if isinstance(enc, str):
    md.append(f"| encoder included | | {enc} | | | | |")
  else:
    for r in enc:
      md.append(f"| encoder included ({r['encoder']}; encoder alone "
                f"{r['encode_ms_per_query']:.2f} ms/query) | {r['batch']} | "
                f"{r['ms_per_query']:.3f} | | | {r['queries_per_s']:,.0f} | |")
  md.append("")
  return md


def _training_md(tr: dict) -> list[str]:
  """speed.md's training-step section."""
  md = ["## Training step (fake CPU devices share the same cores: a correctness check of "
        "the sharded step, not a speed-up)\n"]
  if tr.get("status") != "ok":
    md.append(tr.get("status", "not run") + "\n")
  else:
    md += ["| devices | batch | K_neg | examples/s | step s | compile s | peak MiB/device |",
           "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in tr["rows"]:
      md.append(f"| {r['devices']} | {r['batch']} | {r['k_neg']} | {r['examples_per_s']:,.0f} "
                f"| {r['step_s']:.3f} | {r['compile_s']:.1f} | "
                f"{r['peak_bytes_per_device'] / 2**20:,.0f} |")
    md.append("")
  return md


if __name__ == "__main__":
  sys.exit(main())
