"""What ``precision="bf16"`` changes on trained models, and what it costs or saves on this CPU:

  python -m benchmarks.precision --run toollens=runs/toollens --run bfcl=runs/bfcl \
      [--batches 1 1024] [--repeats 5] [--compile F32.json BF16.json] [--out benchmarks/results]
      [--force]

For each ``CONFIG=WORKDIR`` (a preset and the workdir ``hyset train --config CONFIG`` wrote),
its best/ model predicts every test query of the preset's data set twice, with the prepared
products (P Zᵀ, Z M_m) in f32 (the default) and in bf16 (``pipeline.prepare(precision=
"bf16")``: bf16 operands, f32 accumulation, stage 2 in f32), and reports:

- the share of test queries whose best set changes (compared as sets of tools), whose
  shortlist changes (as a set) and whose top 5 of the ranking changes (in order);
- R@5, COMP@5 and set exact both ways (the model's recorded ranking);
- the throughput ratio bf16 / f32 of ``predict_prepared`` (compiled; the model's terms and
  query inputs, test queries tiled to the batch) at each --batches size, with the default
  method (``auto``: the native CPU kernels; with bf16 the pair matrices take the JAX form, the
  native pair kernel reading f32 only) and with ``gather`` (every step in JAX in both
  precisions, so the dtype alone differs). The two precisions are timed in turn within each
  repeat; the median of the repeats is reported.

``--compile F32.json BF16.json``: two ``hyset bench compile --json`` results of the same
topology and sizes, one per ``--precision``; adds their bytes accessed per device side by side
(the compiler's count, the relevant predicted gain on an accelerator: this CPU is not one).

Writes ``precision.json`` and ``precision.md`` under --out (an existing folder; existing files
need ``--force``).
"""
from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import statistics
import time

import numpy as np

from benchmarks import provenance

METHODS = ("auto", "gather")
PRECISIONS = ("f32", "bf16")


def _sets(pred) -> list[frozenset]:
  return [frozenset(t[:n].tolist()) for t, n in zip(pred.set_tools, pred.set_size)]


def agreement(a, b) -> dict[str, float]:
  """Shares of queries where the two predictions differ: the best set (as a set), the
  shortlist (as a set) and the ranking's top 5 (in order)."""
  sets = np.mean([x != y for x, y in zip(_sets(a), _sets(b))])
  short = np.mean([set(x.tolist()) != set(y.tolist()) for x, y in zip(a.shortlist, b.shortlist)])
  top5 = np.mean(np.any(np.asarray(a.ranking)[:, :5] != np.asarray(b.ranking)[:, :5], axis=1))
  return {"set_changed": float(sets), "shortlist_changed": float(short),
          "top5_changed": float(top5)}


def throughput(prepared: dict, x, model, batch: int, method: str, repeats: int
               ) -> dict[str, float]:
  """Queries/s of ``predict_prepared`` per precision at ``batch`` (queries tiled), median of
  ``repeats``; the precisions take turns within each repeat."""
  import jax

  from hyset_jax.inference import pipeline
  n = x.num_queries
  rows = np.arange(batch) % n
  xb = jax.device_put(jax.tree.map(lambda a: np.asarray(a)[rows], x))
  kw = dict(k1=model.k1, k_pool=model.k_pool, max_size=model.max_set_size, method=method,
            ranking=model.default_ranking)
  compiled = {p: pipeline.predict_prepared.lower(prep, xb, **kw).compile()
              for p, prep in prepared.items()}

  def run(p):
    return jax.block_until_ready(compiled[p](prepared[p], xb))

  calls = {}
  for p in prepared:  # warm up; enough calls for a sample of ≥ 0.2 s
    run(p)
    t0 = time.perf_counter()
    run(p)
    calls[p] = max(1, int(np.ceil(0.2 / max(time.perf_counter() - t0, 1e-6))))
  times = {p: [] for p in prepared}
  for r in range(repeats):
    for p in (PRECISIONS if r % 2 == 0 else PRECISIONS[::-1]):
      t0 = time.perf_counter()
      for _ in range(calls[p]):
        run(p)
      times[p].append((time.perf_counter() - t0) / calls[p])
  qps = {p: batch / statistics.median(t) for p, t in times.items()}
  return {"f32_qps": qps["f32"], "bf16_qps": qps["bf16"], "ratio": qps["bf16"] / qps["f32"],
          "times_s": times}


