"""launch/: multi-process runs equal single-process ones (also with Z sharded over ``tools``);
dead or missing ranks and Ctrl-C stop the whole job within a bounded time; the SLURM, Kubernetes
and TPU VM templates run here by simulation (stand-in srun / gcloud, local processes)."""
import importlib.util
import json
import os
import pathlib
import random
import signal
import socket
import stat
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


@pytest.fixture(scope="session")
def two_device_reference(tmp_path_factory, worker_id):
  """The reference of the multi-process tests: one process on two devices (the same 2-way data
  mesh), 8 steps of the synthetic config. Trained once per test run: the xdist workers share it
  through a lock in their common temporary folder. Returns (workdir, its JSON summary line)."""
  import filelock
  base = tmp_path_factory.getbasetemp()
  root = base if worker_id == "master" else base.parent
  workdir, out = root / "two-device-reference", root / "two-device-reference.out"
  with filelock.FileLock(str(root / "two-device-reference.lock")):
    if not out.exists():
      run = subprocess.run([sys.executable, str(SCRIPT), str(workdir), "8"], cwd=REPO, text=True,
                           env=_env(XLA_FLAGS="--xla_force_host_platform_device_count=2"),
                           capture_output=True, timeout=300)
      assert run.returncode == 0, run.stdout + run.stderr
      out.write_text(run.stdout)
  return workdir, out.read_text()


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


@pytest.mark.heavy
def test_two_processes_equal_one_process_and_resume(tmp_path, two_device_reference):
  """Same global batch of 16 on a 2-device mesh: one process with two devices, or two
  processes with one each (interrupted after 4 steps and resumed) — the same θ."""
  one, out1 = two_device_reference
  assert '"processes": 1, "devices": 2' in out1
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
  for name in ("final", "best"):
    a, b = read_params(one / name), read_params(multi / name)
    for k in a:
      np.testing.assert_allclose(a[k], b[k], atol=1e-5, err_msg=f"{name}/{k}")
  # Process 0 alone wrote the logs and exports; both ranks logged to their own files.
  rows = [json.loads(r) for r in (multi / "metrics.jsonl").read_text().splitlines()]
  # The header, then the steps, then the ranking chosen at the end.
  assert [r["step"] for r in rows if "ranking" not in r] == [-1, 0, 2, 4, 6, 8]
  assert "interrupted_at" in (tmp_path / "logs1" / "rank1.log").read_text()


@pytest.mark.heavy
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
      "from hyset_jax.training.sharding import maybe_initialize_distributed\n"
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


