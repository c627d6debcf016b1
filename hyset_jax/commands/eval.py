"""``hyset eval``: score one retrieval method on one split of a data set.

    hyset eval --data SPEC --split NAME --method METHOD [--model DIR] [--encoder DIR] \
        [--seed N] [--limit N] [--ranking R] [--precision f32|bf16] --out metrics.json [--force]

METHOD: bm25, dense, fusion, hyset, linear-head, mlp-head, set-classifier, or one of the
paper's set-level baselines: cardinality, mmr, facility-location, deepsets, set-transformer.

Writes the metrics of docs/contracts.md (``hyset_jax.evaluation.metrics.evaluate``) as JSON
and prints a one-line summary; ``--precision`` (``--method hyset``; the dtype of the prepared
products, as ``hyset predict --precision``) is recorded in the JSON as ``"precision"`` when
given. ``--method hyset`` without ``--model`` scores the
untrained HYSET built from the encoder's tool embeddings (P = I, M = 0), which
ranks exactly like ``dense``: the baseline any training must beat. ``--model``
takes a model directory or a ``hyset train`` workdir (its best/ model); a model trained on
another library is carried onto the data set's (hyset_jax.io.carry: tools it lacks get the
tool encoder's embedding, tools the library does not list are dropped, stderr says how many;
on a library with none of the model's tools, its query tower is left out and the default
ranking is logit).
``--split validation`` on a data set without one scores the validation split
training carves out of train (same query-id hash, ``--validation-fraction``).
The trained baselines
(``linear-head``, ``mlp-head``, ``set-classifier``: hyset_jax.retrievers.trained) are first fit
on the data set's train split (less the validation carve HYSET training makes), with --seed;
the set-level baselines (docs/baselines.md) choose their settings on that validation split.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from hyset_jax.commands import float_in_open_unit, int_at_least
from hyset_jax.data import specs
from hyset_jax.data.types import ToolLibrary
from hyset_jax.errors import UserError

# hyset_jax.retrievers.trained.TRAINED_METHODS, spelled out: importing the retrievers
# package (bm25s, ~2 s) would slow every `hyset` invocation that only builds the parser.
TRAINED_METHODS = ("linear-head", "mlp-head", "set-classifier", "cardinality", "mmr",
                   "facility-location", "deepsets", "set-transformer")
METHODS = ("bm25", "dense", "fusion", "hyset", *TRAINED_METHODS)

# Rankings are read to the deepest reported cut-off (COMP@5, NDCG@5).
EVAL_DEPTH = 5


def add_parser(subparsers: Any) -> None:
  p = subparsers.add_parser(
      "eval", help="score a retrieval method on a data split (metrics of docs/contracts.md)",
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--data", required=True, metavar="SPEC",
                 help="data set: a data spec (docs/contracts.md): " + specs.spec_forms())
  p.add_argument("--split", required=True, metavar="NAME",
                 help="split to score, e.g. test or validation")
  p.add_argument("--validation-fraction", type=float_in_open_unit, default=None, metavar="F",
                 help="--split validation on data without one: the fraction of train carved "
                      "out, as training's data.validation_fraction (default: the --model "
                      "workdir's config.json, else 0.1)")
  p.add_argument("--method", required=True, choices=METHODS, help="retrieval method to score")
  p.add_argument("--model", metavar="DIR",
                 help="--method hyset: a model directory or a hyset train workdir "
                      "(its best/); default: untrained HYSET")
  p.add_argument("--encoder", metavar="DIR",
                 help="frozen encoder checkpoint directory (default: all-MiniLM-L6-v2; "
                      "with --model, the query_encoder its manifest names)")
  p.add_argument("--seed", type=int, default=0,
                 help="seed of a trained baseline (linear-head, mlp-head, set-classifier, "
                      "the set-level baselines)")
  p.add_argument("--limit", type=int_at_least(1), metavar="N",
                 help="score only the first N queries of the split (default: all)")
  from hyset_jax import choices
  p.add_argument("--ranking", choices=choices.RANKINGS, default=None,
                 help="--method hyset: how the shortlist is ranked (default: the model's, else "
                      f"{choices.DEFAULT_RANKING})")
  p.add_argument("--precision", choices=choices.PRECISIONS, default=None,
                 help="--method hyset: dtype of the prepared products P Zᵀ and Z M_m, as "
                      f"hyset predict --precision (default {choices.DEFAULT_PRECISION}; bf16 is "
                      "approximate: docs/speed.md); recorded in the metrics JSON when given")
  p.add_argument("--out", required=True, metavar="FILE", help="where to write the metrics JSON")
  p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
  p.set_defaults(func=run)


def _check_args(args: argparse.Namespace) -> None:
  if args.model is not None and args.method != "hyset":
    raise UserError(f"--model is only used with --method hyset, not --method {args.method}")
  if args.ranking is not None and args.method != "hyset":
    raise UserError(f"--ranking is only used with --method hyset, not --method {args.method}")
  if args.precision is not None and args.method != "hyset":
    raise UserError(f"--precision is only used with --method hyset (it sets the dtype of "
                    f"HYSET's prepared products), not --method {args.method}")
  if args.encoder is not None and args.method == "bm25":
    raise UserError("--encoder is not used by --method bm25 (it has no encoder)")
  if args.method in TRAINED_METHODS and args.split == "train":
    raise UserError(f"--method {args.method} is fit on the train split; score it on another "
                    f"split (e.g. test)")


def validation_fraction(explicit: float | None, model: str | None) -> float | None:
  """--validation-fraction, else data.validation_fraction of the training run's config.json
  (the --model workdir, or the workdir around a best/ or final/ model), else None."""
  if explicit is not None or model is None:
    return explicit
  for config in (Path(model) / "config.json", Path(model).parent / "config.json"):
    if config.is_file():
      try:
        value = json.loads(config.read_text(encoding="utf-8"))["data"]["validation_fraction"]
      except (ValueError, KeyError, TypeError, OSError):
        return None
      return value if isinstance(value, float) and 0 < value < 1 else None
  return None


def _load_encoder(path: str | None) -> Any:
  from hyset_jax.encoder import load_encoder
  return load_encoder(model_dir=path)


def _hyset_from_model_dir(path: str, encoder_dir: str | None, tools: ToolLibrary,
                          ranking: str | None = None, data: str = "the data set's library",
                          precision: str = "f32") -> Any:
  """A HysetRetriever from a model directory or a training workdir's best/, carried onto the
  data's library (``data``: its spec) when that differs from the model's (hyset_jax.io.carry)."""
  from hyset_jax.io.modeldir import load_best
  from hyset_jax.io.carry import carry_onto
  from hyset_jax.retrievers import HysetRetriever
  model = carry_onto(load_best(path)[1], tools, data)
  encoder = _load_encoder(encoder_dir if encoder_dir is not None else model.query_encoder)
  return HysetRetriever(model.params, model.tool_ids, encoder,
                        k1=model.k1, k_pool=model.k_pool, max_size=model.max_set_size,
                        ranking=ranking or model.ranking, lexical=model.lexical,
                        precision=precision)


def build_retriever(method: str, tools: ToolLibrary, *, model: str | None = None,
                    encoder_dir: str | None = None, ranking: str | None = None,
                    train: Any = (), seed: int = 0, data: str = "the data set's library",
                    validation: Any = (), precision: str = "f32") -> Any:
  """The retriever ``--method`` names, over the data set's tool library (``train``: the
  queries a trained baseline is fit on; ``validation``: those the set-level baselines choose
  their settings on; ``data``: the library's spec, for messages; ``precision``: HYSET's
  prepared products' dtype)."""
  from hyset_jax import retrievers
  if method in TRAINED_METHODS:
    from hyset_jax.retrievers.trained import fit_baseline
    return fit_baseline(method, tools, _load_encoder(encoder_dir), train, seed=seed,
                        validation=validation)
  if method == "bm25":
    return retrievers.BM25Retriever(tools)
  if method == "hyset" and model is not None:
    return _hyset_from_model_dir(model, encoder_dir, tools, ranking, data, precision)
  encoder = _load_encoder(encoder_dir)
  if method == "dense":
    return retrievers.DenseRetriever(tools, encoder)
  if method == "fusion":
    # BM25 first: it breaks RRF ties.
    return retrievers.FusionRetriever(
        [retrievers.BM25Retriever(tools), retrievers.DenseRetriever(tools, encoder)])
  if method == "hyset":
    return retrievers.HysetRetriever.untrained(tools, encoder, ranking=ranking,
                                               precision=precision)
  raise UserError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")


