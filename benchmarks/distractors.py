"""A library grown with distractor tools (the paper's Table 3 "distractors" setting).

  python -m benchmarks.distractors --model runs/toollens/best \
      --data beir:../shared/data/toollens --split test --sizes 1000 10000 100000 --tag toollens

The model's library is padded to each size with tools of other data sets (BFCL, Seal-Tools,
UltraTool, StableToolBench's test tools; ``--sources``), in a seeded order, leaving out any whose
text or ToolBench ``tool_name``/``api_name`` is one of the library's own tools (the same API
listed twice would be a right answer counted wrong). Past what they hold, generated tools: the
first half of one real distractor's text joined to the second half of another's, with a fresh
id — texts of the same vocabulary and form, which no gold set names. Every size's library
extends the previous one, so its distractors are a superset.

For each size the trained model is carried onto the padded library (the added tools get their
frozen encoder embedding, as ``hyset eval --model`` does) and scored on the split; the dense
retriever over the same library is the reference. Reported: R@5, COMP@5 (and R@3, NDCG@5,
COMP@3), their change from the undistracted library, and ms per query (the whole retrieval of
the split in one call, after a warm-up, divided by the number of queries: query encoding
included, cached). Writes ``benchmarks/results/distractors_<tag>.{json,md,png}``.
"""
from __future__ import annotations

import argparse
import pathlib
import re
import sys
import time

import numpy as np

from benchmarks import provenance
from hyset_jax.data.types import ToolLibrary

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "results"
DATA = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"
SOURCES = ("bfcl", f"seal:{DATA / 'seal_tools'}", f"ultratool:{DATA / 'ultratool'}",
           f"toolbench:{DATA / 'stabletoolbench' / 'test_instruction'}")
METRICS = ("recall@3", "recall@5", "ndcg@5", "comp@3", "comp@5")
_API = re.compile(r"tool_name:([^,]*), api_name:([^,]*),")


def _api(text: str) -> tuple[str, str] | None:
  found = _API.search(text)
  return (found.group(1).strip(), found.group(2).strip()) if found else None


def real_distractors(base: ToolLibrary, sources, seed: int) -> list[str]:
  """Tool texts of ``sources`` (data specs) that are none of ``base``'s tools, each text once,
  in a seeded order."""
  from hyset_jax.data.specs import load_dataset
  own_texts = set(base.texts)
  own_apis = {a for a in map(_api, base.texts) if a}
  texts: dict[str, None] = {}
  for spec in sources:
    for text in load_dataset(spec).tools.texts:
      if text not in own_texts and _api(text) not in own_apis:
        texts.setdefault(text, None)
  pool = sorted(texts)
  return [pool[i] for i in np.random.default_rng(seed).permutation(len(pool))]


