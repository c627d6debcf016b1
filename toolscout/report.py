"""The experiment report as Markdown and as one figure (in the spirit of paper Figure 1).

Both read only the JSON report dict (:func:`toolscout.experiment.run`), so they
can be regenerated from ``report.json`` alone.
"""
from __future__ import annotations

import pathlib
from typing import Any

RETRIEVER_LABELS = {
    "ots": "Off-the-shelf dense", "specialist": "Specialist", "aggregate": "Aggregate",
    "bm25": "BM25", "fusion": "BM25+dense RRF", "bm25_specialist": "BM25+specialist RRF",
}
DETECTOR_LABELS = {
    "tfidf": "TF-IDF query centroid", "tfidf_tool": "TF-IDF tool side (gold tools)",
    "semantic": "Sentence-embedding centroid", "length_gap": "Query-length gap",
    "multistep_gap": "Multi-step-rate gap",
}


def _pct(x: float | None) -> str:
  return "—" if x is None else f"{100 * x:.1f}%"


def _num(x: float | None, digits: int = 3) -> str:
  return "—" if x is None else f"{x:.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(r) + " |" for r in rows]
  return "\n".join(lines) + "\n"


def markdown(r: dict[str, Any]) -> str:
  """The whole report as Markdown."""
  s, env, cfg = r["summary"], r["environment"], r["config"]
  ref = s["reference"]
  out = [f"# ToolScout experiment report (`{cfg['name']}`)\n",
         f"- Command: `{env['command']}`",
         f"- Date (UTC): {env['date_utc']}; machine: {env['machine']}, {env['cpus']} CPUs, "
         f"{env['platform']}; JAX {env['jax']} ({env['jax_backend']}), scikit-learn {env['sklearn']}",
         f"- Wall time: {r['timing']['total_s']:.0f} s ({', '.join(f'{k} {v}' for k, v in r['timing'].items() if k != 'total_s')})",
         f"- Tool corpus: {r['suite']['n_tools']} tools (BFCL functions ∪ ToolLens tools), "
         f"fixed across sources; encoder `{cfg['encoder']}`; depth {cfg['depth']}; "
         f"reference (specialist) source `{ref}`; unsafe = specialist coverage < "
         f"{_pct(cfg['coverage_floor'])}.\n"]
  if cfg["encoder"] == "hashing":
    out.append("> Smoke-test configuration: the encoder is a feature-hashing stand-in. "
               "These numbers test the pipeline, not the method.\n")

  out.append("## Summary\n")
  out.append(_table(["", "Coverage"], [
      [f"Specialist on matched `{ref}`", _pct(s["specialist_matched"])],
      [f"Aggregate on matched `{ref}`", _pct(s["aggregate_matched"])],
      ["Specialist on mismatched sources (pooled)", _pct(s["specialist_mismatched"])],
      ["Aggregate on mismatched sources (pooled)", _pct(s["aggregate_mismatched"])],
      ["Mixed stream: specialist only", _pct(s["mixed_specialist"])],
      ["Mixed stream: aggregate only", _pct(s["mixed_aggregate"])],
      ["Mixed stream: TF-IDF routed (batch, LOSO τ)", _pct(s["mixed_routed_batch"])],
      ["Routed / aggregate", _num(s["routed_over_aggregate"])],
      [f"Routed on matched `{ref}`", _pct(s["routed_matched"])],
      ["Mixed stream: TF-IDF routed (batch, label-free default τ)", _pct(s["mixed_routed_default"])],
      ["Routed (default τ) / aggregate", _num(s["routed_default_over_aggregate"])],
      [f"Routed (default τ) on matched `{ref}`", _pct(s["routed_default_matched"])],
  ]))
  out.append(f"Unsafe sources (specialist coverage < {_pct(cfg['coverage_floor'])}): "
             f"{', '.join(s['unsafe_sources']) or 'none'}. Goal (routed ≥ 0.95× aggregate on the "
             f"mixed stream and routed ≥ aggregate on matched traffic): with the LOSO-calibrated τ "
             f"**{'met' if s['goal_met'] else 'not met'}**; with the label-free default τ of "
             f"`toolscout fit` **{'met' if s['goal_met_default'] else 'not met'}**.\n")

  out.append("## Coverage@{} per source\n".format(cfg["depth"]))
  rets = list(RETRIEVER_LABELS)
  rows = []
  modes, routing = r["routing"]["modes"], r["routing"]
  loso_cov = modes["batch (one decision per source)"]["per_source_coverage"]
  default_cov = modes["batch, default tau (no labels)"]["per_source_coverage"]
  for name, ps in r["per_source"].items():
    rows.append([f"`{name}`" + (" (ref)" if name == ref else ""), str(ps["n_test"])]
                + [_pct(ps["coverage"][k]) for k in rets]
                + [f"{_pct(loso_cov[name])} ({routing['batch']['route'][name][0].upper()})",
                   f"{_pct(default_cov[name])} ({routing['batch_default']['route'][name][0].upper()})",
                   _num(routing["batch"]["distance"][name]), "yes" if ps["unsafe"] else "no"])
  m = r["mixed"]
  rows.append(["**mixed stream**", str(m["n"])] + [_pct(m["coverage"][k]) for k in rets]
              + [_pct(s["mixed_routed_batch"]), _pct(s["mixed_routed_default"]), "", ""])
  out.append("Routed columns: one decision per source (its test split as a batch); (S) = sent to "
             "the specialist, (A) = to the aggregate; LOSO τ = calibrated on the other sources' "
             "unsafe labels, default τ = `toolscout fit`'s label-free τ.\n")
  out.append(_table(["Source", "n"] + [RETRIEVER_LABELS[k] for k in rets]
                    + ["Routed (LOSO τ)", "Routed (default τ)", "d_tfidf", "Unsafe"], rows))

  out.append("## Routing modes on the mixed stream\n")
  out.append("The stream is every source's test split, one source after another (sessions "
             "of one source's traffic; rolling windows straddle a boundary only at the switch). "
             "τ is calibrated per window size on source-level distances (median window "
             "distance per source) and applied leave-one-source-out; the default-τ rows use "
             "`toolscout fit`'s label-free τ (95th percentile of held-out reference windows). "
             "G = reranked top-1 correct over all queries (MLP reranker of the chosen retriever).\n")
  rows = [[label, _pct(v["coverage"]), _pct(v["global"]), _pct(v["matched_coverage"]),
           _pct(v["specialist_share"]), _pct(v["specialist_share_matched"])]
          for label, v in r["routing"]["modes"].items()]
  out.append(_table(["Mode", "Coverage", "G (MLP)", f"Matched `{ref}` cov.",
                     "→ specialist (all)", "→ specialist (matched)"], rows))
  rows = [[str(n), str(w["n_windows"]), _pct(w["accuracy"]), _num(w["f1"])]
          for n, w in r["routing"]["windows"].items()]
  out.append("Window classification (non-overlapping windows within each source, unsafe vs safe, "
             "LOSO τ):\n")
  out.append(_table(["Window", "Windows", "Accuracy", "F1 (unsafe)"], rows))
  lat = r["latency"]
  out.append(f"Latency (CPU): fitting the fingerprint on {lat['n_reference']} reference queries "
             f"{lat['fit_ms']:.1f} ms; one request {lat['request_median_ms']:.3f} ms median, "
             f"{lat['request_p95_ms']:.3f} ms p95 ({lat['n_timed_requests']} requests); the whole "
             f"{lat['n_stream']}-query stream (transform + centroid) {lat['stream_median_ms']:.1f} ms "
             f"median of 5.\n")

  out.append("## Detectors of specialist collapse\n")
  rows = [[DETECTOR_LABELS[k], _num(v["pearson"], 2), _num(v["weighted_pearson"], 2),
           _pct(v["loso_accuracy"]), _num(v["loso_f1"], 2)] for k, v in r["detectors"].items()]
  out.append(_table(["Detector", "Pearson r", "Weighted r", "LOSO acc.", "LOSO F1"], rows))
  c = r["source_classifier"]
  out.append(f"Query-side vs tool-side TF-IDF distance, weighted r = "
             f"{_num(r['query_tool_weighted_r'], 2)}. TF-IDF source classifier (logistic "
             f"regression, {c['folds']}-fold CV over {len(c['sources'])} sources with ≥ "
             f"{cfg['classifier_min_count']} queries, {c['n_queries']} queries): accuracy "
             f"{_pct(c['accuracy'])}, macro-F1 {_pct(c['macro_f1'])}.\n")

  out.append("## Sensitivity to the coverage floor\n")
  out.append("Unsafe = specialist coverage below the floor; LOSO accuracy / F1 of each detector's "
             "threshold rule, and batch routing with the LOSO τ at that floor.\n")
  dets = list(DETECTOR_LABELS)
  rows = []
  for floor, f in r["floor_sweep"].items():
    rows.append([_pct(float(floor)), ", ".join(f["unsafe_sources"]) or "none"]
                + [f"{_pct(f['detectors'][d]['loso_accuracy'])} / {_num(f['detectors'][d]['loso_f1'], 2)}"
                   for d in dets]
                + [_pct(f["routed_coverage"]), _pct(f["routed_matched"])])
  out.append(_table(["Floor", "Unsafe sources"] + [DETECTOR_LABELS[d] for d in dets]
                    + ["Routed mixed cov.", f"Routed `{ref}` cov."], rows))

  out.append("## Reranked top-1 (P@1 among covered, G = coverage × P@1)\n")
  rows = []
  for k in ("ots", "specialist", "aggregate"):
    rows.append([RETRIEVER_LABELS[k], _pct(m["coverage"][k]), _pct(m["p1_covered"][k]["linear"]),
                 _pct(m["p1_covered"][k]["mlp"]), _pct(m["global"][k]["linear"]),
                 _pct(m["global"][k]["mlp"])])
  out.append("Mixed stream:\n")
  out.append(_table(["Retriever", "Cov.", "Lin. P@1", "MLP P@1", "Lin. G", "MLP G"], rows))
  mass = r["reranker_coefficient_mass"]
  out.append("Linear reranker coefficient mass: " + "; ".join(
      f"{RETRIEVER_LABELS[k]}: " + ", ".join(f"{g} {_pct(v)}" for g, v in mass[k].items())
      for k in mass) + ".\n")

  out.append("## Few-shot continuation repair\n")
  rep = r["repair"]
  if not rep["sources"]:
    out.append("No non-reference source has enough training queries for the shot sweep.\n")
  else:
    shots = [str(k) for k in cfg["repair_shots"]]
    rows = []
    for name, e in rep["sources"].items():
      rows.append([f"`{name}`", str(e["n_test"]),
                   f"{_pct(e['specialist']['coverage'])} / {_pct(e['specialist']['global'])}"]
                  + [f"{_pct(e['shots'][k]['coverage'])} / {_pct(e['shots'][k]['global'])}"
                     if k in e["shots"] else "—" for k in shots]
                  + [f"{_pct(e['aggregate']['coverage'])} / {_pct(e['aggregate']['global'])}"])
    w = rep["weighted"]
    rows.append(["**weighted**", "",
                 f"{_pct(w['coverage']['specialist'])} / {_pct(w['global']['specialist'])}"]
                + [f"{_pct(w['coverage'][k])} / {_pct(w['global'][k])}" for k in shots]
                + [f"{_pct(w['coverage']['aggregate'])} / {_pct(w['global']['aggregate'])}"])
    out.append("The sources where the specialist loses most coverage (lowest specialist coverage "
               f"among non-reference sources with ≥ {max(cfg['repair_shots'])} training queries). "
               "Coverage / G (MLP reranker of the specialist), continuation from the specialist "
               "with k matched training examples:\n")
    out.append(_table(["Source", "n", "Specialist"] + [f"{k}-shot" for k in shots]
                      + ["Aggregate"], rows))

  pt = r.get("paired_transfer")
  if pt:
    cols = list(next(iter(pt.values())))
    labels = {"ots": "Off-the-shelf dense"}
    out.append("## Paired synthetic styles over the same tools (paper Table 30)\n")
    out.append("ToolLens natural queries vs API-template requests rendered from the same tools' "
               "schemas (disjoint query ids); adapters trained on one style, evaluated on both:\n")
    out.append(_table(["Train ↓ / eval →"] + [f"`{c}`" for c in cols],
                      [[labels.get(k, f"Adapter on `{k[3:]}`")] + [_pct(v[c]) for c in cols]
                       for k, v in pt.items()]))

  out.append("## Skill-card rendering check\n")
  sc = r["skill_cards"]
  if sc is None:
    out.append("Not run (skill_cards=false).\n")
  else:
    ms = sc["mixed_coverage"]
    spec_ref = sc["per_source_coverage"]["specialist"][ref]
    ots_ref = sc["per_source_coverage"]["ots"][ref]
    raw = r["per_source"][ref]["coverage"]
    out.append(_table(
        ["Rendering", f"{ref} OTS", f"{ref} specialist", "Specialist → mixed", "Mixed OTS",
         "Mixed aggregate", "Switch (LOSO τ)", "Switch (label-free τ)"],
        [["Tool schema", _pct(raw["ots"]), _pct(raw["specialist"]), _pct(m["coverage"]["specialist"]),
          _pct(m["coverage"]["ots"]), _pct(m["coverage"]["aggregate"]), _pct(s["mixed_routed_batch"]),
          _pct(s["mixed_routed_default"])],
         ["Skill card", _pct(ots_ref), _pct(spec_ref), _pct(ms["specialist"]), _pct(ms["ots"]),
          _pct(ms["aggregate"]), _pct(ms["routed"]), _pct(ms["routed_default"])]]))
    d = sc["detectors"]
    out.append(f"With skill cards, weighted r with specialist coverage: TF-IDF "
               f"{_num(d['tfidf']['weighted_pearson'], 2)}, semantic "
               f"{_num(d['semantic']['weighted_pearson'], 2)}. Unsafe sources: "
               f"{', '.join(k for k, v in sc['unsafe'].items() if v) or 'none'}.\n")
    out.append("Example card:\n\n```\n" + sc["example_card"] + "\n```\n")

  if r["suite"]["notes"]:
    out.append("## Data notes\n")
    out.append("\n".join(f"- {n}" for n in r["suite"]["notes"]) + "\n")
  return "\n".join(out)


