"""Orbax checkpoints of a training run: θ, the optimiser state and the loop state, restored
automatically from the newest step that reads (broken newer ones are skipped with a warning)."""
from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import re
import shutil
import sys

from hyset_jax.errors import UserError

log = logging.getLogger("hyset_jax.training.train")


def manager(workdir: pathlib.Path):
  import orbax.checkpoint as ocp
  return ocp.CheckpointManager(
      workdir / "checkpoints",
      options=ocp.CheckpointManagerOptions(max_to_keep=2, create=True,
                                           enable_async_checkpointing=False))


def saved_steps(workdir: pathlib.Path) -> list[int]:
  """The steps saved under ``workdir``'s checkpoints/ (one folder each), ascending; [] if none."""
  folder = workdir / "checkpoints"
  if not folder.is_dir():
    return []
  return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def _quiet_closed_loop_callbacks() -> None:
  """Drop the "Event loop is closed" errors of a failed restore; pass everything else on.

  When Orbax gives up on an unreadable step, TensorStore reads still in flight complete later
  and call back into the asyncio loop Orbax already closed; Python reports each as an
  unraisable exception with a traceback (ten or more for one damaged step) although nothing
  is wrong any more: the step was skipped with a warning.
  """
  previous = sys.unraisablehook
  if getattr(previous, "_hyset_filter", False):
    return

  def hook(unraisable):
    exc = unraisable.exc_value
    if isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
      return
    previous(unraisable)

  hook._hyset_filter = True
  sys.unraisablehook = hook


class _DropErrors(logging.Filter):
  def filter(self, record: logging.LogRecord) -> bool:
    return record.levelno < logging.ERROR


@contextlib.contextmanager
def _orbax_errors_raised_not_logged():
  """Orbax's writer threads log a failed write with its traceback (on the ``absl`` logger)
  before the save raises it; :func:`save` turns the raised error into one line, so the log
  records are dropped while it runs."""
  logger, drop = logging.getLogger("absl"), _DropErrors()
  logger.addFilter(drop)
  try:
    yield
  finally:
    logger.removeFilter(drop)


def restore_latest(mngr, abstract_state):
  """(state, loop-state dict) of the newest checkpoint that restores, or None.

  ``abstract_state`` carries the target sharding, so a checkpoint saved by a different
  process/device layout restores onto this run's mesh.
  """
  import orbax.checkpoint as ocp
  for step in sorted(mngr.all_steps(), reverse=True):
    try:
      restored = mngr.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state), loop=ocp.args.JsonRestore()))
      return restored["state"], restored["loop"]
    except Exception as e:  # noqa: BLE001 - any failure means this step is unusable
      _quiet_closed_loop_callbacks()
      log.warning("checkpoint step %d in %s is unreadable (%s: %s); trying an older one",
                  step, mngr.directory, type(e).__name__, str(e)[:200])
  return None


def io_reason(e: BaseException) -> str:
  """What went wrong in a failed write, in a few words: an OSError's text, or the OS error
  TensorStore names (``... File too large [os_error_code='27']``), else the message's start."""
  if isinstance(e, OSError) and e.strerror:
    return e.strerror
  code = re.search(r"os_error_code='(\d+)'", str(e))
  return os.strerror(int(code.group(1))) if code else str(e)[:200]


def save(mngr, step: int, state, loop: dict) -> None:
  """Save ``state`` and the JSON-able ``loop`` at ``step``, once (Orbax refuses a saved step).

  Raises:
    UserError: when the step cannot be written (a full disk, a read-only folder). Orbax writes
      into ``<step>.orbax-checkpoint-tmp`` and renames it only when complete, so the older
      checkpoints are untouched; the partial folder is removed, and a rerun resumes from the
      newest complete step.
  """
  import orbax.checkpoint as ocp
  if step in mngr.all_steps():
    return
  _quiet_closed_loop_callbacks()  # a failed write's pending TensorStore callbacks, as above
  try:
    with _orbax_errors_raised_not_logged():
      mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                              loop=ocp.args.JsonSave(loop)), force=True)
      mngr.wait_until_finished()
  except Exception as e:  # noqa: BLE001 - TensorStore reports a failed write as a ValueError
    log.debug("checkpoint step %d failed", step, exc_info=e)
    directory = pathlib.Path(mngr.directory)
    for partial in directory.glob(f"{step}.orbax-checkpoint-tmp*"):
      shutil.rmtree(partial, ignore_errors=True)
    latest = [s for s in mngr.all_steps() if s != step]
    kept = (f"the last complete checkpoint is step {max(latest)}, which a rerun resumes from"
            if latest else "no earlier checkpoint exists")
    raise UserError(f"cannot write checkpoint step {step} in {directory}: {io_reason(e)}; "
                    f"{kept}") from None
