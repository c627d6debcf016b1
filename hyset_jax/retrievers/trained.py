"""The trained baselines by name: what ``hyset eval --method`` and the benchmark tables fit.

Each is fit on a data set's training queries (frozen encoder embeddings), deterministically
given ``seed``; on a 2-core CPU the linear head and the set classifier take well under a
minute of compute, the MLP head a few minutes:

==================  ===========================================================================
``linear-head``     per-tool linear head, W started at the dense ranking
``mlp-head``        per-tool one-hidden-layer MLP head (1,024 GELU units)
``set-classifier``  softmax over the distinct training gold sets (the memorisation baseline)
==================  ===========================================================================

and the paper's set-level baselines (§3.3; docs/baselines.md), each over the shortlist of the
linear head's logits ℓ, with their settings chosen on ``validation``:

=====================  ========================================================================
``cardinality``        ℓ's order; the set: its top m̂, m̂ from a classifier over sizes 1..M
``mmr``                maximal marginal relevance over the shortlist; the set: the first m̂
``facility-location``  greedy facility location (coverage of ℓ's mass); the set: gain ≥ γ
``deepsets``           a DeepSets set scorer, exhaustive argmax over the shortlist's subsets
``set-transformer``    a Set Transformer (SAB + PMA) scorer, decoded the same way
=====================  ========================================================================

The per-tool heads use the per-tool softmax loss and score their top 5 as the set, like the
rank-only retrievers; both choices are measured against the alternatives (one-vs-rest
sigmoid loss, a validation-chosen probability threshold) in docs/baselines.md.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from hyset_jax.data.types import Query, ToolLibrary
from hyset_jax.errors import UserError
from hyset_jax.retrievers.heads import HeadConfig, ToolHeadRetriever
from hyset_jax.retrievers.set_classifier import DEFAULT_CONFIG, SetClassifierRetriever

HEADS = {"linear-head": HeadConfig(hidden=0, loss="softmax"),
         "mlp-head": HeadConfig(hidden=1024, loss="softmax")}
GREEDY_SET_METHODS = ("cardinality", "mmr", "facility-location")
SET_SCORER_METHODS = ("deepsets", "set-transformer")
SET_METHODS = GREEDY_SET_METHODS + SET_SCORER_METHODS
TRAINED_METHODS = (*HEADS, "set-classifier", *SET_METHODS)


def fit_baseline(name: str, tools: ToolLibrary, encoder: Any, train: Sequence[Query], *,
                 seed: int = 0, validation: Sequence[Query] = (), set_rule: str = "top5",
                 **overrides: Any) -> Any:
  """Fits the trained baseline ``name`` on ``train``.

  Args:
    name: one of :data:`TRAINED_METHODS`.
    tools: the tool library.
    encoder: the frozen query encoder.
    train: training queries with gold sets.
    seed: initialisation and minibatch order.
    validation: held-out queries; needed by ``set_rule="threshold"`` and the set methods.
    set_rule: ``"top5"`` or ``"threshold"`` (per-tool heads only).
    overrides: :class:`HeadConfig` fields to change (e.g. ``loss="sigmoid"``), or for the set
      methods :class:`~hyset_jax.retrievers.shortlist.SetBaselineConfig` fields.

  Returns:
    A retriever (``retrieve(queries, depth) -> Retrieval``).
  """
  if name in SET_METHODS:
    return _fit_set_method(name, tools, encoder, train, seed, validation, set_rule, overrides)
  if name == "set-classifier":
    if set_rule != "top5":
      raise UserError("the set classifier predicts its argmax set; it takes no set rule")
    config = dataclasses.replace(DEFAULT_CONFIG, seed=seed, **overrides)
    return SetClassifierRetriever.fit(tools, encoder, train, config)
  if name not in HEADS:
    raise UserError(f"unknown trained baseline {name!r}; choose from {', '.join(TRAINED_METHODS)}")
  config = dataclasses.replace(HEADS[name], seed=seed, **overrides)
  return ToolHeadRetriever.fit(tools, encoder, train, config, set_rule=set_rule,
                               validation=validation)


def _fit_set_method(name: str, tools: ToolLibrary, encoder: Any, train: Sequence[Query],
                    seed: int, validation: Sequence[Query], set_rule: str,
                    overrides: dict[str, Any]) -> Any:
  from hyset_jax.retrievers.greedy_sets import GreedySetRetriever
  from hyset_jax.retrievers.set_scorers import SetScorerRetriever
  from hyset_jax.retrievers.shortlist import SetBaselineConfig
  if set_rule != "top5":
    raise UserError(f"{name} predicts its own set; it takes no set rule")
  if not validation:
    raise UserError(f"{name} chooses its settings on validation queries; none were given")
  config = SetBaselineConfig(seed=seed, **overrides)
  if name in GREEDY_SET_METHODS:
    return GreedySetRetriever.fit(name, tools, encoder, train, validation, config)
  return SetScorerRetriever.fit(name, tools, encoder, train, validation, config)
