"""A rank killed mid-step in a 2-process run, then the same command again.

Three runs of ``launch/local.py -n 2`` (jax.distributed over 127.0.0.1) of the synthetic
training script (``tests/distributed_train_script.py``): an uninterrupted one; one whose rank
``--rank`` gets SIGKILL once training has written checkpoint ``--kill-after`` — the launcher
must stop the survivor and exit non-zero, naming the dead rank, within ``--grace`` plus a
margin; and the same command again, which must resume from the newest checkpoint and end with
the uninterrupted run's parameters and metrics. Too slow for ``make test`` (three 2-process
runs); tests/test_launch.py kills a rank without the resume.

  python -m benchmarks.kill_rank_resume [--steps 24] [--rank 1] [--json FILE]

Exit status 1 when a check fails; ``--json`` keeps the record (with provenance).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
from safetensors.numpy import load_file

from benchmarks import provenance

REPO = pathlib.Path(__file__).resolve().parents[1]
LAUNCHER = REPO / "launch" / "local.py"
SCRIPT = REPO / "tests" / "distributed_train_script.py"


def launch(workdir: pathlib.Path, steps: int, logdir: pathlib.Path,
           grace: float) -> subprocess.Popen:
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO), "XLA_FLAGS": ""}
  env.pop("JAX_COORDINATOR_ADDRESS", None)
  # The script with INFO logging on, so that each rank's log says where it resumed from.
  run = ("import logging, runpy, sys; logging.basicConfig(level=logging.INFO); "
         f"sys.argv = [{str(SCRIPT)!r}, *sys.argv[1:]]; "
         f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')")
  return subprocess.Popen([sys.executable, str(LAUNCHER), "--logdir", str(logdir), "-n", "2",
                           "--grace", str(grace), "--", "python", "-c", run, str(workdir),
                           str(steps)], env=env, cwd=REPO, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def rank_pids(proc: subprocess.Popen, lines: list[str], timeout: float = 120) -> list[int]:
  """The rank pids the launcher prints (``launch: rank pids 0:PID 1:PID``)."""
  end = time.monotonic() + timeout
  while time.monotonic() < end:
    line = proc.stdout.readline()
    lines.append(line)
    if line.startswith("launch: rank pids"):
      return [int(x.split(":")[1]) for x in line.split()[3:]]
    if not line and proc.poll() is not None:
      break
  raise SystemExit("the launcher never reported its rank pids:\n" + "".join(lines))


def complete_steps(workdir: pathlib.Path) -> list[int]:
  folder = workdir / "checkpoints"
  return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() \
      else []


def alive(pid: int) -> bool:
  try:
    return pathlib.Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
  except OSError:
    return False


def rows(workdir: pathlib.Path) -> list[dict]:
  out = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
  for r in out:
    r.pop("examples_per_s", None)  # wall-clock, not a result
  return out


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--steps", type=int, default=24)
  p.add_argument("--kill-after", type=int, default=8,
                 help="kill once this checkpoint step is complete (checkpoints every 4 steps)")
  p.add_argument("--rank", type=int, choices=(0, 1), default=1, help="the rank killed")
  p.add_argument("--grace", type=float, default=5.0, help="launcher --grace, s")
  p.add_argument("--json", help="write the record here")
  args = p.parse_args(argv)
  checks: dict[str, bool] = {}
  record: dict = {"steps": args.steps, "rank_killed": args.rank}
  with tempfile.TemporaryDirectory(prefix="kill-rank-") as tmp:
    tmp = pathlib.Path(tmp)
    t0 = time.monotonic()
    clean = launch(tmp / "clean", args.steps, tmp / "logs-clean", args.grace)
    out = clean.communicate(timeout=900)[0]
    if clean.returncode != 0:
      raise SystemExit(f"the uninterrupted run failed:\n{out[-3000:]}")
    record["clean_run_s"] = round(time.monotonic() - t0, 1)

    killed, lines = launch(tmp / "killed", args.steps, tmp / "logs-killed", args.grace), []
    pids = rank_pids(killed, lines)
    end = time.monotonic() + 600
    while not [s for s in complete_steps(tmp / "killed") if s >= args.kill_after]:
      if killed.poll() is not None or time.monotonic() > end:
        raise SystemExit("the run ended before it could be killed:\n" + "".join(lines)
                         + killed.stdout.read())
      time.sleep(0.05)
    record["killed_after_checkpoint"] = complete_steps(tmp / "killed")[-1]
    os.kill(pids[args.rank], signal.SIGKILL)
    t_kill = time.monotonic()
    try:
      rest = killed.communicate(timeout=args.grace + 60)[0]
    except subprocess.TimeoutExpired:
      killed.kill()
      rest = killed.communicate()[0]
    record["stop_s"] = round(time.monotonic() - t_kill, 2)
    said = [line for line in (lines + rest.splitlines(True))
            if f"rank {args.rank} exited with code -9" in line]
    record["launcher_line"] = said[0].strip() if said else None
    checks["launcher exits non-zero"] = killed.returncode not in (0, None)
    checks["the launcher names the dead rank"] = bool(said)
    checks["stopped within grace + 60 s"] = record["stop_s"] < args.grace + 60
    checks["no rank left running"] = not any(alive(pid) for pid in pids)

    t0 = time.monotonic()
    again = launch(tmp / "killed", args.steps, tmp / "logs-again", args.grace)
    out = again.communicate(timeout=900)[0]
    record["resume_run_s"] = round(time.monotonic() - t0, 1)
    checks["the same command again succeeds"] = again.returncode == 0
    log0 = (tmp / "logs-again" / "rank0.log").read_text() if (
        tmp / "logs-again" / "rank0.log").exists() else out
    resumed = [line for line in log0.splitlines() if "resumed from step" in line]
    record["resumed"] = resumed[0].split("resumed from")[-1].strip() if resumed else None
    checks["it resumed from a checkpoint"] = bool(resumed)
    if again.returncode == 0:
      a = load_file(str(tmp / "clean" / "final" / "params.safetensors"))
      b = load_file(str(tmp / "killed" / "final" / "params.safetensors"))
      diff = max(float(np.max(np.abs(a[k] - b[k]))) for k in a)
      record["max_abs_param_diff"] = diff
      checks["final parameters = the uninterrupted run's"] = diff <= 1e-6 and a.keys() == b.keys()
      checks["metrics = the uninterrupted run's"] = rows(tmp / "clean") == rows(tmp / "killed")
  record["checks"] = checks
  for name, ok in checks.items():
    print(f"{'ok ' if ok else 'FAIL'} {name}")
  print(json.dumps({k: v for k, v in record.items() if k != "checks"}))
  if args.json:
    provenance.write_json(args.json, record)
  return 0 if all(checks.values()) else 1


if __name__ == "__main__":
  sys.exit(main())
