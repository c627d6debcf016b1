"""The report's figure: four panels in the spirit of paper Figure 1, one function each."""
from __future__ import annotations

import pathlib
from typing import Any

import numpy as np

from toolscout.keys import BATCH_DEFAULT, BATCH_LOSO, Mode, Tau

Report = dict[str, Any]  # the JSON report dict


def coverage_per_source(ax: Any, r: Report) -> None:
  """A: coverage of each retriever and of batch routing, per source."""
  names, ref = list(r["per_source"]), r["summary"]["reference"]
  modes = r["routing"]["modes"]
  routed = {"routed": modes[BATCH_LOSO.key]["per_source_coverage"],
            "routed_default": modes[BATCH_DEFAULT.key]["per_source_coverage"]}
  series = [("specialist", "Specialist"), ("aggregate", "Aggregate"),
            ("routed", "Routed (LOSO τ)"), ("routed_default", "Routed (label-free τ)"),
            ("bm25", "BM25"), ("fusion", "BM25+dense RRF")]
  x = np.arange(len(names))
  width = 0.14
  for i, (key, label) in enumerate(series):
    vals = [routed[key][s] if key in routed else r["per_source"][s]["coverage"][key]
            for s in names]
    ax.bar(x + (i - 2.5) * width, vals, width, label=label)
  ax.set_xticks(x, [f"{s}*" if s == ref else s for s in names], rotation=40, ha="right",
                fontsize=8)
  ax.set_ylabel(f"coverage@{r['config']['depth']}")
  ax.set_ylim(0, 1.3)  # headroom for the legend above the bars
  ax.set_yticks(np.linspace(0, 1, 6))
  ax.set_title("A. Coverage per source (* = specialist's training source)")
  ax.legend(fontsize=8, ncol=3, loc="upper center")


def distance_vs_collapse(ax: Any, r: Report) -> None:
  """B: each source's TF-IDF distance from the reference against specialist coverage."""
  names = list(r["per_source"])
  d = [r["per_source"][s]["detectors"]["tfidf"] for s in names]
  cov = [r["per_source"][s]["coverage"]["specialist"] for s in names]
  n = [r["per_source"][s]["n_test"] for s in names]
  ax.scatter(d, cov, s=[20 + 200 * v / max(n) for v in n], alpha=0.7)
  for xi, yi, s in zip(d, cov, names):
    ax.annotate(s, (xi, yi), fontsize=7, xytext=(3, 3), textcoords="offset points")
  ax.axhline(r["config"]["coverage_floor"], color="gray", ls="--", lw=1, label="coverage floor")
  r_w = r["detectors"]["tfidf"]["weighted_pearson"]
  ax.set_xlabel("d_tfidf(source, reference)")
  ax.set_ylabel("specialist coverage")
  ax.set_title(f"B. TF-IDF distance vs specialist coverage (weighted r = "
               f"{r_w if r_w is not None else float('nan'):.2f})")
  ax.legend(fontsize=8)


def _routed_bars(r: Report) -> list[tuple[str, float, str]]:
  """(label, coverage, colour) of the routing modes panel C shows: batch, per request and the
  first rolling window, with each kind of τ."""
  modes = r["routing"]["modes"]
  first_window = next((w for w in r["config"]["windows"] if w > 1), None)
  bars = []
  for tau, color, tag in ((Tau.LOSO, "C2", "LOSO"), (Tau.DEFAULT, "C3", "label-free")):
    picks = [("batch", Mode(tau)), ("per request", Mode(tau, 1))]
    if first_window:
      picks.append((f"window {first_window}", Mode(tau, first_window)))
    bars += [(f"{tag}: {short}", modes[mode.key]["coverage"], color)
             for short, mode in picks if mode.key in modes]
  return bars


def mixed_stream(ax: Any, r: Report) -> None:
  """C: coverage on the mixed stream of each retriever and routing mode."""
  m = r["mixed"]["coverage"]
  bars = ([("Specialist", m["specialist"], "C0"), ("Aggregate", m["aggregate"], "C1")]
          + _routed_bars(r)
          + [("BM25", m["bm25"], "C4"), ("BM25+dense", m["fusion"], "C5"),
             ("BM25+spec.", m["bm25_specialist"], "C6")])
  ax.bar(range(len(bars)), [b[1] for b in bars], color=[b[2] for b in bars])
  for i, (_, v, _) in enumerate(bars):
    ax.text(i, v + 0.01, f"{100 * v:.1f}", ha="center", fontsize=8)
  ax.set_xticks(range(len(bars)), [b[0] for b in bars], rotation=30, ha="right", fontsize=8)
  ax.set_ylim(0, 1.05)
  ax.set_title(f"C. Mixed stream ({r['mixed']['n']} queries): coverage; green = routed with "
               f"LOSO τ, red = label-free τ", fontsize=10)


def repair_curves(ax: Any, r: Report) -> None:
  """D: coverage of each repaired source against the number of matched examples."""
  rep = r["repair"]
  if rep["sources"]:
    shots = r["config"]["repair_shots"]
    for i, (s, e) in enumerate(rep["sources"].items()):
      ks = [k for k in shots if str(k) in e["shots"]]
      ys = [e["specialist"]["coverage"]] + [e["shots"][str(k)]["coverage"] for k in ks]
      ax.plot([0] + ks, ys, marker="o", color=f"C{i}", label=s)
      ax.axhline(e["aggregate"]["coverage"], color=f"C{i}", ls=":", lw=1)
    ax.set_xscale("symlog", linthresh=5)
    ax.set_xticks([0] + list(shots), ["0"] + [str(k) for k in shots])
    ax.set_xlabel("matched examples (continuation from the specialist)")
    ax.set_ylabel("coverage (dotted: aggregate)")
    ax.legend(fontsize=8)
  else:
    ax.text(0.5, 0.5, "no collapsed source to repair", ha="center", va="center")
  ax.set_ylim(0, 1.05)
  ax.set_title("D. Few-shot repair of collapsed sources")


def figure(r: Report, path: str | pathlib.Path) -> None:
  """Four panels: per-source coverage, TF-IDF distance vs collapse, mixed stream, repair."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(2, 2, figsize=(15, 10))
  coverage_per_source(axes[0, 0], r)
  distance_vs_collapse(axes[0, 1], r)
  mixed_stream(axes[1, 0], r)
  repair_curves(axes[1, 1], r)
  fig.suptitle(f"ToolScout on BFCL + ToolLens ({r['config']['name']} config, encoder "
               f"{r['config']['encoder']})")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