def figure(r: dict[str, Any], path: str | pathlib.Path) -> None:
  """Four panels: per-source coverage, TF-IDF distance vs collapse, mixed stream, repair."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np

  names = list(r["per_source"])
  ref = r["summary"]["reference"]
  fig, axes = plt.subplots(2, 2, figsize=(15, 10))

  ax = axes[0, 0]
  modes = r["routing"]["modes"]
  routed = {"routed": modes["batch (one decision per source)"]["per_source_coverage"],
            "routed_default": modes["batch, default tau (no labels)"]["per_source_coverage"]}
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

  ax = axes[0, 1]
  d = [r["per_source"][s]["detectors"]["tfidf"] for s in names]
  cov = [r["per_source"][s]["coverage"]["specialist"] for s in names]
  n = [r["per_source"][s]["n_test"] for s in names]
  ax.scatter(d, cov, s=[20 + 200 * v / max(n) for v in n], alpha=0.7)
  for xi, yi, s in zip(d, cov, names):
    ax.annotate(s, (xi, yi), fontsize=7, xytext=(3, 3), textcoords="offset points")
  ax.axhline(r["config"]["coverage_floor"], color="gray", ls="--", lw=1, label="coverage floor")
  det = r["detectors"]["tfidf"]
  ax.set_xlabel("d_tfidf(source, reference)")
  ax.set_ylabel("specialist coverage")
  ax.set_title(f"B. TF-IDF distance vs specialist coverage (weighted r = "
               f"{det['weighted_pearson'] if det['weighted_pearson'] is not None else float('nan'):.2f})")
  ax.legend(fontsize=8)

  ax = axes[1, 0]
  m = r["mixed"]["coverage"]
  bars = [("Specialist", m["specialist"], "C0"), ("Aggregate", m["aggregate"], "C1")]
  first_window = next((w for w in r["config"]["windows"] if w > 1), None)
  for suffix, color, tag in (("", "C2", "LOSO"), (", default tau (no labels)", "C3", "label-free")):
    picks = [("batch", "batch (one decision per source)" if not suffix else "batch" + suffix),
             ("per request", "per request" + suffix)]
    if first_window:
      picks.append((f"window {first_window}", f"rolling window {first_window}" + suffix))
    for short, key in picks:
      if key in modes:
        bars.append((f"{tag}: {short}", modes[key]["coverage"], color))
  bars += [("BM25", m["bm25"], "C4"), ("BM25+dense", m["fusion"], "C5"),
           ("BM25+spec.", m["bm25_specialist"], "C6")]
  ax.bar(range(len(bars)), [b[1] for b in bars], color=[b[2] for b in bars])
  for i, (_, v, _) in enumerate(bars):
    ax.text(i, v + 0.01, f"{100 * v:.1f}", ha="center", fontsize=8)
  ax.set_xticks(range(len(bars)), [b[0] for b in bars], rotation=30, ha="right", fontsize=8)
  ax.set_ylim(0, 1.05)
  ax.set_title(f"C. Mixed stream ({r['mixed']['n']} queries): coverage; green = routed with "
               f"LOSO τ, red = label-free τ", fontsize=10)

  ax = axes[1, 1]
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
  fig.suptitle(f"ToolScout on BFCL + ToolLens ({r['config']['name']} config, encoder "
               f"{r['config']['encoder']})")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
