"""A loaded model ready to answer text queries: encoder, two-stage inference, tool definitions.

:class:`Retriever` is what every front end (the HTTP app, the MCP server) calls. It holds no
request state, so one instance serves any number of connections; its device calls are made
from one thread at a time (the micro-batcher's), since they share compiled functions.

A prediction row has the fields of ``hyset predict`` — ``set``, ``set_score``, ``ranking``,
``shortlist`` (tool ids) — computed by :func:`hyset_jax.inference.pipeline.predict_batched`
(through the library's own compiled programs) on the model's own query encoder, from the model prepared once per set-size
limit a request asks for (:func:`hyset_jax.inference.pipeline.prepare`: P Zᵀ, Z M_m and the
neighbour table), plus ``tools``: the definitions of the set's members
(:func:`hyset_jax.data.tooltext.definition`).

Compiled programs belong to a library (:class:`Programs`): a Retriever predicts through its own
jitted function, which a catalogue update's successor shares when its arrays have the same
shapes (the same programs answer it, nothing compiles) and otherwise replaces. A library's
programs are freed with its last Retriever, so a server whose library changes size at every
update holds the programs of the libraries it serves, not of every size it ever served (the
module-level ``jax.jit`` of :mod:`hyset_jax.inference.pipeline` keeps one program per shape for
the life of the process).

A request may carry a tool filter (:mod:`hyset_jax.inference.filters`, intersected with its API key's
policy): ``Options.allowed`` holds its mask, inference masks the other tools before the
shortlist, and the slots they fill when fewer than K_pool tools are allowed are left out of
``ranking`` and ``shortlist``.
"""
from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from hyset_jax import choices
from hyset_jax.inference import ann, filters, pipeline
from hyset_jax.model import terms
from hyset_jax.model.query_inputs import QueryInputs
from hyset_jax.data.tooltext import definition
from hyset_jax.errors import FieldError, UserError

# The values of the ``ranking`` request field (the model's recorded ranking is the default).
RANKINGS: tuple[str, ...] = tuple(pipeline.RANKINGS)
# Encoder rows per forward pass in a server (see load_retriever), and the longest query length
# (tokens) compiled at start-up; longer queries compile on first sight.
ENCODER_ROWS = 8
WARM_MAX_TOKENS = 128


@dataclasses.dataclass(frozen=True)
class Options:
  """Per-request settings; requests with equal options share a device call (the filter
  ``allowed``, bool[N] or None, does not split them: masks are stacked per query)."""
  max_size: int
  k_pool: int
  ranking: str
  allowed: np.ndarray | None = dataclasses.field(default=None, compare=False, repr=False)


def check_text(name: str, text: str) -> None:
  """FieldError for a text that is not valid Unicode: a lone UTF-16 surrogate (JSON allows
  ``"\\ud800"``) cannot be encoded as UTF-8, which the tokenizer needs (a 500 otherwise)."""
  try:
    text.encode("utf-8")
  except UnicodeEncodeError as e:
    raise FieldError(name, f"holds a lone UTF-16 surrogate (U+{ord(text[e.start]):04X} at "
                           f"character {e.start}); expected valid Unicode text") from None


def _int(name: str, value: Any) -> int:
  if not isinstance(value, int) or isinstance(value, bool):
    raise FieldError(name, f"must be an integer, got {type(value).__name__}")
  return value


def tool_catalog(tool_ids: Sequence[str], specs: Sequence[str]) -> tuple[list[dict], str]:
  """The definition of every model tool (model row order), read from library ``specs``.

  Later specs win for an id found in several. Tools no spec defines get their id as name.
  Returns the definitions and a line saying where they came from.
  """
  defs, _, where = tool_catalog_and_tags(tool_ids, specs)
  return defs, where


