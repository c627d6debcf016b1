"""Killed jobs and broken checkpoints lose nothing (a real subprocess and a real SIGKILL)."""
import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

from hyset_jax.training import train

from hyset_jax.testing import small_config, synthetic_data

def run_worker(workdir, kill_at_step=None):
  """``python -m hyset_jax.testing WORKDIR`` (40 synthetic steps, a checkpoint every 5)."""
  proc = subprocess.Popen([sys.executable, "-m", "hyset_jax.testing", str(workdir)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  if kill_at_step is None:
    assert proc.wait(timeout=300) == 0, proc.stderr.read()
    return None
  log = pathlib.Path(workdir) / "metrics.jsonl"
  deadline = time.time() + 300
  while time.time() < deadline and proc.poll() is None:
    if log.exists() and sum(1 for _ in log.open()) >= kill_at_step:
      break
    time.sleep(0.02)
  assert proc.poll() is None, "the worker ended before it could be killed"
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  return proc.returncode


def metrics_rows(workdir):
  rows = [json.loads(x) for x in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()]
  for r in rows:
    r.pop("examples_per_s", None)  # wall-clock, not a result
  return rows


@pytest.mark.heavy
def test_sigkill_at_a_random_step_then_restart_matches_uninterrupted(tmp_path):
  run_worker(tmp_path / "clean")
  k = random.Random().randint(7, 33)
  assert run_worker(tmp_path / "killed", kill_at_step=k) == -signal.SIGKILL
  assert not (tmp_path / "killed" / "final").exists()
  run_worker(tmp_path / "killed")   # the same command again
  a = load_file(str(tmp_path / "clean" / "final" / "params.safetensors"))
  b = load_file(str(tmp_path / "killed" / "final" / "params.safetensors"))
  for name in a:
    np.testing.assert_array_equal(a[name], b[name], err_msg=f"{name} (killed at step ~{k})")
  assert metrics_rows(tmp_path / "clean") == metrics_rows(tmp_path / "killed")


@pytest.mark.heavy
def test_corrupted_newest_checkpoint_falls_back_with_a_warning(tmp_path, caplog, capfd):
  data = synthetic_data()
  config = small_config(num_steps=12, checkpoint_every=4)
  train.train_and_evaluate(config, tmp_path / "clean", data=data, progress=False,
                           num_devices=1)
  out = train.train_and_evaluate(config, tmp_path / "broken", data=data, progress=False,
                                 stop_after=10, num_devices=1)
  assert out == {"interrupted_at": 10}
  newest = tmp_path / "broken" / "checkpoints" / "10"
  # Only the array data: the metadata still parses, so Orbax starts reading (TensorStore) and
  # fails mid-way — the case that used to print a traceback per pending read.
  for f in newest.rglob("*"):
    if f.is_file() and f.stat().st_size > 0 and f.parent.name == "d":
      f.write_bytes(b"\0garbage" * 4)
  capfd.readouterr()
  with caplog.at_level("WARNING", logger="hyset_jax.training.train"):
    train.train_and_evaluate(config, tmp_path / "broken", data=data, progress=False,
                             num_devices=1)
  assert any("step 10" in r.getMessage() and "unreadable" in r.getMessage()
             for r in caplog.records)
  err = capfd.readouterr().err
  assert "Traceback" not in err and "Event loop is closed" not in err
  a = load_file(str(tmp_path / "clean" / "final" / "params.safetensors"))
  b = load_file(str(tmp_path / "broken" / "final" / "params.safetensors"))
  for name in a:
    np.testing.assert_array_equal(a[name], b[name])


def test_unwritable_workdir_fails_before_training(tmp_path):
  import pytest
  from hyset_jax.errors import UserError
  locked = tmp_path / "locked"
  locked.mkdir()
  (locked / "file").write_text("x")
  with pytest.raises(UserError, match="workdir .*is not a writable folder"):
    train.train_and_evaluate(small_config(), locked / "file" / "run", data=synthetic_data(),
                             progress=False)
  shutil.rmtree(locked)
