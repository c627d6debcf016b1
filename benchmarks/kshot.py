"""k-shot adaptation to held-out categories (the paper's UC setting, Table 3).

  python -m benchmarks.kshot --config toollens --data beir:../shared/data/toollens \
      --seed 0 --work runs/kshot_toollens --tag toollens [--steps N] [--adapt-steps N]

1. Split (``benchmarks/generalisation_splits.py --kind categories``): the held-out categories'
   tools leave the training library; their queries are split into ``adapt`` and ``test``.
2. Base: ``hyset train`` on the rest (``DIR/split/train``), then scored on the test queries over
   the whole library (0-shot: the held-out tools get their encoder embedding).
3. k-shot, k in ``--shots`` (1 5 10): θ continues from the base model (``train.init_model``) for
   ``--adapt-steps`` steps on the base's training queries plus the first k adapt queries of each
   held-out category, repeated so that they are ``--shot-share`` of the training queries (a few
   queries among thousands would otherwise hardly be drawn), over the base's library plus the
   tools the shots name (a held-out tool no shot names is carried at its encoder embedding, as
   at 0 shots, rather than trained as a negative only); validation is the base's, which
   holds no held-out-category query, so the adapted model is the one after the last step (a
   fixed schedule, ``train.keep=last``: best/ is the last step, the post-θ fits chosen on it).
   It is scored over the whole library.
4. Full supervision: ``hyset train`` from the dense start on the base's training queries plus
   every adapt query (no repetition), the same steps as the base.

Every method that trains is adapted the same way: the per-tool linear head (``--baselines``) is
fit on each setting's training queries (shots repeated the same way); dense needs no training.
"recovers X%" = the k-shot COMP@5 / the full-supervision COMP@5 of the same method. Every step
is a command line a user could run; finished steps are reused on a rerun (resumable). Writes
``benchmarks/results/kshot_<tag>.{json,md,png}``.
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import subprocess
import sys
import time

from benchmarks import provenance

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
METRICS = ("recall@3", "recall@5", "ndcg@5", "comp@3", "comp@5")


def _run(*args: str) -> None:
  print("$ " + " ".join(args), file=sys.stderr, flush=True)
  subprocess.run([sys.executable, "-m", *args], cwd=REPO, check=True)


def _hyset(*args: str) -> None:
  _run("hyset_jax.cli", *args)


def adapt_recipe(steps: int, last: bool = False) -> list[str]:
  """The adaptation recipe of every k-shot and cross-domain (+ target) run, as ``hyset train``
  overrides, less its start: ``steps`` steps of the preset's schedule (its peak rate) without
  warm-up; ``last``: the last step is best/ (a validation that holds no query it adapts to
  cannot choose one: the k-shot runs)."""
  return [f"train.num_steps={steps}", "train.warmup_steps=0",
          f"train.eval_every={max(1, steps // 4)}", f"train.checkpoint_every={steps}",
          *(["train.keep=last"] if last else [])]


def adapt_overrides(init: pathlib.Path, steps: int, last: bool = False) -> list[str]:
  """:func:`adapt_recipe` from θ of the model ``init``."""
  return [f"train.init_model={pathlib.Path(init).resolve()}", *adapt_recipe(steps, last)]


def _write_setting(root: pathlib.Path, library, train, validation, test) -> str:
  """A BEIR folder over the whole library with the given splits (an empty one left out); returns
  its spec. Written once: a finished folder (renamed into place whole) is reused."""
  from benchmarks import unseen_split
  from hyset_jax.data.types import Dataset
  if not (root / "qrels").is_dir():
    tmp = root.with_name(root.name + ".tmp")
    if tmp.exists():
      import shutil
      shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    unseen_split.write_beir(tmp, Dataset("kshot", library, {}),
                            {"train": train, "validation": validation, "test": test})
    tmp.rename(root)
  return f"beir:{root}"


def first_k(adapt, held: set[str], cats, k: int) -> list:
  """The first k queries of each held-out category in the adapt split (the split's order)."""
  from benchmarks.generalisation_splits import query_category
  out, count = [], {}
  for q in adapt:
    c = query_category(q, held, cats)
    if count.get(c, 0) < k:
      out.append(q)
      count[c] = count.get(c, 0) + 1
  return out


def _mixed(train, extra, seed: int) -> tuple:
  """train and extra in one seeded order: a preset that trains on the first n queries
  (data.max_train_queries) then sees the extra ones in proportion."""
  import numpy as np
  both = tuple(train) + tuple(extra)
  return tuple(both[i] for i in np.random.default_rng(seed).permutation(len(both)))


def _repeated(queries, times: int) -> tuple:
  import dataclasses
  return tuple(dataclasses.replace(q, id=f"{q.id}#{r}") for r in range(times) for q in queries)


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--config", required=True, help="hyset train preset, e.g. toollens")
  p.add_argument("--data", required=True, metavar="SPEC")
  p.add_argument("--seed", type=int, default=0, help="the split's seed (and training's)")
  p.add_argument("--categories", type=int, default=3)
  p.add_argument("--shots", type=int, nargs="+", default=[1, 5, 10])
  p.add_argument("--shot-share", type=float, default=0.1)
  p.add_argument("--steps", type=int, help="training steps of base and full (preset's default)")
  p.add_argument("--adapt-steps", type=int, default=100)
  p.add_argument("--baselines", nargs="*", default=["linear-head"])
  p.add_argument("--work", required=True, metavar="DIR")
  p.add_argument("--tag", required=True)
  args = p.parse_args(argv)
  return run(args, argv)


def _settings(args, work: pathlib.Path) -> dict[str, dict]:
  """Writes the split and one BEIR folder per setting; returns {setting: its spec and inputs}."""
  from benchmarks import generalisation_splits as gs
  from hyset_jax.data.specs import load_dataset
  from hyset_jax.data.splits import with_validation
  split = work / "split"
  if not (split / "split.json").exists():
    _run("benchmarks.generalisation_splits", "--kind", "categories", "--data", args.data,
         "--seed", str(args.seed), "--categories", str(args.categories), "--out", str(split),
         "--force")
  manifest = json.loads((split / "split.json").read_text())
  held = set(manifest["held_out_tools"])
  base = with_validation(load_dataset(f"beir:{split}/train"))
  test_data = load_dataset(f"beir:{split}/test")
  library, cats = test_data.tools, gs.library_categories(test_data.tools)
  train, val = base.split("train"), base.split("validation")
  adapt, test = test_data.split("adapt"), test_data.split("test")
  out = {"base": {"spec": f"beir:{split}/train", "eval": _write_setting(
      work / "setting_0", library, train, val, test), "shots": 0}}
  for k in args.shots:
    shots = first_k(adapt, held, cats, k)
    times = max(1, math.ceil(args.shot_share * len(train) / ((1 - args.shot_share) * len(shots))))
    queries = _mixed(train, _repeated(shots, times), args.seed)
    # HYSET trains over the base's library plus the tools the shots name: a held-out tool no
    # shot names stays out of training, so the adapted model carries it at its encoder
    # embedding as the 0-shot model does. Over the whole library, training would push every
    # such tool down as a negative only, and the queries that need one would be lost
    # (measured: COMP@5 15.6 -> 0.0 on them at 5 shots, ToolLens seed 0).
    unnamed = held - {t for q in shots for t in q.gold}
    spec = _write_setting(work / f"setting_{k}_named", gs.library_without(library, unnamed),
                          queries, val, ())
    out[f"{k}-shot"] = {"spec": spec, "eval": _write_setting(work / f"setting_{k}", library,
                                                             queries, val, test),
                        "shots": len(shots), "repeats": times,
                        "library": len(library) - len(unnamed)}
  spec = _write_setting(work / "setting_full", library, _mixed(train, adapt, args.seed), val,
                        test)
  out["full"] = {"spec": spec, "eval": spec, "shots": len(adapt)}
  return out | {"_meta": {"held_out_categories": manifest["held_out_categories"],
                          "held_out_tools": len(held), "train": len(train),
                          "validation": len(val), "adapt": len(adapt), "test": len(test)}}


def _train(args, name: str, spec: str, workdir: pathlib.Path, init: pathlib.Path | None) -> float:
  """hyset train for one setting (skipped when its final/ exists); returns its seconds (those
  of the run that made it, kept in ``kshot_seconds.txt``)."""
  record = workdir / "kshot_seconds.txt"
  if (workdir / "final" / "manifest.json").exists():
    return float(record.read_text()) if record.exists() else float("nan")
  steps = args.adapt_steps if init else args.steps
  sets = [f"train.seed={args.seed}", *(adapt_overrides(init, steps, last=True) if init else
                                       [f"train.num_steps={steps}"] if steps else [])]
  t0 = time.time()
  _hyset("train", "--config", args.config, "--data", spec, "--workdir", str(workdir),
         *[x for kv in sets for x in ("--set", kv)])
  record.write_text(f"{time.time() - t0:.1f}\n")
  return time.time() - t0


def _eval(spec: str, method: str, model: pathlib.Path | None, out: pathlib.Path, seed: int
          ) -> dict:
  if not out.exists():
    _hyset("eval", "--data", spec, "--split", "test", "--method", method, "--seed", str(seed),
           *(["--model", str(model)] if model else []), "--out", str(out))
  return json.loads(out.read_text())


def run(args: argparse.Namespace, argv: list[str] | None) -> int:
  work = pathlib.Path(args.work)
  work.mkdir(parents=True, exist_ok=True)
  settings = _settings(args, work)
  meta = settings.pop("_meta")
  results: dict[str, dict] = {}
  seconds: dict[str, float] = {}
  base_model = work / "train_base" / "best"
  for name, s in settings.items():
    workdir = work / f"train_{name}"
    init = None if name in ("base", "full") else base_model
    seconds[name] = _train(args, name, s["spec"], workdir, init)
    # An adapted run keeps its last step (train.keep=last): its validation holds no query of
    # the held-out categories, so the best one would be the starting model.
    model = workdir / "best"
    results[name] = {"hyset": _eval(s["eval"], "hyset", model,
                                    work / f"eval_{name}_hyset.json", args.seed)}
    for method in args.baselines:
      results[name][method] = _eval(s["eval"], method, None,
                                    work / f"eval_{name}_{method}.json", args.seed)
  results["base"]["dense"] = _eval(settings["base"]["eval"], "dense", None,
                                   work / "eval_dense.json", args.seed)
  _report(args, argv, meta, settings, results, seconds)
  return 0


def _report(args, argv, meta, settings, results, seconds) -> None:
  command = "python -m benchmarks.kshot " + " ".join(argv or sys.argv[1:])
  methods = ["hyset", *args.baselines]
  lines = [f"`{command}` — {time.strftime('%Y-%m-%d')}, {provenance.machine()}.",
           f"Held-out categories {', '.join(meta['held_out_categories'])} "
           f"({meta['held_out_tools']} tools); {meta['train']} training queries, "
           f"{meta['adapt']} adapt, {meta['test']} test queries (split seed {args.seed}). "
           f"k-shot: {args.adapt_steps} steps from the base model, shots "
           f"{args.shot_share:.0%} of the training queries. Percent; \"of full\" = COMP@5 / "
           f"the same method's full-supervision COMP@5.", "",
           "| setting | method | queries trained on | " + " | ".join(METRICS) +
           " | of full | train s |", "|---|---|---|" + "---|" * (len(METRICS) + 2)]
  for name, per in results.items():
    for method, m in per.items():
      full = results["full"].get(method, {}).get("comp@5")
      share = f"{100 * m['comp@5'] / full:.1f}%" if full else "–"
      trained = ("–" if method == "dense" else
                 f"{meta['train']} + {settings[name]['shots']}"
                 + (f" ×{settings[name]['repeats']}" if "repeats" in settings[name] else ""))
      lines.append(f"| {name} | {method} | {trained} | " +
                   " | ".join(f"{100 * m[k]:.2f}" for k in METRICS) +
                   f" | {share} | {seconds.get(name, 0) if method == 'hyset' else 0:.0f} |")
  RESULTS.mkdir(exist_ok=True)
  stem = RESULTS / f"kshot_{args.tag}"
  provenance.write_json(stem.with_suffix(".json"),
                        {"meta": meta | {"settings": settings, "seconds": seconds},
                         "results": results}, command)
  stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
  _plot(results, methods, stem.with_suffix(".png"), args.tag)
  print("\n".join(lines))


def _plot(results, methods, path: pathlib.Path, tag: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  names = [n for n in results if n != "full"]
  fig, ax = plt.subplots(figsize=(6, 3.5))
  for method in methods:
    ys = [100 * results[n][method]["comp@5"] for n in names]
    line, = ax.plot(range(len(names)), ys, marker="o", label=method)
    ax.axhline(100 * results["full"][method]["comp@5"], ls="--", color=line.get_color(),
               lw=0.8)
  ax.set_xticks(range(len(names)), ["0-shot" if n == "base" else n for n in names])
  ax.set_ylabel("COMP@5 (%)")
  ax.set_title(f"k-shot adaptation to held-out categories ({tag}); dashed: full supervision",
               fontsize=8)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


if __name__ == "__main__":
  sys.exit(main())
