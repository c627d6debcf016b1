"""The held-out-tool setting on ToolLens: tools unseen in training, added afterwards.

1. Hold out a fraction of ToolLens's tools (chosen by a sha256 hash of the tool id, so the
   choice is the same on every machine): they are left out of the library, and every query that
   needs one is left out of training and validation.
2. Train HYSET on the rest (``hyset train --config toollens``, shortened by ``--steps``).
3. Add the held-out tools to the trained model without retraining (``hyset tools add``: their
   z is the normalised frozen-encoder embedding).
4. Evaluate the test queries that need a held-out tool, over the full library: HYSET with the
   added tools against the dense retriever (frozen MiniLM, cosine) — ``hyset eval``. The test
   queries that need only seen tools are scored too, for the same model, as a reference.

Every step is the command line a user runs; intermediate BEIR folders go under ``--workdir``.
Writes ``<out>.json`` and ``<out>.md``.

  python -m benchmarks.held_out_tools --workdir runs/held_out --steps 400
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time
from typing import Any, NamedTuple

from benchmarks import provenance

REPO = pathlib.Path(__file__).resolve().parents[1]
TOOLLENS = REPO / ".." / "shared" / "data" / "toollens"
METRICS = ("recall@3", "recall@5", "ndcg@5", "comp@3", "comp@5", "set_f1", "set_exact")


def hyset(*args: str) -> None:
  cmd = [sys.executable, "-m", "hyset_jax.cli", *args]
  print("$ hyset " + " ".join(args), file=sys.stderr, flush=True)
  subprocess.run(cmd, cwd=REPO, check=True)


def write_beir(root: pathlib.Path, corpus: list[dict], queries: list[dict],
               qrels: dict[str, list[tuple[str, str]]]) -> str:
  """A BEIR folder: corpus.jsonl, queries.jsonl, qrels/<split>.tsv. Returns its data spec."""
  (root / "qrels").mkdir(parents=True, exist_ok=True)
  with open(root / "corpus.jsonl", "w", encoding="utf-8") as f:
    f.writelines(json.dumps(t, ensure_ascii=False) + "\n" for t in corpus)
  with open(root / "queries.jsonl", "w", encoding="utf-8") as f:
    f.writelines(json.dumps(q, ensure_ascii=False) + "\n" for q in queries)
  for split, rows in qrels.items():
    with open(root / "qrels" / f"{split}.tsv", "w", encoding="utf-8") as f:
      f.write("query-id\tcorpus-id\tscore\n")
      f.writelines(f"{q}\t{t}\t1\n" for q, t in rows)
  return f"beir:{root}"


def read_jsonl(path: pathlib.Path) -> list[dict]:
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


class _Splits(NamedTuple):
  """The held-out-tool data: the ToolLens data set, the held-out tool ids, the training and
  new-tool test query counts, and the data specs of the BEIR folders written under the
  workdir (train: seen tools only; add: the held-out tools' library; eval_new / eval_seen:
  the full library with the test queries that need a held-out tool / only seen tools)."""
  data: Any
  held: set[str]
  n_train: int
  n_new: int
  train_spec: str
  add_spec: str
  eval_new_spec: str
  eval_seen_spec: str


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--workdir", required=True)
  p.add_argument("--data", default=str(TOOLLENS), help="ToolLens BEIR folder")
  p.add_argument("--fraction", type=float, default=0.1, help="share of tools held out")
  p.add_argument("--steps", type=int, default=400, help="training steps (preset: 1500)")
  p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "held_out_tools"))
  args = p.parse_args(argv)

  work = pathlib.Path(args.workdir).absolute()
  work.mkdir(parents=True, exist_ok=True)
  splits = _write_splits(args.data, args.fraction, work)
  data, held = splits.data, splits.held
  print(f"held out {len(held)} of {len(data.tools)} tools; {splits.n_train} of "
        f"{len(data.split('train'))} train queries kept; {splits.n_new} test queries need a "
        f"held-out tool", file=sys.stderr, flush=True)

  run = work / "run"
  reused = (run / "test_metrics.json").is_file()  # hyset train reuses a finished run
  start = time.time()
  hyset("train", "--config", "toollens", "--workdir", str(run), "--no-progress",
        "--data", splits.train_spec, "--set", f"train.num_steps={args.steps}")
  train_s = time.time() - start
  hyset("tools", "add", "--model", str(run), "--tools", splits.add_spec, "--out",
        str(work / "added"), "--force")
  results = _evaluate(work, splits)
  _write(args, argv, splits, results, None if reused else train_s)
  return 0


def _write_splits(data_dir: str, fraction: float, work: pathlib.Path) -> _Splits:
  """Holds out ``fraction`` of the tools (by hash) and writes the four BEIR folders under
  ``work``. Returns them with the counts (:class:`_Splits`)."""
  from hyset_jax.data.beir import load_beir
  from hyset_jax.data.splits import unit_hash

  data = load_beir(data_dir)
  held = {t for t in data.tools.ids if unit_hash(t, "held-out-tools") < fraction}
  corpus = read_jsonl(pathlib.Path(data_dir) / "corpus.jsonl")
  queries = {q["_id"]: q for q in read_jsonl(pathlib.Path(data_dir) / "queries.jsonl")}

  def qrels(split, keep):
    return [(q.id, t) for q in data.split(split) if keep(q) for t in q.gold]

  def needs(q):
    return bool(held & set(q.gold))

  def seen_only(q):
    return not needs(q)

  train_spec = write_beir(
      work / "seen", [t for t in corpus if t["_id"] not in held],
      [q for q in queries.values()],
      {"train": qrels("train", seen_only), "test": qrels("test", seen_only)})
  add_spec = write_beir(
      work / "held_out_library", [t for t in corpus if t["_id"] in held],
      [queries[q.id] for q in data.split("test") if needs(q)],
      {"test": [(q, t) for q, t in qrels("test", needs) if t in held]})
  full_new_spec = write_beir(work / "eval_new", corpus, list(queries.values()),
                             {"test": qrels("test", needs)})
  full_seen_spec = write_beir(work / "eval_seen", corpus, list(queries.values()),
                              {"test": qrels("test", seen_only)})
  n_train = sum(seen_only(q) for q in data.split("train"))
  n_new = sum(needs(q) for q in data.split("test"))
  return _Splits(data, held, n_train, n_new, train_spec, add_spec, full_new_spec,
                 full_seen_spec)


def _evaluate(work: pathlib.Path, splits: _Splits) -> dict[str, dict]:
  """``hyset eval`` of the dense retriever and of HYSET with the added tools, on the new-tool
  and the seen-tool test queries. Returns {row: its metrics}."""
  full_new_spec, full_seen_spec = splits.eval_new_spec, splits.eval_seen_spec
  results = {}
  for name, method, model, spec in [
      ("dense (frozen MiniLM), new-tool queries", "dense", None, full_new_spec),
      ("HYSET + added tools, new-tool queries", "hyset", work / "added", full_new_spec),
      ("dense (frozen MiniLM), seen-tool queries", "dense", None, full_seen_spec),
      ("HYSET + added tools, seen-tool queries", "hyset", work / "added", full_seen_spec)]:
    out = work / f"{method}_{'new' if spec == full_new_spec else 'seen'}.json"
    hyset("eval", "--data", spec, "--split", "test", "--method", method,
          *(["--model", str(model)] if model else []), "--out", str(out), "--force")
    results[name] = json.loads(out.read_text())
  return results


def _write(args: argparse.Namespace, argv: list[str] | None, splits: _Splits,
           results: dict[str, dict], train_s: float | None) -> None:
  """Writes ``<out>.json`` and ``<out>.md`` and prints the table; ``train_s``: None when the
  run was reused."""
  data, held, n_train = splits.data, splits.held, splits.n_train
  meta = {"command": "python -m benchmarks.held_out_tools " + " ".join(argv or sys.argv[1:]),
          "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
          "machine": f"{os.cpu_count()} CPU cores (shared), no accelerator",
          "held_out_tools": len(held), "tools": len(data.tools), "train_queries": n_train,
          "new_tool_test_queries": splits.n_new, "steps": args.steps,
          "train_seconds": train_s}
  lines = [f"`{meta['command']}` — {meta['date']}, {meta['machine']}. {len(held)} of "
           f"{len(data.tools)} ToolLens tools held out of training ({n_train} train queries "
           f"kept), added with `hyset tools add` after {args.steps} training steps "
           f"({'an existing run' if train_s is None else f'{train_s / 60:.1f} min'}); test "
           f"split, percentages.", "",
           "| method | queries | " + " | ".join(METRICS) + " |",
           "|---|---|" + "---|" * len(METRICS)]
  for name, m in results.items():
    lines.append(f"| {name} | {m['n_queries']} | " +
                 " | ".join(f"{100 * m[k]:.2f}" for k in METRICS) + " |")
  out = pathlib.Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  provenance.write_json(out.with_suffix(".json"), {"meta": meta, "results": results},
                        meta["command"])
  out.with_suffix(".md").write_text("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  sys.exit(main())