def tool_catalog_and_tags(tool_ids: Sequence[str], specs: Sequence[str]
                          ) -> tuple[list[dict], dict[str, frozenset[str]], str]:
  """:func:`tool_catalog` and each defined tool's filter tags (:func:`filters.tags_of`; an
  ``mcp:FILE.json`` library also tags its tools with the file's stem, the MCP server's name
  as a client would call it)."""
  import pathlib

  from hyset_jax.data.specs import load_dataset
  found: dict[str, dict] = {}
  tags: dict[str, frozenset[str]] = {}
  for spec in specs:
    tools = load_dataset(spec).tools
    server = pathlib.Path(spec[4:]).stem if spec.startswith("mcp:") else None
    for i, tool_id in enumerate(tools.ids):
      found[tool_id] = definition(tool_id, tools.texts[i], tools.metadata[i])
      meta = tools.metadata[i] if server is None else {**tools.metadata[i], "server": server}
      tags[tool_id] = filters.tags_of(meta)
  defs = [found.get(t) or definition(t, None, None) for t in tool_ids]
  known = sum(t in found for t in tool_ids)
  where = ", ".join(specs) if specs else "no library named (pass --tools SPEC)"
  return defs, tags, f"tool definitions for {known} of {len(tool_ids)} tools from {where}"


class Programs:
  """The compiled prediction programs of one library
  (:func:`pipeline.own_rankings_program`: dropped when this object is, with the last Retriever
  holding it). ``traces`` counts compilations (one per distinct argument shape and static
  option set)."""

  def __init__(self):
    # A list, not self: a closure over self would be a reference cycle, and the programs
    # would wait for the cycle collector instead of going with the last reference.
    traces = self._traces = [0]

    def traced():
      traces[0] += 1
    self.predict = pipeline.own_rankings_program(on_trace=traced)

  @property
  def traces(self) -> int:
    return self._traces[0]


def library_shapes(model) -> tuple:
  """What decides the shapes of a library's compiled programs: its parameter tree and every
  array's shape and dtype (the tool count among them), and whether it has a lexical term."""
  leaves, tree = jax.tree.flatten(model.params)
  return (tree, tuple((np.shape(a), str(getattr(a, "dtype", type(a).__name__)))
                      for a in leaves), model.lexical is None)


