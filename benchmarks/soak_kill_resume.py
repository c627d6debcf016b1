"""Soak: kill a training process with SIGKILL at random steps, over and over, then check that
the final parameters and metrics equal an uninterrupted run's.

  python -m benchmarks.soak_kill_resume --cycles 20      (make soak)

The fast single-kill version of this check runs in `make test` (tests/test_faults.py).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
from safetensors.numpy import load_file


def _rows(workdir: pathlib.Path) -> list[dict]:
  rows = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
  for r in rows:
    r.pop("examples_per_s", None)
  return rows


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--cycles", type=int, default=20)
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()
  rng = random.Random(args.seed)
  cmd = [sys.executable, "-m", "hyset_jax.testing", "--steps", str(args.steps)]
  with tempfile.TemporaryDirectory() as tmp:
    clean, killed = pathlib.Path(tmp, "clean"), pathlib.Path(tmp, "killed")
    subprocess.run(cmd + [str(clean)], check=True, stdout=subprocess.DEVNULL)
    kills = 0
    for cycle in range(args.cycles):
      proc = subprocess.Popen(cmd + [str(killed)], stdout=subprocess.DEVNULL)
      time.sleep(rng.uniform(2.0, 8.0))   # process start + a random number of steps
      if proc.poll() is not None:
        break
      proc.send_signal(signal.SIGKILL)
      proc.wait()
      kills += 1
      done = len((killed / "metrics.jsonl").read_text().splitlines()) \
          if (killed / "metrics.jsonl").exists() else 0
      print(f"cycle {cycle + 1}: killed at ~step {done}", flush=True)
    subprocess.run(cmd + [str(killed)], check=True, stdout=subprocess.DEVNULL)
    a = load_file(str(clean / "final" / "params.safetensors"))
    b = load_file(str(killed / "final" / "params.safetensors"))
    same = all(np.array_equal(a[k], b[k]) for k in a) and _rows(clean) == _rows(killed)
  print(f"{kills} kills: final parameters and metrics {'IDENTICAL' if same else 'DIFFER'} "
        f"to the uninterrupted run")
  return 0 if same else 1


if __name__ == "__main__":
  sys.exit(main())
