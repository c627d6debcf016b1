"""Retrieval quality tables for the README: baselines, HYSET over seeds, ablations.

  python -m benchmarks.retrieval_quality --config toollens --seeds 0 1 2 --out benchmarks/results

Every HYSET row is ``hyset train`` (resumable: rerunning skips finished runs) followed by the
best-by-validation model on the test split. Rows:

- BM25 / dense (frozen MiniLM) / BM25+dense RRF, through ``hyset eval``'s retrievers;
- HYSET untrained (= dense);
- HYSET, paper objective: Eq. 10 with the 50/30/20 mix (``tool_loss_weight=0``,
  ``shortlist_negatives=0``);
- HYSET, preset: the config as shipped (per-tool loss + shortlist negatives);
- ablations on the preset (paper §3.3): no F_set, identity M, one shared M;
- the preset model ranked by stage-1 ℓ instead of greedy marginal gain, and its greedy top-|Ê|
  as a set instead of the exact argmax Ê;
- per-tool heads on the same frozen embeddings (linear, MLP) trained with the per-tool loss:
  what the frozen encoder allows, as a ceiling reference.

Writes ``retrieval_<config>.json`` and ``.md`` under --out.
"""
from __future__ import annotations

import argparse
import datetime
import json
import logging
import pathlib
import platform
import subprocess
import time

import numpy as np

KEYS = ("recall@3", "recall@5", "ndcg@3", "ndcg@5", "comp@3", "comp@5", "set_f1", "set_exact")


def run_hyset(config_name: str, variant: str, overrides: list[str], seed: int,
              runs: pathlib.Path) -> dict:
  from hyset_jax import config as config_lib
  from hyset_jax.train import train_and_evaluate
  workdir = runs / f"{config_name}_{variant}_s{seed}"
  config = config_lib.resolve(config_name, overrides + [f"train.seed={seed}"])
  t0 = time.time()
  summary = train_and_evaluate(config, workdir, progress=False)
  summary["wall_s"] = round(time.time() - t0, 1)
  summary["workdir"] = str(workdir)
  return summary


def per_tool_head(data, test, hidden: int, seed: int, steps: int = 3000) -> dict:
  """A per-tool softmax head on the frozen query embeddings (the ceiling reference rows)."""
  import jax
  import jax.numpy as jnp
  import optax
  from hyset_jax import losses, metrics
  train = data.splits["train"]
  n = len(data.tool_ids)
  gold = np.zeros((len(train.ids), 5), np.int32)
  mask = np.zeros((len(train.ids), 5), bool)
  for i, g in enumerate(train.gold):
    gold[i, :len(g)], mask[i, :len(g)] = g, True
  key = jax.random.key(seed)
  if hidden:
    params = {"w1": jax.random.normal(key, (train.embeddings.shape[1], hidden)) * 0.05,
              "w2": jax.random.normal(jax.random.fold_in(key, 1), (hidden, n)) * 0.05}
    f = lambda p, x: jax.nn.gelu(x @ p["w1"]) @ p["w2"]
  else:
    params = {"w": jnp.asarray(data.tool_embeddings.T * 20.0)}
    f = lambda p, x: x @ p["w"]
  opt = optax.adam(3e-3)
  state = opt.init(params)

  @jax.jit
  def step(p, s, x, g, m):
    loss, grads = jax.value_and_grad(lambda p: losses.tool_loss(f(p, x), g, m))(p)
    updates, s = opt.update(grads, s)
    return optax.apply_updates(p, updates), s, loss

  rng = np.random.default_rng(seed)
  for _ in range(steps):
    idx = rng.integers(0, len(train.ids), 256)
    params, state, _ = step(params, state, train.embeddings[idx], gold[idx], mask[idx])
  scores = np.asarray(f(params, jnp.asarray(test.embeddings)))
  top = np.argsort(-scores, axis=1)[:, :10]
  ids = np.asarray(data.tool_ids, dtype=object)
  return metrics.evaluate([ids[r].tolist() for r in top],
                          [[data.tool_ids[t] for t in g] for g in test.gold])


