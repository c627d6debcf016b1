"""``hyset predict``: best tool set, tool ranking and shortlist for each query.

Output: one JSON object a line, in input order, with ``query_id``, ``set`` (tool ids),
``set_score``, ``ranking`` (tool ids) and ``shortlist`` (tool ids, shortlist order); the
contract is in docs/contracts.md. ``--tools SPEC`` carries the model onto another library first
(hyset_jax.io.carry): tools it lacks get the tool encoder's embedding, as ``hyset tools add`` gives
them, tools SPEC does not list are dropped, and stderr says how many of each; on a library with
none of the model's tools, its query tower is left out and the default ranking is ``logit``.

``--allow FILE`` / ``--deny FILE`` (one tool id a line; ``prefix*`` for every id starting
with ``prefix``; blank lines and ``#`` comments skipped) limit the answers to the allowed tools
before retrieval: the set is the exact best set over them. When fewer tools are allowed than
the shortlist holds, ``ranking`` and ``shortlist`` list only the allowed ones. An id the
library lacks, or lists that allow no tool, exit 2.

``--first-stage ann`` (or the manifest's ``"first_stage"``) finds stage 1's and the expansion's
candidates through an approximate index over the tools, for very large libraries
(hyset_jax/inference/ann.py, docs/speed.md); with a filter or the lexical term the first stage
stays exact.
"""
from __future__ import annotations

import argparse
import json
import pathlib

import numpy as np

from hyset_jax import choices
from hyset_jax.commands import int_at_least
from hyset_jax.errors import FieldError, UserError


def add_parser(sub: argparse._SubParsersAction) -> None:
  p = sub.add_parser("predict", help="predict tool sets with a model directory",
                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--model", required=True, metavar="DIR",
                 help="model directory (any format version) or hyset train workdir (its "
                      "best/ model)")
  src = p.add_mutually_exclusive_group(required=True)
  src.add_argument("--queries", metavar="FILE.jsonl",
                   help="queries as JSONL in BEIR format ({_id, text})")
  src.add_argument("--query-embeddings", metavar="FILE.npy",
                   help="float32 [Q, d_r] .npy; query_id = row index")
  p.add_argument("--tools", metavar="SPEC",
                 help="predict over this library instead of the model's: new tools get the "
                      "tool encoder's embedding, unlisted ones are dropped (default: the "
                      "model's own tools)")
  p.add_argument("--out", required=True, metavar="FILE.jsonl", help="output JSONL")
  p.add_argument("--k1", type=int_at_least(1), metavar="N",
                 help="stage-1 size K1 (default: the manifest's)")
  p.add_argument("--k-pool", type=int_at_least(2), metavar="N",
                 help="shortlist size K_pool (default: the manifest's)")
  p.add_argument("--max-size", type=int_at_least(2), metavar="N",
                 help="largest set size M, at most the manifest's (default: the manifest's)")
  p.add_argument("--batch-size", type=int_at_least(1), default=256, metavar="N",
                 help="queries per inference call (default 256)")
  p.add_argument("--method", choices=choices.METHOD_CHOICES, default=choices.DEFAULT_METHOD,
                 help="subset-enumeration implementation (default auto: the native CPU kernel "
                      "where it can run, else gather; matmul_bf16 is approximate)")
  p.add_argument("--precision", choices=choices.PRECISIONS, default=choices.DEFAULT_PRECISION,
                 help="dtype of the prepared products P Zᵀ and Z M_m (default f32; bf16 halves "
                      "their bytes, with f32 accumulation, for accelerators; approximate: "
                      "docs/speed.md)")
  p.add_argument("--first-stage", choices=choices.FIRST_STAGES, default=None,
                 help="how stage 1 and the expansion find candidates: exact (scan every tool) "
                      "or ann (an approximate index over the tools, built on first use and "
                      "cached beside the model; for very large libraries: docs/speed.md) "
                      "(default: the model's manifest, else exact)")
  p.add_argument("--ranking", choices=choices.RANKINGS, default=None,
                 help="how the shortlist is ranked (default: the model's, else "
                      f"{choices.DEFAULT_RANKING}); the set is the same under every ranking")
  p.add_argument("--allow", metavar="FILE",
                 help="answer with these tools only (one id a line; prefix* for a prefix)")
  p.add_argument("--deny", metavar="FILE",
                 help="never answer with these tools (one id a line; prefix* for a prefix)")
  p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
  p.set_defaults(func=run)


def allowed_tools(tool_ids, allow: str | None, deny: str | None) -> np.ndarray | None:
  """bool[N] from ``--allow`` / ``--deny`` files (None: neither given); UserError naming the
  flag, the file and the entry for an id the library lacks, or for lists allowing nothing."""
  from hyset_jax.inference import filters
  if not allow and not deny:
    return None
  index = filters.FilterIndex(tool_ids)
  masks = []
  for flag, path in (("--allow", allow), ("--deny", deny)):
    if not path:
      continue
    ids = filters.read_id_file(path, flag)
    try:
      mask = index.mask(filters.ToolFilter(allow=ids), "list", require=False)
    except FieldError as e:
      raise UserError(f"{flag} {path}: {e.message}") from None
    masks.append(mask if flag == "--allow" else ~mask)
  out = filters.intersect(*masks)
  if not out.any():
    raise UserError(f"--allow/--deny allow none of the library's {len(tool_ids)} tools")
  return out


