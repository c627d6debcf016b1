"""A training workdir: its checks, its lock, its metrics log and its model exports.

  config.json          the resolved config (a rerun with a different one is refused)
  checkpoints/<step>/  Orbax (hyset_jax.training.checkpoints)
  best/, final/        model directories
  metrics.jsonl        one line per log/eval step (process 0); the first line is the header
                       {"step": -1, "memory": …}: this start's per-device memory and FLOPs
  curves.png           training loss and validation metrics (hyset_jax.training.curves)
  test_metrics.json    the best model on the test split
  .lock                held by the running job's process 0 (a second run on the same workdir is
                       refused; the kernel releases it when the process dies, so a killed run
                       leaves no stale lock)
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import pathlib
from collections.abc import Iterator

import jax

from hyset_jax import config as config_lib
from hyset_jax.io import modeldir
from hyset_jax.model import parameters, terms
from hyset_jax.errors import UserError
from hyset_jax.io_utils import atomic_write, ensure_writable_dir

log = logging.getLogger("hyset_jax.training.train")

CONFIG_FILE = "config.json"
# Config keys that only change what is chosen after training: a rerun may change them.
# The switches of the terms chosen after θ (training.post_theta): a finished run may switch one
# on or off, which only rechooses.
AFTER_TRAINING = frozenset(f"model.{t.fit.switch}" for t in terms.REGISTRY.values() if t.fit)
METRICS_FILE = "metrics.jsonl"
LOCK_FILE = ".lock"


def _flat(d: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flat(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = list(v) if isinstance(v, (list, tuple)) else v
  return out


def check(workdir: pathlib.Path, config: config_lib.Config) -> None:
  """A writable workdir that holds no run of a different config and no foreign files.

  Runs before anything is written, so a refused workdir is left exactly as it was.
  """
  if workdir.name.isdigit() and workdir.parent.name == "checkpoints":
    raise UserError(f"--workdir {workdir} is a checkpoint step inside a workdir; pass the "
                    f"workdir itself ({workdir.parent.parent})")
  if workdir.exists() and not workdir.is_dir():
    raise UserError(f"workdir {workdir} exists and is not a folder")
  existing = next(p for p in (workdir, *workdir.parents) if p.exists())
  if not existing.is_dir() or not os.access(existing, os.W_OK):
    raise UserError(f"workdir {workdir}: {existing} is not a writable folder")
  saved = workdir / CONFIG_FILE
  if saved.exists():
    try:
      previous = json.loads(saved.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise UserError(f"{saved}: not valid JSON ({e}); this workdir's config is damaged — "
                      f"use a new workdir, or delete {saved} to start this one afresh") from None
    if not isinstance(previous, dict):
      raise UserError(f"{saved}: expected a JSON object (a hyset config), got "
                      f"{type(previous).__name__}; use a new workdir")
    old, new = _flat(previous), _flat(json.loads(config.to_json()))
    # A key the saved config lacks is a field added since that run: it ran with its default.
    defaults = _flat(json.loads(config_lib.Config().to_json()))
    old = {**{k: defaults[k] for k in new.keys() - old.keys() if k in defaults}, **old}
    # The mesh is how the run is laid out, not what it computes: a resume may change it; nor
    # do the switches of what is chosen after θ (AFTER_TRAINING).
    diff = sorted(k for k in old.keys() | new.keys()
                  if old.get(k) != new.get(k) and not k.startswith("mesh.")
                  and k not in AFTER_TRAINING)
    if diff:
      raise UserError(f"workdir {workdir} holds a run with a different config (differs in: "
                      f"{', '.join(diff)}); resume with the same config or use a new workdir")
  MetricsLog.check(workdir / METRICS_FILE)


def create(workdir: pathlib.Path) -> None:
  """The workdir (and missing parents), once the inputs have been read."""
  ensure_writable_dir(workdir, "workdir")


def write_config(workdir: pathlib.Path, config: config_lib.Config) -> None:
  if jax.process_index() == 0:
    # Atomic: other processes of a multi-process job may be reading it in check().
    with atomic_write(workdir / CONFIG_FILE) as f:
      f.write(config.to_json() + "\n")


@contextlib.contextmanager
def lock(workdir: pathlib.Path) -> Iterator[None]:
  """One job per workdir: process 0 holds an exclusive ``flock`` on ``.lock`` while it runs."""
  if jax.process_index() != 0:
    yield
    return
  path = workdir / LOCK_FILE
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      if e.errno not in (errno.EAGAIN, errno.EACCES):
        raise
      holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
      raise UserError(f"workdir {workdir} is in use by a running training job (pid {holder}); "
                      f"wait for it to finish or use another workdir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    yield
  finally:
    os.close(fd)  # closing releases the lock


class MetricsLog:
  """metrics.jsonl, written by process 0; on resume, lines after the restored step are dropped.

  A line of a step that will be run again (after the restored checkpoint) is dropped, so a
  killed and restarted run's log equals an uninterrupted run's.

  ``header`` (a row with step -1) becomes the first line, replacing an earlier start's: it
  describes the run as laid out now (its mesh and per-device memory). ``rows`` holds the steps.
  """

  def __init__(self, path: pathlib.Path, resume_step: int, header: dict | None = None):
    self.path = path
    self.enabled = jax.process_index() == 0
    # Steps the restored checkpoint has done; a start with nothing restored (resume_step 0)
    # keeps none, since its step-0 validation is logged again. The end-of-run ranking choice is
    # made again by every run that finishes, so an earlier one is dropped too.
    self.rows = [r for r in self.read(path) if 0 <= r["step"] <= resume_step
                 and "ranking" not in r] if resume_step > 0 else []
    kept = ([header] if header else []) + self.rows
    if self.enabled:
      with atomic_write(path) as f:
        f.writelines(json.dumps(r) + "\n" for r in kept)

  @staticmethod
  def read(path: pathlib.Path) -> list[dict]:
    rows = []
    if not path.exists():
      return rows
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
      try:
        row = json.loads(line)
      except json.JSONDecodeError:
        # A process killed mid-write leaves a torn last line; the steps after the restored
        # checkpoint are replayed and logged again anyway.
        log.warning("%s:%d: dropping a torn metrics line", path, n)
        continue
      if not isinstance(row, dict) or not isinstance(row.get("step"), int):
        raise UserError(f"{path}:{n}: not a hyset metrics line (expected a JSON object with an "
                        f"integer 'step'); this workdir holds someone else's metrics.jsonl — "
                        f"use a new workdir")
      rows.append(row)
    return rows

  @classmethod
  def check(cls, path: pathlib.Path) -> None:
    cls.read(path)

  def write(self, row: dict) -> None:
    self.rows.append(row)
    if self.enabled:
      with open(self.path, "a") as f:
        f.write(json.dumps(row) + "\n")


def export_model(params, tool_ids, query_encoder: str, mc: config_lib.ModelConfig,
                 out: pathlib.Path, *, ranking: str | None = None,
                 force: bool = False) -> pathlib.Path:
  """Write θ as a model directory (the constraints applied exactly; see parameters.host_params)."""
  md = modeldir.ModelDir(parameters.host_params(params), tuple(tool_ids), mc.max_set_size, mc.k1,
                         mc.k_pool, query_encoder, ranking=ranking)
  return modeldir.save_model_dir(out, md, force=force)
