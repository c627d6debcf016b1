"""The Markdown report and PNG plots of one suite run, and the plot of a retrieval-quality
table (benchmarks/results/)."""
from __future__ import annotations

import pathlib

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _fmt(x, digits=0):
  return "–" if x is None else f"{x:,.{digits}f}"


def _mib(b):
  return "–" if not b else f"{b / 2**20:,.0f}"


def main_table_md(rows, ref_qps, peak_gflops, write_floor_s) -> str:
  lines = ["| implementation | method | batch | queries/s | subsets/s | × NumPy | "
           "% arithmetic bound | % write floor | compile s | peak MiB |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for r in rows:
    if r["status"] != "ok":
      lines.append(f"| {r['impl']} | | {r['batch']} | {r['status']} | | | | | | |")
      continue
    qps = r["queries_per_s"]
    bound = 100 * qps * r["min_flops_per_query"] / (peak_gflops * 1e9)
    # The floor was measured for the main batch; scale per query.
    floor = 100 * (write_floor_s / r["batch_for_floor"]) * qps if r.get("batch_for_floor") else None
    lines.append(
        f"| {r['impl']} | {r.get('method') or ''} | {r['batch']} | {_fmt(qps)} | "
        f"{_fmt(r['subsets_per_s'] / 1e6, 1)} M | {qps / ref_qps:,.2f} | {bound:.2f} | "
        f"{_fmt(floor, 1)} | {_fmt(r.get('compile_s'), 2)} | {_mib(r.get('peak_bytes'))} |")
  return "\n".join(lines)


def sweep_md(rows, name: str) -> str:
  values = sorted({r["value"] for r in rows})
  impls = list(dict.fromkeys(r["impl"] for r in rows))
  by = {(r["impl"], r["value"]): r for r in rows}
  head = f"| {name} | " + " | ".join(f"{i} q/s" for i in impls) + " |"
  lines = [head, "|" + "---:|" * (len(impls) + 1)]
  for v in values:
    cells = []
    for i in impls:
      r = by.get((i, v))
      cells.append("–" if r is None else (_fmt(r["queries_per_s"]) if r["status"] == "ok"
                                          else r["status"]))
    lines.append(f"| {v} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def plot_sweep(rows, name: str, path: pathlib.Path, xlabel: str, logx: bool) -> None:
  fig, ax = plt.subplots(figsize=(6, 4))
  for impl in dict.fromkeys(r["impl"] for r in rows):
    pts = sorted((r["value"], r["queries_per_s"]) for r in rows
                 if r["impl"] == impl and r["status"] == "ok")
    if pts:
      ax.plot(*zip(*pts), marker="o", label=impl)
  ax.set_xlabel(xlabel)
  ax.set_ylabel("queries / s")
  ax.set_yscale("log")
  if logx:
    ax.set_xscale("log", base=2)
  ax.grid(True, which="both", alpha=0.3)
  ax.legend()
  ax.set_title(f"subset enumeration vs {name}")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def plot_main(rows, ref_qps, path: pathlib.Path) -> None:
  ok = [r for r in rows if r["status"] == "ok"]
  fig, ax = plt.subplots(figsize=(7, 3.8))
  names = [r["impl"] for r in ok]
  ratios = [r["queries_per_s"] / ref_qps for r in ok]
  ax.barh(names, ratios, color=["tab:blue" if n.startswith("jax") else "tab:gray" for n in names])
  ax.set_xscale("log")
  ax.axvline(1, color="k", lw=0.8)
  ax.axvline(30, color="tab:red", lw=0.8, ls="--", label="goal: 30× NumPy")
  ax.set_xlabel("queries/s relative to the NumPy reference (same run)")
  ax.legend(loc="lower right")
  ax.set_title("K_pool = 20, M = 5: every subset scored")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def best_table_md(rows, min_flops, peak_gflops) -> str:
  """Best-set rows with ratios over NumPy (gather + argmax) and NumPy-matmul (+ argmax)."""
  ok = {r["impl"]: r for r in rows if r["status"] == "ok"}
  ref = ok.get("numpy", {}).get("queries_per_s")
  ref_mm = ok.get("numpy-matmul", {}).get("queries_per_s")
  lines = ["| implementation | method | batch | queries/s | × NumPy | × NumPy-matmul | "
           "% arithmetic bound | compile s | peak MiB |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
  for r in rows:
    if r["status"] != "ok":
      lines.append(f"| {r['impl']} | | {r['batch']} | {r['status']} | | | | | |")
      continue
    qps = r["queries_per_s"]
    lines.append(
        f"| {r['impl']} | {r.get('method') or ''} | {r['batch']} | {_fmt(qps)} | "
        f"{_fmt(qps / ref if ref else None, 2)} | {_fmt(qps / ref_mm if ref_mm else None, 2)} | "
        f"{100 * qps * min_flops / (peak_gflops * 1e9):.2f} | {_fmt(r.get('compile_s'), 2)} | "
        f"{_mib(r.get('peak_bytes'))} |")
  return "\n".join(lines)


def library_md(rows) -> str:
  lines = ["| N | table | prepare s | batch | ms / query | dense ms / query | × dense | "
           "beyond stage 1, ms / query |", "|---:|---|---:|---:|---:|---:|---:|---:|"]
  for r in rows:
    lines.append(f"| {r['num_tools']:,} | {r['table']} | {r['prepare_s']:.1f} | {r['batch']} | "
                 f"{r['ms_per_query']:.3f} | {r['dense_ms_per_query']:.3f} | "
                 f"{r['ratio_to_dense']:.2f} | {r['beyond_stage1_ms_per_query']:.3f} |")
  return "\n".join(lines)


def plot_library(rows, path: pathlib.Path) -> None:
  fig, ax = plt.subplots(figsize=(6.5, 4))
  for batch in sorted({r["batch"] for r in rows}):
    pts = sorted((r["num_tools"], r["ms_per_query"], r["dense_ms_per_query"],
                  r["beyond_stage1_ms_per_query"]) for r in rows if r["batch"] == batch)
    n, total, dense, beyond = zip(*pts)
    line, = ax.plot(n, total, marker="o", label=f"HYSET, batch {batch}")
    ax.plot(n, dense, marker="s", ls="--", color=line.get_color(), label=f"dense pass, batch {batch}")
    ax.plot(n, [max(b, 1e-4) for b in beyond], marker="^", ls=":", color=line.get_color(),
            label=f"beyond stage 1, batch {batch}")
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xlabel("library size N (d = 256)")
  ax.set_ylabel("ms / query")
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=7)
  ax.set_title("cost against library size")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


QUALITY_METRICS = (("recall@5", "R@5"), ("comp@3", "COMP@3"), ("comp@5", "COMP@5"))


def plot_quality(rows: dict[str, list[dict]], path, title: str) -> None:
  """Horizontal bars of R@5, COMP@3 and COMP@5 (%, mean with the seeds' std as error bars) for
  every row of a retrieval_quality table, in the table's order."""
  names = list(rows)
  y = np.arange(len(names))
  height = 0.8 / len(QUALITY_METRICS)
  fig, ax = plt.subplots(figsize=(9, 0.32 * len(names) + 1.6))
  for i, (key, label) in enumerate(QUALITY_METRICS):
    vals = [[100 * m[key] for m in rows[n]] for n in names]
    ax.barh(y + (i - 1) * height, [np.mean(v) for v in vals], height,
            xerr=[np.std(v) if len(v) > 1 else 0 for v in vals], label=label, capsize=2)
  ax.set_yticks(y, [n if len(n) <= 60 else n[:57] + "..." for n in names], fontsize=7)
  ax.invert_yaxis()
  ax.set_xlabel("% of test queries")
  ax.set_title(title, fontsize=9)
  ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
  ax.grid(axis="x", alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
