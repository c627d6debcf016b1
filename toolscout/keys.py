"""The experiment report's keys, in one place: retrievers, rerankers, detectors, routing modes.

Each is a typed constant whose value is the key written to ``report.json``; the
display label of the Markdown report and the figure is derived from the constant
here, so no prose string is ever used as a key.

>>> Mode(Tau.DEFAULT, 10).key, Mode(Tau.DEFAULT, 10).label
('default/window_10', 'rolling window 10, default tau (no labels)')
>>> Mode.from_key("loso/batch") == Mode(Tau.LOSO, None)
True
"""
from __future__ import annotations

import dataclasses
import enum


class Retriever(enum.StrEnum):
  """A first-stage retriever of the experiment."""
  OTS = "ots"
  SPECIALIST = "specialist"
  AGGREGATE = "aggregate"
  BM25 = "bm25"
  FUSION = "fusion"
  BM25_SPECIALIST = "bm25_specialist"

  @property
  def label(self) -> str:
    return _RETRIEVER_LABELS[self]


_RETRIEVER_LABELS = {
    Retriever.OTS: "Off-the-shelf dense", Retriever.SPECIALIST: "Specialist",
    Retriever.AGGREGATE: "Aggregate", Retriever.BM25: "BM25",
    Retriever.FUSION: "BM25+dense RRF", Retriever.BM25_SPECIALIST: "BM25+specialist RRF",
}
# The dense retrievers (a projection over frozen embeddings; reranked) and the lexical controls.
DENSE = (Retriever.OTS, Retriever.SPECIALIST, Retriever.AGGREGATE)
CONTROLS = (Retriever.BM25, Retriever.FUSION, Retriever.BM25_SPECIALIST)


class Reranker(enum.StrEnum):
  """A reranker kind of :func:`toolscout.reranker.fit_reranker`."""
  LINEAR = "linear"
  MLP = "mlp"


class Detector(enum.StrEnum):
  """A source-level collapse detector (:mod:`toolscout.proxies`)."""
  TFIDF = "tfidf"
  TFIDF_TOOL = "tfidf_tool"
  SEMANTIC = "semantic"
  LENGTH_GAP = "length_gap"
  MULTISTEP_GAP = "multistep_gap"

  @property
  def label(self) -> str:
    return _DETECTOR_LABELS[self]


_DETECTOR_LABELS = {
    Detector.TFIDF: "TF-IDF query centroid", Detector.TFIDF_TOOL: "TF-IDF tool side (gold tools)",
    Detector.SEMANTIC: "Sentence-embedding centroid", Detector.LENGTH_GAP: "Query-length gap",
    Detector.MULTISTEP_GAP: "Multi-step-rate gap",
}


class Tau(enum.StrEnum):
  """Where a routing mode's threshold comes from."""
  LOSO = "loso"        # calibrated on the other sources' unsafe labels (leave one source out)
  DEFAULT = "default"  # ``toolscout fit``'s label-free τ (held-out reference windows)


@dataclasses.dataclass(frozen=True)
class Mode:
  """A routing mode on the mixed stream.

  Attributes:
    tau: where τ comes from.
    window: ``None`` = one decision per source (its test split as a batch); N = each
      request scored with the centroid of the last N requests (1 = per request).
  """
  tau: Tau
  window: int | None = None

  @property
  def key(self) -> str:
    return f"{self.tau}/" + ("batch" if self.window is None else f"window_{self.window}")

  @classmethod
  def from_key(cls, key: str) -> Mode:
    tau, _, scope = key.partition("/")
    return cls(Tau(tau), None if scope == "batch" else int(scope.removeprefix("window_")))

  @property
  def label(self) -> str:
    if self.window is None:
      return ("batch (one decision per source)" if self.tau == Tau.LOSO
              else "batch, default tau (no labels)")
    scope = "per request" if self.window == 1 else f"rolling window {self.window}"
    return scope if self.tau == Tau.LOSO else f"{scope}, default tau (no labels)"


BATCH_LOSO = Mode(Tau.LOSO)
BATCH_DEFAULT = Mode(Tau.DEFAULT)
