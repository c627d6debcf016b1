"""The training inputs: a data set read through its spec and encoded once with the frozen
encoder (cached), as tool rows and per-split query sets.

Besides the configured train, validation and test splits, every split that holds only no-tool
queries (empty gold sets: BFCL's ``irrelevant_*``) is encoded too, with empty gold rows, for
evaluating abstention. Nothing trains on them or scores retrieval metrics on them: training
reads ``config.data.train_split`` alone, and a configured split with an empty gold set is
refused here.
"""
from __future__ import annotations

import dataclasses
import logging

import numpy as np

from hyset_jax import config as config_lib
from hyset_jax.errors import UserError

log = logging.getLogger("hyset_jax.training.train")


@dataclasses.dataclass(frozen=True)
class QuerySet:
  """One split's queries: ids, texts, f32[n, d_r] frozen embeddings, gold sets as sorted rows
  (``()`` for a no-tool query)."""
  ids: tuple[str, ...]
  texts: tuple[str, ...]
  embeddings: np.ndarray            # f32[n, d_r]
  gold: tuple[tuple[int, ...], ...]  # sorted tool rows


@dataclasses.dataclass(frozen=True)
class TrainingData:
  """The library (ids, f32[N, d_z] encoder embeddings), the query encoder and the splits.

  ``query_encoder`` is what a model directory records for it
  (:func:`hyset_jax.encoder.encoder_reference`: the default's name or a directory's absolute
  path), so ``hyset predict`` embeds with the encoder training read.
  """
  tool_ids: tuple[str, ...]
  tool_embeddings: np.ndarray       # f32[N, d_z], encoder output
  query_encoder: str
  splits: dict[str, QuerySet]
  tool_texts: tuple[str, ...] = ()  # row order; what the lexical term's BM25 indexes


def tool_encoder(data: TrainingData):
  """texts -> f32[n, d_z]: the encoder output ``data`` holds for its tools with those texts —
  how carrying a model onto ``data``'s library embeds a tool (hyset_jax.io.carry.EncodeTools)."""
  by_text = dict(zip(data.tool_texts, np.asarray(data.tool_embeddings, np.float32)))
  return lambda texts: np.stack([by_text[t] for t in texts])


def load_config_dataset(c: config_lib.DataConfig, max_set_size: int):
  """The data set of ``c`` (gold sets up to ``max_set_size``), its validation split carved from
  train when it has none, and with ``c.validation_sets`` > 0 the held-out-set validation part
  (splits.with_unseen_validation): the splits training, the benchmarks and their baselines
  read."""
  from hyset_jax.data.specs import load_dataset
  from hyset_jax.data.splits import with_unseen_validation, with_validation
  dataset = load_dataset(c.spec, max_set_size=max_set_size)
  if c.val_split not in dataset.splits:
    dataset = with_validation(dataset, c.validation_fraction)
  if c.validation_sets:
    dataset = with_unseen_validation(dataset, c.validation_sets, c.validation_sets_seed,
                                     train=c.train_split, validation=c.val_split)
  return dataset


def validation_parts(data: TrainingData, c: config_lib.DataConfig) -> dict[str, QuerySet]:
  """The splits model selection reads: the configured validation split and, with
  ``c.validation_sets`` > 0, the held-out-set part; selection takes the mean of their
  metrics (:func:`hyset_jax.evaluation.evaluator.mean_metrics`)."""
  from hyset_jax.data.splits import UNSEEN_VALIDATION
  names = (c.val_split,) + ((UNSEEN_VALIDATION,) if c.validation_sets else ())
  return {name: data.splits[name] for name in names}


def prepare_data(config: config_lib.Config) -> TrainingData:
  """Read the data set, encode tools and queries with the frozen encoder (cached)."""
  from hyset_jax.encoder import encode_cached, encoder_reference, load_encoder

  c = config.data
  dataset = load_config_dataset(c, config.model.max_set_size)
  if len(dataset.tools) < config.model.k_pool:
    raise UserError(f"{c.spec}: the tool library has {len(dataset.tools)} tools, fewer than "
                    f"model.k_pool = {config.model.k_pool}; lower model.k_pool and model.k1")
  encoder = load_encoder(config.model.encoder or None)
  index = dataset.tools.index()
  from hyset_jax.data.splits import UNSEEN_VALIDATION
  configured = ((c.train_split, c.max_train_queries), (c.val_split, c.max_eval_queries))
  if c.validation_sets:
    configured += ((UNSEEN_VALIDATION, c.max_eval_queries),)
  if c.test_split in dataset.splits:
    configured += ((c.test_split, c.max_eval_queries),)
  else:
    # A training library without test queries (e.g. a held-out-tools split's train folder,
    # whose test needs tools it lacks): the run reports validation only.
    log.info("%s has no %r split: no test metrics at the end", c.spec, c.test_split)
  names = {name for name, _ in configured}
  # Splits of no-tool queries only: encoded for abstention, after the configured ones.
  no_tool = [(name, c.max_eval_queries) for name, qs in dataset.splits.items()
             if name not in names and qs and not any(q.gold for q in qs)]
  splits = {}
  for name, limit in configured + tuple(no_tool):
    queries = dataset.split(name)
    if limit:
      queries = queries[:limit]
    missing = [q.id for q in queries if any(t not in index for t in q.gold)]
    if missing:
      raise UserError(f"{c.spec}: {len(missing)} {name} queries name gold tools missing from "
                      f"the library, e.g. {missing[:3]}")
    if not queries:
      raise UserError(f"{c.spec}: split {name!r} has no queries")
    empty = [q.id for q in queries if not q.gold]
    if empty and name in names:
      # Training needs a gold set per query and every retrieval metric divides by its size.
      raise UserError(f"{c.spec}: split {name!r} has {len(empty)} queries with an empty gold "
                      f"set (no-tool requests, e.g. {empty[:3]}); it cannot be the train, "
                      f"validation or test split (data.train_split, data.val_split, "
                      f"data.test_split): name a split with gold tools")
    log.info("encoding %d %s queries", len(queries), name)
    emb = encode_cached(encoder, [q.text for q in queries])
    splits[name] = QuerySet(tuple(q.id for q in queries), tuple(q.text for q in queries),
                            np.asarray(emb, np.float32),
                            tuple(tuple(sorted(index[t] for t in q.gold)) for q in queries))
  log.info("encoding %d tools", len(dataset.tools))
  tool_emb = np.asarray(encode_cached(encoder, dataset.tools.texts), np.float32)
  return TrainingData(dataset.tools.ids, tool_emb, encoder_reference(config.model.encoder or None),
                      splits, tuple(dataset.tools.texts))
