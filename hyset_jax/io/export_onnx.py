"""``hyset export --format onnx``: stage 1 and stage 2 as ONNX models, through jax2onnx.

Files::

  stage1.onnx     query_embeddings f32[B, d_r] -> shortlist i32[B, K_pool],
                  (+ lexical_scores f32[B, N]      shortlist_logits f32[B, K_pool]
                   with the lexical term)
  stage2.onnx     query_embeddings, shortlist, shortlist_logits
                                               -> set_tools i32[B, M], set_size i32[B],
                                                  set_score f32[B], ranking i32[B, K_pool]
  signature.json  format, sizes, tool_ids (row order), inputs and outputs of each model
  lexical.json    with the lexical term only: how to compute lexical_scores from the text

The functions converted are the StableHLO export's (:func:`hyset_jax.io.export.stablehlo_functions`:
:func:`hyset_jax.inference.pipeline.shortlist` and :func:`hyset_jax.inference.pipeline.rerank` with θ closed over),
so θ is embedded as initializers and the outputs mean what ``hyset predict`` writes (tool rows;
``tool_ids`` maps them to ids). Run them with onnxruntime: stage 1's outputs, with the query
embeddings again (the query-conditioned set term uses them), are stage 2's inputs.

Exporter: jax2onnx (maintained, converts jaxprs primitive by primitive, no TensorFlow). What
does not export, plainly:

- **a symbolic batch dimension.** jax2onnx's symbolic dimensions fail inside JAX's indexing
  (the shortlist gathers) on this JAX version, so B is fixed when exporting
  (``--onnx-batch``, default 1): pad a smaller batch with zero rows and drop their outputs.
- **only the portable enumeration** (``gather``, ``choices.PORTABLE_METHOD``) is exported; the
  ``method`` choice of ``hyset predict`` (whose default on a CPU is the native kernel, a custom
  call no other runtime has) does not carry over: all methods give the same sets.
- **the query encoder** is not in the graph: the input is the query embedding r(x), as for the
  StableHLO export.
- onnxruntime has no kernels for boolean ``EyeLike`` and ``OneHot``, which the greedy ranking
  converts to; after conversion the identity is stored as the constant it is and the one-hot
  is computed as float and cast (:func:`_patch_bool_ops`) — the same tensors.

jax2onnx is installed without its dependency metadata (``pip install --no-deps jax2onnx``; the
Makefile does it): its metadata pins orbax-checkpoint below the version training uses, and the
converter itself does not need orbax.
"""
from __future__ import annotations

import json
import os
import pathlib

from hyset_jax import choices
from hyset_jax.io import modeldir
from hyset_jax.errors import UserError
from hyset_jax.io_utils import atomic_dir

ONNX_FORMAT = "hyset-onnx/1"
OPSET = 23


def _require():
  try:
    import jax2onnx  # noqa: F401
    import onnx  # noqa: F401
  except ImportError as e:
    raise UserError(f"--format onnx needs jax2onnx and onnx ({e.name} is missing): "
                    f"pip install onnx onnx-ir sympy dm-pix equinox einops && "
                    f"pip install --no-deps jax2onnx") from None


def _patch_bool_ops(model) -> dict[str, int]:
  """Rewrite the boolean ops onnxruntime has no kernel for (see the module docstring):

  - ``EyeLike`` with a bool output -> the constant identity it computes (shapes are static);
  - ``OneHot`` with bool values -> ``OneHot`` over the same values as float, then ``Cast`` to
    bool (the same tensor).

  Returns how many nodes of each kind were rewritten.
  """
  import numpy as np
  from onnx import TensorProto, helper, numpy_helper, shape_inference
  graph = model.graph
  inferred = shape_inference.infer_shapes(model).graph.value_info
  shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in inferred}
  inits = {i.name: i for i in graph.initializer}
  nodes, counts = [], {"EyeLike": 0, "OneHot": 0}
  for node in graph.node:
    attrs = {a.name: a for a in node.attribute}
    if node.op_type == "EyeLike" and "dtype" in attrs and attrs["dtype"].i == TensorProto.BOOL:
      shape = shapes.get(node.input[0])
      if not shape or len(shape) != 2 or not all(shape):
        raise UserError(f"cannot export: boolean EyeLike node {node.name!r} has no static "
                        f"2-d shape (got {shape})")
      k = attrs["k"].i if "k" in attrs else 0
      eye = numpy_helper.from_array(np.eye(shape[0], shape[1], k, dtype=bool), node.output[0])
      nodes.append(helper.make_node("Constant", [], [node.output[0]], value=eye,
                                    name=f"{node.name}_constant"))
      counts["EyeLike"] += 1
    elif (node.op_type == "OneHot" and node.input[2] in inits
          and inits[node.input[2]].data_type == TensorProto.BOOL):
      values = numpy_helper.to_array(inits[node.input[2]]).astype(np.float32)
      name = f"{node.input[2]}_as_float"
      graph.initializer.append(numpy_helper.from_array(values, name))
      out = node.output[0]
      node.input[2], node.output[0] = name, f"{out}_as_float"
      nodes += [node, helper.make_node("Cast", [node.output[0]], [out], to=TensorProto.BOOL,
                                       name=f"{node.name}_cast_bool")]
      counts["OneHot"] += 1
    else:
      nodes.append(node)
  del graph.node[:]
  graph.node.extend(nodes)
  return counts