class Retriever:
  """Text queries in, prediction rows out, for one model directory.

  Args:
    model: a loaded model directory (:func:`hyset_jax.io.modeldir.load_model_dir`).
    encode: texts -> f32[n, d_r], the model's query encoder.
    warm_texts: texts whose encoding compiles the encoder shapes requests will use.
    definitions: one tool definition per model tool, in row order.
    method: the subset-enumeration implementation.
    max_batch: the largest device batch; smaller batches are padded to a power of two, so
      at most log2(max_batch) + 1 shapes compile per option set.
    cache_dir: where the neighbour tables are cached (None: built in memory only).
    sentence_encoder: the loaded encoder behind ``encode``, when there is one: a catalogue
      update embeds new tools with it rather than loading it again
      (:func:`hyset_jax.serve.catalogue.tool_embedder`).
    tags: tool id -> its filter tags (:func:`filters.tags_of`); tools not in it have none
      (those a catalogue update adds).
    first_stage: the approximate first stage's settings (:func:`ann.settings`), or None for the
      exact one. Its index over the model's Z is built (or read from ``cache_dir``) on first
      use and replaces the neighbour table; filtered requests run the exact first stage.
    programs: the compiled programs to predict with (:class:`Programs`); None: new ones.
      :meth:`with_library` passes its own to a successor of the same shapes.
    precision: the dtype of the prepared products (:data:`choices.PRECISIONS`,
      :func:`pipeline.prepare`); every set-size limit, and every successor a catalogue update
      builds (:meth:`with_library`), is prepared in it.
  """

  def __init__(self, model, encode: Callable[[list[str]], np.ndarray], definitions: list[dict],
               *, method: str = choices.DEFAULT_METHOD, max_batch: int = 64,
               warm_texts: Sequence[str] = ("warm up",), cache_dir=None,
               sentence_encoder=None, tags: dict[str, frozenset[str]] | None = None,
               first_stage: ann.Settings | None = None, programs: Programs | None = None,
               precision: str = choices.DEFAULT_PRECISION):
    if len(definitions) != len(model.tool_ids):
      raise ValueError("one definition per tool expected")
    self.model = model
    self.encode = encode
    self.definitions = definitions
    self.method = method
    self.precision = choices.check("precision", precision, choices.PRECISIONS)
    self.max_batch = max_batch
    # The manifest's ranking (the oldest directories have none: greedy).
    self.default_ranking = model.default_ranking
    # A term may rule some rankings out (the seen-set prior: greedy).
    self.rankings = terms.allowed_rankings(model.params)
    self.defaults = Options(model.max_set_size, model.k_pool, self.default_ranking)
    self.warm_texts = list(warm_texts)
    self.cache_dir = cache_dir
    self.sentence_encoder = sentence_encoder
    self.tags = dict(tags or {})
    self._prepared: dict[int, pipeline.PreparedModel] = {}
    self.first_stage = first_stage
    self._ann: ann.Index | None = None
    self._filter_index: filters.FilterIndex | None = None
    self.programs = programs if programs is not None else Programs()

  @property
  def filter_index(self) -> filters.FilterIndex:
    """This library's ids and tags, indexed for filters (built on first use)."""
    if self._filter_index is None:
      self._filter_index = filters.FilterIndex(
          self.model.tool_ids, [self.tags.get(t, ()) for t in self.model.tool_ids])
    return self._filter_index

  def allowed(self, request: filters.ToolFilter | None, policy: filters.ToolFilter
              ) -> np.ndarray | None:
    """bool[N]: the tools a request may be answered with — its own filter (strict: an
    unknown id or tag is a FieldError naming it) within its policy (ids the library no
    longer has are skipped); None when neither restricts anything. FieldError ``tools``
    when nothing is left."""
    index = self.filter_index
    mask = filters.intersect(index.mask(policy, "policy", strict=False, require=False),
                             index.mask(request or filters.EVERYTHING, "tools", require=False))
    if mask is not None and not mask.any():
      raise FieldError("tools", "no tool of the library is allowed (the request's filter "
                                "within the API key's policy)")
    return mask

  def with_library(self, model, definitions: list[dict]) -> Retriever:
    """This retriever's encoder and settings over ``model``, an edited copy of its model.

    Nothing is prepared yet. Neighbour tables are built in memory: a cache beside the source
    model directory is keyed by Z, and an edited library's tables do not belong there.

    The successor shares this library's compiled programs when its arrays have the same shapes
    (:func:`library_shapes`: an update that adds as many tools as it removes), so nothing
    compiles; otherwise it gets its own, and these go with the last Retriever of this library.
    With an ANN first stage it never shares: the index is a static argument, one per library,
    so shared programs would pile up one per update."""
    same = self.first_stage is None and library_shapes(model) == library_shapes(self.model)
    return Retriever(model, self.encode, definitions, method=self.method,
                     max_batch=self.max_batch, warm_texts=self.warm_texts, cache_dir=None,
                     sentence_encoder=self.sentence_encoder, tags=self.tags,
                     first_stage=self.first_stage, programs=self.programs if same else None,
                     precision=self.precision)

  @property
  def prepared_sizes(self) -> tuple[int, ...]:
    """The set-size limits prepared so far (a successor prepares the same ones)."""
    return tuple(self._prepared)

  @property
  def num_tools(self) -> int:
    return len(self.model.tool_ids)

  def options(self, max_size: Any = None, k_pool: Any = None, ranking: Any = None) -> Options:
    """Validated per-request options (``None`` = the model's); FieldError naming the field."""
    m, n = self.model, self.num_tools
    max_size = m.max_set_size if max_size is None else _int("max_size", max_size)
    k_pool = m.k_pool if k_pool is None else _int("k_pool", k_pool)
    if not 2 <= max_size <= m.max_set_size:
      raise FieldError("max_size", f"must be between 2 and the model's max_set_size "
                                   f"{m.max_set_size}, got {max_size}")
    low = max(m.k1 + 1, max_size)
    if not low <= k_pool <= n:
      raise FieldError("k_pool", f"must be between {low} (above the model's k1 = {m.k1} and "
                                 f"at least max_size) and the library size {n}, got {k_pool}")
    ranking = self.default_ranking if ranking is None else ranking
    if ranking not in self.rankings:
      raise FieldError("ranking", f"must be one of {', '.join(self.rankings)} for this model, "
                                  f"got {ranking!r}")
    return Options(max_size, k_pool, ranking)

  def prepared(self, max_size: int) -> pipeline.PreparedModel:
    """The model prepared for set size ``max_size`` (built on first use, then kept).

    The per-model products and the neighbour table are not recomputed per request: at
    N = 13,860, d = 768 that is ~80 GFLOP (~1 s on a 2-core CPU), far more than a query's own
    work. The table is as wide as the model's k_pool needs; a request with a larger k_pool
    scans every tool instead (same answer). No lock: like every device call here it runs on
    the micro-batcher's one thread (or before serving starts, in warm_up)."""
    if max_size not in self._prepared:
      self._prepared[max_size] = pipeline.prepare(
          self.model.params, max_size=max_size, k_pool=self.model.k_pool,
          cache_dir=self.cache_dir, neighbor_table=self.ann_index() is None,
          precision=self.precision)
    return self._prepared[max_size]

  def ann_index(self) -> ann.Index | None:
    """The approximate first stage's index over this library (built on first use, then
    kept; one for every set-size limit), or None when the first stage is exact."""
    if self._ann is None and self.first_stage is not None:
      self._ann = ann.for_model(self.model.params, self.first_stage, cache_dir=self.cache_dir,
                                progress=self.num_tools > 20_000)
      if self._ann is None:  # the model cannot use it (the lexical term): exact from now on
        self.first_stage = None
    return self._ann

  def bucket(self, n: int) -> int:
    """The padded batch size for n queries: the next power of two, at most ``max_batch``."""
    return min(self.max_batch, 1 << max(0, n - 1).bit_length())

  def predict(self, emb: np.ndarray, options: Options,
              lexical: np.ndarray | None = None,
              allowed: np.ndarray | None = None) -> list[dict]:
    """Prediction rows for f32[n, d_r] query embeddings (one device call per bucket);
    ``lexical``: their f32[n, N] lexical scores, required for a model with the lexical term
    (:meth:`retrieve_batch` computes them from the texts); ``allowed``: bool[n, N], each
    query's filter (None: every tool)."""
    n = emb.shape[0]
    bucket = self.bucket(n)
    pad = -n % bucket
    if pad:
      emb = np.concatenate([emb, np.zeros((pad, emb.shape[1]), np.float32)])
    if self.model.lexical is not None:
      if lexical is None:
        raise ValueError("this model has a lexical term: pass the queries' lexical scores "
                         "(ModelDir.lexical_scores of their texts)")
      lexical = np.concatenate([lexical, np.zeros((pad, self.num_tools), np.float32)])
    if allowed is not None:
      allowed = np.concatenate([allowed, np.ones((pad, self.num_tools), bool)])
    pred = pipeline.predict_batched(self.prepared(options.max_size),
                                     QueryInputs(emb, lexical, allowed), k1=self.model.k1,
                                     k_pool=options.k_pool, max_size=options.max_size,
                                     batch_size=bucket, method=self.method,
                                     ranking=options.ranking, first_stage=self.ann_index(),
                                     program=self.programs.predict)
    ids, defs = self.model.tool_ids, self.definitions
    rows = []
    for q in range(n):
      members = [int(t) for t in pred.set_tools[q] if t >= 0]
      rows.append({
          "set": [ids[t] for t in members],
          "set_score": float(pred.set_score[q]),
          # -1: a slot left to a tool the filter rules out (fewer allowed than K_pool)
          "ranking": [ids[t] for t in pred.ranking[q] if t >= 0],
          "shortlist": [ids[t] for t in pred.shortlist[q] if t >= 0],
          "tools": [defs[t] for t in members],
      })
    return rows

  def retrieve_batch(self, requests: Sequence[tuple[Sequence[str], Options]]) -> list[list[dict]]:
    """Answer several requests at once: one encoder call for all their texts, then one
    prediction call per distinct option set. Returns rows per request, in order."""
    texts = [t for request_texts, _ in requests for t in request_texts]
    emb = np.asarray(self.encode(texts), np.float32)
    lexical = self.model.lexical_scores(texts)          # None without the lexical term
    starts = np.cumsum([0] + [len(t) for t, _ in requests])
    # Filtered requests share a call with each other, not with unfiltered ones: those keep
    # the fast path (the neighbour table) that a mask rules out.
    groups: dict[tuple[Options, bool], list[int]] = {}
    for i, (_, options) in enumerate(requests):
      groups.setdefault((options, options.allowed is not None), []).append(i)
    out: list[list[dict]] = [[] for _ in requests]
    for (options, masked), members in groups.items():
      rows = np.concatenate([np.arange(starts[i], starts[i + 1]) for i in members])
      allowed = None
      if masked:
        allowed = np.concatenate([np.broadcast_to(requests[i][1].allowed,
                                                  (starts[i + 1] - starts[i], self.num_tools))
                                  for i in members])
      answers = self.predict(emb[rows], options, None if lexical is None else lexical[rows],
                             allowed)
      k = 0
      for i in members:
        size = starts[i + 1] - starts[i]
        out[i] = answers[k:k + size]
        k += size
    return out

  def warm_up(self, encoder: bool = True) -> None:
    """Prepare the model, compile the default options for every batch bucket and (with
    ``encoder``) the encoder for the usual query lengths, so that no request waits for a
    compilation. A catalogue update warms its new library with ``encoder=False``: the encoder
    is shared and already warm."""
    d = self.query_dim
    size = 1
    while True:
      # Zero lexical scores (no word matched) compile the same program real ones run.
      lexical = (None if self.model.lexical is None else
                 np.zeros((size, self.num_tools), np.float32))
      self.predict(np.zeros((size, d), np.float32), self.defaults, lexical)
      if size >= self.max_batch:
        break
      size = min(self.max_batch, size * 2)
    if encoder:
      self.encode(self.warm_texts)

  @property
  def query_dim(self) -> int:
    return int(self.model.params.projection.shape[0])


