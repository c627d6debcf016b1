"""The report's Markdown: one function per section, each returning its lines."""
from __future__ import annotations

from typing import Any

from toolscout.keys import BATCH_DEFAULT, BATCH_LOSO, DENSE, Detector, Mode, Retriever
from toolscout.report.cells import num, pct, table

Report = dict[str, Any]  # the JSON report dict


def header(r: Report) -> list[str]:
  env, cfg = r["environment"], r["config"]
  laps = ", ".join(f"{k} {v}" for k, v in r["timing"].items() if k != "total_s")
  out = [f"# ToolScout experiment report (`{cfg['name']}`)\n",
         f"- Command: `{env['command']}`",
         f"- Date (UTC): {env['date_utc']}; machine: {env['machine']}, {env['cpus']} CPUs, "
         f"{env['platform']}; JAX {env['jax']} ({env['jax_backend']}), scikit-learn {env['sklearn']}",
         f"- Wall time: {r['timing']['total_s']:.0f} s ({laps})",
         f"- Tool corpus: {r['suite']['n_tools']} tools (BFCL functions ∪ ToolLens tools), "
         f"fixed across sources; encoder `{cfg['encoder']}`; depth {cfg['depth']}; "
         f"reference (specialist) source `{r['summary']['reference']}`; unsafe = specialist "
         f"coverage < {pct(cfg['coverage_floor'])}.\n"]
  if cfg["encoder"] == "hashing":
    out.append("> Smoke-test configuration: the encoder is a feature-hashing stand-in. "
               "These numbers test the pipeline, not the method.\n")
  return out


def summary(r: Report) -> list[str]:
  s, cfg = r["summary"], r["config"]
  ref = s["reference"]
  rows = [
      [f"Specialist on matched `{ref}`", pct(s["specialist_matched"])],
      [f"Aggregate on matched `{ref}`", pct(s["aggregate_matched"])],
      ["Specialist on mismatched sources (pooled)", pct(s["specialist_mismatched"])],
      ["Aggregate on mismatched sources (pooled)", pct(s["aggregate_mismatched"])],
      ["Mixed stream: specialist only", pct(s["mixed_specialist"])],
      ["Mixed stream: aggregate only", pct(s["mixed_aggregate"])],
      ["Mixed stream: TF-IDF routed (batch, LOSO τ)", pct(s["mixed_routed_batch"])],
      ["Routed / aggregate", num(s["routed_over_aggregate"])],
      [f"Routed on matched `{ref}`", pct(s["routed_matched"])],
      ["Mixed stream: TF-IDF routed (batch, label-free default τ)", pct(s["mixed_routed_default"])],
      ["Routed (default τ) / aggregate", num(s["routed_default_over_aggregate"])],
      [f"Routed (default τ) on matched `{ref}`", pct(s["routed_default_matched"])],
  ]
  verdict = {True: "met", False: "not met"}
  return ["## Summary\n", table(["", "Coverage"], rows),
          f"Unsafe sources (specialist coverage < {pct(cfg['coverage_floor'])}): "
          f"{', '.join(s['unsafe_sources']) or 'none'}. Goal (routed ≥ 0.95× aggregate on the "
          f"mixed stream and routed ≥ aggregate on matched traffic): with the LOSO-calibrated τ "
          f"**{verdict[s['goal_met']]}**; with the label-free default τ of "
          f"`toolscout fit` **{verdict[s['goal_met_default']]}**.\n"]


def coverage(r: Report) -> list[str]:
  s, routing, ref = r["summary"], r["routing"], r["summary"]["reference"]
  loso_cov = routing["modes"][BATCH_LOSO.key]["per_source_coverage"]
  default_cov = routing["modes"][BATCH_DEFAULT.key]["per_source_coverage"]

  def routed(cov: dict, batch: str, name: str) -> str:
    return f"{pct(cov[name])} ({routing[batch]['route'][name][0].upper()})"

  rows = []
  for name, ps in r["per_source"].items():
    rows.append([f"`{name}`" + (" (ref)" if name == ref else ""), str(ps["n_test"])]
                + [pct(ps["coverage"][k]) for k in Retriever]
                + [routed(loso_cov, "batch", name), routed(default_cov, "batch_default", name),
                   num(routing["batch"]["distance"][name]), "yes" if ps["unsafe"] else "no"])
  m = r["mixed"]
  rows.append(["**mixed stream**", str(m["n"])] + [pct(m["coverage"][k]) for k in Retriever]
              + [pct(s["mixed_routed_batch"]), pct(s["mixed_routed_default"]), "", ""])
  return [f"## Coverage@{r['config']['depth']} per source\n",
          "Routed columns: one decision per source (its test split as a batch); (S) = sent to "
          "the specialist, (A) = to the aggregate; LOSO τ = calibrated on the other sources' "
          "unsafe labels, default τ = `toolscout fit`'s label-free τ.\n",
          table(["Source", "n"] + [k.label for k in Retriever]
                + ["Routed (LOSO τ)", "Routed (default τ)", "d_tfidf", "Unsafe"], rows)]