def generated(real: list[str], n: int, seed: int, taken: set[str]) -> list[str]:
  """``n`` new texts, each the first half of one real text's words and the second half of
  another's, none in ``taken`` (nor repeated)."""
  rng = np.random.default_rng(seed + 1)
  words = [t.split() for t in real]
  out: list[str] = []
  seen = set(taken)
  while len(out) < n:
    a, b = rng.integers(len(words), size=2)
    if a == b:
      continue
    wa, wb = words[a], words[b]
    text = " ".join(wa[:max(1, len(wa) // 2)] + wb[len(wb) // 2:])
    if text not in seen:
      seen.add(text)
      out.append(text)
  return out


def padded(base: ToolLibrary, distractors: list[str], size: int) -> ToolLibrary:
  """``base`` followed by the first ``size - len(base)`` distractors (ids ``distractor:i``)."""
  extra = distractors[:max(0, size - len(base))]
  return ToolLibrary(base.ids + tuple(f"distractor:{i}" for i in range(len(extra))),
                     base.texts + tuple(extra), base.metadata + ({},) * len(extra))


def _score(method: str, library: ToolLibrary, queries, model: str | None) -> dict:
  from hyset_jax.commands.eval import EVAL_DEPTH, build_retriever
  from hyset_jax.evaluation.metrics import evaluate
  retriever = build_retriever(method, library, model=model, data=f"{len(library)} tools")
  texts = [q.text for q in queries]
  retriever.retrieve(texts[:8], depth=EVAL_DEPTH)  # compile, encode: not timed
  t0 = time.perf_counter()
  result = retriever.retrieve(texts, depth=EVAL_DEPTH)
  ms = 1e3 * (time.perf_counter() - t0) / len(texts)
  return evaluate(result.rankings, [q.gold for q in queries], result.sets) | {"ms_per_query": ms}


def main(argv: list[str] | None = None) -> int:
  from hyset_jax import cli
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--model", required=True, help="a trained model directory (or workdir)")
  p.add_argument("--data", required=True, metavar="SPEC", help="the model's data set")
  p.add_argument("--split", default="test")
  p.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
  p.add_argument("--sources", nargs="+", default=list(SOURCES), metavar="SPEC")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--limit", type=int, help="score the first N queries only")
  p.add_argument("--tag", required=True)
  p.set_defaults(func=run)
  return cli.run(p, argv)


def run(args: argparse.Namespace) -> int:
  from hyset_jax.data.specs import load_dataset
  dataset = load_dataset(args.data)
  queries = dataset.split(args.split)[:args.limit]
  base = dataset.tools
  real = real_distractors(base, args.sources, args.seed)
  need = max(args.sizes) - len(base)
  made = generated(real, max(0, need - len(real)), args.seed, set(real) | set(base.texts))
  distractors = real + made
  rows = []
  for size in [len(base), *sorted(s for s in args.sizes if s > len(base))]:
    library = padded(base, distractors, size)
    for method in ("hyset", "dense"):
      m = _score(method, library, queries, args.model if method == "hyset" else None)
      rows.append({"method": method, "tools": len(library),
                   "real": min(len(real), size - len(base)),
                   "generated": max(0, size - len(base) - len(real)), **m})
      print(f"{method} {len(library)} tools: R@5 {100 * m['recall@5']:.2f} COMP@5 "
            f"{100 * m['comp@5']:.2f} {m['ms_per_query']:.2f} ms/query", flush=True)
  _write(args, rows, len(queries), len(real))
  return 0


def _write(args, rows: list[dict], n_queries: int, n_real: int) -> None:
  command = "python -m benchmarks.distractors " + " ".join(sys.argv[1:])
  first = {r["method"]: r for r in rows if r["tools"] == rows[0]["tools"]}
  lines = [f"`{command}` — {time.strftime('%Y-%m-%d')}, {provenance.machine()}; "
           f"{n_queries} {args.split} queries; {n_real} real distractors available "
           f"(seed {args.seed}), the rest generated. Percent; Δ = change from the undistracted "
           f"library in points.", "",
           "| method | tools | real + generated | " + " | ".join(METRICS) +
           " | ΔR@5 | ΔCOMP@5 | ms/query |", "|---|---:|---|" + "---:|" * (len(METRICS) + 3)]
  for r in rows:
    d5 = 100 * (r["recall@5"] - first[r["method"]]["recall@5"])
    dc = 100 * (r["comp@5"] - first[r["method"]]["comp@5"])
    lines.append(f"| {r['method']} | {r['tools']:,} | {r['real']:,} + {r['generated']:,} | " +
                 " | ".join(f"{100 * r[k]:.2f}" for k in METRICS) +
                 f" | {d5:+.2f} | {dc:+.2f} | {r['ms_per_query']:.2f} |")
  RESULTS.mkdir(exist_ok=True)
  stem = RESULTS / f"distractors_{args.tag}"
  provenance.write_json(stem.with_suffix(".json"), {"rows": rows, "queries": n_queries,
                                                    "real_distractors": n_real}, command)
  stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
  _plot(rows, stem.with_suffix(".png"), args.tag)
  print("\n".join(lines))


def _plot(rows, path: pathlib.Path, tag: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, (ax, at) = plt.subplots(1, 2, figsize=(9, 3.5))
  for method in ("hyset", "dense"):
    rs = [r for r in rows if r["method"] == method]
    xs = [r["tools"] for r in rs]
    ax.plot(xs, [100 * r["recall@5"] for r in rs], marker="o", label=f"{method} R@5")
    ax.plot(xs, [100 * r["comp@5"] for r in rs], marker="s", ls="--", label=f"{method} COMP@5")
    at.plot(xs, [r["ms_per_query"] for r in rs], marker="o", label=method)
  for a in (ax, at):
    a.set_xscale("log")
    a.set_xlabel("tools in the library")
    a.legend(fontsize=7)
  ax.set_ylabel("%")
  at.set_ylabel("ms per query")
  ax.set_title(f"distractors ({tag})", fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


if __name__ == "__main__":
  sys.exit(main())
