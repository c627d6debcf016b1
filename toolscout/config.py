"""Experiment configuration: one typed dataclass, named presets, ``KEY=VALUE`` overrides.

Presets:

- ``full``: the measured run (all BFCL categories with answers + ToolLens natural
  and API-template styles over the union of their tools; at most 2,000 train and
  500 test queries per source; frozen all-MiniLM-L6-v2; skill-card check on).
- ``tiny``: the same pipeline on a few small sources with a feature-hashing
  stand-in for the encoder, so it runs in seconds in tests. Its numbers are a
  smoke test, not results.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from hyset_jax import config as config_lib
from hyset_jax.errors import UserError
from toolscout.adapter import AdapterConfig


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
  """Everything :func:`toolscout.experiment.run` reads.

  Attributes:
    name: preset name (recorded in the report).
    toollens_spec: ``beir:PATH`` of ToolLens (relative paths are from the working folder);
      default: ``toollens`` under the shared data root (:func:`hyset_jax.config.shared_data`).
    bfcl_spec: ``bfcl`` (the installed bfcl-eval data) or ``bfcl:PATH``.
    bfcl_categories: BFCL categories to use; empty = all with answers.
    reference_source: the specialist's training source.
    max_train, max_test: per-source query caps.
    encoder: ``"minilm"`` (the frozen sentence encoder) or ``"hashing"`` (tests).
    encoder_dir: a sentence-transformers directory; empty = the installed default.
    depth: candidate depth for coverage.
    coverage_floor: unsafe = specialist coverage below this (paper: 0.30).
    epochs, batch_size, learning_rate, scale, hard_negatives: adapter training. The
      full preset's 4 epochs at 3e-3 were chosen by matched-source validation
      coverage only (15% of ToolLens training queries held out; lr {1e-3, 3e-3} ×
      epochs {1, 2, 4, 8, 16}: 94.1-97.1%, best 97.1% at 3e-3 × 4), never by
      coverage on other sources.
    repair_shots: matched examples for few-shot continuation.
    repair_epochs: continuation epochs (one step each when shots ≤ batch size).
    repair_max_sources: repair at most this many collapsed sources (lowest coverage first).
    reranker_train_queries: covered training pools used to fit each reranker.
    mlp_hidden, mlp_max_iter: the MLP reranker.
    floor_sweep: coverage floors for the sensitivity table (unsafe sets, LOSO
      detector accuracy and routed coverage at each floor).
    windows: window sizes for window routing and the window accuracy table.
    classifier_min_count: sources with fewer queries are left out of the source classifier.
    latency_requests: single requests timed for the per-request latency.
    skill_cards: run the skill-card rendering check.
    seed: every random choice.
  """
  name: str = "full"
  toollens_spec: str = dataclasses.field(
      default_factory=lambda: "beir:" + config_lib.shared_data("toollens"))
  bfcl_spec: str = "bfcl"
  bfcl_categories: tuple[str, ...] = ()
  reference_source: str = "toollens"
  max_train: int = 2000
  max_test: int = 500
  encoder: str = "minilm"
  encoder_dir: str = ""
  depth: int = 20
  coverage_floor: float = 0.30
  floor_sweep: tuple[float, ...] = (0.3, 0.5, 0.7, 0.9)
  epochs: int = 4
  batch_size: int = 64
  learning_rate: float = 3e-3
  scale: float = 20.0
  hard_negatives: int = 1
  repair_shots: tuple[int, ...] = (5, 10, 20, 50)
  repair_epochs: int = 30
  repair_max_sources: int = 5
  reranker_train_queries: int = 3000
  mlp_hidden: tuple[int, ...] = (64, 32)
  mlp_max_iter: int = 200
  windows: tuple[int, ...] = (1, 10, 20, 50, 100)
  classifier_min_count: int = 50
  latency_requests: int = 500
  skill_cards: bool = True
  seed: int = 0

  def adapter(self, **changes: Any) -> AdapterConfig:
    base = AdapterConfig(epochs=self.epochs, batch_size=self.batch_size,
                         learning_rate=self.learning_rate, scale=self.scale,
                         hard_negatives=self.hard_negatives, mine_depth=self.depth,
                         seed=self.seed)
    return dataclasses.replace(base, **changes)

  def validate(self) -> None:
    if self.encoder not in ("minilm", "hashing"):
      raise UserError(f"encoder must be minilm or hashing, got {self.encoder!r}")
    for field in ("max_train", "max_test", "depth", "epochs", "batch_size", "hard_negatives",
                  "repair_epochs", "reranker_train_queries", "latency_requests"):
      if getattr(self, field) < 1:
        raise UserError(f"{field} must be >= 1, got {getattr(self, field)}")
    if not 0 < self.coverage_floor < 1:
      raise UserError(f"coverage_floor must be in (0, 1), got {self.coverage_floor}")
    if not self.windows or min(self.windows) < 1 or not self.repair_shots or min(self.repair_shots) < 1:
      raise UserError("windows and repair_shots must be non-empty lists of positive integers")


def full() -> ExperimentConfig:
  """The measured run (the defaults)."""
  return ExperimentConfig()


def tiny() -> ExperimentConfig:
  """:func:`full` on three small BFCL categories and capped ToolLens with the hashing encoder."""
  return dataclasses.replace(
      full(), name="tiny", bfcl_categories=("simple_python", "simple_java", "live_simple"),
      max_train=60, max_test=30, encoder="hashing", epochs=2, batch_size=16,
      repair_shots=(5, 10), repair_epochs=5, repair_max_sources=2,
      reranker_train_queries=100, mlp_hidden=(16,), mlp_max_iter=50, windows=(1, 10),
      classifier_min_count=20, latency_requests=50)


# Built when asked for, so the data root (HYSET_DATA) is read then, not at import.
PRESETS: dict[str, Callable[[], ExperimentConfig]] = {"full": full, "tiny": tiny}


def get_config(name: str) -> ExperimentConfig:
  if name not in PRESETS:
    raise UserError(f"unknown config {name!r}; choose from {', '.join(sorted(PRESETS))}")
  return PRESETS[name]()


def apply_overrides(config: ExperimentConfig, overrides: Sequence[str]) -> ExperimentConfig:
  """``config`` with ``KEY=VALUE`` overrides applied (hyset's parser, the one of the project) and
  validated.

  >>> apply_overrides(get_config("tiny"), ["seed=3", "windows=1,5"]).windows
  (1, 5)
  """
  config = config_lib.apply_overrides(config, overrides)
  config.validate()
  return config
