"""What the lexical term costs a request, measured on a trained model and its own test queries:

  python -m benchmarks.lexical_cost --model runs/demo/best --config bfcl --tag bfcl \
      [--batches 1 64] [--repeats 5] [--queries N] [--out benchmarks/results] [--force]

A model with the lexical term answers a request in three steps:
the query encoder, BM25 of the query text over the tool texts (b, ``hyset_jax.model.lexical``) and
the prepared two-stage prediction with ℓ' = ℓ + β·b. Without the term the middle step is
absent and the prediction reads ℓ. For each batch size this times, over every test query of
the config's data set (the first --queries of them) in batches of that size (the last one
padded by the prediction itself), each step alone — the encoder (not cached), BM25, the
prediction without b and with it — after one warm-up pass (compilation). Each repeat times
every batch; a step's ms/query is the median over the repeats. Machines here are shared, so what to read are the same-run ratios:

- ``request``: (encoder + BM25 + prediction with b) / (encoder + prediction without b), what a
  ``hyset predict`` or ``hyset serve`` request pays for the term;
- ``retrieval``: (BM25 + prediction with b) / (prediction without b), the same without the
  encoder (for callers that bring query embeddings to a model without the term).

Writes ``lexical_cost_<tag>.json``, ``.md`` and ``.png`` (each step's ms/query as stacked bars,
without and with the term, per batch size) under --out (an existing folder; existing files
need ``--force``).
"""
from __future__ import annotations

import argparse
import datetime
import pathlib
import sys
import time

import numpy as np

from benchmarks import provenance

STEPS = ("encoder", "bm25", "predict", "predict_with_b")


def time_steps(model, encoder, texts: list[str], batch: int, repeats: int,
               progress=None) -> dict[str, float]:
  """Median ms/query of each of :data:`STEPS` over ``repeats`` passes over ``texts`` in
  batches of ``batch``, after one untimed pass."""
  from hyset_jax.inference import pipeline
  from hyset_jax.model.query_inputs import QueryInputs
  prepared = pipeline.prepare(model.params, max_size=model.max_set_size, k_pool=model.k_pool)
  plain = prepared._replace(params=prepared.params._replace(lexical_weight=None))
  chunks = [texts[i:i + batch] for i in range(0, len(texts), batch)]

  def predict(m, emb, lex):
    return pipeline.predict_batched(m, QueryInputs(emb, lex), k1=model.k1,
                                     k_pool=model.k_pool, max_size=model.max_set_size,
                                     batch_size=batch, ranking=model.default_ranking)

  def one_pass() -> dict[str, float]:
    spent = dict.fromkeys(STEPS, 0.0)
    for i, chunk in enumerate(chunks):
      t0 = time.perf_counter()
      emb = np.asarray(encoder.encode(chunk, progress=False), np.float32)
      t1 = time.perf_counter()
      lex = model.lexical_scores(chunk)
      spent["bm25"] += time.perf_counter() - t1
      spent["encoder"] += t1 - t0
      # The two predictions take turns going first, so neither always finds the caches warm.
      order = (("predict", plain, None), ("predict_with_b", prepared, lex))
      for name, m, b in order if i % 2 == 0 else order[::-1]:
        t = time.perf_counter()
        predict(m, emb, b)
        spent[name] += time.perf_counter() - t
    return {name: 1e3 * s / len(texts) for name, s in spent.items()}

  one_pass()  # compiles both predictions for this batch shape
  runs = []
  for _ in range(repeats):
    runs.append(one_pass())
    if progress is not None:
      progress(batch, len(runs))
  ms = {name: float(np.median([r[name] for r in runs])) for name in STEPS}
  ms["request"] = (ms["encoder"] + ms["bm25"] + ms["predict_with_b"]) / (
      ms["encoder"] + ms["predict"])
  ms["retrieval"] = (ms["bm25"] + ms["predict_with_b"]) / ms["predict"]
  return ms