def routing_modes(r: Report) -> list[str]:
  ref = r["summary"]["reference"]
  modes = [[Mode.from_key(key).label, pct(v["coverage"]), pct(v["global"]),
            pct(v["matched_coverage"]), pct(v["specialist_share"]),
            pct(v["specialist_share_matched"])] for key, v in r["routing"]["modes"].items()]
  windows = [[str(n), str(w["n_windows"]), pct(w["accuracy"]), num(w["f1"])]
             for n, w in r["routing"]["windows"].items()]
  lat = r["latency"]
  return [
      "## Routing modes on the mixed stream\n",
      "The stream is every source's test split, one source after another (sessions "
      "of one source's traffic; rolling windows straddle a boundary only at the switch). "
      "τ is calibrated per window size on source-level distances (median window "
      "distance per source) and applied leave-one-source-out; the default-τ rows use "
      "`toolscout fit`'s label-free τ (95th percentile of held-out reference windows). "
      "G = reranked top-1 correct over all queries (MLP reranker of the chosen retriever).\n",
      table(["Mode", "Coverage", "G (MLP)", f"Matched `{ref}` cov.", "→ specialist (all)",
             "→ specialist (matched)"], modes),
      "Window classification (non-overlapping windows within each source, unsafe vs safe, "
      "LOSO τ):\n",
      table(["Window", "Windows", "Accuracy", "F1 (unsafe)"], windows),
      f"Latency (CPU): fitting the fingerprint on {lat['n_reference']} reference queries "
      f"{lat['fit_ms']:.1f} ms; one request {lat['request_median_ms']:.3f} ms median, "
      f"{lat['request_p95_ms']:.3f} ms p95 ({lat['n_timed_requests']} requests); the whole "
      f"{lat['n_stream']}-query stream (transform + centroid) {lat['stream_median_ms']:.1f} ms "
      f"median of 5.\n"]


def detectors(r: Report) -> list[str]:
  rows = [[Detector(k).label, num(v["pearson"], 2), num(v["weighted_pearson"], 2),
           pct(v["loso_accuracy"]), num(v["loso_f1"], 2)] for k, v in r["detectors"].items()]
  c = r["source_classifier"]
  return ["## Detectors of specialist collapse\n",
          table(["Detector", "Pearson r", "Weighted r", "LOSO acc.", "LOSO F1"], rows),
          f"Query-side vs tool-side TF-IDF distance, weighted r = "
          f"{num(r['query_tool_weighted_r'], 2)}. TF-IDF source classifier (logistic "
          f"regression, {c['folds']}-fold CV over {len(c['sources'])} sources with ≥ "
          f"{r['config']['classifier_min_count']} queries, {c['n_queries']} queries): accuracy "
          f"{pct(c['accuracy'])}, macro-F1 {pct(c['macro_f1'])}.\n"]


def floor_sweep(r: Report) -> list[str]:
  ref = r["summary"]["reference"]
  rows = []
  for floor, f in r["floor_sweep"].items():
    rows.append([pct(float(floor)), ", ".join(f["unsafe_sources"]) or "none"]
                + [f"{pct(f['detectors'][d]['loso_accuracy'])} / "
                   f"{num(f['detectors'][d]['loso_f1'], 2)}" for d in Detector]
                + [pct(f["routed_coverage"]), pct(f["routed_matched"])])
  return ["## Sensitivity to the coverage floor\n",
          "Unsafe = specialist coverage below the floor; LOSO accuracy / F1 of each detector's "
          "threshold rule, and batch routing with the LOSO τ at that floor.\n",
          table(["Floor", "Unsafe sources"] + [d.label for d in Detector]
                + ["Routed mixed cov.", f"Routed `{ref}` cov."], rows)]


def reranking(r: Report) -> list[str]:
  m, mass = r["mixed"], r["reranker_coefficient_mass"]
  rows = [[k.label, pct(m["coverage"][k]), pct(m["p1_covered"][k]["linear"]),
           pct(m["p1_covered"][k]["mlp"]), pct(m["global"][k]["linear"]),
           pct(m["global"][k]["mlp"])] for k in DENSE]
  masses = "; ".join(f"{Retriever(k).label}: " + ", ".join(f"{g} {pct(v)}" for g, v in by.items())
                     for k, by in mass.items())
  return ["## Reranked top-1 (P@1 among covered, G = coverage × P@1)\n", "Mixed stream:\n",
          table(["Retriever", "Cov.", "Lin. P@1", "MLP P@1", "Lin. G", "MLP G"], rows),
          f"Linear reranker coefficient mass: {masses}.\n"]


