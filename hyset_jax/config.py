"""Typed, validated training configuration with named presets and dotted overrides.

Presets live in the repository's ``configs/<name>.py``, installed as the package
``hyset_jax.configs`` (each defines ``get_config() -> Config``; derived presets import their base
and change what differs, as flax/examples' imagenet ``configs/tpu.py`` does); a path to such a
file works too. ``--set train.batch_size=64`` style overrides are parsed against the field types
(:func:`apply_overrides`, the one override parser of the project, also used by toolscout), so a
typo or a wrong type fails before any device work starts. The resolved config is written into
the workdir as ``config.json``.

Data roots are resolved once, here: :func:`shared_data` is ``$HYSET_DATA`` when set, else the
``shared/data`` folder beside the checkout (``../shared/data`` from the repository root).
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
import json
import math
import os
import pathlib
import pkgutil
import typing
from collections.abc import Sequence
from typing import Any, Literal

from hyset_jax.errors import UserError

PRESETS_PACKAGE = "hyset_jax.configs"
_CHECKOUT = pathlib.Path(__file__).resolve().parents[1]


def shared_data(*parts: str) -> str:
  """An absolute path under the shared data root (``$HYSET_DATA``, else ../shared/data beside
  the checkout, else ../shared/data from the working folder)."""
  root = os.environ.get("HYSET_DATA")
  if not root:
    beside = _CHECKOUT.parent / "shared" / "data"
    root = str(beside if beside.is_dir() else pathlib.Path("../shared/data").absolute())
  return str(pathlib.Path(root, *parts))


@dataclasses.dataclass
class DataConfig:
  spec: str = "bfcl"                  # a data spec (docs/contracts.md)
  train_split: str = "train"
  val_split: str = "validation"       # carved from train when the data set has none
  test_split: str = "test"
  validation_fraction: float = 0.1
  # > 0: also hold this many multi-tool gold sets (all their queries) out of train into a
  # second validation part, "validation_unseen" (sets no other split uses), and choose best/
  # and every fit after θ on the mean of both parts' metrics, so that selection sees new
  # combinations of known tools as well as seen ones. 0 = the paper's validation (by query).
  validation_sets: int = 0
  validation_sets_seed: int = 0       # the draw of those sets
  max_train_queries: int = 0          # 0 = all; > 0 keeps a deterministic prefix (tiny runs)
  max_eval_queries: int = 0


@dataclasses.dataclass
class ModelConfig:
  encoder: str = ""                   # sentence-transformers dir; "" = default MiniLM
  max_set_size: int = 5               # M
  k1: int = 15
  k_pool: int = 20
  # P starts as init_scale · I: the dense ranking, with logits cos/0.05 instead of cos, so the
  # softmaxes of F_align and of the loss are not flat at the start (see model.init_params).
  init_scale: float = 20.0
  # Train Z (the paper does). Off keeps the encoder's tool embeddings, for libraries whose test
  # queries mostly need tools never seen in training (BFCL): a trained Z only moves seen tools.
  train_tool_embeddings: bool = True
  # Ablations of paper §3.3: per-cardinality M_m (HYSET), one shared learned M,
  # fixed identity M, or no F_set at all (model.INTERACTIONS).
  interaction: Literal["per_cardinality", "shared", "identity", "none"] = "per_cardinality"
  # The query tower before P (scoring.query_tower): residual ReLU layers; 0 = the paper's
  # linear P exactly. tower_hidden 0 = d_r.
  tower_depth: int = 0
  tower_hidden: int = 0
  # A query-conditioned set term beside M_m (scoring.QueryInteraction): a rank-R interaction
  # and a per-size preference, both linear in q(r). Off = the paper's query-independent F_set.
  conditioned: bool = False
  conditioned_rank: int = 16
  # The row blend (terms/row_blend.py): after θ, Z blended toward the encoder's tool rows,
  # z' = normalize(α·z + (1 − α)·e), α chosen on validation from 0.75, 0.5 and 0.25 against
  # α = 1 (Z as trained), which wins ties; fitted before the terms below. For requests that need
  # new combinations of seen tools; needs a trained Z; off = the paper.
  row_blend: bool = False
  # The seen-set prior (set_prior.py): after θ, a softmax classifier over the training gold
  # sets on r, added to F for those sets with a weight λ (and floor τ) chosen on validation,
  # where λ = 0 (no prior) competes too. For sets that repeat training sets; off = the paper.
  set_prior: bool = False
  # The lexical term (lexical.py): after θ, ℓ' = ℓ + β · (the query's BM25 scores over the tool
  # texts, divided by its best), β chosen on validation where β = 0 (no term) competes. For
  # requests that name several intents in words a dense vector averages away; off = the paper.
  lexical: bool = False
  # Abstention (terms/abstain.py): after θ (and the terms above), a threshold τ on the best
  # set's score below which the empty set is delivered ("no tool needed"), chosen on the data
  # set's irrelevant_<val split> requests (BFCL's irrelevance categories): the most of them
  # abstained with at most 2 points of R@5 lost on the relevant validation queries. Off = the
  # paper (a set is always delivered).
  abstain: bool = False
  # The set term's weight (terms/set_weight.py): after θ, the prior and the lexical term, stage 2
  # scores F_align + γ·(F_set + F_cond) with γ chosen on validation from 0, 0.25, 0.5 and 2
  # against γ = 1 (the paper's model), which wins ties. For libraries whose test sets are new
  # combinations, where the trained pair terms can misjudge the set's size; off = the paper.
  set_weight: bool = False
  # The ranking recorded in the model directory: "auto" picks greedy, logit, set-first,
  # set-mean or set-max on the validation split after training (the delivered set is the same
  # for all).
  ranking: Literal["auto", "greedy", "logit", "set-first", "set-mean", "set-max"] = "auto"


@dataclasses.dataclass
class RewardConfig:
  provider: Literal["none", "proxy", "file", "command"] = "none"
  path: str = ""                      # rewards JSONL for provider=file
  command: str = ""                   # shell command for provider=command
  refresh_every: int = 20000          # T_ref steps (paper)
  refresh_size: int = 5000            # N_sub queries per refresh (paper)


@dataclasses.dataclass
class TrainConfig:
  seed: int = 0
  batch_size: int = 256               # global; must divide evenly over devices and processes
  num_steps: int = 2000
  learning_rate: float = 3e-3
  warmup_steps: int = 100
  k_neg: int = 64                     # |C_i|, the gold set included
  negative_mix: tuple[float, float, float] = (0.5, 0.3, 0.2)  # uniform, in-batch, hard
  hard_neighbors: int = 8             # nearest neighbours considered per gold tool
  # Share of negatives drawn as subsets of the query's current shortlist S ∪ E* (not in the
  # paper; negatives.sample_pools). The paper's mix splits the rest.
  shortlist_negatives: float = 0.0
  eta: float = 0.0                    # η, weight of L_self (0 disables it)
  # μ, weight of an auxiliary per-tool loss on ℓ (losses.tool_loss); 0 = the paper's Eq. 10.
  tool_loss_weight: float = 0.0
  # Whether the set losses (Eq. 8, L_self, the exhaustive loss) move Z. False: Z is trained by
  # the per-tool loss alone (needs μ > 0) and the set terms read it as it is — not in the paper;
  # for tool sets unseen in training, where set losses pull seen sets' tools together.
  set_losses_train_z: bool = True
  # ν, weight of the exhaustive-shortlist loss (losses.exhaustive_loss): −log softmax of E* over
  # every subset of the query's current shortlist — the competition of the Eq. 14 argmax.
  # Not in the paper; 0 = off.
  exhaustive_loss_weight: float = 0.0
  # σ of Gaussian noise added to each training query embedding (each row rescaled to its own
  # norm), drawn per step from the seed (batches.noisy_queries): a regulariser for query
  # vectors the encoder was tuned on (their training rows are more separable than unseen
  # queries'). Not in the paper; 0 = off.
  query_noise: float = 0.0
  interaction_l2: float = 1e-4        # λ
  # A model directory to start θ from instead of the dense start (continued training, k-shot
  # adaptation; hyset_jax.training.warm_start): carried onto the data set's tools, a fresh
  # optimiser. "" = the dense start. A checkpoint in the workdir still wins (resume).
  init_model: str = ""
  log_every: int = 50
  eval_every: int = 250
  checkpoint_every: int = 250
  patience: int = 4                   # evaluations without a better val Recall@5
  # Which evaluated θ becomes best/ (and gets the post-θ fits): "best" = the best validation
  # Recall@5; "last" = the last step, no early stop — a fixed schedule, for an adaptation whose
  # validation holds none of what it adapts to (k-shot: best/ would keep the starting model).
  keep: str = "best"
  eval_batch_size: int = 256


@dataclasses.dataclass
class MeshConfig:
  """The device mesh (``data``, ``tools``): batch rows split on ``data``; Z, its optimiser state
  and the per-tool products split on ``tools`` (hyset_jax.training.sharding, docs/sharding.md).

  -1 = the rest of the devices (at most one axis). tools = 1 is plain data parallelism.
  """
  data: int = -1
  tools: int = 1
  # Per-device memory budget in GiB for ``hyset train --dry-run`` (0 = no check).
  memory_per_device_gb: float = 0.0


@dataclasses.dataclass
class Config:
  name: str = "custom"
  data: DataConfig = dataclasses.field(default_factory=DataConfig)
  model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
  train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
  rewards: RewardConfig = dataclasses.field(default_factory=RewardConfig)
  mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=1, sort_keys=True)


def validate(config: Config) -> Config:
  """Cross-field checks, before any data is read or any device is touched."""
  m, t = config.model, config.train
  from hyset_jax.inference.subsets import validate_sizes
  validate_sizes(m.k_pool, m.max_set_size, k1=m.k1)
  if m.conditioned_rank < 0:
    raise UserError(f"model.conditioned_rank must be ≥ 0, got {m.conditioned_rank}")
  from hyset_jax.io.model_format import SCHEMA  # no JAX: the schema's declaration of the term
  if m.set_prior and m.ranking in SCHEMA["terms"]["prior"].get("rankings_excluded", ()):
    raise UserError(f"model.set_prior=true rules out model.ranking={m.ranking} (its marginal "
                    f"gains are under F alone); use auto or another ranking")
  if m.tower_depth < 0 or m.tower_hidden < 0:
    raise UserError(f"model.tower_depth and model.tower_hidden must be ≥ 0, got "
                    f"{m.tower_depth} and {m.tower_hidden}")
  mix = t.negative_mix
  if len(mix) != 3 or any(x < 0 for x in mix) or abs(sum(mix) - 1) > 1e-6:
    raise UserError(f"train.negative_mix must be three non-negative fractions summing to 1 "
                    f"(uniform, in-batch, hard), got {mix}")
  if not 0 <= t.shortlist_negatives < 1:
    raise UserError(f"train.shortlist_negatives must be in [0, 1), got {t.shortlist_negatives}")
  if t.k_neg < 2:
    raise UserError(f"train.k_neg must be ≥ 2 (the gold set plus at least one negative), "
                    f"got {t.k_neg}")
  for name in ("batch_size", "num_steps", "log_every", "eval_every", "checkpoint_every",
               "eval_batch_size", "hard_neighbors"):
    if getattr(t, name) < 1:
      raise UserError(f"train.{name} must be ≥ 1, got {getattr(t, name)}")
  if m.row_blend and not m.train_tool_embeddings:
    raise UserError("model.row_blend=true needs model.train_tool_embeddings=true (with Z fixed "
                    "at the encoder's rows there is nothing to blend)")
  if t.keep not in ("best", "last"):
    raise UserError(f"train.keep must be best or last, got {t.keep!r}")
  if t.learning_rate <= 0:
    raise UserError(f"train.learning_rate must be > 0, got {t.learning_rate}")
  if not t.set_losses_train_z and not t.tool_loss_weight:
    raise UserError("train.set_losses_train_z=false needs train.tool_loss_weight > 0 "
                    "(the per-tool loss is then the only one that trains Z)")
  if min(t.eta, t.interaction_l2, t.tool_loss_weight, t.exhaustive_loss_weight,
         t.query_noise) < 0:
    raise UserError("train.eta, train.interaction_l2, train.tool_loss_weight, "
                    "train.exhaustive_loss_weight and train.query_noise must be ≥ 0")
  if config.data.validation_sets < 0:
    raise UserError(f"data.validation_sets must be ≥ 0, got {config.data.validation_sets}")
  if not 0 < config.data.validation_fraction < 1:
    raise UserError(f"data.validation_fraction must be in (0, 1), got "
                    f"{config.data.validation_fraction}")
  r = config.rewards
  if t.eta > 0 and r.provider == "none":
    raise UserError("train.eta > 0 needs a reward provider: set rewards.provider to proxy, "
                    "file or command")
  if r.provider == "file" and not r.path:
    raise UserError("rewards.provider=file needs rewards.path (a JSONL of query_id, tools, reward)")
  if r.provider == "command" and not r.command:
    raise UserError("rewards.provider=command needs rewards.command")
  if r.refresh_every < 1 or r.refresh_size < 1:
    raise UserError("rewards.refresh_every and rewards.refresh_size must be ≥ 1")
  mesh = config.mesh
  if any(v == 0 or v < -1 for v in (mesh.data, mesh.tools)) or mesh.data == mesh.tools == -1:
    raise UserError(f"mesh.data and mesh.tools must be ≥ 1 or -1 (the rest of the devices, for "
                    f"at most one of them), got {mesh.data} and {mesh.tools}")
  if mesh.memory_per_device_gb < 0:
    raise UserError(f"mesh.memory_per_device_gb must be ≥ 0 (0 = no check), got "
                    f"{mesh.memory_per_device_gb}")
  return config


def presets() -> list[str]:
  package = importlib.import_module(PRESETS_PACKAGE)
  return sorted(m.name for m in pkgutil.iter_modules(package.__path__)
                if not m.name.startswith("_"))


def _module(name: str):
  """The preset module ``name`` (in hyset_jax.configs) or the .py file at path ``name``."""
  path = pathlib.Path(name)
  if path.suffix != ".py":
    if name not in presets():
      close = difflib.get_close_matches(name, presets(), n=1)
      hint = f"; did you mean {close[0]!r}?" if close else ""
      raise UserError(f"unknown config {name!r}: presets are {', '.join(presets())}{hint} "
                      f"(or give the path of a .py file defining get_config())")
    return importlib.import_module(f"{PRESETS_PACKAGE}.{name}")
  if not path.is_file():
    raise UserError(f"config file {path} does not exist")
  spec = importlib.util.spec_from_file_location(f"hyset_config_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
  except SyntaxError as e:
    raise UserError(f"{path}:{e.lineno}: syntax error in config file: {e.msg}") from None
  except Exception as e:  # noqa: BLE001 - a user's file may raise anything; name it
    raise UserError(f"{path}: loading the config file failed: {type(e).__name__}: {e}") from None
  return module


def load_preset(name: str) -> Config:
  """A preset name (hyset_jax.configs) or a path to a .py file → its ``get_config()``."""
  module = _module(name)
  where = getattr(module, "__file__", name)
  if not callable(getattr(module, "get_config", None)):
    raise UserError(f"{where}: defines no get_config() function")
  try:
    config = module.get_config()
  except Exception as e:  # noqa: BLE001
    raise UserError(f"{where}: get_config() failed: {type(e).__name__}: {e}") from None
  if not isinstance(config, Config):
    raise UserError(f"{where}: get_config() must return hyset_jax.config.Config, got "
                    f"{type(config).__name__}")
  return config


def _parse_value(text: str, kind: Any, key: str) -> Any:
  """``text`` parsed as ``kind`` (a field's type hint): bool accepts true/false/1/0 (any case),
  floats must be finite, tuples accept ``a,b,c`` (brackets optional), ``tuple[int, ...]`` any
  length."""
  origin = typing.get_origin(kind)
  if origin is Literal:
    choices = typing.get_args(kind)
    if text not in choices:
      raise UserError(f"--set {key}: {text!r} is not one of {', '.join(choices)}")
    return text
  if origin is tuple:
    parts = [p.strip() for p in text.strip("()[] ").split(",") if p.strip()]
    args = typing.get_args(kind)
    if len(args) == 2 and args[1] is Ellipsis:
      args = (args[0],) * len(parts)
    elif len(parts) != len(args):
      raise UserError(f"--set {key}: expected {len(args)} comma-separated values, got {text!r}")
    return tuple(_parse_value(p, a, key) for a, p in zip(args, parts))
  try:
    if kind is bool:
      if text.lower() not in ("true", "false", "1", "0"):
        raise ValueError
      return text.lower() in ("true", "1")
    if kind is int:
      return int(text)
    if kind is float:
      value = float(text)
      if not math.isfinite(value):  # nan passes every `x < 0` check and would train silently
        raise ValueError
      return value
  except ValueError:
    raise UserError(f"--set {key}: expected {kind.__name__}, got {text!r}") from None
  return text


def _override(node: Any, parts: list[str], text: str, key: str) -> Any:
  """``node`` (a dataclass, frozen or not) with the field at ``parts`` set from ``text``."""
  fields = {f.name for f in dataclasses.fields(node)}
  part = parts[0]
  if part not in fields:
    close = difflib.get_close_matches(part, fields, n=1)
    prefix = key.split(".")[:key.count(".") - len(parts) + 1]
    hint = f"; did you mean {'.'.join(prefix + [close[0]])!r}?" if close else ""
    raise UserError(f"--set: unknown config key {key!r}{hint}")
  hint = typing.get_type_hints(type(node))[part]
  if len(parts) == 1:
    if dataclasses.is_dataclass(hint):
      raise UserError(f"--set: {key!r} is a section; set one of its fields")
    value = _parse_value(text, hint, key)
  else:
    child = getattr(node, part)
    if not dataclasses.is_dataclass(child):
      raise UserError(f"--set: {key.rsplit('.', len(parts) - 1)[0]!r} is not a section")
    value = _override(child, parts[1:], text, key)
  return dataclasses.replace(node, **{part: value})


def apply_overrides(config: Any, overrides: Sequence[str]) -> Any:
  """``config`` (any config dataclass: hyset's ``Config``, toolscout's ``ExperimentConfig``) with
  ``section.field=value`` strings applied. Returns a new object; unknown keys and wrong types are
  UserErrors. The one override parser of the project.

  >>> apply_overrides(Config(), ["train.batch_size=64", "model.train_tool_embeddings=0"]).train.batch_size
  64
  """
  for item in overrides:
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
      raise UserError(f"--set expects key=value, got {item!r}")
    config = _override(config, key.strip().split("."), text.strip(), key.strip())
  return config


def from_dict(data: dict[str, Any]) -> Config:
  """Inverse of :meth:`Config.to_dict` (for a workdir's config.json)."""
  def build(cls, values):
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
      if f.name in values:
        v = values[f.name]
        if dataclasses.is_dataclass(hints[f.name]):
          v = build(hints[f.name], v)
        elif typing.get_origin(hints[f.name]) is tuple:
          v = tuple(v)
        kwargs[f.name] = v
    return cls(**kwargs)
  return build(Config, data)


def resolve(name: str, overrides: list[str] | None = None) -> Config:
  """Preset + overrides, validated."""
  return validate(apply_overrides(load_preset(name), overrides or []))