def rank_variants(model_dir: pathlib.Path, data, test) -> dict[str, dict]:
  """The preset model ranked by ℓ alone, and its greedy top-|Ê| used as the set."""
  from hyset_jax import inference, metrics, modeldir
  md = modeldir.load_model_dir(model_dir)
  p = md.params
  pred = inference.predict_batched(p, test.embeddings, k1=md.k1, k_pool=md.k_pool,
                                   max_size=md.max_set_size)
  ids = np.asarray(data.tool_ids, dtype=object)
  gold = [[data.tool_ids[t] for t in g] for g in test.gold]
  ell = test.embeddings @ p.projection @ p.tool_embeddings.T
  stage1 = [ids[r].tolist() for r in np.argsort(-ell, axis=1)[:, :md.k_pool]]
  exact_sets = [ids[t[:k]].tolist() for t, k in zip(pred.set_tools, pred.set_size)]
  greedy = [ids[r].tolist() for r in pred.ranking]
  greedy_sets = [r[:k] for r, k in zip(greedy, pred.set_size)]
  return {"ranked by ℓ (stage 1), set Ê": metrics.evaluate(stage1, gold, exact_sets),
          "greedy ranking, set = greedy top-|Ê|": metrics.evaluate(greedy, gold, greedy_sets)}


def baselines(config, data, test) -> dict[str, dict]:
  from hyset_jax import metrics
  from hyset_jax.data.specs import load_dataset
  from hyset_jax.encoder import load_encoder
  from hyset_jax.model import init_params
  from hyset_jax.retrievers import BM25Retriever, DenseRetriever, FusionRetriever
  from hyset_jax.evaluation import evaluate_split
  tools = load_dataset(config.data.spec).tools
  encoder = load_encoder(config.model.encoder or None)
  gold = [[data.tool_ids[t] for t in g] for g in test.gold]
  out = {}
  bm25, dense = BM25Retriever(tools), DenseRetriever(tools, encoder)
  for name, r in (("BM25", bm25), ("dense (frozen MiniLM)", dense),
                  ("BM25+dense RRF", FusionRetriever([bm25, dense]))):
    got = r.retrieve(list(test.texts), depth=20)
    out[name] = metrics.evaluate(got.rankings, gold, got.sets)
  untrained = init_params(data.tool_embeddings, test.embeddings.shape[1],
                          config.model.max_set_size)
  out["HYSET untrained (= dense)"] = evaluate_split(untrained, test, data.tool_ids,
                                                    config.model, 256)
  return out


def multi_tool_rows(config, data, test, keep: list[int], runs: pathlib.Path, args) -> dict:
  """Baselines and the trained HYSET runs again, on the multi-tool test queries only."""
  import dataclasses
  from hyset_jax import modeldir
  from hyset_jax.evaluation import evaluate_split
  sub = dataclasses.replace(test, ids=tuple(test.ids[i] for i in keep),
                            texts=tuple(test.texts[i] for i in keep),
                            embeddings=test.embeddings[keep],
                            gold=tuple(test.gold[i] for i in keep))
  rows = {k: [v] for k, v in baselines(config, data, sub).items()}
  for label, tag in (("HYSET, paper objective (Eq. 10)", "paper"), ("HYSET, preset", "preset")):
    for seed in args.seeds:
      best = modeldir.load_model_dir(runs / f"{args.config}_{tag}_s{seed}" / "best")
      rows.setdefault(label, []).append(evaluate_split(best.params, sub, data.tool_ids,
                                                       config.model, 256))
  return rows