def load_retriever(model_path: str, tool_specs: Sequence[str] = (), *,
                   method: str = choices.DEFAULT_METHOD,
                   max_batch: int = 64, log=lambda msg: print(msg, file=sys.stderr),
                   first_stage: str | None = None,
                   precision: str = choices.DEFAULT_PRECISION) -> Retriever:
  """A Retriever for a model directory (or `hyset train` workdir) and its query encoder.
  ``first_stage``: ``"exact"`` or ``"ann"`` (None: what the model's manifest records);
  ``precision``: the prepared products' dtype (:class:`Retriever`)."""
  from hyset_jax.encoder import load_query_encoder
  from hyset_jax.io.modeldir import load_best
  from hyset_jax.inference import neighbors
  from hyset_jax.io.modeldir import data_spec

  choices.check("precision", precision, choices.PRECISIONS)  # before seconds of loading
  source, model = load_best(model_path)
  if not tool_specs:
    spec = data_spec(source, None)
    tool_specs = (spec,) if spec else ()
  definitions, tags, where = tool_catalog_and_tags(model.tool_ids, tool_specs)
  if not model.query_encoder:
    raise UserError(f"{source}: the manifest names no query encoder (query_encoder is null), "
                    f"so text queries cannot be embedded; serve a model trained with an encoder")
  encoder = load_query_encoder(model.query_encoder, int(model.params.projection.shape[0]))
  log(f"model {source}: {len(model.tool_ids)} tools, max_set_size {model.max_set_size}, "
      f"k1 {model.k1}, k_pool {model.k_pool}, precision {precision}; {where}")

  def encode(texts: list[str]) -> np.ndarray:
    # Fixed 8-row encoder batches: the encoder compiles one program per (rows, length) bucket,
    # and a server sees every batch size; with the rows fixed only the length varies.
    return encoder.encode(texts, batch_size=ENCODER_ROWS, progress=False)

  # One text per length bucket a query usually falls in (``n`` words ≈ n + 2 tokens).
  warm = [" ".join(["tool"] * max(1, b - 2)) for b in encoder.buckets if b <= WARM_MAX_TOKENS]
  return Retriever(model, encode, definitions, method=method, max_batch=max_batch,
                   warm_texts=[t for t in warm for _ in range(ENCODER_ROWS)],
                   cache_dir=neighbors.cache_dir_beside(source), sentence_encoder=encoder,
                   tags=tags, first_stage=ann.settings(model.first_stage, first_stage),
                   precision=precision)
