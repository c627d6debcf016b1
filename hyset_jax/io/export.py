"""Exports of a trained model for other stacks (``hyset export --format …``).

Every format is a directory written atomically (a temporary directory renamed into place), never
over a non-empty one unless ``force``:

- ``hyset``: the model directory (:mod:`hyset_jax.io.modeldir`, docs/contracts.md).
- ``npz``: ``model.npz``, readable with ``np.load(path, allow_pickle=False)`` — the same arrays
  (``tool_embeddings``, ``projection``, ``interaction_2`` … ``interaction_M``) plus ``tool_ids``
  (unicode) and the manifest fields (``format``, ``terms`` (unicode), ``max_set_size``, ``k1``,
  ``k_pool``, ``query_encoder``) as 0-d arrays; each term's tensors; the lexical term adds
  ``lexical_tool_texts`` (unicode, row order), ``lexical_k1``,
  ``lexical_b`` and ``lexical_tokenizer``.
- ``projector``: TensorBoard Embedding Projector files — ``tensors.tsv`` (the rows of Z),
  ``metadata.tsv`` (header ``id  category  name``), ``projector_config.pbtxt`` (TensorBoard's
  ``ProjectorConfig``, paths relative to the directory) and ``projector_config.json`` (the
  standalone projector.tensorflow.org form).
- ``stablehlo``: :mod:`jax.export` artifacts with θ embedded as constants and a symbolic batch
  dimension ``q`` — ``stage1`` (query → shortlist), ``stage2`` (shortlist → best set, score,
  ranking) and ``predict`` (both) — each as ``<name>.jax_exported`` (``Exported.serialize()``),
  described by ``signature.json``. Loading needs only ``jax`` (``jax.export.deserialize``), not
  this package. A model with the lexical term takes a second input ``lexical_scores``
  f32[q, N] in ``stage1`` and ``predict`` (b(x, t): the query's BM25 scores over its best; β is
  embedded), and the directory holds ``lexical.json`` to compute it from the query text.
- ``onnx``: ``stage1.onnx`` and ``stage2.onnx`` (fixed batch) for onnxruntime, with
  ``signature.json`` — :mod:`hyset_jax.io.export_onnx`.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
from collections.abc import Callable, Sequence

import numpy as np

from hyset_jax import choices
from hyset_jax.io import modeldir
from hyset_jax.errors import UserError
from hyset_jax.io_utils import atomic_dir, output_dir
from hyset_jax.model.query_inputs import QueryInputs

FORMATS = ("hyset", "npz", "projector", "stablehlo", "onnx")
NPZ_FILE = "model.npz"
SIGNATURE_FILE = "signature.json"
# /2: stage2 also takes query_embeddings (the query tower and the query-conditioned set term).
STABLEHLO_FORMAT = "hyset-stablehlo/2"
DEFAULT_PLATFORMS = ("cpu", "cuda", "tpu")
# The files that make a directory an earlier export of each format: ``--force`` replaces only
# such a directory (io_utils.output_dir), never an unrelated one.
MARKERS = {"hyset": (modeldir.MANIFEST_FILE, modeldir.PARAMS_FILE), "npz": (NPZ_FILE,),
           "projector": ("tensors.tsv", "projector_config.pbtxt"),
           "stablehlo": (SIGNATURE_FILE,), "onnx": ("stage1.onnx", "stage2.onnx")}


# --------------------------------------------------------------------------- directories

def check_out(out: str | os.PathLike, force: bool, fmt: str, inputs=(),
              what: str | None = None) -> pathlib.Path:
  """``--out`` of a ``fmt`` directory (a format of :data:`MARKERS`, or ``hyset-pytorch``),
  checked before any work by :func:`hyset_jax.io_utils.output_dir` with the format's marker
  files: ``--force`` replaces only an earlier output of the same format. The one guard of
  ``hyset export`` and ``hyset import`` (whose output is a ``hyset`` model directory)."""
  if fmt == "hyset-pytorch":
    # Written by hyset_jax.io.peer, not here; imported on use like the other peer code.
    from hyset_jax.io.peer.convert import CHECKPOINT_FILE
    marker = (CHECKPOINT_FILE,)
  else:
    marker = MARKERS[fmt]
  return output_dir(out, force, marker=marker, inputs=inputs, what=what or f"{fmt} export")


# --------------------------------------------------------------------------- npz

def write_npz(out: str | os.PathLike, model: modeldir.ModelDir, *,
              force: bool = False) -> pathlib.Path:
  """``out/model.npz``: the model directory's tensors, ``tool_ids`` and the manifest fields
  (``query_encoder`` left out when the model names none)."""
  arrays = modeldir.tensors(model.params, model.max_set_size)
  arrays["tool_ids"] = np.asarray(model.tool_ids, dtype=str)
  if model.lexical is not None:
    doc = modeldir.lexical_document(model.lexical)
    arrays["lexical_tool_texts"] = np.asarray(doc["tool_texts"], dtype=str)
    arrays.update({f"lexical_{k}": np.asarray(doc[k]) for k in ("k1", "b", "tokenizer")})
  arrays.update({k: np.asarray(v, dtype=str if k == "terms" else None)
                 for k, v in model.manifest().items()
                 if k not in ("tool_ids", "first_stage", "foreign") and v is not None})
  # first_stage and foreign: hyset-jax runtime choices (hyset_jax/inference/ann.py, io/carry.py),
  # not part of the exported model
  with atomic_dir(out, force, marker=MARKERS["npz"], what="npz export") as tmp:
    np.savez(tmp / NPZ_FILE, **arrays)
  return pathlib.Path(out)


# --------------------------------------------------------------------------- projector

def _clean(text: str) -> str:
  """One TSV cell: no tabs or line breaks, never empty."""
  return re.sub(r"\s+", " ", str(text)).strip() or "-"


def _from_text(text: str, field: str) -> str:
  """``field:value`` out of a ``key:value, key:value`` tool text (ToolLens renders tools so)."""
  m = re.search(rf"(?:^|[\s,]){field}:\s*([^,]*)", text)
  return m.group(1).strip() if m else ""


def label_from_id(tool_id: str) -> tuple[str, str]:
  """(category, name) when no data set is readable: ``tool::api`` ids give the tool."""
  return (tool_id.split("::")[0] if "::" in tool_id else "unknown"), tool_id


def label_from_metadata(tool_id: str, text: str, meta: dict) -> tuple[str, str]:
  """(category, name) from a tool's metadata, else fields in its text, else its id."""
  category = (meta.get("category") or meta.get("category_name")
              or _from_text(text, "category_name"))
  tool, api = meta.get("tool_name") or "", meta.get("api_name") or ""
  if not (tool or api):
    tool, api = _from_text(text, "tool_name"), _from_text(text, "api_name")
  name = " / ".join(x for x in (tool, api) if x) or meta.get("name") or meta.get("title") or tool_id
  return str(category or label_from_id(tool_id)[0]), str(name)