def _cov_g(e: dict) -> str:
  return f"{pct(e['coverage'])} / {pct(e['global'])}"


def repair(r: Report) -> list[str]:
  rep, cfg = r["repair"], r["config"]
  out = ["## Few-shot continuation repair\n"]
  if not rep["sources"]:
    return out + ["No non-reference source has enough training queries for the shot sweep.\n"]
  shots = [str(k) for k in cfg["repair_shots"]]
  rows = [[f"`{name}`", str(e["n_test"]), _cov_g(e["specialist"])]
          + [_cov_g(e["shots"][k]) if k in e["shots"] else "—" for k in shots]
          + [_cov_g(e["aggregate"])] for name, e in rep["sources"].items()]
  w = rep["weighted"]

  def col(k: str) -> dict:
    return {"coverage": w["coverage"][k], "global": w["global"][k]}

  rows.append(["**weighted**", "", _cov_g(col("specialist"))] + [_cov_g(col(k)) for k in shots]
              + [_cov_g(col("aggregate"))])
  return out + [
      "The sources where the specialist loses most coverage (lowest specialist coverage "
      f"among non-reference sources with ≥ {max(cfg['repair_shots'])} training queries). "
      "Coverage / G (MLP reranker of the specialist), continuation from the specialist "
      "with k matched training examples:\n",
      table(["Source", "n", "Specialist"] + [f"{k}-shot" for k in shots] + ["Aggregate"], rows)]


def paired_transfer(r: Report) -> list[str]:
  pt = r.get("paired_transfer")
  if not pt:
    return []
  cols = list(next(iter(pt.values())))
  rows = [["Off-the-shelf dense" if k == "ots" else f"Adapter on `{k[3:]}`"]
          + [pct(v[c]) for c in cols] for k, v in pt.items()]
  return ["## Paired synthetic styles over the same tools (paper Table 30)\n",
          "ToolLens natural queries vs API-template requests rendered from the same tools' "
          "schemas (disjoint query ids); adapters trained on one style, evaluated on both:\n",
          table(["Train ↓ / eval →"] + [f"`{c}`" for c in cols], rows)]


def skill_cards(r: Report) -> list[str]:
  out = ["## Skill-card rendering check\n"]
  sc = r["skill_cards"]
  if sc is None:
    return out + ["Not run (skill_cards=false).\n"]
  s, m, ref = r["summary"], r["mixed"]["coverage"], r["summary"]["reference"]
  ms, cards, raw = sc["mixed_coverage"], sc["per_source_coverage"], r["per_source"][ref]["coverage"]
  rows = [["Tool schema", pct(raw["ots"]), pct(raw["specialist"]), pct(m["specialist"]),
           pct(m["ots"]), pct(m["aggregate"]), pct(s["mixed_routed_batch"]),
           pct(s["mixed_routed_default"])],
          ["Skill card", pct(cards["ots"][ref]), pct(cards["specialist"][ref]),
           pct(ms["specialist"]), pct(ms["ots"]), pct(ms["aggregate"]), pct(ms["routed"]),
           pct(ms["routed_default"])]]
  d = sc["detectors"]
  return out + [
      table(["Rendering", f"{ref} OTS", f"{ref} specialist", "Specialist → mixed", "Mixed OTS",
             "Mixed aggregate", "Switch (LOSO τ)", "Switch (label-free τ)"], rows),
      f"With skill cards, weighted r with specialist coverage: TF-IDF "
      f"{num(d['tfidf']['weighted_pearson'], 2)}, semantic "
      f"{num(d['semantic']['weighted_pearson'], 2)}. Unsafe sources: "
      f"{', '.join(k for k, v in sc['unsafe'].items() if v) or 'none'}.\n",
      "Example card:\n\n```\n" + sc["example_card"] + "\n```\n"]


def data_notes(r: Report) -> list[str]:
  notes = r["suite"]["notes"]
  return ["## Data notes\n", "\n".join(f"- {n}" for n in notes) + "\n"] if notes else []


SECTIONS = (header, summary, coverage, routing_modes, detectors, floor_sweep, reranking, repair,
            paired_transfer, skill_cards, data_notes)


def markdown(r: Report) -> str:
  """The whole report as Markdown."""
  return "\n".join(line for section in SECTIONS for line in section(r))