def summary_line(method: str, data: str, split: str, metrics: dict, seconds: float) -> str:
  """One line: method, data, split, size and the headline metrics, as percentages."""
  keys = ("recall@3", "recall@5", "ndcg@3", "ndcg@5", "comp@3", "comp@5", "set_f1")
  parts = " ".join(f"{k}={100 * metrics[k]:.2f}" for k in keys)
  return f"{method} {data} {split} n={metrics['n_queries']}: {parts} ({seconds:.1f}s)"


def run(args: argparse.Namespace) -> int:
  from hyset_jax import choices, io_utils
  from hyset_jax.data import splits
  from hyset_jax.data.specs import input_paths, load_dataset
  from hyset_jax.evaluation.metrics import evaluate

  _check_args(args)
  # Fail before minutes of encoding.
  out = io_utils.output_file(args.out, args.force,
                             inputs=(*input_paths(args.data), args.model, args.encoder))
  start = time.perf_counter()
  dataset = load_dataset(args.data)
  if args.split == "validation":
    # The split training validates on (hyset_jax.training.train.prepare_data does the same).
    fraction = validation_fraction(args.validation_fraction, args.model)
    dataset = (splits.with_validation(dataset) if fraction is None
               else splits.with_validation(dataset, fraction))
  queries = dataset.split(args.split)
  if args.limit is not None:
    queries = queries[:args.limit]
  if not queries:
    raise UserError(f"split {args.split!r} of {args.data} has no queries to score")
  no_gold = [q.id for q in queries if not q.gold]
  if no_gold:
    raise UserError(f"{len(no_gold)} queries of split {args.split!r} have no gold tools "
                    f"(e.g. {', '.join(no_gold[:3])}); metrics are undefined for them")

  train = validation = ()
  if args.method in TRAINED_METHODS:
    from hyset_jax.config import DataConfig
    from hyset_jax.data.splits import with_validation
    carved = with_validation(dataset, DataConfig.validation_fraction)
    train, validation = carved.split("train"), carved.split("validation")
  retriever = build_retriever(args.method, dataset.tools, model=args.model,
                              encoder_dir=args.encoder, ranking=args.ranking, train=train,
                              seed=args.seed, data=args.data, validation=validation,
                              precision=args.precision or choices.DEFAULT_PRECISION)
  result = retriever.retrieve([q.text for q in queries], depth=EVAL_DEPTH)
  metrics = evaluate(result.rankings, [q.gold for q in queries], result.sets)
  if args.precision is not None:
    # Only when given: the default record stays the metric keys of docs/contracts.md alone.
    metrics["precision"] = args.precision

  with io_utils.atomic_write(out) as f:
    f.write(json.dumps(metrics, indent=2) + "\n")
  print(summary_line(args.method, args.data, args.split, metrics, time.perf_counter() - start)
        + f" -> {out}")
  return 0