def _io(values) -> list[dict]:
  from onnx import helper
  out = []
  for v in values:
    t = v.type.tensor_type
    out.append({"name": v.name, "dtype": helper.tensor_dtype_to_np_dtype(t.elem_type).name,
                "shape": [d.dim_value if d.HasField("dim_value") else d.dim_param
                          for d in t.shape.dim]})
  return out


def write_onnx(out: str | os.PathLike, model: modeldir.ModelDir, *, batch: int = 1,
               force: bool = False) -> pathlib.Path:
  """``stage1.onnx``, ``stage2.onnx`` and ``signature.json`` for a fixed batch of ``batch``."""
  _require()
  import jax
  import jax.numpy as jnp
  import onnx
  from jax2onnx import to_onnx

  from hyset_jax.io.export import lexical_static, stablehlo_functions, write_lexical
  if batch < 1:
    raise UserError(f"--onnx-batch must be ≥ 1, got {batch}")
  k1, k_pool, m = model.k1, model.k_pool, model.max_set_size
  d_r = int(model.params.projection.shape[0])
  specs = {"query_embeddings": jax.ShapeDtypeStruct((batch, d_r), jnp.float32),
           "shortlist": jax.ShapeDtypeStruct((batch, k_pool), jnp.int32),
           "shortlist_logits": jax.ShapeDtypeStruct((batch, k_pool), jnp.float32),
           "lexical_scores": jax.ShapeDtypeStruct((batch, len(model.tool_ids)), jnp.float32)}
  functions = stablehlo_functions(model, k1=k1, k_pool=k_pool, max_size=m)
  signature = {
      "format": ONNX_FORMAT, "exporter": f"jax2onnx {_version('jax2onnx')}", "opset": OPSET,
      "batch": batch, "batch_note": "fixed at export; pad smaller batches with zero rows",
      "static": {"k1": k1, "k_pool": k_pool, "max_set_size": m,
                 "num_tools": len(model.tool_ids), "query_dim": d_r, "method": choices.PORTABLE_METHOD,
                 "ranking": model.default_ranking,
                 "query_encoder": model.query_encoder, "lexical": lexical_static(model)},
      "tool_ids": list(model.tool_ids), "models": {}}
  with atomic_dir(out, force) as tmp:
    for name in ("stage1", "stage2"):
      fn, in_names, out_names = functions[name]
      try:
        proto = to_onnx(fn, [specs[i] for i in in_names], model_name=f"hyset_{name}",
                        opset=OPSET, input_names=in_names, output_names=out_names)
      except Exception as e:  # noqa: BLE001 - a converter failure names the primitive
        raise UserError(f"jax2onnx could not convert {name}: {type(e).__name__}: "
                        f"{str(e)[:300]}") from None
      patched = _patch_bool_ops(proto)
      onnx.checker.check_model(proto)
      onnx.save(proto, str(tmp / f"{name}.onnx"))
      signature["models"][name] = {"file": f"{name}.onnx", "inputs": _io(proto.graph.input),
                                   "outputs": _io(proto.graph.output),
                                   "rewritten_bool_ops": patched}
    (tmp / "signature.json").write_text(json.dumps(signature, indent=1, ensure_ascii=False)
                                        + "\n", encoding="utf-8")
    write_lexical(tmp, model)
  # jax2onnx traces through JAX's own caches with its primitives swapped in; a later trace of
  # the same jitted function in this process (a StableHLO export, measured: "MLIR translation
  # rule for primitive 'jax.numpy.arange' not found") would reuse those jaxprs. Drop them.
  jax.clear_caches()
  return pathlib.Path(out)


def _version(package: str) -> str:
  import importlib.metadata
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return "unknown"
