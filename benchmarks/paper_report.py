"""The tables of benchmarks/paper_tables.py, built from its cells' prediction files: mean ± std
over seeds, HYSET against every baseline (paired bootstrap and exact McNemar on the seed-0
predictions), the issue's targets with their distance, the full run's estimated duration, and
the Markdown, JSON and plot they are written as."""
from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np

from benchmarks import paper_cells as pc
from benchmarks import paper_estimate, provenance

KEYS = ("recall@3", "recall@5", "ndcg@3", "ndcg@5", "comp@3", "comp@5", "set_exact")
HEAD = ("R@3", "R@5", "NDCG@3", "NDCG@5", "COMP@3", "COMP@5", "exact")
# The metrics the issue's targets are stated on; each gets a "HYSET vs best baseline" line.
TARGET_KEYS = ("recall@5", "comp@5")
# "One night": the length of a run started in the evening and read in the morning.
NIGHT_S = 12 * 3600
SIG_COLUMN = "HYSET − row, COMP@5 [95% CI]"
MCNEMAR_COLUMN = "McNemar p, exact set (HYSET only / row only)"


def check_outputs(folder: pathlib.Path, tag: str, force: bool) -> dict[str, pathlib.Path]:
  """The three result files, checked before any cell runs (existing ones need --force)."""
  from hyset_jax import io_utils
  return {ext: io_utils.output_file(folder / f"{tag}.{ext}", force, flag="--results")
          for ext in ("md", "json", "png")}


def _per_query(out: pathlib.Path, cell: pc.Cell, split: str, queries: list
               ) -> dict[str, np.ndarray]:
  """The cell's per-query metrics on ``split``, in the split's order, from its predictions."""
  from hyset_jax.evaluation import significance
  lines = (out / "cells" / cell.name / f"pred.{split}.jsonl").read_text().splitlines()
  by_id = {}
  for line in lines:
    p = json.loads(line)
    by_id[p["query_id"]] = p
  preds = [by_id[q.id] for q in queries]
  return significance.per_query_metrics([p["ranking"] for p in preds],
                                        [q.gold for q in queries], [p["set"] for p in preds])


def _rows(cells: list[pc.Cell], out: pathlib.Path, split: str, queries: list
          ) -> dict[str, dict[str, Any]]:
  """{row key: {"label", "cells", "runs": [metrics per seed], "first": per-query metrics of
  the first seed}} of the cells that score ``split``."""
  rows: dict[str, dict[str, Any]] = {}
  for cell in cells:
    key = cell.method + (f"_from_{cell.source}" if cell.source else "")
    label = pc.LABELS[cell.method] + (f", carried from {cell.source}" if cell.source else "")
    result = json.loads((out / "cells" / cell.name / "result.json").read_text())
    row = rows.setdefault(key, {"label": label, "runs": [], "seeds": []})
    row["runs"].append(result["splits"][split])
    row["seeds"].append(cell.seed)
    if "first" not in row:
      row["first"] = _per_query(out, cell, split, queries)
  return rows


def _compare(hyset: dict[str, np.ndarray], other: dict[str, np.ndarray], resamples: int
             ) -> dict[str, dict]:
  """HYSET (B) against another row (A) on the same queries: ``diff`` = HYSET − row."""
  from hyset_jax.evaluation import significance
  return significance.compare(other, hyset, resamples=resamples, seed=0)


def _stats(runs: list[dict]) -> dict[str, dict[str, float]]:
  out = {}
  for k in KEYS:
    a = np.array([r[k] for r in runs], dtype=float)
    out[k] = {"mean": float(a.mean()), "std": float(a.std(ddof=1)) if len(a) > 1 else None}
  return out


def table(title: str, rows: dict[str, dict], hyset_key: str | None, resamples: int,
          baselines: tuple[str, ...]) -> dict:
  """One table: every row's mean ± std, HYSET against each other row, and against the best
  baseline (the row in ``baselines`` with the highest mean) on each target metric."""
  doc: dict[str, Any] = {"title": title, "rows": {}, "vs_best": {}}
  hyset = rows.get(hyset_key) if hyset_key else None
  for key, row in rows.items():
    entry = {"label": row["label"], "seeds": row["seeds"], "metrics": _stats(row["runs"])}
    if hyset is not None and key != hyset_key:
      entry["vs_hyset"] = _compare(hyset["first"], row["first"], resamples)
    doc["rows"][key] = entry
  base = [k for k in rows if k in baselines]
  if hyset is None or not base:
    return doc
  for metric in TARGET_KEYS:
    best = max(base, key=lambda k: doc["rows"][k]["metrics"][metric]["mean"])
    h, b = (doc["rows"][k]["metrics"][metric]["mean"] for k in (hyset_key, best))
    sig = doc["rows"][best]["vs_hyset"][metric]
    doc["vs_best"][metric] = {
        "best": best, "hyset": h, "baseline": b, "ratio": h / b if b else None,
        "diff": sig["diff"], "ci_low": sig["ci_low"], "ci_high": sig["ci_high"],
        "significant": bool(sig["ci_low"] > 0 or sig["ci_high"] < 0)}
  return doc


