"""The ``toolscout`` console script.

    toolscout fit --reference FILE.jsonl --out DIR [--threshold τ] [--force]
    toolscout route --router DIR --queries FILE.jsonl [--window N | --batch N]
                    [--threshold τ] --out FILE.jsonl [--force]
    toolscout experiment --config tiny|full --out DIR [--set KEY=VALUE ...] [--force]

``fit`` fits the TF-IDF fingerprint on the reference (training) source's queries
and stores τ: the one given, or τ(N) per window size derived from held-out
reference windows (:mod:`toolscout.router`). ``route`` writes one line per
query, in input order: ``{"query_id", "distance", "route"}`` with ``route``
``"specialist"`` when distance < τ, else ``"aggregate"``. Per request by default;
``--window N`` scores each request with the centroid of the last N requests
(rolling), ``--batch N`` scores consecutive chunks of N requests together. The first
N − 1 rolling windows (and a last, shorter chunk) hold fewer than N requests; each takes
the τ of the size it holds, not τ(N). N larger than the stream is an error: no request
would be scored on N requests.
``experiment`` runs the paper's main experiment (:mod:`toolscout.experiment`).

Outputs: an existing ``--out`` is refused without ``--force``, and ``--force`` replaces
only its own kind (a router directory, a report directory, a routes file) — never a
directory of another kind, such as a ``hyset`` model directory.

User errors print ``error: ...`` on stderr and exit 2, without a traceback.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from hyset_jax.errors import UserError


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="toolscout", description="Source-style routing in front of tool retrievers (ToolScout).")
  sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

  fit = sub.add_parser("fit", help="fit a router on reference (training-source) queries",
                       description="Fit the TF-IDF fingerprint and threshold on reference queries.")
  fit.add_argument("--reference", required=True, metavar="FILE.jsonl",
                   help="the specialist's training queries, BEIR format ({\"_id\", \"text\"})")
  fit.add_argument("--out", required=True, metavar="DIR", help="router directory to write")
  fit.add_argument("--threshold", type=float, metavar="TAU",
                   help="route to the specialist when distance < TAU (in (0, 1]); default: "
                        "95th percentile of held-out reference windows, per window size")
  fit.add_argument("--force", action="store_true",
                   help="replace DIR if it is a toolscout router (never another kind of directory)")
  fit.set_defaults(func=run_fit)

  rt = sub.add_parser("route", help="route queries to the specialist or the aggregate retriever",
                      description="Score queries against a fitted router and route them.")
  rt.add_argument("--router", required=True, metavar="DIR", help="directory from `toolscout fit`")
  rt.add_argument("--queries", required=True, metavar="FILE.jsonl",
                  help="incoming queries in order, BEIR format ({\"_id\", \"text\"})")
  mode = rt.add_mutually_exclusive_group()
  mode.add_argument("--window", type=int, metavar="N",
                    help="score each query with the centroid of the last N queries (rolling; "
                         "N at most the number of queries)")
  mode.add_argument("--batch", type=int, metavar="N",
                    help="score consecutive chunks of N queries together (N at most the number "
                        "of queries)")
  rt.add_argument("--threshold", type=float, metavar="TAU",
                  help="override the router's threshold")
  rt.add_argument("--out", required=True, metavar="FILE.jsonl", help="where to write decisions")
  rt.add_argument("--force", action="store_true", help="overwrite --out if it exists")
  rt.set_defaults(func=run_route)

  ex = sub.add_parser("experiment", help="run the paper's main experiment end to end",
                      description="Specialist collapse, routing, detectors, repair, skill cards.")
  ex.add_argument("--config", required=True, metavar="NAME", help="preset: tiny or full")
  ex.add_argument("--out", required=True, metavar="DIR", help="report directory")
  ex.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                  help="override a config field, e.g. --set seed=1 (repeatable)")
  ex.add_argument("--force", action="store_true",
                  help="replace DIR if it holds a toolscout report (never another kind of directory)")
  ex.set_defaults(func=run_experiment)
  return parser


def _check_threshold(tau: float | None) -> None:
  if tau is not None and not 0.0 < tau <= 1.0:
    raise UserError(f"--threshold must be in (0, 1] (TF-IDF distances lie in [0, 1]), got {tau}")


def run_fit(args: argparse.Namespace) -> int:
  from toolscout import fingerprint as fpr
  from toolscout import router, routerdir
  from toolscout.queries import read_queries

  _check_threshold(args.threshold)
  out = routerdir.check_out(args.out, args.force, inputs=[args.reference])
  ids, texts = read_queries(args.reference, "reference query file")
  if len(ids) < router.MIN_REFERENCE:
    raise UserError(
        f"{args.reference}: only {len(ids)} reference queries; need at least "
        f"{router.MIN_REFERENCE} to fit the fingerprint and hold out windows for τ")
  start = time.perf_counter()
  try:
    fp = fpr.fit_fingerprint(texts)
    thresholds = (None if args.threshold is not None else router.default_thresholds(ids, texts))
  except ValueError as e:
    raise UserError(f"{args.reference}: cannot fit the fingerprint: {e}") from None
  fit_s = time.perf_counter() - start
  if args.threshold is not None:
    model = routerdir.Router(fp, {1: args.threshold}, "given")
  else:
    model = routerdir.Router(fp, thresholds, "reference-holdout", {"holdout": {
        "fraction": router.HOLDOUT_FRACTION, "quantile": router.HOLDOUT_QUANTILE,
        "rule": "tau(N) = quantile of held-out reference window distances; fingerprint for "
                "the holdout fitted on the other queries"}})
  routerdir.save_router(model, out, args.force)
  taus = ", ".join(f"N={k}: {v:.3f}" for k, v in sorted(model.thresholds.items()))
  print(f"fitted on {len(ids)} reference queries, {len(fp.vocabulary)} terms, "
        f"{fit_s:.2f}s; tau ({model.threshold_source}) {taus}; wrote {out}")
  return 0


def _check_window(flag: str, size: int, n: int, path: str) -> None:
  """A window or batch larger than the stream would score no request on N requests: τ(N)
  would then be applied to partial windows it was never calibrated for."""
  if size > n:
    raise UserError(f"{flag} {size} is larger than the {n} queries in {path}: no request would "
                    f"be scored with a window of {size}; use {flag} {n} or less")


def run_route(args: argparse.Namespace) -> int:
  from hyset_jax import io_utils
  from toolscout import fingerprint as fpr
  from toolscout import outputs, router, routerdir
  from toolscout.queries import read_queries

  _check_threshold(args.threshold)
  for flag, value in (("--window", args.window), ("--batch", args.batch)):
    if value is not None and value < 1:
      raise UserError(f"{flag} must be >= 1, got {value}")
  out = outputs.check_file(args.out, args.force, inputs=[args.queries, args.router])
  model = routerdir.load_router(args.router)
  ids, texts = read_queries(args.queries)
  flag, size = ("--batch", args.batch) if args.batch is not None else ("--window", args.window or 1)
  _check_window(flag, size, len(ids), args.queries)
  start = time.perf_counter()
  if args.batch is not None:
    distances = fpr.chunk_distances(model.fingerprint, texts, size)
    seen = fpr.chunk_sizes(len(texts), size)
  else:
    distances = fpr.window_distances(model.fingerprint, texts, size)
    seen = fpr.window_sizes(len(texts), size)
  thresholds = {1: args.threshold} if args.threshold is not None else model.thresholds
  taus = router.thresholds_for_sizes(thresholds, seen)
  routes = router.route(distances, taus)
  elapsed = time.perf_counter() - start
  with io_utils.atomic_write(out) as f:
    for query_id, d, r in zip(ids, distances, routes):
      f.write(json.dumps({"query_id": query_id, "distance": round(float(d), 6),
                          "route": str(r)}) + "\n")
  n_spec = int((routes == router.SPECIALIST).sum())
  partial = int((seen < size).sum())
  shorter = (f"; {partial} scored on fewer than {size} queries, each with the tau of its size"
             if partial else "")
  print(f"routed {len(ids)} queries (tau={router.threshold_for_window(thresholds, size):.3f}"
        f"{shorter}): {n_spec} specialist, {len(ids) - n_spec} aggregate; "
        f"{1000 * elapsed / len(ids):.3f} ms/query; wrote {out}")
  return 0


def run_experiment(args: argparse.Namespace) -> int:
  from toolscout import config as cfg
  from toolscout import experiment

  config = cfg.apply_overrides(cfg.get_config(args.config), args.set)
  experiment.run_and_write(config, args.out, args.force)  # checks --out before any work
  return 0


def main(argv: list[str] | None = None) -> int:
  from hyset_jax.cli import run
  return run(build_parser(), argv)


if __name__ == "__main__":
  sys.exit(main())
