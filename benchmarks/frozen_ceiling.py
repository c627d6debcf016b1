"""How far frozen query embeddings go at naming the gold *set* (ToolLens: every test set occurs
in training), independent of HYSET:

  python -m benchmarks.frozen_ceiling --config toollens --out benchmarks/results [--force]

- k-nearest training queries (cosine), votes weighted by exp(20 · similarity);
- multinomial logistic regression over the training gold sets (scikit-learn, converged, a sweep
  of C), and how often the gold set is among its top r sets.

A set predictor built on the same embeddings that HYSET reads cannot exceed what these reach by
much: they bound the exact-set rate (and so COMP@|E*|) that a frozen encoder supports.

Whether that bound is the *data's* or the *encoder's*: the same logistic regression over
TF-IDF word features of the query text (scikit-learn, sublinear tf, C = 100), how many test
queries both predictors get wrong, and their product of probabilities (the mean of the two
log-probabilities). If the two fail on different queries, the text holds more than the
embedding shows, and a tuned encoder can reach it. ``--encoder DIR`` measures the same on
another encoder's vectors (e.g. ``hyset finetune``'s OUT/encoder) and names the outputs
``frozen_ceiling_<config>_<DIR's name>``.

Writes ``frozen_ceiling_<config>[_<name>].json`` and ``.md`` under --out (an existing folder;
existing files need ``--force``).
"""
from __future__ import annotations

import argparse
import collections
import datetime
import pathlib
import sys
from typing import NamedTuple

import numpy as np

from benchmarks import provenance


def _unit(x: np.ndarray) -> np.ndarray:
  return x / np.linalg.norm(x, axis=1, keepdims=True)


class _Sets(NamedTuple):
  """The training gold sets as classes: y, int[n_train], each training query's class;
  classes, {sorted set: class}; sets, {class: sorted set}."""
  y: np.ndarray
  classes: dict[tuple[int, ...], int]
  sets: dict[int, tuple[int, ...]]


def _set_classes(train) -> _Sets:
  """Numbers the training split's distinct gold sets in order of first occurrence."""
  classes: dict[tuple[int, ...], int] = {}
  y = np.array([classes.setdefault(tuple(sorted(g)), len(classes)) for g in train.gold])
  return _Sets(y, classes, {v: k for k, v in classes.items()})


def _exact(pred, qs, sets: _Sets) -> float:
  """The share of ``qs``' queries whose predicted class is their gold set."""
  return float(np.mean([sets.sets[p] == tuple(sorted(g)) for p, g in zip(pred, qs.gold)]))


def run(args: argparse.Namespace) -> int:
  from sklearn.linear_model import LogisticRegression
  from hyset_jax import config as config_lib, io_utils
  from hyset_jax.training.train_data import prepare_data
  config = config_lib.resolve(args.config, [f"model.encoder={args.encoder}"] if args.encoder
                              else [])
  stem = f"frozen_ceiling_{args.config}" + (f"_{pathlib.Path(args.encoder).resolve().parent.name}"
                                           if args.encoder else "")
  # Both outputs checked before any work (an existing result needs --force).
  out_json, out_md = (io_utils.output_file(pathlib.Path(args.out) / f"{stem}.{ext}", args.force,
                                           inputs=[args.encoder])
                      for ext in ("json", "md"))
  data = prepare_data(config)
  c = config.data
  train, val, test = (data.splits[s] for s in (c.train_split, c.val_split, c.test_split))
  sets = _set_classes(train)
  x_train, x_val, x_test = (_unit(q.embeddings) for q in (train, val, test))

  rows: dict[str, dict] = {"test gold set occurs in training": {
      "test": float(np.mean([tuple(sorted(g)) in sets.classes for g in test.gold]))}}
  rows.update(_knn_rows(x_train, x_test, test, sets))
  probas = {}
  for cval in args.cs:
    lr = LogisticRegression(C=cval, max_iter=2000).fit(x_train, sets.y)
    row, probas[cval] = _lr_row(lr, x_val, x_test, val, test, sets)
    rows[f"logistic regression over sets, C={cval:g}"] = row
    print(f"LR C={cval:g}: {row}", flush=True)
  if args.tfidf:
    rows.update(_tfidf_rows(args.cs, rows, probas, train, val, test, sets))
  _write(out_json, out_md, rows, c.spec, data.query_encoder, train, test, sets)
  return 0


def _knn_rows(x_train: np.ndarray, x_test: np.ndarray, test, sets: _Sets) -> dict[str, dict]:
  """The k-nearest-training-queries rows (k = 1, 5, 20; votes weighted by
  exp(20 · cosine)): {row: {"test exact": rate}}."""
  rows = {}
  sim = x_test @ x_train.T
  for k in (1, 5, 20):
    pred = []
    for row in sim:
      votes: collections.Counter = collections.Counter()
      for j in np.argsort(-row)[:k]:
        votes[sets.y[j]] += float(np.exp(20 * row[j]))
      pred.append(votes.most_common(1)[0][0])
    rows[f"{k}-nearest training queries"] = {"test exact": _exact(pred, test, sets)}
    print(f"kNN k={k}: test exact {rows[f'{k}-nearest training queries']['test exact']:.4f}",
          flush=True)
  return rows