@pytest.mark.heavy
def test_two_processes_of_four_devices_with_z_sharded_equal_one_device(tmp_path):
  """2 processes x 4 devices on mesh (data=2, tools=4) — Z split over each process's devices,
  gathered across hosts for evaluation and export — equal one process on one device. With the
  presets' shortlist negatives: every process builds its rows from the batch's shortlist
  (pipeline.shortlist_distinct reads S0 on the host)."""
  negatives = ["--set", "train.shortlist_negatives=0.4"]
  single = subprocess.Popen(
      [sys.executable, str(SCRIPT), str(tmp_path / "one"), "8", *negatives], cwd=REPO, text=True,
      env=_env(XLA_FLAGS="--xla_force_host_platform_device_count=1"),
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  multi = tmp_path / "two"
  proc = launch(["-n", "2", "--devices-per-process", "4", "--timeout", "240", "--", "python",
                 str(SCRIPT), str(multi), "8", "--set", "mesh.tools=4", *negatives],
                tmp_path / "logs",
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  out = proc.communicate(timeout=300)[0]
  assert proc.returncode == 0, out
  assert '"processes": 2, "devices": 8' in out and '"steps": 8' in out
  out1 = single.communicate(timeout=300)[0]
  assert single.returncode == 0, out1
  for name in ("final", "best"):
    a, b = read_params(tmp_path / "one" / name), read_params(multi / name)
    for k in a:
      np.testing.assert_allclose(a[k], b[k], atol=1e-5, err_msg=f"{name}/{k}")
  header = json.loads((multi / "metrics.jsonl").read_text().splitlines()[0])
  assert header["memory"]["mesh"] == {"data": 2, "tools": 4}


# ------------------------------------------------------------------ cluster templates, simulated

def _executable(path, text):
  path.write_text(text)
  path.chmod(path.stat().st_mode | stat.S_IEXEC)


def stand_in_bin(tmp_path):
  """A bin/ folder with the commands the templates call, standing in for a cluster's:

  - ``hyset``: tests/distributed_train_script.py, which takes ``hyset train``'s arguments and
    trains the synthetic 8-step config (the templates' own --config/--data are ignored);
  - ``srun``: runs its command as $SLURM_NTASKS local tasks with the variables srun sets per
    task, and fails as a whole when one task fails (--kill-on-bad-exit);
  - ``gcloud``: records its arguments; ``ssh --command`` of a ``--dry-run`` is run here.
  """
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  _executable(bin_dir / "hyset", f'#!/bin/sh\nexec "{sys.executable}" "{SCRIPT}" "$@"\n')
  _executable(bin_dir / "srun", """#!/bin/bash
while [[ "${1:-}" == --* ]]; do shift; done   # srun's own options
pids=()
for ((i = 0; i < SLURM_NTASKS; i++)); do
  SLURM_PROCID=$i SLURM_LOCALID=$i SLURM_STEP_NODELIST=$SLURM_JOB_NODELIST SLURM_STEPID=0 \
    SLURM_STEP_NUM_NODES=1 SLURM_STEP_NUM_TASKS=$SLURM_NTASKS "$@" > "$SRUN_LOGDIR/task$i.log" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || { rc=$?; kill "${pids[@]}" 2>/dev/null; }; done
exit $rc
""")
  _executable(bin_dir / "gcloud", """#!/bin/bash
printf '%s\n' "$*" >> "$GCLOUD_LOG"
for a in "$@"; do
  case $a in
    --command=*--dry-run*) cmd=${a#--command=}; exec bash -c "${cmd//HYSET_DISTRIBUTED=auto/}";;
  esac
done
""")
  return bin_dir


def _slurm_job_id():
  """A job id whose SLURM-derived coordinator port (JAX: 61440 + id % 4096) is free now."""
  for _ in range(100):
    job = random.randrange(1, 10 ** 6)
    with socket.socket() as s:
      try:
        s.bind(("127.0.0.1", job % 4096 + 61440))
        return job
      except OSError:
        continue
  raise AssertionError("no free port in JAX's SLURM range")


def _run_k8s(tmp_path, bin_dir):
  """The Indexed Job's pods as local processes: the manifest's command, args and env; pod i gets
  JOB_COMPLETION_INDEX=i. Kubernetes' parts are simulated: the headless service's DNS name of
  pod 0 becomes 127.0.0.1 (a free port), the volumes are folders under tmp_path."""
  import yaml
  _, job = yaml.safe_load_all((REPO / "launch" / "k8s_indexed_job.yaml").read_text())
  pod = job["spec"]["template"]["spec"]
  container = pod["containers"][0]
  env = _env(PATH=f"{bin_dir}:{os.environ['PATH']}",
             XLA_FLAGS="--xla_force_host_platform_device_count=1")
  env.update({e["name"]: str(e["value"]) for e in container["env"]})
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  env["JAX_COORDINATOR_ADDRESS"] = f"127.0.0.1:{port}"
  mounts = {m["mountPath"]: tmp_path / "k8s" / m["name"] for m in container["volumeMounts"]}
  args = [a for a in container["args"]]
  for mount, local in mounts.items():
    local.mkdir(parents=True, exist_ok=True)
    args = [a.replace(f"{mount}/", f"{local}/") for a in args]
  pods = [subprocess.Popen(container["command"] + args, cwd=REPO, text=True,
                           env=dict(env, JOB_COMPLETION_INDEX=str(i)),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
          for i in range(job["spec"]["parallelism"])]
  outs = [p.communicate(timeout=300)[0] for p in pods]
  for p, out in zip(pods, outs):
    assert p.returncode == 0, out
  workdir = next(a for a in args[0].split() if a.startswith(str(mounts["/runs"])))
  return pathlib.Path(workdir), outs


@pytest.mark.heavy
def test_slurm_and_kubernetes_templates_train_like_the_local_launcher(tmp_path,
                                                                     two_device_reference):
  """slurm.sbatch under a stand-in srun (2 tasks, JAX's own SLURM detection through
  HYSET_DISTRIBUTED=auto) and the Indexed Job's pods give launch/local.py -n 2's parameters.

  The reference is one process on two devices (the same 2-way data mesh), which
  test_two_processes_equal_one_process_and_resume shows equals launch/local.py -n 2."""
  bin_dir = stand_in_bin(tmp_path)
  local, _ = two_device_reference

  (tmp_path / "srun").mkdir()
  slurm = subprocess.run(
      ["bash", str(REPO / "launch" / "slurm.sbatch")], cwd=tmp_path, text=True, timeout=300,
      capture_output=True,
      env=_env(PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_ID=str(_slurm_job_id()),
               SLURM_JOB_NAME="hyset-train", SLURM_NTASKS="2", SLURM_JOB_NODELIST="localhost",
               SLURM_SUBMIT_DIR=str(REPO), SRUN_LOGDIR=str(tmp_path / "srun"),
               WORKDIR=str(tmp_path / "slurm"), HYSET="hyset", CONFIG="tiny",
               XLA_FLAGS="--xla_force_host_platform_device_count=1"))
  logs = "\n".join(p.read_text() for p in sorted((tmp_path / "srun").iterdir()))
  assert slurm.returncode == 0, slurm.stderr + logs
  assert '"process": 1, "processes": 2' in logs  # JAX found both tasks from SLURM_* alone

  k8s_workdir, outs = _run_k8s(tmp_path, bin_dir)
  assert '"process": 1, "processes": 2' in "".join(outs)

  for workdir in (tmp_path / "slurm", k8s_workdir):
    for name in ("final", "best"):
      a, b = read_params(local / name), read_params(workdir / name)
      for k in a:
        np.testing.assert_allclose(a[k], b[k], atol=1e-5, err_msg=f"{workdir} {name}/{k}")


@pytest.mark.heavy
def test_tpu_vm_script_dry_run(tmp_path):
  """tpu_vm.sh against a stand-in gcloud: the commands it sends, and its dry-run command run
  here (one worker, CPU devices) compiling the step and printing the per-device memory."""
  bin_dir = stand_in_bin(tmp_path)
  log = tmp_path / "gcloud.log"
  env = _env(PATH=f"{bin_dir}:{os.environ['PATH']}", TPU_NAME="my-tpu", ZONE="us-west4-a",
             GCLOUD_LOG=str(log), REMOTE_DIR=str(REPO), CONFIG="tiny",
             HYSET=f"{sys.executable} -m hyset_jax.cli")
  env.pop("XLA_FLAGS", None)
  # Over budget: the report is printed, then exit 2 names what does not fit.
  out = subprocess.run(["bash", str(REPO / "launch" / "tpu_vm.sh"), "dry-run", "--devices", "4",
                        "--num-tools", "4000", "--set", "mesh.tools=4", "--set",
                        "mesh.memory_per_device_gb=0.001"], env=env, cwd=REPO,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 2, out.stderr
  assert "mesh: data=1 x tools=4 = 4 cpu device(s)" in out.stdout
  assert "parameters" in out.stdout and "FLOPs per step" in out.stdout
  assert "more than mesh.memory_per_device_gb=0.001" in out.stderr
  subprocess.run(["bash", str(REPO / "launch" / "tpu_vm.sh"), "train", "--set", "mesh.tools=4"],
                 env=dict(env, WORKDIR="/mnt/runs/x"), cwd=REPO, check=True, timeout=60)
  calls = log.read_text().splitlines()
  assert calls[0].startswith("compute tpus tpu-vm ssh my-tpu --zone=us-west4-a --worker=all")
  train_call = " ".join(calls[-1].split())
  assert "--worker=all" in train_call and "HYSET_DISTRIBUTED=auto" in train_call
  assert "train --config tiny --workdir /mnt/runs/x --no-progress --set mesh.tools=4" in train_call
  bad = subprocess.run(["bash", str(REPO / "launch" / "tpu_vm.sh"), "nonsense"], env=env,
                       capture_output=True, text=True)
  assert bad.returncode == 2 and "usage" in bad.stderr
