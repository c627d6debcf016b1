"""The trained baselines by name: what ``hyset eval --method`` and the benchmark tables fit.

Each is fit on a data set's training queries (frozen encoder embeddings), deterministically
given ``seed``; on a 2-core CPU the linear head and the set classifier take well under a
minute of compute, the MLP head a few minutes:

==================  ===========================================================================
``linear-head``     per-tool linear head, W started at the dense ranking
``mlp-head``        per-tool one-hidden-layer MLP head (1,024 GELU units)
``set-classifier``  softmax over the distinct training gold sets (the memorisation baseline)
==================  ===========================================================================

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
TRAINED_METHODS = (*HEADS, "set-classifier")


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
    validation: held-out queries; needed by ``set_rule="threshold"``.
    set_rule: ``"top5"`` or ``"threshold"`` (per-tool heads only).
    overrides: :class:`HeadConfig` fields to change (e.g. ``loss="sigmoid"``).

  Returns:
    A retriever (``retrieve(queries, depth) -> Retrieval``).
  """
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
