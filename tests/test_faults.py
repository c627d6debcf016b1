"""Killed jobs, broken checkpoints and injected faults lose nothing: a real SIGKILL, a full
disk (RLIMIT_FSIZE), a read-only folder (a read-only bind mount), a model directory removed
under a running server, SIGTERM during a catalogue update, a clock stepped back."""
import contextlib
import hashlib
import json
import os
import pathlib
import random
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

from hyset_jax.training import train

from hyset_jax.testing import small_config, synthetic_data

import serving
from serving import library, model_dir  # noqa: F401 (fixtures)

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


# --------------------------------------------------------------------------- injected faults
# A full disk, a read-only folder, a model directory removed under a server, SIGTERM during a
# catalogue update, a clock stepped back: the previous state is left byte for byte and the
# error is one line naming the path (exit 2 for a command).

def tree_digest(path):
  """{relative path: sha256} of every file under ``path`` (or of ``path`` itself)."""
  path = pathlib.Path(path)
  files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
  return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@contextlib.contextmanager
def file_size_limit(limit):
  """RLIMIT_FSIZE on this process: a write past ``limit`` bytes of a file fails with EFBIG
  ("File too large") — what a full disk does to the write that needs one more block, without
  a mount (no root). Python ignores SIGXFSZ, so the write raises OSError instead of killing
  the process. The limit is per file: the small files (metrics.jsonl) still fit."""
  soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
  resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
  try:
    yield
  finally:
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def fault_config():
  return small_config(num_steps=12, checkpoint_every=4, eval_every=12)


@pytest.fixture(scope="module")
def interrupted_run(tmp_path_factory):
  """A workdir stopped after 4 of 12 steps: checkpoints/4 and best/ (the step-0 model)."""
  workdir = tmp_path_factory.mktemp("faults") / "run"
  out = train.train_and_evaluate(fault_config(), workdir, data=synthetic_data(), progress=False,
                                 stop_after=4, num_devices=1)
  assert out == {"interrupted_at": 4}
  return workdir


def test_disk_full_while_checkpointing_keeps_the_last_checkpoint(tmp_path, capfd, caplog):
  """Mechanism: RLIMIT_FSIZE (file_size_limit) in this process; Orbax's array files go past
  it, the JSON files (≤ 3.4 kB) do not. With 256 tools Z alone, and each of its Adam moments,
  is 16 kB, so some array file passes the limit however Orbax batches the arrays into files
  (with the fixture's 40 tools each array is 2.5 kB, and a save that, most likely, flushed them in
  small batches fit under the limit: a flake under load). The failed step's partial folder used
  to stay behind with a traceback per writer thread; now: one UserError, step 4
  byte-identical, a rerun resumes from it."""
  from hyset_jax.errors import UserError
  workdir, data = tmp_path / "run", synthetic_data(n_tools=256)
  assert train.train_and_evaluate(fault_config(), workdir, data=data, progress=False,
                                  stop_after=4, num_devices=1) == {"interrupted_at": 4}
  before = tree_digest(workdir / "checkpoints")
  capfd.readouterr()
  with file_size_limit(8000), pytest.raises(UserError) as e:
    train.train_and_evaluate(fault_config(), workdir, data=data, progress=False,
                             num_devices=1)
  message = str(e.value)
  assert message == (f"cannot write checkpoint step 8 in {workdir / 'checkpoints'}: File too "
                     f"large; the last complete checkpoint is step 4, which a rerun resumes "
                     f"from")
  err = capfd.readouterr().err
  assert "Traceback" not in err and "Event loop is closed" not in err, err[-2000:]
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["4"]
  assert tree_digest(workdir / "checkpoints") == before
  with caplog.at_level("INFO", logger="hyset_jax.training.train"):
    out = train.train_and_evaluate(fault_config(), workdir, data=data, progress=False,
                                   num_devices=1)
  assert out["steps"] == 12 and "resumed from step 4" in caplog.messages