def tool_labels(tool_ids: Sequence[str], spec: str | None) -> tuple[list[tuple[str, str]], str]:
  """(category, name) per tool, and where they came from (for the user)."""
  fallback = [label_from_id(t) for t in tool_ids]
  if not spec:
    return fallback, "from the tool ids (no data set named; pass --data SPEC)"
  try:
    from hyset_jax.data.specs import load_dataset
    tools = load_dataset(spec).tools
  except (UserError, OSError) as e:
    return fallback, f"from the tool ids (data set {spec!r} unreadable: {e})"
  index = tools.index()
  labels, found = [], 0
  for t, fb in zip(tool_ids, fallback):
    i = index.get(t)
    if i is None:
      labels.append(fb)
    else:
      labels.append(label_from_metadata(t, tools.texts[i], tools.metadata[i] or {}))
      found += 1
  return labels, f"from {spec} ({found} of {len(tool_ids)} tools found there)"


def write_projector(out: str | os.PathLike, model: modeldir.ModelDir,
                    labels: Sequence[tuple[str, str]], *, force: bool = False) -> pathlib.Path:
  """TensorBoard Embedding Projector files for the tool embeddings Z."""
  z = np.asarray(model.params.tool_embeddings, np.float32)
  n, d = z.shape
  name = "hyset_tool_embeddings"
  with atomic_dir(out, force, marker=MARKERS["projector"], what="projector export") as tmp:
    np.savetxt(tmp / "tensors.tsv", z, fmt="%.8g", delimiter="\t")
    with open(tmp / "metadata.tsv", "w", encoding="utf-8") as f:
      f.write("id\tcategory\tname\n")
      for t, (category, label) in zip(model.tool_ids, labels):
        f.write(f"{_clean(t)}\t{_clean(category)}\t{_clean(label)}\n")
    (tmp / "projector_config.pbtxt").write_text(
        "embeddings {\n"
        f'  tensor_name: "{name}"\n'
        f"  tensor_shape: {n}\n"
        f"  tensor_shape: {d}\n"
        '  tensor_path: "tensors.tsv"\n'
        '  metadata_path: "metadata.tsv"\n'
        "}\n", encoding="utf-8")
    (tmp / "projector_config.json").write_text(json.dumps({"embeddings": [{
        "tensorName": name, "tensorShape": [n, d], "tensorPath": "tensors.tsv",
        "metadataPath": "metadata.tsv"}]}, indent=1) + "\n", encoding="utf-8")
  return pathlib.Path(out)


