"""Cross-domain transfer (the paper's CD setting, Table 3): train on one data set, score on
another through the cross-library path, with and without a small target training set.

  python -m benchmarks.cross_domain --work runs/cross [--pairs toollens:toolbench ...] \
      [--target-queries 50] [--adapt-steps 100] --tag all

Per pair SOURCE:TARGET:

- zero-shot: the SOURCE model (``hyset train --config SOURCE``, or an existing workdir given
  with ``--model NAME=DIR``) scored on TARGET's test split by ``hyset eval --model``: carried onto
  TARGET's library (tools it has not seen get their encoder embedding, the rest are dropped);
- + target: θ continued from the SOURCE model (``train.init_model``) for ``--adapt-steps`` steps
  under the SOURCE model's preset (its M and terms) on the first ``--target-queries`` of
  TARGET's training queries that fit its M, validated on TARGET's validation queries that fit;
- in-domain: TARGET's own model (given, or its preset on its training split, queries of more
  tools than its M left out), the reference.

"retains X%" = the transferred model's COMP@5 / the in-domain model's COMP@5, both on TARGET's
test split. Dense over TARGET's library is the floor. Data sets: ``toollens`` (ToolLens, BEIR),
``toolbench`` (StableToolBench's six test sets, solvable subset: ToolBench APIs like ToolLens's;
trained in-domain with the toollens preset), ``bfcl``, ``ultratool``, ``seal_tools``. Every step
is a command line; finished steps are reused (resumable). Writes
``benchmarks/results/cross_domain_<tag>.{json,md,png}``.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import time

from benchmarks import kshot, provenance

REPO = pathlib.Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
RESULTS = REPO / "benchmarks" / "results"
# name: (data spec, preset)
DATASETS = {
    "toollens": (f"beir:{DATA / 'toollens'}", "toollens"),
    "toolbench": (f"toolbench:{DATA / 'stabletoolbench' / 'test_instruction'}", "toollens"),
    "bfcl": ("bfcl", "bfcl"),
    "ultratool": (f"ultratool:{DATA / 'ultratool'}", "ultratool"),
    "seal_tools": (f"seal:{DATA / 'seal_tools'}", "seal_tools"),
}
PAIRS = ("toollens:toolbench", "ultratool:seal_tools", "seal_tools:ultratool", "bfcl:seal_tools")
METRICS = ("recall@3", "recall@5", "ndcg@5", "comp@3", "comp@5")


def _hyset(*args: str) -> None:
  print("$ hyset " + " ".join(args), file=sys.stderr, flush=True)
  subprocess.run([sys.executable, "-m", "hyset_jax.cli", *args], cwd=REPO, check=True)


def _trained(workdir: pathlib.Path, preset: str, spec: str, *sets: str) -> pathlib.Path:
  """``workdir`` after ``hyset train`` (run only when it has no final/)."""
  if not (workdir / "final").exists():
    _hyset("train", "--config", preset, "--data", spec, "--workdir", str(workdir),
           *[x for kv in sets for x in ("--set", kv)])
  return workdir / "best"


def _eval(spec: str, method: str, model: pathlib.Path | None, out: pathlib.Path) -> dict:
  if not out.exists():
    _hyset("eval", "--data", spec, "--split", "test", "--method", method,
           *(["--model", str(model)] if model else []), "--out", str(out))
  return json.loads(out.read_text())


def _fitting(name: str, max_size: int, work: pathlib.Path, limit: int = 0) -> str:
  """TARGET's training data for a model of M = ``max_size``: a BEIR folder over its library
  with the (first ``limit``) training queries and its validation split, each query of at most
  ``max_size`` tools (a model of M cannot be trained on larger gold sets), no test split (the
  test is scored on the data set itself). Returns its spec."""
  from benchmarks import unseen_split
  from hyset_jax.data.specs import load_dataset
  from hyset_jax.data.splits import with_validation
  root = work / (f"data_{name}_m{max_size}" + (f"_n{limit}" if limit else ""))
  if not (root / "qrels").exists():
    data = with_validation(load_dataset(DATASETS[name][0]))
    fits = lambda qs: tuple(q for q in qs if len(q.gold) <= max_size)
    train = fits(data.split("train"))
    tmp = root.with_name(root.name + ".tmp")
    if tmp.exists():
      import shutil
      shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    unseen_split.write_beir(tmp, data, {"train": train[:limit] if limit else train,
                                        "validation": fits(data.split("validation"))})
    tmp.rename(root)
  return f"beir:{root}"


def _model(name: str, work: pathlib.Path, given: dict[str, str]) -> pathlib.Path:
  """NAME's model (its best/): given, or its preset trained on its training split (queries
  of more tools than the preset's M left out)."""
  if name in given:
    path = pathlib.Path(given[name])
    return path / "best" if (path / "best").is_dir() else path
  from hyset_jax import config as config_lib
  preset = DATASETS[name][1]
  m = config_lib.load_preset(preset).model.max_set_size
  return _trained(work / f"model_{name}", preset, _fitting(name, m, work))