def plot(rows: dict[int, dict[str, float]], title: str, path: pathlib.Path) -> None:
  """Stacked bars of ms/query: encoder + prediction without the term, encoder + BM25 +
  prediction with it, side by side for each batch size."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6.4, 4.0))
  parts = (("encoder", "encoder", "tab:gray"), ("bm25", "BM25", "tab:orange"),
           ("predict", "prediction", "tab:blue"))
  labels, named, x = [], set(), 0
  for b, r in rows.items():
    for with_term in (False, True):
      bottom = 0.0
      for key, name, color in parts:
        if key == "bm25" and not with_term:
          continue
        v = r["predict_with_b" if key == "predict" and with_term else key]
        ax.bar(x, v, bottom=bottom, color=color, label=None if name in named else name)
        named.add(name)
        bottom += v
      labels.append(f"batch {b}\n{'with' if with_term else 'without'}")
      x += 1
  ax.set_xticks(range(len(labels)), labels)
  ax.set_ylabel("ms / query")
  ax.set_title(title, fontsize=9)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def run(args: argparse.Namespace) -> int:
  from hyset_jax import config as config_lib, io_utils
  from hyset_jax.encoder import load_encoder
  from hyset_jax.errors import UserError
  from hyset_jax.io.modeldir import load_model_dir
  from hyset_jax.training.train_data import load_config_dataset
  if min(args.repeats, *args.batches, args.queries or 1) < 1:
    raise UserError("--repeats, --queries and every --batches value must be at least 1")
  out_json, out_md, out_png = (
      io_utils.output_file(pathlib.Path(args.out) / f"lexical_cost_{args.tag}.{e}", args.force,
                           inputs=[args.model]) for e in ("json", "md", "png"))
  model = load_model_dir(args.model)
  if model.lexical is None:
    raise UserError(f"{args.model}: this model has no lexical term (its terms: "
                    f"{', '.join(model.terms) or 'none'}; e.g. best/ of "
                    f"`hyset train --config bfcl` has it)")
  if model.query_encoder is None:
    raise UserError(f"{args.model}: the model directory names no query encoder")
  config = config_lib.resolve(args.config)
  dataset = load_config_dataset(config.data, model.max_set_size)
  texts = [q.text for q in dataset.split(config.data.test_split)][:args.queries]
  if not texts:
    raise UserError(f"{config.data.spec}: its test split {config.data.test_split!r} is empty")
  encoder = load_encoder(model.query_encoder)
  report = lambda b, k: print(f"batch {b}: repeat {k}/{args.repeats} done", flush=True)
  rows = {b: time_steps(model, encoder, texts, b, args.repeats, report) for b in args.batches}
  command = "python -m benchmarks.lexical_cost " + " ".join(args.argv)
  meta = {"command": command, "date": datetime.date.today().isoformat(),
          "model": str(pathlib.Path(args.model).resolve()), "spec": config.data.spec,
          "test_queries": len(texts), "num_tools": len(model.tool_ids),
          "beta": float(model.params.lexical_weight), "ranking": model.default_ranking,
          "repeats": args.repeats}
  provenance.write_json(out_json, {"meta": meta,
                                  "by_batch": {str(b): r for b, r in rows.items()}}, command)
  lines = [f"{config.data.spec} test split ({len(texts)} queries, {len(model.tool_ids)} tools), "
           f"model {meta['model']} (β = {meta['beta']:g}); `{command}`, {meta['date']}. "
           f"ms/query, median of {args.repeats} passes; the ratios are what to read.", "",
           "| batch | encoder | BM25 | predict without b | predict with b | request × | "
           "retrieval × |", "|---:|---:|---:|---:|---:|---:|---:|"]
  lines += [f"| {b} | {r['encoder']:.3f} | {r['bm25']:.3f} | {r['predict']:.3f} | "
            f"{r['predict_with_b']:.3f} | {r['request']:.2f} | {r['retrieval']:.2f} |"
            for b, r in rows.items()]
  out_md.write_text("\n".join(lines) + "\n")
  plot(rows, f"lexical term's cost: {config.data.spec}, {len(model.tool_ids)} tools, "
             f"β = {meta['beta']:g} ({meta['date']})", out_png)
  print("\n".join(lines))
  return 0


def main(argv: list[str] | None = None) -> int:
  from hyset_jax import cli
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", required=True, metavar="DIR",
                      help="a model directory with the lexical term")
  parser.add_argument("--tag", required=True, help="names the outputs")
  parser.add_argument("--config", default="bfcl",
                      help="the preset whose data set's test queries to time (default: bfcl)")
  parser.add_argument("--batches", type=int, nargs="+", default=[1, 64], metavar="B",
                      help="batch sizes (default: 1 64)")
  parser.add_argument("--repeats", type=int, default=5, help="timed passes per batch size")
  parser.add_argument("--queries", type=int, default=None, metavar="N",
                      help="time only the first N test queries (default: all)")
  parser.add_argument("--out", default="benchmarks/results", metavar="DIR",
                      help="existing folder for lexical_cost_<tag>.json and .md")
  parser.add_argument("--force", action="store_true", help="replace existing result files")
  parser.set_defaults(func=run, argv=list(sys.argv[1:] if argv is None else argv))
  return cli.run(parser, argv)


if __name__ == "__main__":
  sys.exit(main())
