"""What the choices after θ cost: every candidate of a finished run's post-θ grid scored on its
validation and on its test split, so that what validation chose stands beside what the test
would have chosen.

  python -m benchmarks.selection_ceiling --workdir RUN [--workdir RUN2 ...] \\
      --out benchmarks/results/selection_ceiling_NAME.json [--force]

The grid, on the run's best/ model with every post-θ term stripped: the row blend's α (1 and
``row_blend.ALPHAS``, where the run has the term on and trains Z) × the lexical term's β (0 and
its grid, where the run has it on) × every ranking they allow. The seen-set prior is left out
(λ = 0): its fit is the slowest, and where test combinations are new validation rarely keeps it.
Candidates are scored jointly (training chooses term by term, in registry order) on the run's
validation (both parts where it has two) and on its test split, by the criterion the fits use
(the mean of ``SET_CHOICE_METRICS``).

Per run: validation's pick with its test COMP@5 and R@5; the test's own pick by the same
criterion; the best test COMP@5 of any candidate. Writes FILE (JSON, with provenance) and
FILE with the suffix .md, a table (an existing file needs --force).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

import numpy as np

from benchmarks import provenance


def grid(model, data, config):
  """(label, model) for every α × β of the run's switched-on terms (α = 1, β = 0 included)."""
  from hyset_jax.model import terms
  mc = config.model
  alphas = [("α=1", model)]
  if mc.row_blend:  # the term's own grid (none where Z is the encoder's)
    alphas += list(terms.REGISTRY["row_blend"].fit.candidates(model, data, config))
  for a_label, m in alphas:
    yield f"{a_label} β=0", m
    if mc.lexical:
      for b_label, mb in terms.REGISTRY["lexical"].fit.candidates(m, data, config):
        yield f"{a_label} {b_label}", mb


def criterion(metrics: dict[str, float]) -> float:
  from hyset_jax.model.terms.lexical import SET_CHOICE_METRICS
  return float(np.mean([metrics[k] for k in SET_CHOICE_METRICS]))


def score_run(workdir: pathlib.Path, batch_size: int = 256) -> dict:
  """Every candidate of ``workdir``'s grid on validation and test; the three picks."""
  from hyset_jax import config as config_lib
  from hyset_jax.errors import UserError
  from hyset_jax.evaluation import evaluator
  from hyset_jax.io import modeldir
  from hyset_jax.model import terms
  from hyset_jax.training import post_theta
  from hyset_jax.training.train_data import prepare_data, validation_parts
  for need in ("config.json", "best"):
    if not (workdir / need).exists():
      raise UserError(f"--workdir {workdir}: no {need}; pass a finished `hyset train` workdir")
  try:
    saved = json.loads((workdir / "config.json").read_text())
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise UserError(f"{workdir / 'config.json'}: not valid JSON ({e})") from None
  if not isinstance(saved, dict):
    raise UserError(f"{workdir / 'config.json'}: expected a JSON object (a hyset config), got "
                    f"{type(saved).__name__}")
  config = config_lib.validate(config_lib.from_dict(saved))
  data = prepare_data(config)
  if config.data.test_split not in data.splits:
    raise UserError(f"--workdir {workdir}: its data ({config.data.spec}) has no "
                    f"{config.data.test_split!r} split to score")
  model = post_theta.strip(modeldir.load_model_dir(workdir / "best"))
  parts, test = validation_parts(data, config.data), data.splits[config.data.test_split]
  rows = {}
  for label, m in grid(model, data, config):
    rankings = tuple(terms.allowed_rankings(m.params))
    val = evaluator.evaluate_parts(m.params, parts, data.tool_ids, config.model, batch_size,
                                   rankings, lexical=m.lexical)
    tst = evaluator.evaluate_rankings(m.params, test, data.tool_ids, config.model, batch_size,
                                      rankings, lexical=m.lexical)
    for r in rankings:
      rows[f"{label} {r}"] = {"validation": criterion(val[r]), "test": criterion(tst[r]),
                              "validation comp@5": val[r]["comp@5"],
                              "test comp@5": tst[r]["comp@5"], "test recall@5": tst[r]["recall@5"]}
    print(f"{workdir.name}: {label}: best test COMP@5 "
          f"{100 * max(tst[r]['comp@5'] for r in rankings):.2f}", flush=True)
  # Ties: max keeps the first candidate (α = 1, β = 0 and the paper's greedy come first), as the
  # fits do.
  pick = lambda key: max(rows, key=lambda k: rows[k][key])
  return {"workdir": str(workdir), "candidates": rows,
          "validation pick": pick("validation"), "test pick": pick("test"),
          "best test comp@5": pick("test comp@5"),
          "test queries": len(test.ids),
          "validation queries": sum(len(q.ids) for q in parts.values())}


def table_md(runs: list[dict], command: str, date: str) -> str:
  lines = [f"`{command}`; {date}. COMP@5 and R@5 on test in percent; the picks by the mean of "
           "the fits' criterion metrics (validation's, the test's own), and the best COMP@5 of "
           "any candidate.", "",
           "| run | validation's pick | test COMP@5 | test R@5 | the test's pick | test COMP@5 "
           "| best candidate for COMP@5 | test COMP@5 |", "|---|---|---:|---:|---|---:|---|---:|"]
  got = {k: [] for k in ("v", "t", "b")}
  for run in runs:
    c = run["candidates"]
    v, t, b = run["validation pick"], run["test pick"], run["best test comp@5"]
    for key, pick in zip(got, (v, t, b)):
      got[key].append(100 * c[pick]["test comp@5"])
    lines.append(f"| {pathlib.Path(run['workdir']).name} | {v} | {100 * c[v]['test comp@5']:.2f} "
                 f"| {100 * c[v]['test recall@5']:.2f} | {t} | {100 * c[t]['test comp@5']:.2f} "
                 f"| {b} | {100 * c[b]['test comp@5']:.2f} |")
  if len(runs) > 1:
    lines.append(f"| mean | | {np.mean(got['v']):.2f} | | | {np.mean(got['t']):.2f} | | "
                 f"{np.mean(got['b']):.2f} |")
  return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
  from hyset_jax import io_utils
  out = pathlib.Path(args.out)
  if out.suffix != ".json":
    from hyset_jax.errors import UserError
    raise UserError(f"--out {out}: expected a .json file name (the table goes beside it as .md)")
  out_json = io_utils.output_file(out, args.force)
  out_md = io_utils.output_file(out.with_suffix(".md"), args.force)
  runs = [score_run(pathlib.Path(w)) for w in args.workdir]
  command = " ".join(["python -m benchmarks.selection_ceiling",
                      *(f"--workdir {w}" for w in args.workdir), f"--out {args.out}"])
  provenance.write_json(out_json, {"runs": runs}, command)
  meta = json.loads(out_json.read_text())["provenance"]
  out_md.write_text(table_md(runs, meta["command"], f"{meta['machine']}; {meta['date']}"))
  print(out_md.read_text(), end="")
  return 0


def main(argv: list[str] | None = None) -> int:
  from hyset_jax import cli
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir", action="append", required=True, metavar="DIR",
                      help="a finished `hyset train` workdir (repeatable)")
  parser.add_argument("--out", required=True, metavar="FILE.json",
                      help="the JSON result; the Markdown table goes beside it as .md")
  parser.add_argument("--force", action="store_true", help="replace existing result files")
  parser.set_defaults(func=run)
  return cli.run(parser, argv)


if __name__ == "__main__":
  sys.exit(main())
