"""Orbax checkpoints of a training run: θ, the optimiser state and the loop state, restored
automatically from the newest step that reads (broken newer ones are skipped with a warning)."""
from __future__ import annotations

import logging
import pathlib
import sys

log = logging.getLogger("hyset_jax.training.train")


def manager(workdir: pathlib.Path):
  import orbax.checkpoint as ocp
  return ocp.CheckpointManager(
      workdir / "checkpoints",
      options=ocp.CheckpointManagerOptions(max_to_keep=2, create=True,
                                           enable_async_checkpointing=False))


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


def save(mngr, step: int, state, loop: dict) -> None:
  """Save ``state`` and the JSON-able ``loop`` at ``step``, once (Orbax refuses a saved step)."""
  import orbax.checkpoint as ocp
  if step in mngr.all_steps():
    return
  mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                          loop=ocp.args.JsonSave(loop)), force=True)
  mngr.wait_until_finished()