def load_query_embeddings(path: str | pathlib.Path, dim: int) -> np.ndarray:
  """A float [Q, dim] .npy of finite values, as float32; UserError naming the fault otherwise
  (the NumPy reference's reader, so that both refuse the same files)."""
  from hyset_jax.io import reference
  from hyset_jax.io.model_format import ModelError
  try:
    return reference.load_queries(path, dim)
  except ModelError as e:
    raise UserError(str(e)) from None


def encode_queries(path: str, encoder_name: str, dim: int
                   ) -> tuple[list[str], np.ndarray, list[str]]:
  """BEIR-format queries encoded with the model's query encoder (cached): (ids, f32[Q, d_r],
  texts)."""
  from hyset_jax.data import files
  from hyset_jax.data.beir import read_queries
  from hyset_jax.encoder import load_query_encoder
  from hyset_jax.encoder import encode_cached
  queries = read_queries(files.require_file(path, "queries file"))
  encoder = load_query_encoder(encoder_name, dim)
  texts = [text for text, _ in queries.values()]
  emb = encode_cached(encoder, texts)
  return list(queries), np.asarray(emb, np.float32), texts


def resolve_overrides(model, k1: int | None, k_pool: int | None, max_size: int | None):
  """The (K1, K_pool, M) to use: command-line overrides on top of the manifest, validated."""
  from hyset_jax.inference.subsets import validate_sizes
  k1 = model.k1 if k1 is None else k1
  k_pool = model.k_pool if k_pool is None else k_pool
  max_size = model.max_set_size if max_size is None else max_size
  if max_size > model.max_set_size:
    raise UserError(f"--max-size {max_size} exceeds the model's max_set_size "
                    f"{model.max_set_size} (it has interaction matrices up to "
                    f"interaction_{model.max_set_size} only)")
  validate_sizes(k_pool, max_size, k1=k1, num_tools=len(model.tool_ids))
  return k1, k_pool, max_size


def run(args: argparse.Namespace) -> int:
  from hyset_jax import io_utils
  from hyset_jax.inference import ann, pipeline, neighbors
  from hyset_jax.io.modeldir import load_best
  from hyset_jax.data.specs import input_paths

  tool_inputs = input_paths(args.tools) if args.tools else ()
  out = io_utils.output_file(args.out, args.force,
                            inputs=(args.model, args.queries, args.query_embeddings,
                                    args.allow, args.deny, *tool_inputs))
  model_path, model = load_best(args.model)
  if args.tools:
    from hyset_jax.io.carry import carry_onto
    from hyset_jax.data.specs import load_dataset
    model = carry_onto(model, load_dataset(args.tools).tools, args.tools)
  k1, k_pool, max_size = resolve_overrides(model, args.k1, args.k_pool, args.max_size)
  if args.query_embeddings:
    if model.lexical is not None:
      raise UserError(f"{model_path}: this model has a lexical term (BM25 over the tool texts), "
                      f"which needs the query texts: pass --queries, not "
                      f"--query-embeddings")
    emb = load_query_embeddings(args.query_embeddings, model.params.projection.shape[0])
    query_ids, x = [str(i) for i in range(emb.shape[0])], model.query_inputs(emb)
  else:
    query_ids, emb, texts = encode_queries(args.queries, model.query_encoder,
                                           model.params.projection.shape[0])
    x = model.query_inputs(emb, texts)
  allowed = allowed_tools(model.tool_ids, args.allow, args.deny)
  if allowed is not None:
    x = x._replace(allowed=np.broadcast_to(allowed, (emb.shape[0], allowed.size)))
  # The approximate first stage when the model or --first-stage asks for it: an ANN index over
  # Z, cached beside the model directory like the neighbour table (which it replaces).
  cache_dir = neighbors.cache_dir_beside(model_path)
  first_stage = ann.for_model(model.params, ann.settings(model.first_stage, args.first_stage),
                              cache_dir=cache_dir, progress=len(model.tool_ids) > 20_000,
                              filtered=allowed is not None)
  # The fast path: per-model products and the expansion's neighbour table, cached beside the
  # model directory (built once per model, N²·d flops; keyed by Z, so a carried model's table
  # is its own file there).
  prepared = pipeline.prepare(model.params, max_size=max_size, k_pool=k_pool,
                               neighbor_table=first_stage is None,
                               cache_dir=cache_dir, progress=len(model.tool_ids) > 20_000,
                               precision=args.precision)
  pred = pipeline.predict_batched(prepared, x, k1=k1, k_pool=k_pool, max_size=max_size,
                                   batch_size=args.batch_size, method=args.method,
                                   ranking=args.ranking or model.ranking,
                                   progress=emb.shape[0] > 4 * args.batch_size,
                                   first_stage=first_stage)
  ids = model.tool_ids
  with io_utils.atomic_write(out) as f:
    for q, qid in enumerate(query_ids):
      row = {
          "query_id": qid,
          "set": [ids[t] for t in pred.set_tools[q] if t >= 0],
          "set_score": float(pred.set_score[q]),
          # -1: a slot a filter left to a disallowed tool (fewer allowed than K_pool).
          "ranking": [ids[t] for t in pred.ranking[q] if t >= 0],
          "shortlist": [ids[t] for t in pred.shortlist[q] if t >= 0],
      }
      f.write(json.dumps(row, ensure_ascii=False) + "\n")
  print(f"wrote {len(query_ids)} predictions to {out}")
  return 0
