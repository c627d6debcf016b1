"""Stage 1: the suite (:mod:`toolscout.sources`), frozen embeddings of tools and queries, gold rows."""
from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any

import numpy as np

from hyset_jax.data import splits
from hyset_jax.data.types import Query
from hyset_jax.errors import UserError
from toolscout import embedding, sources
from toolscout.config import ExperimentConfig


def log(message: str) -> None:
  """A progress line on stderr (the experiment's stages take seconds to minutes each)."""
  print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclasses.dataclass
class Prepared:
  """Everything later stages share. ``[s]`` = per source name, ``[s][split]`` = per split.

  Attributes:
    names: source names, the reference (the specialist's training source) first.
    tool_emb: ``float32[N, d]`` frozen embeddings of the library's tool texts.
    queries: ``[s][split]`` queries; splits are ``"train"`` and ``"test"``.
    emb: ``[s][split] -> float32[n, d]`` frozen query embeddings.
    gold: ``[s][split]`` gold tools of each query as library rows.
  """
  config: ExperimentConfig
  suite: sources.Suite
  names: list[str]
  encoder: Any
  tool_emb: np.ndarray
  queries: dict[str, dict[str, tuple[Query, ...]]]
  emb: dict[str, dict[str, np.ndarray]]
  gold: dict[str, dict[str, list[list[int]]]]

  @property
  def reference(self) -> str:
    return self.names[0]

  def texts(self, s: str, split: str) -> list[str]:
    return [q.text for q in self.queries[s][split]]

  def gold_sets(self, s: str, split: str) -> list[set[str]]:
    return [set(q.gold) for q in self.queries[s][split]]

  def counts(self, split: str = "test") -> dict[str, int]:
    """Queries per source in ``split``."""
    return {s: len(self.queries[s][split]) for s in self.names}

  def stream(self) -> tuple[list[str], np.ndarray]:
    """The mixed stream: every source's test split, one source after another.

    Returns:
      the texts and ``str[n]``, the source of each.
    """
    texts = [t for s in self.names for t in self.texts(s, "test")]
    src = np.array([s for s in self.names for _ in self.queries[s]["test"]])
    return texts, src


def prepare(config: ExperimentConfig) -> Prepared:
  """Builds the suite and embeds every tool and query once."""
  suite = sources.build_suite(
      config.toollens_spec, config.bfcl_spec or None, config.bfcl_categories or None,
      config.reference_source, config.max_train, config.max_test)
  names = list(suite.sources)
  if len(names) < 3:
    raise UserError(f"the experiment needs at least 3 sources, got {names}")
  if not suite.sources[names[0]].train:
    raise UserError(f"reference source {names[0]!r} has no training queries")
  encoder = embedding.get_encoder(config.encoder, config.encoder_dir)
  log(f"suite: {len(suite.tools)} tools, {len(names)} sources; embedding tools")
  tool_emb = embedding.embed(encoder, suite.tools.texts)
  index = suite.tools.index()
  queries = {s: {"train": suite.sources[s].train, "test": suite.sources[s].test} for s in names}
  log("embedding queries")
  emb, gold = {}, {}
  for s in names:
    emb[s] = {sp: embedding.embed(encoder, [q.text for q in qs]) for sp, qs in queries[s].items()}
    gold[s] = {sp: [[index[g] for g in q.gold] for q in qs] for sp, qs in queries[s].items()}
  return Prepared(config, suite, names, encoder, tool_emb, queries, emb, gold)


def reranker_sample(data: Prepared) -> list[tuple[str, int]]:
  """(source, row) of the training queries the rerankers learn from: the
  ``reranker_train_queries`` smallest id hashes over every source, so the pick does not depend
  on file order."""
  items = [(s, i, q.id) for s in data.names for i, q in enumerate(data.queries[s]["train"])]
  items.sort(key=lambda it: splits.unit_hash(it[2], "toolscout-reranker"))
  return [(s, i) for s, i, _ in items[:data.config.reranker_train_queries]]