def fmt(values: list[float]) -> str:
  a = 100 * np.asarray(values)
  return f"{a.mean():.2f} ± {a.std(ddof=1):.2f}" if len(a) > 1 else f"{a[0]:.2f}"


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", default="toollens")
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--ablation-seeds", type=int, nargs="+", default=[0])
  parser.add_argument("--runs", default="runs/results")
  parser.add_argument("--multi-tool", action="store_true",
                      help="also a table on the test queries with ≥ 2 gold tools")
  parser.add_argument("--out", default="benchmarks/results")
  args = parser.parse_args()
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
  for noisy in ("absl", "orbax", "jax"):
    logging.getLogger(noisy).setLevel(logging.WARNING)

  from hyset_jax import config as config_lib
  from hyset_jax.train_data import prepare_data
  config = config_lib.resolve(args.config)
  data = prepare_data(config)
  test = data.splits[config.data.test_split]
  runs = pathlib.Path(args.runs)
  rows: dict[str, list[dict]] = {k: [v] for k, v in baselines(config, data, test).items()}
  costs: dict[str, list[float]] = {}
  paper = ["train.tool_loss_weight=0", "train.shortlist_negatives=0"]
  variants = [("HYSET, paper objective (Eq. 10)", "paper", paper, args.seeds),
              ("HYSET, preset", "preset", [], args.seeds),
              ("preset, no F_set", "noset", ["model.interaction=none"], args.ablation_seeds),
              ("preset, identity M", "identity", ["model.interaction=identity"],
               args.ablation_seeds),
              ("preset, one shared M", "shared", ["model.interaction=shared"],
               args.ablation_seeds)]
  if not config.model.train_tool_embeddings:
    variants.append(("preset, Z trained (paper)", "ztrain", ["model.train_tool_embeddings=true"],
                     args.ablation_seeds))
  for label, tag, overrides, seeds in variants:
    for seed in seeds:
      summary = run_hyset(args.config, tag, overrides, seed, runs)
      rows.setdefault(label, []).append(summary["test"])
      costs.setdefault(label, []).append(summary["wall_s"])
      if tag == "preset" and seed == seeds[0]:
        for name, m in rank_variants(pathlib.Path(summary["workdir"]) / "best", data,
                                     test).items():
          rows[f"preset, {name}"] = [m]
  for hidden, name in ((0, "per-tool linear head (ceiling ref.)"),
                       (1024, "per-tool MLP head (ceiling ref.)")):
    rows[name] = [per_tool_head(data, test, hidden, s) for s in args.seeds]

  multi = [i for i, g in enumerate(test.gold) if len(g) >= 2]
  multi_rows = {}
  if args.multi_tool and multi:
    multi_rows = multi_tool_rows(config, data, test, multi, runs, args)

  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  meta = {"command": f"python -m benchmarks.retrieval_quality --config {args.config} --seeds "
                     f"{' '.join(map(str, args.seeds))}",
          "date": datetime.date.today().isoformat(), "machine": platform.processor() or
          platform.machine(), "cpus": subprocess.run(["nproc"], capture_output=True,
                                                     text=True).stdout.strip(),
          "spec": config.data.spec, "test_queries": len(test.ids),
          "train_wall_s": {k: v for k, v in costs.items()}}
  (out / f"retrieval_{args.config}.json").write_text(json.dumps({"meta": meta, "rows": rows},
                                                                indent=1))
  lines = [f"{config.data.spec} test split ({len(test.ids)} queries), frozen MiniLM encoder; "
           f"mean ± std over seeds {args.seeds} where several; "
           f"`{meta['command']}`, {meta['date']}, {meta['cpus']} CPUs.", "",
           "| method | runs | " + " | ".join(KEYS) + " |",
           "|---|---|" + "---|" * len(KEYS)]
  for name, ms in rows.items():
    lines.append(f"| {name} | {len(ms)} | " + " | ".join(fmt([m[k] for m in ms]) for k in KEYS)
                 + " |")
  if multi_rows:
    lines += ["", f"Multi-tool test queries only (|E*| ≥ 2: {len(multi)} queries):", "",
              "| method | runs | " + " | ".join(KEYS) + " |", "|---|---|" + "---|" * len(KEYS)]
    for name, ms in multi_rows.items():
      lines.append(f"| {name} | {len(ms)} | " +
                   " | ".join(fmt([m[k] for m in ms]) for k in KEYS) + " |")
  lines.append("")
  lines.append("Training wall time per run (s, this CPU, to early stop or the step budget): " +
               ", ".join(f"{k}: {np.mean(v):.0f}" for k, v in costs.items()))
  (out / f"retrieval_{args.config}.md").write_text("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  main()