def _pair(source: str, target: str, args, work: pathlib.Path, given) -> dict:
  spec = DATASETS[target][0]
  src = _model(source, work, given)
  config = json.loads((src.parent / "config.json").read_text())
  rows = {"zero-shot": _eval(spec, "hyset", src, work / f"eval_{source}_to_{target}.json")}
  # θ continues under the source model's own preset (its M and terms), on target queries.
  adapted = _trained(work / f"adapt_{source}_to_{target}", config["name"],
                     _fitting(target, config["model"]["max_set_size"], work,
                              args.target_queries),
                     *kshot.adapt_overrides(src, args.adapt_steps))
  rows["+ target"] = _eval(spec, "hyset", adapted,
                           work / f"eval_{source}_to_{target}_adapted.json")
  rows["in-domain"] = _eval(spec, "hyset", _model(target, work, given),
                            work / f"eval_{target}_in_domain.json")
  rows["dense"] = _eval(spec, "dense", None, work / f"eval_{target}_dense.json")
  return rows


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--pairs", nargs="+", default=list(PAIRS), metavar="SOURCE:TARGET")
  p.add_argument("--model", action="append", default=[], metavar="NAME=DIR",
                 help="an existing model (directory or workdir) for a data set, e.g. "
                      "ultratool=runs/ultratool")
  p.add_argument("--target-queries", type=int, default=50)
  p.add_argument("--adapt-steps", type=int, default=100)
  p.add_argument("--work", required=True, metavar="DIR")
  p.add_argument("--tag", required=True)
  args = p.parse_args(argv)
  pairs = [tuple(x.split(":")) for x in args.pairs]
  bad = [x for x in args.pairs if x.count(":") != 1 or not set(x.split(":")) <= set(DATASETS)]
  if bad:
    p.error(f"--pairs {bad}: expected SOURCE:TARGET from {', '.join(DATASETS)}")
  given = dict(x.split("=", 1) for x in args.model)
  work = pathlib.Path(args.work)
  work.mkdir(parents=True, exist_ok=True)
  t0 = time.time()
  results = {f"{s}→{t}": _pair(s, t, args, work, given) for s, t in pairs}
  _report(args, argv, results, time.time() - t0)
  return 0


def _report(args, argv, results: dict, seconds: float) -> None:
  command = "python -m benchmarks.cross_domain " + " ".join(argv or sys.argv[1:])
  lines = [f"`{command}` — {time.strftime('%Y-%m-%d')}, {provenance.machine()}, "
           f"{seconds / 60:.0f} min. Target test splits, percent. \"+ target\": "
           f"{args.adapt_steps} steps from the source model on {args.target_queries} target "
           f"training queries. Retains = COMP@5 / in-domain COMP@5.", "",
           "| source → target | model | " + " | ".join(METRICS) + " | retains |",
           "|---|---|" + "---:|" * (len(METRICS) + 1)]
  for pair, rows in results.items():
    ref = rows["in-domain"]["comp@5"]
    for name, m in rows.items():
      share = f"{100 * m['comp@5'] / ref:.1f}%" if ref and name != "in-domain" else "–"
      lines.append(f"| {pair} | {name} | " + " | ".join(f"{100 * m[k]:.2f}" for k in METRICS)
                   + f" | {share} |")
  RESULTS.mkdir(exist_ok=True)
  stem = RESULTS / f"cross_domain_{args.tag}"
  provenance.write_json(stem.with_suffix(".json"), {"results": results, "seconds": seconds,
                                                    "adapt_steps": args.adapt_steps,
                                                    "target_queries": args.target_queries},
                        command)
  stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
  _plot(results, stem.with_suffix(".png"))
  print("\n".join(lines))


def _plot(results: dict, path: pathlib.Path) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np
  names = ("zero-shot", "+ target", "in-domain", "dense")
  fig, ax = plt.subplots(figsize=(7, 3.5))
  x = np.arange(len(results))
  for i, name in enumerate(names):
    ax.bar(x + (i - 1.5) * 0.2, [100 * r[name]["comp@5"] for r in results.values()], 0.2,
           label=name)
  ax.set_xticks(x, list(results), fontsize=7)
  ax.set_ylabel("COMP@5 (%)")
  ax.set_title("cross-domain transfer", fontsize=9)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


if __name__ == "__main__":
  sys.exit(main())