def test_disk_full_while_exporting_and_predicting_keeps_the_old_output(tmp_path,
                                                                       interrupted_run,
                                                                       capsys):
  """Mechanism: RLIMIT_FSIZE in this process, around ``hyset export`` and ``hyset predict``
  (cli.main, which turns the UserError into exit 2). The outputs are written beside their
  final name and renamed only when complete (io_utils.atomic_dir / atomic_write)."""
  from hyset_jax import cli
  export, predictions = tmp_path / "export", tmp_path / "predictions.jsonl"
  queries = tmp_path / "queries.npy"
  np.save(queries, synthetic_data().splits["test"].embeddings.astype(np.float32))
  model = str(interrupted_run / "best")
  export_args = ["export", "--workdir", model, "--out", str(export), "--format", "npz"]
  predict_args = ["predict", "--model", model, "--query-embeddings", str(queries),
                  "--out", str(predictions)]
  assert cli.main(export_args) == 0 and cli.main(predict_args) == 0
  kept = {p: tree_digest(p) for p in (export, predictions)}
  capsys.readouterr()
  for args, out, limit in ((export_args, export, 3000), (predict_args, predictions, 2000)):
    assert out.stat().st_size > limit or out.is_dir()
    with file_size_limit(limit):
      code = cli.main([*args, "--force"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.splitlines()[-1] == f"error: cannot write {out}: File too large", err
    assert "Traceback" not in err
    assert tree_digest(out) == kept[out]
  # No temporary file or folder left beside the outputs.
  assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "predictions.jsonl",
                                                        "queries.npy"]


def read_only(folder):
  """A command prefix that runs its command with ``folder`` read-only. As root (whom file
  modes do not stop) a read-only bind mount in a new user and mount namespace (``unshare
  -rm``, no privilege needed); otherwise mode 0555 on the folder."""
  if os.geteuid() != 0:
    folder.chmod(0o555)
    return []
  return ["unshare", "-rm", "sh", "-c",
          'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" "$0" && exec "$@"',
          str(folder)]


def test_read_only_workdir_fails_at_start_and_keeps_the_run(tmp_path, interrupted_run):
  """Mechanism: read_only() (a read-only bind mount as root). ``hyset train`` resuming a run
  in a read-only folder: exit 2 before any work, one line naming the folder, the run's files
  byte-identical. (A new workdir in a read-only folder meets the same check.)"""
  box = tmp_path / "box"
  box.mkdir()
  shutil.copytree(interrupted_run, box / "run")
  before = tree_digest(box)
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
  done = subprocess.run([*read_only(box), sys.executable, "-m", "hyset_jax.cli", "train",
                         "--config", "tiny", "--workdir", str(box / "run")], env=env,
                        capture_output=True, text=True, timeout=300)
  box.chmod(0o755)
  assert done.returncode == 2, done.stderr[-2000:]
  run = box / "run"
  assert done.stderr.strip() == f"error: workdir {run}: {run} is not a writable folder"
  assert tree_digest(box) == before


def test_a_clock_stepped_back_during_training(tmp_path, monkeypatch):
  """Mechanism: time.time monkeypatched to jump back an hour once training is under way (a
  wall clock stepped back by NTP or a resumed VM; no root to set the real clock). Throughput
  used to come out negative (wall-clock durations); the run finishes with positive rates."""
  import time as time_module
  from hyset_jax.training import workdir as workdir_lib
  real, skewed = time_module.time, {"on": False}
  monkeypatch.setattr(time_module, "time", lambda: real() - (3600 if skewed["on"] else 0))
  write = workdir_lib.MetricsLog.write

  def write_then_skew(self, row):
    write(self, row)
    skewed["on"] = skewed["on"] or row.get("step", 0) >= 2

  monkeypatch.setattr(workdir_lib.MetricsLog, "write", write_then_skew)
  out = train.train_and_evaluate(small_config(num_steps=6, eval_every=6), tmp_path / "run",
                                 data=synthetic_data(), progress=False, num_devices=1)
  assert skewed["on"] and out["steps"] == 6 and out["train_seconds_this_run"] >= 0
  rates = [r["examples_per_s"] for r in metrics_rows_raw(tmp_path / "run")
           if "examples_per_s" in r]
  assert len(rates) == 3 and all(r > 0 for r in rates), rates


def metrics_rows_raw(workdir):
  return [json.loads(x) for x in (pathlib.Path(workdir) / "metrics.jsonl").read_text()
          .splitlines()]


FLIGHT = {"id": "book_flight", "name": "book_flight", "description": "Book a flight."}


def test_model_directory_changed_and_removed_under_a_running_server(tmp_path, model_dir,
                                                                    library):
  """Mechanism: the served model directory (a copy) overwritten with garbage, then deleted,
  under the running app (TestClient, lifespan started); then the --persist folder's parent
  deleted. The server answers from memory as before; an update it cannot persist is a 409
  naming ``persist`` (it used to be a 500), the library unchanged; once the folder is back,
  updates persist again."""
  from starlette.testclient import TestClient

  from hyset_jax.io import modeldir
  from hyset_jax.serve.app import create_app
  from hyset_jax.serve.retriever import load_retriever
  served, parent = tmp_path / "served", tmp_path / "live"
  shutil.copytree(model_dir, served)
  parent.mkdir()
  live = parent / "model"
  retriever = load_retriever(str(served), [f"mcp:{library}"], max_batch=8, log=lambda _: None)
  app = create_app(retriever, max_batch=8, max_wait_ms=2, warm_up=False, persist=live)
  query = {"query": serving.QUERIES[0]}
  with TestClient(app, raise_server_exceptions=False) as client:
    first = client.post("/v1/retrieve", json=query).json()
    for f in served.iterdir():
      f.write_bytes(b"garbage")
    assert client.post("/v1/retrieve", json=query).json() == first
    shutil.rmtree(served)
    for cache in tmp_path.glob("served.cache"):  # the neighbour tables beside it, if any
      shutil.rmtree(cache)
    assert client.post("/v1/retrieve", json=query).json() == first
    # A set-size limit not prepared yet: its neighbour table cannot be cached, and is not.
    assert client.post("/v1/retrieve", json={**query, "max_size": 2}).status_code == 200
    added = client.post("/v1/tools", json={"add": [FLIGHT]})
    assert added.status_code == 200 and added.json()["version"] == 2
    assert modeldir.load_model_dir(live).tool_ids[-1] == "book_flight"

    shutil.rmtree(parent)
    refused = client.post("/v1/tools", json={"remove": ["book_flight"]})
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["field"] == "persist"
    assert "unchanged" in refused.json()["error"]["message"] and str(tmp_path) not in refused.text
    listed = client.get("/v1/tools").json()
    assert listed["version"] == 2 and listed["count"] == 41
    assert client.post("/v1/retrieve", json=query).json()["catalogue_version"] == 2
    parent.mkdir()
    again = client.post("/v1/tools", json={"remove": ["book_flight"]})
    assert again.status_code == 200 and again.json()["version"] == 3
  assert list(modeldir.load_model_dir(live).tool_ids) == [f"t{i}" for i in range(40)]


def _sigterm_during_update(tmp_path, model_dir, library, delay: float):
  """One server: POST /v1/tools, SIGTERM ``delay`` s later. Returns (reply, sent, live, old)."""
  from hyset_jax.io import modeldir
  live = tmp_path / "live"
  if live.exists():
    shutil.rmtree(live)
  shutil.copytree(model_dir, live)  # the previous persisted model
  old = list(modeldir.load_model_dir(live).tool_ids)
  port = serving.free_port()
  url = f"http://127.0.0.1:{port}"
  reply = {}

  def update():
    try:
      reply["answer"] = serving.post(url + "/v1/tools", {"add": [FLIGHT]}, timeout=120)
    except Exception as e:  # noqa: BLE001 - a lost answer is asserted on below
      reply["answer"] = e
    reply["at"] = time.monotonic()

  with serving.server_process(["--model", str(model_dir), "--tools", f"mcp:{library}",
                               "--persist", str(live), "--no-warm-up", "--max-batch", "8"],
                              port) as proc:
    thread = threading.Thread(target=update)
    thread.start()
    time.sleep(delay)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    thread.join(timeout=120)
    assert proc.wait(timeout=60) == -signal.SIGTERM
    stderr = proc.communicate()[1]
  assert "Traceback" not in stderr, stderr[-2000:]
  return reply, sent, live, old


def test_sigterm_during_a_catalogue_update_leaves_a_whole_model(tmp_path, model_dir, library):
  """Mechanism: a real ``hyset serve --persist DIR`` process gets SIGTERM while ``POST
  /v1/tools`` is being applied (its first use of the encoder compiles, so the update takes
  seconds). The shutdown finishes the update: it is answered, DIR holds the whole new model
  (the write is a rename of a complete folder), nothing partial is left beside it. On a fast
  machine the update can end before the signal: then again with a shorter delay, until one run
  had it in flight."""
  from hyset_jax.io import modeldir
  in_flight = False
  for delay in (0.5, 0.2, 0.05):
    reply, sent, live, old = _sigterm_during_update(tmp_path, model_dir, library, delay)
    assert reply["answer"][0] == 200, reply
    assert list(modeldir.load_model_dir(live).tool_ids) == old + ["book_flight"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["live"]
    if reply["at"] > sent:  # it was in flight when SIGTERM came
      in_flight = True
      break
  assert in_flight, "every update ended before SIGTERM reached the server"