# --------------------------------------------------------------------------- StableHLO

_OUTPUT_DOCS = {
    "shortlist": "tool rows (indices into tool_ids) in shortlist order: S0 by ℓ, then expansion",
    "shortlist_logits": "ℓ(x, t) = q(r(x))ᵀ P z_t of the shortlist tools (+ β · lexical_scores "
                        "with the lexical term)",
    "lexical_scores": "b(x, t): the query's BM25 scores over the tool texts divided by its "
                      "largest, 0 where no word matches (lexical.json says how)",
    "set_tools": "tool rows of the best set, ascending shortlist position, padded with -1",
    "set_size": "number of tools in the best set",
    "set_score": "F(x, E) of the best set",
    "ranking": "tool rows: the shortlist ranked by the model's ranking method "
               "(static.ranking; docs/model.md)",
}


def _spec(name: str, aval) -> dict:
  shape = [d if isinstance(d, int) else str(d) for d in aval.shape]
  return {"name": name, "shape": shape, "dtype": str(aval.dtype),
          **({"description": _OUTPUT_DOCS[name]} if name in _OUTPUT_DOCS else {})}


def stablehlo_functions(model: modeldir.ModelDir, *, k1: int, k_pool: int, max_size: int
                        ) -> dict[str, tuple[Callable, list[str], list[str]]]:
  """name -> (function of arrays only, input names, output names); θ is closed over."""
  import jax
  import jax.numpy as jnp
  from hyset_jax.inference import pipeline
  # jnp arrays (not NumPy): indexing them with traced shortlists must stay in the graph.
  params = jax.tree.map(jnp.asarray, pipeline.truncate(model.params, max_size))
  ranking = model.default_ranking  # what `hyset predict` uses without --ranking
  # The portable JAX form: the native kernel is a custom call that other stacks cannot run.
  method = choices.PORTABLE_METHOD

  lexical = model.lexical is not None

  def stage1(query_embeddings, lexical_scores=None):
    return tuple(pipeline.shortlist(params, QueryInputs(query_embeddings, lexical_scores), k1,
                                     k_pool, max_size))

  def stage2_fn(query_embeddings, shortlist, shortlist_logits):
    # A plain tuple: the artifact must load where pipeline.Reranked is not registered.
    return tuple(pipeline.rerank(params, query_embeddings,
                                  pipeline.Shortlist(shortlist, shortlist_logits),
                                  k_pool=k_pool, max_size=max_size, method=method,
                                  ranking=ranking))

  def predict(query_embeddings, lexical_scores=None):
    p = pipeline.predict(params, QueryInputs(query_embeddings, lexical_scores), k1=k1,
                          k_pool=k_pool, max_size=max_size, method=method, ranking=ranking)
    return (p.shortlist, p.set_tools, p.set_size, p.set_score, p.ranking)

  # The lexical term's scores come from the query text, outside the graph (like r(x)).
  queries = ["query_embeddings"] + (["lexical_scores"] if lexical else [])
  return {
      "stage1": (stage1, queries, ["shortlist", "shortlist_logits"]),
      "stage2": (stage2_fn, ["query_embeddings", "shortlist", "shortlist_logits"],
                 ["set_tools", "set_size", "set_score", "ranking"]),
      "predict": (predict, queries,
                  ["shortlist", "set_tools", "set_size", "set_score", "ranking"]),
  }


