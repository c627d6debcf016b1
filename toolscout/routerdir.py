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
directory is readable by any scikit-learn version and by other stacks. A router of
another version is refused with a message that says to refit; a directory that is not
a router at all (a ``hyset`` model directory also has a ``manifest.json``) is refused as
such, and ``toolscout fit --force`` never replaces it.

A directory is written through one staged directory
(:func:`hyset_jax.io_utils.atomic_dir`): it appears complete or not at all.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import zipfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from hyset_jax.errors import UserError
from hyset_jax.io_utils import atomic_dir, atomic_write
from toolscout import fingerprint as fpr
from toolscout import outputs

FORMAT = "toolscout-router/1"
_KIND = FORMAT.split("/")[0] + "/"  # every version of the format
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


def is_router_dir(path: pathlib.Path) -> bool:
  """Whether ``path`` holds a router of any ``toolscout-router/*`` format (the only kind of
  directory ``toolscout fit --force`` replaces)."""
  return outputs.format_of(path / MANIFEST).startswith(_KIND)


def check_out(directory: str | pathlib.Path, force: bool,
              inputs: Sequence[str | pathlib.Path] = ()) -> pathlib.Path:
  """Fail before any work unless a router may be written to ``directory``
  (:func:`toolscout.outputs.check_dir`; ``inputs``: the files it is fitted from)."""
  return outputs.check_dir(directory, force, "toolscout router", is_router_dir, inputs)


def save_router(router: Router, directory: str | pathlib.Path, force: bool = False) -> None:
  """Writes ``router`` as ``directory`` through a staged directory
  (:func:`hyset_jax.io_utils.atomic_dir`): a new directory, or with ``force`` one that
  replaces an existing router as a whole; never anything else (:func:`check_out`)."""
  directory = check_out(directory, force)
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
  with atomic_dir(directory, force) as tmp:
    with atomic_write(tmp / ARRAYS, "wb") as f:
      np.savez(f, idf=fp.vectorizer.idf_, centroid=fp.centroid)
    with atomic_write(tmp / VOCABULARY) as f:
      json.dump(fp.vocabulary, f, ensure_ascii=False)
    with atomic_write(tmp / MANIFEST) as f:
      json.dump(manifest, f, indent=2, ensure_ascii=False)
      f.write("\n")


def _read_json(path: pathlib.Path, what: str) -> Any:
  if not path.is_file():
    raise UserError(f"{path}: missing {what}; is {path.parent} a directory written by "
                    f"`toolscout fit`?")
  try:
    return json.loads(path.read_text(encoding="utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise UserError(f"{path}: not valid JSON ({e}); is {path.parent} a directory written by "
                    f"`toolscout fit`?") from None


def _check_format(directory: pathlib.Path, manifest: Any) -> None:
  found = manifest.get("format") if isinstance(manifest, dict) else None
  if not isinstance(found, str) or not found.startswith(_KIND):
    # Another kind of directory (a hyset model has a manifest.json too): say so, and never
    # suggest `fit --force` into it.
    raise UserError(
        f"{directory} is not a toolscout router directory: its {MANIFEST} has format {found!r}, "
        f"a router's has {FORMAT!r}. Give --router the directory `toolscout fit --out` wrote")
  if found != FORMAT:
    raise UserError(
        f"{directory}: router format {found!r} is not supported; this toolscout reads "
        f"{FORMAT!r}. Refit the router with this version: `toolscout fit --reference "
        f"FILE.jsonl --out {directory} --force`")


def _read_arrays(directory: pathlib.Path) -> tuple[np.ndarray, np.ndarray]:
  """idf and centroid, ``float64[V]`` each."""
  try:
    with np.load(directory / ARRAYS, allow_pickle=False) as arrays:
      return arrays["idf"], arrays["centroid"]
  except FileNotFoundError:
    raise UserError(f"{directory / ARRAYS}: missing; refit the router with `toolscout fit`") from None
  except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
    raise UserError(f"{directory / ARRAYS}: unreadable ({e}); refit the router with "
                    f"`toolscout fit`") from None


def _thresholds(path: pathlib.Path, manifest: dict) -> dict[int, float]:
  """τ per window size: sizes ≥ 1, τ finite in [0, 1] (TF-IDF distances lie there)."""
  thresholds = {int(k): float(v) for k, v in manifest["thresholds"].items()}
  if not thresholds:
    raise UserError(f"{path}: no thresholds; refit the router")
  bad = {k: v for k, v in thresholds.items() if k < 1 or not 0.0 <= v <= 1.0}
  if bad:
    raise UserError(f"{path}: thresholds {bad} are not window sizes >= 1 mapped to tau in "
                    f"[0, 1]; refit the router with `toolscout fit`")
  return thresholds


def load_router(directory: str | pathlib.Path) -> Router:
  """Reads a ``toolscout-router/1`` directory.

  Raises:
    UserError: missing or malformed files, a router of another version (an older or
      newer toolscout), or a directory that is not a router, with what to do about it.
  """
  directory = pathlib.Path(directory)
  if directory.exists() and not directory.is_dir():
    raise UserError(f"--router {directory} is a file; expected a router directory written by "
                    f"`toolscout fit --out DIR`")
  if not directory.is_dir():
    raise UserError(f"{directory}: no such router directory; create one with "
                    f"`toolscout fit --reference FILE.jsonl --out {directory}`")
  manifest = _read_json(directory / MANIFEST, "router manifest (manifest.json)")
  _check_format(directory, manifest)
  vocabulary = _read_json(directory / VOCABULARY, "vocabulary (vocabulary.json)")
  idf, centroid = _read_arrays(directory)
  try:
    thresholds = _thresholds(directory / MANIFEST, manifest)
    n_reference = int(manifest["n_reference"])
    params = dict(manifest["tfidf"])
    source = str(manifest["threshold_source"])
  except (KeyError, TypeError, ValueError, AttributeError) as e:
    raise UserError(f"{directory / MANIFEST}: malformed manifest ({type(e).__name__}: {e}); "
                    f"refit the router with `toolscout fit`") from None
  n = len(vocabulary) if isinstance(vocabulary, list) else -1
  if n < 1 or idf.shape != (n,) or centroid.shape != (n,):
    raise UserError(f"{directory}: vocabulary ({n} terms), idf {idf.shape} and centroid "
                    f"{centroid.shape} disagree; refit the router with `toolscout fit`")
  fp = fpr.rebuild_fingerprint(vocabulary, idf, centroid, n_reference, params)
  extra = {k: v for k, v in manifest.items()
           if k not in ("format", "thresholds", "threshold_source", "n_reference",
                        "vocabulary_size", "tfidf")}
  return Router(fp, thresholds, source, extra)