def _fmt(stat: dict) -> str:
  m = 100 * stat["mean"]
  return f"{m:.2f}" if stat["std"] is None else f"{m:.2f} ± {100 * stat['std']:.2f}"


def _ratio(v: dict) -> str:
  return "n/a (baseline 0)" if v["ratio"] is None else f"{v['ratio']:.3f}×"


def markdown_table(doc: dict) -> list[str]:
  lines = [f"**{doc['title']}**", "",
           "| method | seeds | " + " | ".join(HEAD) + f" | {SIG_COLUMN} | {MCNEMAR_COLUMN} |",
           "|---|---|" + "---:|" * len(HEAD) + "---|---|"]
  for row in doc["rows"].values():
    cells = [_fmt(row["metrics"][k]) for k in KEYS]
    sig, mc = "–", "–"
    if "vs_hyset" in row:
      c, e = row["vs_hyset"]["comp@5"], row["vs_hyset"]["set_exact"]
      sig = (f"{100 * c['diff']:+.2f} [{100 * c['ci_low']:+.2f}, {100 * c['ci_high']:+.2f}]")
      mc = f"{e['mcnemar_p']:.3g} ({e['b_only']} / {e['a_only']})"
    seeds = ", ".join("–" if s is None else str(s) for s in row["seeds"])
    lines.append(f"| {row['label']} | {seeds} | " + " | ".join(cells) + f" | {sig} | {mc} |")
  for metric, v in doc["vs_best"].items():
    best = doc["rows"][v["best"]]["label"]
    lines.append(f"\nHYSET vs the best baseline on {metric}: {best} ({100 * v['baseline']:.2f}); "
                 f"HYSET {100 * v['hyset']:.2f} = {_ratio(v)}, seed 0 Δ "
                 f"{100 * v['diff']:+.2f} [{100 * v['ci_low']:+.2f}, {100 * v['ci_high']:+.2f}]"
                 + (" (significant at 5%)" if v["significant"] else " (not significant)"))
  return lines + [""]


def _tables(plan: list[pc.Cell], out: pathlib.Path, overrides: list[str],
            resamples: int) -> dict[str, list[dict]]:
  """{"table1": [...], "carried": [...], "table2": [...]}: one table per data set and split."""
  groups: dict[str, list[dict]] = {"table1": [], "carried": [], "table2": []}
  for data in dict.fromkeys(c.data for c in plan):
    native = tuple(overrides) if data in pc.NATIVE else ()
    _, splits = pc.load_splits(data, native)
    for split, queries in splits.items():
      mine = [c for c in plan if c.data == data]
      where = f"{data}, {split} ({len(queries):,} queries)"
      t1 = [c for c in mine if c.source is None and c.method in ("hyset", *pc.BASELINES)]
      if data in pc.NATIVE and t1:
        groups["table1"].append(table(where, _rows(t1, out, split, queries), "hyset",
                                      resamples, pc.BASELINES))
      abl = [c for c in mine if c.source is None and c.method in pc.HYSET_METHODS
             and c.seed == min(x.seed for x in mine if x.method == c.method)]
      if any(c.method in pc.ABLATIONS for c in abl):
        groups["table2"].append(table(where + ", seed 0", _rows(abl, out, split, queries),
                                      "hyset", resamples, ()))
      for source in dict.fromkeys(c.source for c in mine if c.source):
        cells = [c for c in mine if c.source == source or
                 (c.source is None and c.method in pc.UNTRAINED)]
        groups["carried"].append(table(f"{where}, HYSET trained on {source}",
                                       _rows(cells, out, split, queries),
                                       f"hyset_from_{source}", resamples, pc.UNTRAINED))
  return groups


def _targets(groups: dict[str, list[dict]]) -> list[str]:
  """The issue's targets, each met or missed with its distance."""
  lines = []
  for doc in groups["table1"]:
    for metric, v in doc["vs_best"].items():
      ok = v["hyset"] >= v["baseline"] and (v["significant"] or v["hyset"] == v["baseline"])
      lines.append(f"- {doc['title']}: HYSET ≥ every baseline on {metric}, significant: "
                   f"{'met' if ok else 'missed'} (HYSET − best {100 * v['diff']:+.2f} points, "
                   f"{_ratio(v)})")
      if metric == "comp@5" and doc["title"].startswith("ultratool,"):
        ok = v["ratio"] is not None and v["ratio"] >= 1.115
        lines.append(f"- {doc['title']}: COMP@5 ≥ 1.115× the best baseline: "
                     f"{'met' if ok else 'missed'} ({_ratio(v)})")
  for doc in groups["carried"] + [d for d in groups["table1"] if "test_out" in d["title"]]:
    v = doc["vs_best"].get("comp@5")
    if v:
      dense = doc["rows"].get("dense", {}).get("metrics", {}).get("comp@5", {}).get("mean")
      ok = v["ratio"] is not None and v["ratio"] >= 1.10 and (dense is None
                                                             or v["hyset"] >= dense)
      lines.append(f"- {doc['title']}: COMP@5 ≥ 1.10× the best baseline and ≥ dense: "
                   f"{'met' if ok else 'missed'} ({_ratio(v)} {v['best']})")
  return lines