def write_stablehlo(out: str | os.PathLike, model: modeldir.ModelDir, *, force: bool = False,
                    platforms: Sequence[str] = DEFAULT_PLATFORMS) -> pathlib.Path:
  """Serialized :mod:`jax.export` artifacts of stage 1, stage 2 and both, plus signature.json."""
  import jax
  import jax.numpy as jnp
  from jax import export
  try:
    import flatbuffers  # noqa: F401  (jax.export serialization needs it)
  except ImportError:
    raise UserError("--format stablehlo needs the 'flatbuffers' package (jax.export "
                    "serialization): pip install flatbuffers") from None
  k1, k_pool, m = model.k1, model.k_pool, model.max_set_size
  n, d_z = model.params.tool_embeddings.shape
  d_r = model.params.projection.shape[0]
  q, = export.symbolic_shape("q")
  inputs = {"query_embeddings": jax.ShapeDtypeStruct((q, d_r), jnp.float32),
            "shortlist": jax.ShapeDtypeStruct((q, k_pool), jnp.int32),
            "shortlist_logits": jax.ShapeDtypeStruct((q, k_pool), jnp.float32),
            "lexical_scores": jax.ShapeDtypeStruct((q, n), jnp.float32)}
  signature = {
      "format": STABLEHLO_FORMAT,
      "serialization": "jax.export: Exported.serialize(); load with "
                       "jax.export.deserialize(bytearray(data)) and call .call(*inputs)",
      "jax_version": jax.__version__,
      "platforms": list(platforms),
      "batch_dimension": "q: symbolic, any number of queries ≥ 1",
      "static": {"k1": k1, "k_pool": k_pool, "max_set_size": m, "num_tools": n,
                 "query_dim": d_r, "tool_dim": d_z, "method": choices.PORTABLE_METHOD,
                 "ranking": model.default_ranking,
                 "query_encoder": model.query_encoder,
                 "lexical": lexical_static(model)},
      "tool_ids": list(model.tool_ids),
      "functions": {},
  }
  with atomic_dir(out, force, marker=MARKERS["stablehlo"], what="stablehlo export") as tmp:
    for name, (fn, in_names, out_names) in stablehlo_functions(
        model, k1=k1, k_pool=k_pool, max_size=m).items():
      try:
        exp = export.export(jax.jit(fn), platforms=tuple(platforms))(
            *(inputs[i] for i in in_names))
      except Exception as e:  # noqa: BLE001 - e.g. an unknown platform name
        raise UserError(f"cannot export {name} for platforms {', '.join(platforms)}: "
                        f"{type(e).__name__}: {str(e)[:300]}") from None
      (tmp / f"{name}.jax_exported").write_bytes(exp.serialize())
      assert len(exp.in_avals) == len(in_names) and len(exp.out_avals) == len(out_names)
      signature["functions"][name] = {
          "file": f"{name}.jax_exported",
          "calling_convention_version": exp.calling_convention_version,
          "inputs": [_spec(i, a) for i, a in zip(in_names, exp.in_avals)],
          "outputs": [_spec(o, a) for o, a in zip(out_names, exp.out_avals)],
      }
    (tmp / SIGNATURE_FILE).write_text(json.dumps(signature, indent=1, ensure_ascii=False) + "\n",
                                      encoding="utf-8")
    write_lexical(tmp, model)
  return pathlib.Path(out)


def lexical_static(model: modeldir.ModelDir) -> dict | None:
  """signature.json's ``static.lexical``: β and how b is computed (None without the term)."""
  if model.lexical is None:
    return None
  doc = modeldir.lexical_document(model.lexical)
  return {"weight": float(model.params.lexical_weight), "tokenizer": doc["tokenizer"],
          "k1": doc["k1"], "b": doc["b"], "tool_texts": modeldir.LEXICAL_FILE}


def write_lexical(directory: pathlib.Path, model: modeldir.ModelDir) -> None:
  """lexical.json beside an export's artifacts, for a model with the lexical term."""
  if model.lexical is not None:
    (directory / modeldir.LEXICAL_FILE).write_text(
        json.dumps(modeldir.lexical_document(model.lexical), ensure_ascii=False) + "\n",
        encoding="utf-8")