def measure(config_name: str, workdir: str, batches: list[int], repeats: int, log) -> dict:
  import jax

  from hyset_jax import config as config_lib
  from hyset_jax.errors import UserError
  from hyset_jax.evaluation.evaluator import prediction_metrics
  from hyset_jax.inference import pipeline
  from hyset_jax.io.modeldir import load_best
  from hyset_jax.training.train_data import prepare_data
  path, model = load_best(workdir)
  config = config_lib.resolve(config_name)
  data = prepare_data(config)  # the frozen encoder's embeddings (cached by training)
  if tuple(data.tool_ids) != tuple(model.tool_ids):
    raise UserError(f"{path}: its tools are not those of --config {config_name}'s data set")
  qs = data.splits[config.data.test_split]
  x = model.query_inputs(qs.embeddings, list(qs.texts))
  kw = dict(max_size=model.max_set_size, k_pool=model.k_pool)
  prepared = {p: pipeline.prepare(jax.device_put(model.params), precision=p, **kw)
              for p in PRECISIONS}
  preds = {p: pipeline.predict_batched(prep, x, k1=model.k1, k_pool=model.k_pool,
                                       max_size=model.max_set_size, batch_size=256,
                                       ranking=model.default_ranking)
           for p, prep in prepared.items()}
  abstains = model.params.abstain is not None
  metrics = {p: prediction_metrics(pred, qs, model.tool_ids, abstains)
             for p, pred in preds.items()}
  log(f"{config_name}: {len(qs.ids)} test queries; "
      + ", ".join(f"{p} R@5 {m['recall@5']:.4f}" for p, m in metrics.items()))
  speed = {}
  for method in METHODS:
    for b in batches:
      speed[f"{method}/{b}"] = throughput(prepared, x, model, b, method, repeats)
      log(f"  {method} batch {b}: bf16/f32 = {speed[f'{method}/{b}']['ratio']:.3f}")
  return {"config": config_name, "model": str(path), "test_queries": len(qs.ids),
          "num_tools": len(model.tool_ids), "terms": list(model.terms),
          "k1": model.k1, "k_pool": model.k_pool, "max_size": model.max_set_size,
          "ranking": model.default_ranking,
          "pair_matrices_from_prepared": model.params.conditioned is None,
          "changed": agreement(preds["f32"], preds["bf16"]), "metrics": metrics,
          "throughput": speed}


def compile_bytes(f32_path: str, bf16_path: str) -> list[dict]:
  """Rows (config, part, method, batch, f32 and bf16 bytes accessed and argument bytes per
  device) of two ``hyset bench compile`` results."""
  docs = [json.loads(pathlib.Path(p).read_text()) for p in (f32_path, bf16_path)]
  key = lambda r: (r["config"], r["part"], r["method"], r["batch"])  # noqa: E731
  bf16 = {key(r): r for r in docs[1]["rows"]}
  out = []
  for r in docs[0]["rows"]:
    b = bf16.get(key(r))
    if b is None or r["error"] or b["error"]:
      continue
    out.append({"topology": docs[0]["topology"], "config": r["config"], "part": r["part"],
                "method": r["method"], "batch": r["batch"], "num_tools": r["num_tools"],
                "f32_bytes_accessed": r["bytes_accessed"],
                "bf16_bytes_accessed": b["bytes_accessed"],
                "f32_argument_bytes": r["argument_bytes"],
                "bf16_argument_bytes": b["argument_bytes"]})
  return out