def build(plan: list[pc.Cell], args: Any, ran: dict[str, float], wall_s: float) -> dict:
  """Every table, the targets and the estimate, as the JSON document (with its Markdown)."""
  groups = _tables(plan, args.out, args.overrides, args.resamples)
  estimate = paper_estimate.estimate(plan, args.out, args.overrides)
  md = [f"Cells under `{args.out}`: data sets {', '.join(args.datasets)}; seeds "
        f"{', '.join(map(str, args.seeds))}; overrides {args.overrides or 'none'}. Mean ± std "
        "over seeds (a single value: one run). Significance: HYSET against each row on the "
        f"seed-0 predictions (paired bootstrap over queries, {args.resamples} resamples, seed 0; "
        "exact McNemar on exact set match); percentages.", "",
        "## Table 1: every data set × every method", ""]
  for doc in groups["table1"]:
    md += markdown_table(doc)
  if groups["carried"]:
    md += ["## Models carried across libraries (zero-shot on the target's test split)", ""]
    for doc in groups["carried"]:
      md += markdown_table(doc)
  if groups["table2"]:
    md += ["## Table 2: ablations (seed 0; the row compares HYSET (preset) with it)", ""]
    for doc in groups["table2"]:
      md += markdown_table(doc)
  night = estimate["total_s"] <= NIGHT_S
  timing = [f"- the full run fits one night (≤ {NIGHT_S / 3600:.0f} h): "
            f"{'met' if night else 'missed'} (estimated {estimate['total_s'] / 3600:.1f} h)"]
  if args.quick:
    timing.append(f"- --quick under 15 minutes: {'met' if wall_s < 900 else 'missed'} "
                  f"({wall_s / 60:.1f} min{'' if len(ran) == len(plan) else ', cells reused'})")
  md += ["## Targets (issue #32)", "", *_targets(groups), *timing, "", "## Time", "",
         f"This invocation: {wall_s / 60:.1f} min wall for {len(ran)} cells run "
         f"({len(plan) - len(ran)} reused).", *estimate["lines"]]
  return {"tables": groups, "cells": {c.name: _cell_meta(args.out, c) for c in plan},
          "wall_s": round(wall_s, 1), "ran_s": {k: round(v, 1) for k, v in ran.items()},
          "estimate": estimate, "settings": {"datasets": args.datasets, "methods": args.methods,
                                             "seeds": args.seeds, "overrides": args.overrides,
                                             "quick": args.quick, "out": str(args.out)},
          "markdown": md}


def _cell_meta(out: pathlib.Path, cell: pc.Cell) -> dict:
  result = json.loads((out / "cells" / cell.name / "result.json").read_text())
  return {"wall_s": result["wall_s"], "training": result.get("training", {})}


def write(report: dict, outputs: dict[str, pathlib.Path], args: Any) -> None:
  command = "python -m benchmarks.paper_tables " + " ".join(args.argv)
  doc = {k: v for k, v in report.items() if k != "markdown"}
  provenance.write_json(outputs["json"], _jsonable(doc), command)
  prov = provenance.provenance(command)
  head = [f"# Paper tables{' (--quick)' if args.quick else ''}", "",
          f"`{command}`; {prov['machine']}; {prov['date']}; commit {prov['commit']}.", ""]
  outputs["md"].write_text("\n".join(head + report["markdown"]) + "\n", encoding="utf-8")
  plot(report["tables"]["table1"] + report["tables"]["carried"], outputs["png"])


def _jsonable(x: Any) -> Any:
  if isinstance(x, dict):
    return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
  if isinstance(x, np.generic):
    return x.item()
  return x


def plot(docs: list[dict], path: pathlib.Path) -> None:
  """Grouped bars: COMP@5 (%, mean; the seeds' std as error bars) per data set and method."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  methods = list(dict.fromkeys(k for d in docs for k in d["rows"]))
  width = 0.8 / max(1, len(methods))
  fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(docs) + 2), 4.5))
  for j, key in enumerate(methods):
    xs, ys, es = [], [], []
    for i, d in enumerate(docs):
      if key in d["rows"]:
        m = d["rows"][key]["metrics"]["comp@5"]
        xs.append(i + (j - (len(methods) - 1) / 2) * width)
        ys.append(100 * m["mean"])
        es.append(100 * (m["std"] or 0))
    label = next(d["rows"][key]["label"] for d in docs if key in d["rows"])
    # tab20: up to 20 rows in distinct colours (the default cycle repeats after 10).
    ax.bar(xs, ys, width, yerr=es, label=label, capsize=1.5, color=plt.get_cmap("tab20")(j % 20))
  ax.set_xticks(range(len(docs)), [d["title"].split(" (")[0] + d["title"].split(")")[-1]
                                   for d in docs], fontsize=7, rotation=20, ha="right")
  ax.set_ylabel("COMP@5 (% of test queries)")
  ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
  ax.grid(axis="y", alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
