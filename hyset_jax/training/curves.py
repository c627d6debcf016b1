"""The training curves of a run as a PNG: training loss and validation metrics against step;
:func:`save_png` for every other figure a run writes."""
from __future__ import annotations

import os
import pathlib


def plot_curves(rows: list[dict], path: pathlib.Path) -> None:
  """Training loss and validation Recall@5 against step, as a PNG."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  train = [r for r in rows if "loss" in r]
  val = [r for r in rows if "val_recall@5" in r]
  fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
  ax[0].plot([r["step"] for r in train], [r["loss"] for r in train])
  ax[0].set(xlabel="step", ylabel="training loss", title="training loss (all terms)")
  for key in ("val_recall@5", "val_comp@5", "val_set_f1"):
    ax[1].plot([r["step"] for r in val], [r[key] for r in val], marker="o", label=key[4:])
  ax[1].set(xlabel="step", ylabel="validation", ylim=(0, 1), title="validation metrics")
  ax[1].legend()
  save_png(fig, path)


def save_png(fig, path: pathlib.Path) -> None:
  """Lay out, write atomically (a temporary file renamed over ``path``) and close a figure."""
  import matplotlib.pyplot as plt
  fig.tight_layout()
  tmp = path.with_suffix(".tmp.png")
  fig.savefig(tmp, dpi=110)
  plt.close(fig)
  os.replace(tmp, path)
