"""The router directory ``toolscout fit`` writes and ``toolscout route`` reads.

Format ``toolscout-router/1``::

  DIR/manifest.json    {"format": "toolscout-router/1", "thresholds": {"<N>": τ, ...},
                        "threshold_source": "given" | "reference-holdout",
                        "n_reference", "vocabulary_size", "tfidf": {vectorizer settings},
                        "holdout": {...} (reference-holdout only)}
  DIR/vocabulary.json  the TF-IDF terms in column order (a JSON list)
  DIR/arrays.npz       idf float64[V], centroid float64[V]  (no pickles)

``thresholds`` maps a window size N to τ(N) (:func:`toolscout.router.threshold_for_window`
picks one); a τ given on the command line is stored as the single key ``"1"``,
which that rule then applies to every window size. Nothing is pickled, so a
directory is readable by any scikit-learn version and by other stacks. A
directory of any other format is refused with a message that says to refit.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import zipfile
from typing import Any

import numpy as np

from hyset_jax.errors import UserError
from hyset_jax.io_utils import atomic_write
from toolscout import fingerprint as fpr

FORMAT = "toolscout-router/1"
MANIFEST = "manifest.json"
VOCABULARY = "vocabulary.json"
ARRAYS = "arrays.npz"


@dataclasses.dataclass(frozen=True)
class Router:
  """A fitted router: the reference fingerprint and τ per window size."""
  fingerprint: fpr.Fingerprint
  thresholds: dict[int, float]
  threshold_source: str
  info: dict[str, Any] = dataclasses.field(default_factory=dict)


def save_router(router: Router, directory: str | pathlib.Path) -> None:
  """Writes ``router`` into ``directory`` (created; files replaced atomically)."""
  directory = pathlib.Path(directory)
  try:
    directory.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise UserError(f"cannot create folder {directory}: {e.strerror}") from None
  fp = router.fingerprint
  params = {k: fp.vectorizer.get_params()[k] for k in fpr.TFIDF_PARAMS}
  manifest = {
      "format": FORMAT,
      "thresholds": {str(k): float(v) for k, v in sorted(router.thresholds.items())},
      "threshold_source": router.threshold_source,
      "n_reference": fp.n_reference,
      "vocabulary_size": len(fp.vocabulary),
      "tfidf": {k: list(v) if isinstance(v, tuple) else v for k, v in params.items()},
      **router.info,
  }
  with atomic_write(directory / ARRAYS, "wb") as f:
    np.savez(f, idf=fp.vectorizer.idf_, centroid=fp.centroid)
  with atomic_write(directory / VOCABULARY) as f:
    json.dump(fp.vocabulary, f, ensure_ascii=False)
  # The manifest last: a directory with a manifest is complete.
  with atomic_write(directory / MANIFEST) as f:
    json.dump(manifest, f, indent=2, ensure_ascii=False)
    f.write("\n")


def _read_json(path: pathlib.Path, what: str) -> Any:
  if not path.is_file():
    raise UserError(f"{path}: missing {what}; is {path.parent} a directory written by "
                    f"`toolscout fit`?")
  try:
    return json.loads(path.read_text(encoding="utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise UserError(f"{path}: not valid JSON ({e}); refit the router with `toolscout fit`") from None


def load_router(directory: str | pathlib.Path) -> Router:
  """Reads a ``toolscout-router/1`` directory.

  Raises:
    UserError: missing or malformed files, or a directory of another format
      (an older or newer toolscout), with what to do about it.
  """
  directory = pathlib.Path(directory)
  if not directory.is_dir():
    raise UserError(f"{directory}: no such router directory; create one with "
                    f"`toolscout fit --reference FILE.jsonl --out {directory}`")
  manifest = _read_json(directory / MANIFEST, "router manifest (manifest.json)")
  found = manifest.get("format") if isinstance(manifest, dict) else None
  if found != FORMAT:
    raise UserError(
        f"{directory}: router format {found!r} is not supported; this toolscout reads "
        f"{FORMAT!r}. Refit the router with this version: `toolscout fit --reference "
        f"FILE.jsonl --out {directory} --force`")
  vocabulary = _read_json(directory / VOCABULARY, "vocabulary (vocabulary.json)")
  try:
    with np.load(directory / ARRAYS, allow_pickle=False) as arrays:
      idf, centroid = arrays["idf"], arrays["centroid"]
  except FileNotFoundError:
    raise UserError(f"{directory / ARRAYS}: missing; refit the router with `toolscout fit`") from None
  except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
    raise UserError(f"{directory / ARRAYS}: unreadable ({e}); refit the router with "
                    f"`toolscout fit`") from None
  try:
    thresholds = {int(k): float(v) for k, v in manifest["thresholds"].items()}
    n_reference = int(manifest["n_reference"])
    params = dict(manifest["tfidf"])
    source = str(manifest["threshold_source"])
  except (KeyError, TypeError, ValueError, AttributeError) as e:
    raise UserError(f"{directory / MANIFEST}: malformed manifest ({type(e).__name__}: {e}); "
                    f"refit the router with `toolscout fit`") from None
  if not thresholds:
    raise UserError(f"{directory / MANIFEST}: no thresholds; refit the router")
  n = len(vocabulary) if isinstance(vocabulary, list) else -1
  if n < 1 or idf.shape != (n,) or centroid.shape != (n,):
    raise UserError(f"{directory}: vocabulary ({n} terms), idf {idf.shape} and centroid "
                    f"{centroid.shape} disagree; refit the router with `toolscout fit`")
  fp = fpr.rebuild_fingerprint(vocabulary, idf, centroid, n_reference, params)
  extra = {k: v for k, v in manifest.items()
           if k not in ("format", "thresholds", "threshold_source", "n_reference",
                        "vocabulary_size", "tfidf")}
  return Router(fp, thresholds, source, extra)
