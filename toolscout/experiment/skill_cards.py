"""Stage 7: stages 2, 3 and batch routing again with every tool rendered as a skill card
(:mod:`toolscout.skillcard`, paper Table 32)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from hyset_jax.data.types import ToolLibrary
from toolscout import embedding, router
from toolscout import fingerprint as fpr
from toolscout.experiment.data import Prepared, log
from toolscout.experiment.detectors import judge_detectors
from toolscout.experiment.evaluation import evaluate_retrievers
from toolscout.experiment.lexical import lexical_scores
from toolscout.experiment.outcomes import cat, mean
from toolscout.experiment.routing import route_batches
from toolscout.experiment.training import train_retrievers
from toolscout.keys import DENSE, Detector, Retriever


def skill_cards(data: Prepared, fp: fpr.Fingerprint, values: Mapping[str, Mapping[Detector, float]],
                counts: Mapping[str, int], default_route: Mapping[str, str]) -> dict[str, Any]:
  """Collapse, aggregate and batch routing with every tool rendered as a skill card.

  ``default_route`` is the main run's label-free batch route per source: it depends on the
  queries only, so it is the same with cards.
  """
  from toolscout.skillcard import render_cards
  cards = render_cards(data.suite.tools.texts)
  log("skill cards: embedding cards")
  card_emb = embedding.embed(data.encoder, cards)
  projections, logs = train_retrievers(data, card_emb)
  # BM25 features of the rerankers read the same card texts the dense retrievers see.
  tools = data.suite.tools
  lexical = lexical_scores(data, ToolLibrary(tools.ids, tuple(cards), tools.metadata))
  ev = evaluate_retrievers(data, card_emb, cards, projections, lexical, controls=False)
  cov = {k: {s: mean(ev.coverage[k][s]) for s in data.names} for k in DENSE}
  spec_cov = np.array([cov[Retriever.SPECIALIST][s] for s in data.names])
  unsafe = {s: bool(v) for s, v in zip(data.names, router.unsafe_labels(
      spec_cov, data.config.coverage_floor))}
  batch = route_batches(data, fp, unsafe, ev.coverage[Retriever.SPECIALIST],
                        ev.coverage[Retriever.AGGREGATE])
  mixed = {k: mean(cat(ev.coverage[k], data.names)) for k in DENSE}
  mixed["routed"] = mean(cat(batch["routed"], data.names))
  mixed["routed_default"] = mean(np.concatenate([
      ev.coverage[Retriever.SPECIALIST if default_route[s] == router.SPECIALIST
                  else Retriever.AGGREGATE][s] for s in data.names]))
  return {
      "example_card": cards[0],
      "per_source_coverage": cov, "unsafe": unsafe, "mixed_coverage": mixed,
      "route": batch["route"], "training": logs,
      "detectors": judge_detectors(values, cov[Retriever.SPECIALIST], counts,
                                   data.config.coverage_floor, (Detector.TFIDF, Detector.SEMANTIC)),
  }
