"""launch/local.py: multi-process runs equal single-process ones; dead or missing ranks and
Ctrl-C stop the whole job within a bounded time."""
import importlib.util
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
LAUNCHER = REPO / "launch" / "local.py"
SCRIPT = REPO / "tests" / "distributed_train_script.py"


def _launcher_module():
  spec = importlib.util.spec_from_file_location("hyset_launch_local", LAUNCHER)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _env(**extra):
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO), **extra)
  env.pop("JAX_COORDINATOR_ADDRESS", None)
  return env


def launch(args, logdir, **popen):
  return subprocess.Popen([sys.executable, str(LAUNCHER), "--logdir", str(logdir), *args],
                          env=_env(), cwd=REPO, text=True, **popen)


def read_params(path):
  from safetensors.numpy import load_file
  return load_file(str(path / "params.safetensors"))


def wait_for_pids(proc, n, deadline=60):
  """The rank pids the launcher prints, reading its stdout line by line."""
  end = time.monotonic() + deadline
  while time.monotonic() < end:
    line = proc.stdout.readline()
    if line.startswith("launch: rank pids"):
      return [int(x.split(":")[1]) for x in line.split()[3:]][:n]
    if not line and proc.poll() is not None:
      break
  raise AssertionError("the launcher never reported its rank pids")


def alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  # A zombie (exited, not yet reaped by a parent that has gone) counts as dead.
  try:
    return pathlib.Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
  except OSError:
    return False


def test_helpers():
  local = _launcher_module()
  assert local.with_device_count("--xla_force_host_platform_device_count=8 --foo", 2) == \
      "--foo --xla_force_host_platform_device_count=2"
  assert local.resolve_command(["python", "x.py"]) == [sys.executable, "x.py"]
  env = local.rank_env({"XLA_FLAGS": ""}, 1, 3, 1234, 2, 7)
  assert env["JAX_COORDINATOR_ADDRESS"] == "127.0.0.1:1234"
  assert (env["JAX_NUM_PROCESSES"], env["JAX_PROCESS_ID"], env["HYSET_INIT_TIMEOUT_S"]) == \
      ("3", "1", "7")


def test_two_processes_equal_one_process_and_resume(tmp_path):
  """Same global batch of 16 on a 2-device mesh: one process with two devices, or two
  processes with one each (interrupted after 4 steps and resumed) — the same θ."""
  single = subprocess.Popen(
      [sys.executable, str(SCRIPT), str(tmp_path / "one"), "8"], cwd=REPO, text=True,
      env=_env(XLA_FLAGS="--xla_force_host_platform_device_count=2"),
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  multi = tmp_path / "two"
  common = ["-n", "2", "--timeout", "240", "--", "python", str(SCRIPT), str(multi), "8"]
  first = launch(common + ["4"], tmp_path / "logs1", stdout=subprocess.PIPE,
                 stderr=subprocess.STDOUT)
  out = first.communicate(timeout=300)[0]
  assert first.returncode == 0, out
  assert '"processes": 2' in out and '"interrupted_at": 4' in out
  second = launch(common, tmp_path / "logs2", stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  out = second.communicate(timeout=300)[0]
  assert second.returncode == 0, out
  assert '"steps": 8' in out
  out1 = single.communicate(timeout=300)[0]
  assert single.returncode == 0, out1
  assert '"processes": 1, "devices": 2' in out1
  for name in ("final", "best"):
    a, b = read_params(tmp_path / "one" / name), read_params(multi / name)
    for k in a:
      np.testing.assert_allclose(a[k], b[k], atol=1e-5, err_msg=f"{name}/{k}")
  # Process 0 alone wrote the logs and exports; both ranks logged to their own files.
  rows = (multi / "metrics.jsonl").read_text().splitlines()
  assert [int(r.split('"step": ')[1].split(",")[0]) for r in rows] == [0, 2, 4, 6, 8]
  assert "interrupted_at" in (tmp_path / "logs1" / "rank1.log").read_text()


def test_killing_one_rank_stops_the_other(tmp_path):
  workdir = tmp_path / "w"
  proc = launch(["-n", "2", "--grace", "5", "--", "python", str(SCRIPT), str(workdir), "100000"],
                tmp_path / "logs", stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  try:
    pids = wait_for_pids(proc, 2)
    end = time.monotonic() + 120
    while not (workdir / "metrics.jsonl").exists():  # training is under way
      assert proc.poll() is None, proc.stdout.read()
      assert time.monotonic() < end, "training never started"
      time.sleep(0.2)
    os.kill(pids[1], signal.SIGKILL)
    t0 = time.monotonic()
    proc.wait(timeout=60)
    took = time.monotonic() - t0
  finally:
    if proc.poll() is None:
      proc.kill()
  out = proc.stdout.read()
  assert proc.returncode != 0
  assert took < 60
  assert "rank 1 exited with code -9" in out
  assert not alive(pids[0]) and not alive(pids[1])


def test_a_rank_that_never_arrives_does_not_hang(tmp_path):
  script = tmp_path / "late.py"
  script.write_text(
      "import os, sys\n"
      "if os.environ['JAX_PROCESS_ID'] == '1':\n"
      "  sys.exit(0)  # never joins\n"
      "from hyset_jax.sharding import maybe_initialize_distributed\n"
      "maybe_initialize_distributed()\n"
      "print('joined')\n")
  t0 = time.monotonic()
  proc = launch(["-n", "2", "--init-timeout", "3", "--", "python", str(script)], tmp_path / "logs",
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  out = proc.communicate(timeout=90)[0]
  assert proc.returncode != 0, out
  assert "joined" not in out
  assert time.monotonic() - t0 < 60


def test_ctrl_c_stops_every_rank(tmp_path):
  # SIGTERM is ignored by the ranks, so the launcher has to escalate to SIGKILL.
  sleeper = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
  proc = launch(["-n", "2", "--grace", "1", "--", "python", "-c", sleeper], tmp_path / "logs",
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  pids = wait_for_pids(proc, 2)
  time.sleep(0.5)
  proc.send_signal(signal.SIGINT)
  proc.wait(timeout=30)
  assert proc.returncode == 130
  time.sleep(0.2)
  assert not any(alive(p) for p in pids)
  assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["rank0.log", "rank1.log"]


def test_cluster_templates_parse():
  """The SLURM/TPU scripts are valid bash and the Kubernetes manifest is a Service plus an
  Indexed Job wiring the variables train.py reads (none of them can run here)."""
  for script in ("slurm.sbatch", "tpu_vm.sh"):
    subprocess.run(["bash", "-n", str(REPO / "launch" / script)], check=True)
  assert "HYSET_DISTRIBUTED=auto" in (REPO / "launch" / "slurm.sbatch").read_text()
  import yaml  # installed with transformers
  service, job = yaml.safe_load_all((REPO / "launch" / "k8s_indexed_job.yaml").read_text())
  assert service["kind"] == "Service" and service["spec"]["clusterIP"] == "None"
  spec = job["spec"]
  assert spec["completionMode"] == "Indexed" and spec["parallelism"] == spec["completions"]
  pod = spec["template"]["spec"]
  assert pod["subdomain"] == service["metadata"]["name"]
  env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
  host, port = env["JAX_COORDINATOR_ADDRESS"].split(":")
  assert host == f"{job['metadata']['name']}-0.{service['metadata']['name']}"
  assert int(env["JAX_NUM_PROCESSES"]) == spec["parallelism"]
  assert int(port) == pod["containers"][0]["ports"][0]["containerPort"]
  assert 'JAX_PROCESS_ID="$JOB_COMPLETION_INDEX"' in pod["containers"][0]["args"][0]
