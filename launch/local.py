#!/usr/bin/env python3
"""Run one command as N ``jax.distributed`` processes on this machine (127.0.0.1).

    python launch/local.py --num-processes 2 [--devices-per-process 4] -- hyset train --config tiny --workdir runs/tiny

Every rank gets the environment ``hyset_jax.training.sharding.maybe_initialize_distributed`` reads:

  JAX_COORDINATOR_ADDRESS  127.0.0.1:<a free port>   (rank 0 hosts the coordinator)
  JAX_NUM_PROCESSES        N
  JAX_PROCESS_ID           0..N-1
  HYSET_INIT_TIMEOUT_S     --init-timeout (how long a rank waits for its peers)
  XLA_FLAGS                --xla_force_host_platform_device_count=K (K fake CPU devices a rank)
  JAX_PLATFORMS            cpu (unless already set)

Each rank is a subprocess in its own process group, with its output in ``<logdir>/rank<i>.log``;
rank 0's output is also shown here, prefixed ``[0]`` (``--show-all`` shows every rank).

A missing or dead peer never hangs the job: ``jax.distributed.initialize`` aborts a rank whose
peers do not arrive within the init timeout, and as soon as any rank exits non-zero the others
get SIGTERM, then SIGKILL after ``--grace`` seconds, and the launcher exits with that rank's
code. Ctrl-C (or SIGTERM to the launcher) stops every rank the same way. Only the standard
library is used, so the launcher itself never imports JAX.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

POLL_S = 0.1


def free_port() -> int:
  """A TCP port free on 127.0.0.1 right now (the coordinator binds it a moment later)."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def with_device_count(xla_flags: str, count: int) -> str:
  """``xla_flags`` with its host-platform device count set to ``count``."""
  rest = re.sub(r"--xla_force_host_platform_device_count=\S+", "", xla_flags).split()
  return " ".join(rest + [f"--xla_force_host_platform_device_count={count}"])


def resolve_command(command: list[str]) -> list[str]:
  """``python``/``python3`` and ``hyset`` mean the launcher's own interpreter and its
  environment's ``hyset``, so ``.venv/bin/python launch/local.py -- hyset …`` works without an
  activated venv; any other command runs as given."""
  if command[0] in ("python", "python3"):
    return [sys.executable] + command[1:]
  if command[0] == "hyset":
    beside = pathlib.Path(sys.executable).parent / "hyset"
    if beside.is_file():
      return [str(beside)] + command[1:]
    if shutil.which("hyset") is None:
      return [sys.executable, "-m", "hyset_jax.cli"] + command[1:]
  return command


def rank_env(base: dict[str, str], rank: int, num: int, port: int, devices: int,
             init_timeout: int) -> dict[str, str]:
  env = dict(base)
  env.update(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES=str(num),
             JAX_PROCESS_ID=str(rank), HYSET_INIT_TIMEOUT_S=str(init_timeout),
             XLA_FLAGS=with_device_count(base.get("XLA_FLAGS", ""), devices),
             PYTHONUNBUFFERED="1")
  env.setdefault("JAX_PLATFORMS", "cpu")
  return env


class Rank:
  """One rank: its process (own process group) and a thread copying its output to the log."""

  def __init__(self, index: int, command: list[str], env: dict[str, str], log_path: pathlib.Path,
               echo: bool):
    self.index = index
    self.log_path = log_path
    self.log = open(log_path, "wb")
    self.proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
    self.thread = threading.Thread(target=self._pump, args=(echo,), daemon=True)
    self.thread.start()

  def _pump(self, echo: bool) -> None:
    prefix = f"[{self.index}] ".encode()
    for line in iter(self.proc.stdout.readline, b""):
      self.log.write(line)
      self.log.flush()
      if echo:
        sys.stdout.buffer.write(prefix + line)
        sys.stdout.buffer.flush()
    self.proc.stdout.close()

  def signal(self, sig: int) -> None:
    try:
      os.killpg(self.proc.pid, sig)  # the rank and anything it started
    except (ProcessLookupError, PermissionError):
      pass

  def close(self) -> None:
    self.thread.join(timeout=5)
    self.log.close()

  def tail(self, lines: int = 20) -> str:
    text = self.log_path.read_text(errors="replace").splitlines()
    return "\n".join(f"[{self.index}] {t}" for t in text[-lines:])


def exit_code(returncode: int) -> int:
  """A shell-style code: 128 + signal for a rank killed by a signal."""
  return 128 - returncode if returncode < 0 else returncode


