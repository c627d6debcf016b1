"""One-core timing of the native stage-2 kernel alone, before/after comparisons included.

  python -m benchmarks.native_stage2 [--compare REV ...] [--rounds 3] [--json FILE] [--force]
      [--model DIR --config NAME]

Compiles benchmarks/native/stage2_timing.cc around ``hyset_jax/inference/native/subsets.cc`` (and around
the same file at each git revision given to ``--compare``) with the kernel's own flags, and
runs the builds in turn, ``--rounds`` times, pinned to one core (``taskset -c 0``) when
taskset exists. Each run times, on 1,024 random queries (K_pool = 20, M = 5), the per-group
tables alone and whole groups — tables, the enumeration and the outputs — for the best set
and for every score, best of 20 repeats, in µs per query. No XLA, no thread pool: what the
kernel's code costs, which the shared machine's two-core ratios (``hyset bench enumerate``)
blur by tens of percent. The JSON keeps every run; the Markdown table (stdout) the median per
build.

The best-set output passes over subtrees of subsets whose bound cannot beat a set already
scored (docs/speed.md), so its time depends on the inputs: ``--model DIR --config NAME`` times
the stage-2 inputs (ℓ and G_m of each shortlist) of a trained model directory on the config's
test queries (the first 1,024, repeated when there are fewer) instead of random ones.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile

from benchmarks import provenance

ROOT = pathlib.Path(__file__).resolve().parents[1]
HARNESS = ROOT / "benchmarks" / "native" / "stage2_timing.cc"
KERNEL = ROOT / "hyset_jax" / "inference" / "native" / "subsets.cc"
# Where the kernel lived before the package split (a --compare revision may predate it).
KERNEL_DIRS = ("hyset_jax/inference/native", "hyset_jax/native")
KEYS = ("tables_us_per_query", "best_us_per_query", "scores_us_per_query")


def build(label: str, source: pathlib.Path, workdir: pathlib.Path) -> pathlib.Path:
  """The harness compiled around ``source`` (a subsets.cc beside its parallel.h), from the
  native kernel's build cache when the same compiler, flags and sources built it before (a
  -O3 build takes tens of seconds; ``label`` and ``workdir`` are kept for the caller's names)."""
  import hashlib
  import os
  import tempfile
  import jax
  from hyset_jax.inference import native
  from hyset_jax.errors import UserError

  del label, workdir
  flags = [f for f in native.FLAGS if f not in ("-shared", "-fPIC")]
  try:
    cxx = native._compiler()
  except RuntimeError as e:
    raise UserError(f"cannot build the timing harness: {e}") from None
  key = hashlib.sha256("\0".join([cxx, *flags, jax.ffi.include_dir()]).encode())
  for f in (HARNESS, source, source.with_name("parallel.h")):
    key.update(f.read_bytes() if f.exists() else b"")
  exe = native.cache_dir() / "stage2_harness" / key.hexdigest()[:16] / "stage2"
  if exe.exists():
    return exe
  exe.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=exe.parent)
  os.close(fd)
  try:
    cmd = [cxx, *flags, "-w", "-I", jax.ffi.include_dir(), "-I", str(source.parent),
           f'-DSUBSETS_CC="{source}"', str(HARNESS), "-o", tmp]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
      raise UserError(f"building the timing harness around {source} failed:\n"
                      f"{done.stderr[-2000:]}")
    os.replace(tmp, exe)
  finally:
    if os.path.exists(tmp):
      os.unlink(tmp)
  return exe


QUERIES = 1024


def trained_inputs(model_dir: str, config_name: str, path: pathlib.Path) -> tuple[int, int]:
  """Writes ℓ f32[Q, K] then G f32[Q, M−1, K, K] of the model's shortlists for the config's
  first 1,024 test queries (repeated when fewer) to ``path``; returns (K, M)."""
  import numpy as np
  from hyset_jax import config as config_lib
  from hyset_jax.inference import pipeline
  from hyset_jax.encoder import encode_cached, load_encoder
  from hyset_jax.errors import UserError
  from hyset_jax.io.modeldir import load_model_dir
  from hyset_jax.training.train_data import load_config_dataset

  model = load_model_dir(model_dir)
  if model.query_encoder is None:
    raise UserError(f"{model_dir}: the model directory names no query encoder")
  c = config_lib.resolve(config_name).data
  test = load_config_dataset(c, model.max_set_size).split(c.test_split)
  texts = [test[i % len(test)].text for i in range(QUERIES)]
  emb = encode_cached(load_encoder(model.query_encoder), texts)
  prep = pipeline.prepare(model.params, max_size=model.max_set_size, k_pool=model.k_pool)
  sl = pipeline.shortlist_prepared(prep, model.query_inputs(emb, texts), model.k1,
                                    model.k_pool)
  pairs = pipeline.pair_matrices_prepared(prep, emb, sl.tools)
  with open(path, "wb") as f:
    f.write(np.asarray(sl.logits, np.float32).tobytes())
    f.write(np.asarray(pairs, np.float32).tobytes())
  return model.k_pool, model.max_set_size