def markdown(results: list[dict], compiled: list[dict], command: str, meta: dict) -> list[str]:
  lines = ["# Precision: bf16 products against f32 (trained models)", "",
           f"`{command}` — {meta['date']}, {meta['machine']}, commit {meta['commit']}.", "",
           "Changed: share of test queries whose best set (as a set of tools), shortlist (as "
           "a set) or top 5 of the ranking (in order) differ between the two precisions. "
           "Metrics in %, the model's recorded ranking.", "",
           "| data (test queries) | pair matrices in bf16 | set changed | shortlist changed | "
           "top-5 changed | R@5 f32 → bf16 | COMP@5 f32 → bf16 | set exact f32 → bf16 |",
           "|---|---|---:|---:|---:|---|---|---|"]
  for r in results:
    c, m = r["changed"], r["metrics"]
    both = lambda k: f"{100 * m['f32'][k]:.2f} → {100 * m['bf16'][k]:.2f}"  # noqa: E731
    lines.append(f"| {r['config']} ({r['test_queries']:,}) | "
                 f"{'yes' if r['pair_matrices_from_prepared'] else 'no (conditioned term)'} | "
                 f"{100 * c['set_changed']:.2f}% | {100 * c['shortlist_changed']:.2f}% | "
                 f"{100 * c['top5_changed']:.2f}% | {both('recall@5')} | {both('comp@5')} | "
                 f"{both('set_exact')} |")
  lines += ["", "Throughput of `predict_prepared` on this CPU, queries/s (median of "
            f"{meta['repeats']} repeats, precisions in turn); ratio = bf16 / f32 (> 1: bf16 "
            "faster).", "",
            "| data | method | batch | f32 q/s | bf16 q/s | bf16 / f32 |",
            "|---|---|---:|---:|---:|---:|"]
  for r in results:
    for name, s in r["throughput"].items():
      method, batch = name.split("/")
      lines.append(f"| {r['config']} | {method} | {int(batch):,} | {s['f32_qps']:,.0f} | "
                   f"{s['bf16_qps']:,.0f} | {s['ratio']:.2f} |")
  if compiled:
    lines += ["", f"Bytes accessed per device per call as the compiler counts them "
              f"(`hyset bench compile --topology {compiled[0]['topology']}`, `--precision f32` "
              "and `bf16`; not measured):", "",
              "| config | part | method | N | batch | args MiB f32 → bf16 | "
              "GB accessed f32 → bf16 | bf16 / f32 |", "|---|---|---|---:|---:|---|---|---:|"]
    for c in compiled:
      mib = 2.0 ** 20
      lines.append(f"| {c['config']} | {c['part']} | {c['method']} | {c['num_tools']:,} | "
                   f"{c['batch']:,} | {c['f32_argument_bytes'] / mib:,.1f} → "
                   f"{c['bf16_argument_bytes'] / mib:,.1f} | {c['f32_bytes_accessed'] / 1e9:.3f} "
                   f"→ {c['bf16_bytes_accessed'] / 1e9:.3f} | "
                   f"{c['bf16_bytes_accessed'] / c['f32_bytes_accessed']:.2f} |")
  return lines


def run(args: argparse.Namespace) -> int:
  from hyset_jax import io_utils
  from hyset_jax.errors import UserError
  if args.repeats < 1 or not args.batches or min(args.batches) < 1:
    raise UserError("--repeats and every --batches value must be at least 1")
  runs = []
  for spec in args.run:
    name, sep, workdir = spec.partition("=")
    if not sep or not name or not workdir:
      raise UserError(f"--run {spec!r}: expected CONFIG=WORKDIR, e.g. toollens=runs/toollens")
    runs.append((name, workdir))
  out_json, out_md = (io_utils.output_file(pathlib.Path(args.out) / f"precision.{e}", args.force,
                                           inputs=[w for _, w in runs])
                      for e in ("json", "md"))
  log = lambda msg: print(msg, flush=True)  # noqa: E731
  results = [measure(name, workdir, args.batches, args.repeats, log) for name, workdir in runs]
  compiled = compile_bytes(*args.compile) if args.compile else []
  command = provenance.command()
  meta = {**provenance.provenance(command), "repeats": args.repeats,
          "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes")}
  provenance.write_json(out_json, {"runs": results, "compile": compiled,
                                   "repeats": args.repeats}, command)
  out_md.write_text("\n".join(markdown(results, compiled, command, meta)) + "\n",
                    encoding="utf-8")
  print(f"wrote {out_json} and {out_md}")
  return 0


def main(argv: list[str] | None = None) -> int:
  from hyset_jax import cli
  p = argparse.ArgumentParser(prog="python -m benchmarks.precision", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--run", action="append", required=True, metavar="CONFIG=WORKDIR",
                 help="a preset and the workdir hyset train wrote with it (repeatable)")
  p.add_argument("--batches", type=int, nargs="+", default=[1, 1024], metavar="B",
                 help="batch sizes of the throughput rows (default: 1 1024)")
  p.add_argument("--repeats", type=int, default=5, help="timed samples per row (default 5)")
  p.add_argument("--compile", nargs=2, metavar=("F32.json", "BF16.json"),
                 help="two `hyset bench compile --json` results, --precision f32 and bf16")
  p.add_argument("--out", default="benchmarks/results", metavar="DIR",
                 help="existing folder for precision.json and .md")
  p.add_argument("--force", action="store_true", help="replace existing result files")
  p.set_defaults(func=run)
  return cli.run(p, argv)


if __name__ == "__main__":
  raise SystemExit(main())