def stop_all(ranks: list[Rank], grace: float) -> None:
  """SIGTERM every live rank, then SIGKILL what is still alive after ``grace`` seconds."""
  live = [r for r in ranks if r.proc.poll() is None]
  for r in live:
    r.signal(signal.SIGTERM)
  deadline = time.monotonic() + grace
  while time.monotonic() < deadline and any(r.proc.poll() is None for r in live):
    time.sleep(POLL_S)
  for r in live:
    if r.proc.poll() is None:
      r.signal(signal.SIGKILL)
  for r in live:
    r.proc.wait()


def parse_args(argv: list[str]) -> argparse.Namespace:
  p = argparse.ArgumentParser(
      prog="launch/local.py", description=__doc__.split("\n\n")[0],
      usage="%(prog)s --num-processes N [options] -- COMMAND ...")
  p.add_argument("--num-processes", "-n", type=int, required=True)
  p.add_argument("--devices-per-process", type=int, default=1,
                 help="fake CPU devices per rank (XLA host platform device count); default 1")
  p.add_argument("--logdir", help="where rank<i>.log go (default: a new temporary folder)")
  p.add_argument("--port", type=int, default=0, help="coordinator port (default: a free one)")
  p.add_argument("--init-timeout", type=int, default=60,
                 help="seconds a rank waits for its peers in jax.distributed.initialize")
  p.add_argument("--grace", type=float, default=10.0,
                 help="seconds between SIGTERM and SIGKILL when stopping ranks")
  p.add_argument("--timeout", type=float, default=0,
                 help="stop everything after this many seconds (0: no limit)")
  p.add_argument("--show-all", action="store_true", help="echo every rank's output, not only rank 0")
  p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command each rank runs")
  args = p.parse_args(argv)
  if args.command[:1] == ["--"]:
    args.command = args.command[1:]
  if not args.command:
    p.error("give the command to run after --, e.g. -- hyset train --config tiny --workdir runs/x")
  if args.num_processes < 1 or args.devices_per_process < 1:
    p.error("--num-processes and --devices-per-process must be ≥ 1")
  return args


def main(argv: list[str] | None = None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  logdir = pathlib.Path(args.logdir or tempfile.mkdtemp(prefix="hyset-launch-"))
  logdir.mkdir(parents=True, exist_ok=True)
  port = args.port or free_port()
  command = resolve_command(args.command)
  n = args.num_processes
  print(f"launch: {n} processes x {args.devices_per_process} device(s), coordinator "
        f"127.0.0.1:{port}, logs in {logdir}", flush=True)

  # Ctrl-C / SIGTERM to the launcher: stop every rank (they are in their own process groups,
  # so a terminal's Ctrl-C reaches only us).
  stop_requested: list[int] = []

  def on_signal(signum, _frame):
    stop_requested.append(signum)
  old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}

  ranks: list[Rank] = []
  code = 0
  try:
    for i in range(n):
      env = rank_env(os.environ, i, n, port, args.devices_per_process, args.init_timeout)
      ranks.append(Rank(i, command, env, logdir / f"rank{i}.log", echo=args.show_all or i == 0))
    print("launch: rank pids " + " ".join(f"{r.index}:{r.proc.pid}" for r in ranks), flush=True)
    started = time.monotonic()
    while True:
      if stop_requested:
        print(f"launch: got signal {stop_requested[0]}; stopping all ranks", file=sys.stderr)
        code = 130 if stop_requested[0] == signal.SIGINT else 143
        break
      failed = [r for r in ranks if r.proc.poll() not in (None, 0)]
      if failed:
        first = failed[0]
        code = exit_code(first.proc.returncode) or 1
        others = [r.index for r in ranks if r.proc.poll() is None]
        print(f"launch: rank {first.index} exited with code {first.proc.returncode}; "
              f"stopping ranks {others}", file=sys.stderr)
        if first.index != 0 and not args.show_all:
          first.thread.join(timeout=2)
          print(first.tail(), file=sys.stderr)
        break
      if all(r.proc.poll() == 0 for r in ranks):
        break
      if args.timeout and time.monotonic() - started > args.timeout:
        print(f"launch: --timeout {args.timeout:g}s reached; stopping all ranks", file=sys.stderr)
        code = 124
        break
      time.sleep(POLL_S)
  finally:
    stop_all(ranks, args.grace)
    for r in ranks:
      r.close()
    for s, h in old.items():
      signal.signal(s, h)
  if code:
    print(f"launch: failed (exit {code}); logs in {logdir}", file=sys.stderr)
  return code


if __name__ == "__main__":
  sys.exit(main())