def source_at(rev: str, workdir: pathlib.Path) -> pathlib.Path:
  """subsets.cc and parallel.h as they were at git revision ``rev``."""
  from hyset_jax.errors import UserError

  folder = pathlib.Path(tempfile.mkdtemp(prefix="rev_", dir=workdir))
  for name in ("subsets.cc", "parallel.h"):
    for where in KERNEL_DIRS:
      done = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{where}/{name}"],
                            capture_output=True, text=True)
      if done.returncode == 0:
        break
    else:
      raise UserError(f"--compare {rev}: git cannot show {name} in {' or '.join(KERNEL_DIRS)} "
                      f"there ({done.stderr.strip()})")
    (folder / name).write_text(done.stdout)
  return folder / "subsets.cc"


def run(args) -> int:
  from hyset_jax import io_utils
  from hyset_jax.errors import UserError

  if args.rounds < 1:
    raise UserError(f"--rounds must be at least 1, got {args.rounds}")
  if bool(args.model) != bool(args.config):
    raise UserError("--model and --config go together (a trained model directory and the "
                    "config whose test queries it scores)")
  out = io_utils.output_file(args.json, args.force, flag="--json") if args.json else None
  pin = ["taskset", "-c", "0"] if shutil.which("taskset") else []
  results: dict[str, list[dict]] = {}
  with tempfile.TemporaryDirectory(prefix="hyset_stage2_") as tmp:
    workdir = pathlib.Path(tmp)
    sources = {"working tree": KERNEL, **{rev: source_at(rev, workdir) for rev in args.compare}}
    exes = {label: build(f"b{i}", src, workdir) for i, (label, src) in enumerate(sources.items())}
    shape, inputs = ["20", "5"], []
    if args.model:
      k, m = trained_inputs(args.model, args.config, workdir / "inputs.f32")
      shape, inputs = [str(k), str(m)], [str(workdir / "inputs.f32")]
    for r in range(args.rounds):
      for label, exe in exes.items():
        done = subprocess.run([*pin, str(exe), str(QUERIES), *shape, "20", *inputs],
                              capture_output=True, text=True)
        if done.returncode != 0:
          raise UserError(f"the timing harness for {label} failed (exit {done.returncode}):\n"
                          f"{done.stderr[-2000:]}")
        row = json.loads(done.stdout.strip().splitlines()[-1])
        results.setdefault(label, []).append(row)
        print(f"round {r + 1}/{args.rounds} {label}: " +
              ", ".join(f"{k} {row[k]:.2f}" for k in KEYS), file=sys.stderr)
  lines = ["| build | tables µs/query | best set µs/query | every score µs/query | runs |",
           "|---|---:|---:|---:|---:|"]
  for label, rows in results.items():
    med = [statistics.median(r[k] for r in rows) for k in KEYS]
    lines.append(f"| {label} | {med[0]:.2f} | {med[1]:.2f} | {med[2]:.2f} | {len(rows)} |")
  print("\n".join(lines))
  if out is not None:
    provenance.write_json(out, {"pinned": bool(pin), "inputs": args.model or "random",
                                "config": args.config, "runs": results})
  return 0


def main(argv: list[str] | None = None) -> int:
  from hyset_jax import cli
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--compare", nargs="*", default=[], metavar="REV",
                      help="git revisions whose subsets.cc to time beside the working tree's")
  parser.add_argument("--rounds", type=int, default=3, help="runs of each build, in turn")
  parser.add_argument("--json", metavar="FILE", help="write every run here")
  parser.add_argument("--force", action="store_true", help="replace an existing --json file")
  parser.add_argument("--model", metavar="DIR",
                      help="time a trained model directory's stage-2 inputs (with --config)")
  parser.add_argument("--config", metavar="NAME", help="the config whose test queries to use")
  parser.set_defaults(func=run, argv=list(sys.argv[1:] if argv is None else argv))
  return cli.run(parser, argv)


if __name__ == "__main__":
  sys.exit(main())