def _lr_row(fitted, features_val, features_test, val, test, sets: _Sets
            ) -> tuple[dict, np.ndarray]:
  """A fitted logistic regression's row (validation and test exact, gold among the top r
  sets) and its test probabilities."""
  proba = fitted.predict_proba(features_test)
  top = fitted.classes_[np.argsort(-proba, axis=1)]
  row = {"validation exact": _exact(fitted.predict(features_val), val, sets),
         "test exact": _exact(top[:, 0], test, sets)}
  for r in (2, 3, 5):
    row[f"gold among top {r} sets"] = float(np.mean(
        [tuple(sorted(g)) in {sets.sets[t] for t in ts[:r]} for g, ts in zip(test.gold, top)]))
  return row, proba


def _tfidf_rows(cs: list[float], rows: dict[str, dict], probas: dict[float, np.ndarray],
                train, val, test, sets: _Sets) -> dict[str, dict]:
  """The TF-IDF words' row, and how the embedding LR chosen on validation (from ``rows`` and
  its test ``probas``) overlaps with it: both wrong, and the product of the two."""
  from sklearn.feature_extraction.text import TfidfVectorizer
  from sklearn.linear_model import LogisticRegression
  out: dict[str, dict] = {}
  vectorizer = TfidfVectorizer(sublinear_tf=True).fit(train.texts)
  words = LogisticRegression(C=100.0, max_iter=2000).fit(vectorizer.transform(train.texts),
                                                         sets.y)
  row, p_words = _lr_row(words, vectorizer.transform(val.texts),
                         vectorizer.transform(test.texts), val, test, sets)
  out["logistic regression over sets, TF-IDF words (no encoder), C=100"] = row
  print(f"TF-IDF LR: {row}", flush=True)
  # The embedding LR with the strength that did best on validation, against the words.
  best_c = max(cs, key=lambda cv: rows[f"logistic regression over sets, C={cv:g}"]
               ["validation exact"])
  p_emb = probas[best_c]
  right_emb = np.array([sets.sets[t] == tuple(sorted(g)) for t, g in
                        zip(words.classes_[p_emb.argmax(1)], test.gold)])
  right_words = np.array([sets.sets[t] == tuple(sorted(g)) for t, g in
                          zip(words.classes_[p_words.argmax(1)], test.gold)])
  both = np.log(p_emb + 1e-12) + np.log(p_words + 1e-12)
  out[f"both wrong (embeddings C={best_c:g} and TF-IDF)"] = {
      "test": float(np.mean(~right_emb & ~right_words))}
  out[f"product of the two (embeddings C={best_c:g} × TF-IDF)"] = {
      "test exact": _exact(words.classes_[both.argmax(1)], test, sets)}
  print(out[f"product of the two (embeddings C={best_c:g} × TF-IDF)"], flush=True)
  return out


def _write(out_json: pathlib.Path, out_md: pathlib.Path, rows: dict[str, dict], spec: str,
           query_encoder: str, train, test, sets: _Sets) -> None:
  """Writes the JSON result and the Markdown table, and prints the table."""
  command = "python -m benchmarks.frozen_ceiling " + " ".join(sys.argv[1:])
  meta = {"command": command, "date": datetime.date.today().isoformat(), "spec": spec,
          "query_encoder": query_encoder,
          "train_queries": len(train.ids), "test_queries": len(test.ids),
          "training_sets": len(sets.classes)}
  provenance.write_json(out_json, {"meta": meta, "rows": rows}, command)
  keys = sorted({k for r in rows.values() for k in r}, key=lambda k: (k != "validation exact",
                                                                        k != "test exact", k))
  lines = [f"{spec}: {len(train.ids)} training queries over {len(sets.classes)} distinct gold "
           f"sets, {len(test.ids)} test queries; query embeddings of {query_encoder}; "
           f"`{command}`, {meta['date']}.", "", "| predictor | " + " | ".join(keys) + " |",
           "|---|" + "---:|" * len(keys)]
  for name, r in rows.items():
    lines.append(f"| {name} | " + " | ".join(f"{100 * r[k]:.2f}" if k in r else "–"
                                             for k in keys) + " |")
  out_md.write_text("\n".join(lines) + "\n")
  print("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
  from hyset_jax import cli
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", default="toollens")
  parser.add_argument("--cs", type=float, nargs="+", default=[1.0, 10.0, 100.0],
                      help="inverse regularisation strengths C of the logistic regression")
  parser.add_argument("--encoder", metavar="DIR",
                      help="a sentence-transformers directory to embed with instead of the "
                           "config's encoder (e.g. hyset finetune's OUT/encoder)")
  parser.add_argument("--no-tfidf", dest="tfidf", action="store_false",
                      help="skip the TF-IDF predictor, the overlap and the product rows")
  parser.add_argument("--out", default="benchmarks/results", metavar="DIR",
                      help="existing folder for frozen_ceiling_<config>[_<name>].json and .md")
  parser.add_argument("--force", action="store_true", help="replace existing result files")
  parser.set_defaults(func=run)
  return cli.run(parser, argv)


if __name__ == "__main__":
  sys.exit(main())
