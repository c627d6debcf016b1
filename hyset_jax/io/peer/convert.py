"""The HYSET authors' checkpoint payload from a model directory, and a model directory from it.

The authors' ``HYSETModel.save`` writes, with ``torch.save``, a dict (``format_version`` 2)::

  scorer_state   the HYSETScorer state_dict, in registration order:
                   Z.weight          f32[N, d_z]   (nn.Embedding: one row per tool)
                   P.weight          f32[d_r, d_z] (nn.Linear(d_z, d_r, bias=False): P z = W z)
                   interactions.2 … interactions.<m_max>  f32[d_z, d_z] (nn.ParameterDict)
                 (no buffers, no temperatures: the scorer has these parameters only)
  func_names     list[str], row order of Z
  d_z, d_r, m_max  int
  encoder_type   "bert" (mean pooling) or "qwen" (last token)
  …              anything else ``save(extra=...)`` added: their training adds epoch,
                 validation_recall_at_5 and train_config (which holds k1 and k_pool)

Their scorer is ours term for term: ℓ(x, t) = rᵀ W z_t (our ``projection`` is W), F_align =
Σ softmax_E(ℓ)·ℓ, F_set = Σ_{a<b} z_aᵀ sym(M_|E|) z_b, the expansion by max_{i∈S0} z_tᵀ M_M z_i.
On load (``HYSETModel.load``) they call ``project_constraints_``: every row of Z is divided by
max(‖z‖, 1e-12) and every raw ``interactions.m`` replaced by (M + Mᵀ)/2. :func:`from_payload`
does the same, so that the imported model scores what theirs scores. Terms their scorer lacks
(the query tower, the conditioned set term, the seen-set prior, the lexical term) cannot be
carried: :func:`to_payload` refuses a model that has one, naming it.
"""
from __future__ import annotations

import collections
import os
import pathlib
import re
from typing import Any, NamedTuple, Sequence

import numpy as np

from hyset_jax.errors import UserError
from hyset_jax.model.scoring import HysetParams

FORMAT_VERSION = 2
CHECKPOINT_FILE = "best.pt"      # what `hyset export --format hyset-pytorch` writes in --out
ENCODER_TYPES = ("bert", "qwen")
DEFAULT_K1, DEFAULT_K_POOL = 15, 20  # the authors' defaults (their train and infer scripts)
NORMALIZE_EPS = 1e-12             # torch.nn.functional.normalize's default eps


class AuthorsModel(NamedTuple):
  """A checkpoint's content after the authors' load: θ as HysetParams (NumPy) and its fields."""
  params: HysetParams
  func_names: tuple[str, ...]
  max_set_size: int
  encoder_type: str
  k1: int | None          # from train_config, when the checkpoint has it
  k_pool: int | None


def encoder_type_of(query_encoder: str | None) -> str:
  """The authors' pooling name for our query encoder: "qwen" (last token) for a Qwen model,
  else "bert" (mean pooling, what every sentence-transformers encoder here uses)."""
  return "qwen" if query_encoder and "qwen" in query_encoder.lower() else "bert"


def to_payload(model, where: str | os.PathLike = "model") -> dict:
  """The authors' checkpoint payload for ``model`` (a ModelDir).

  Raises:
    UserError: naming ``where`` and the term, when the model has a term their scorer lacks or
      d_z ≠ d_r (their HYSETModel refuses that: "paper configurations require d_z=d_r").
  """
  from hyset_jax.model import terms
  params = model.params
  # The authors' scorer is the paper's θ alone: every registered term is one it lacks.
  for term in terms.carried(params):
    what = f"the {term.name} term ({term.schema['about'].split(':')[0]})"
    raise UserError(f"{where}: the model has {what}, which the authors' HYSETScorer does not "
                      f"have; a hyset-pytorch checkpoint cannot carry it (export a model of the "
                      f"paper's configuration, e.g. trained with --config paper)")
  z = np.asarray(params.tool_embeddings, np.float32)
  p = np.asarray(params.projection, np.float32)
  d_z, d_r = z.shape[1], p.shape[0]
  if d_z != d_r:
    raise UserError(f"{where}: d_z = {d_z} but d_r = {d_r}; the authors' HYSETModel loads only "
                    f"d_z = d_r (the paper's configuration)")
  state = collections.OrderedDict([("Z.weight", z), ("P.weight", p)])
  for m in range(2, model.max_set_size + 1):
    state[f"interactions.{m}"] = np.asarray(params.interactions[m - 2], np.float32)
  encoder_type = encoder_type_of(model.query_encoder)
  return {
      "format_version": FORMAT_VERSION,
      "scorer_state": state,
      "func_names": list(model.tool_ids),
      "d_z": int(d_z),
      "d_r": int(d_r),
      "m_max": int(model.max_set_size),
      "encoder_type": encoder_type,
      # Their training's train_config carries the shortlist sizes under these names; their
      # load ignores it, ours reads k1 and k_pool back from it.
      "train_config": {"encoder_type": encoder_type, "d_z": int(d_z), "m_max":
                       int(model.max_set_size), "k1": int(model.k1), "k_pool": int(model.k_pool)},
  }


def write_export(out: str | os.PathLike, model, *, force: bool = False,
                 where: str | os.PathLike = "model") -> pathlib.Path:
  """``out/best.pt``: the authors' checkpoint for ``model``, written atomically."""
  from hyset_jax.io_utils import atomic_dir
  from hyset_jax.io.peer import torch_format
  data = torch_format.checkpoint_bytes(to_payload(model, where), folder="best")
  with atomic_dir(out, force, marker=(CHECKPOINT_FILE,), what="hyset-pytorch export") as tmp:
    (tmp / CHECKPOINT_FILE).write_bytes(data)
  return pathlib.Path(out)


def _int(payload: dict, name: str, where: str, minimum: int) -> int:
  v = payload.get(name)
  if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
    raise UserError(f"{where}: field {name!r} must be an integer ≥ {minimum}, got {v!r}")
  return v


def _tensor(state: dict, name: str, shape: tuple[int, ...], why: str, where: str) -> np.ndarray:
  a = state[name]
  if not isinstance(a, np.ndarray) or not np.issubdtype(a.dtype, np.floating):
    raise UserError(f"{where}: scorer_state[{name!r}] must be a floating-point tensor, got "
                    f"{getattr(a, 'dtype', type(a).__name__)}")
  if a.shape != shape:
    raise UserError(f"{where}: scorer_state[{name!r}] must be {list(shape)} ({why}), got "
                    f"{list(a.shape)}")
  if not np.all(np.isfinite(a)):
    raise UserError(f"{where}: scorer_state[{name!r}] contains NaN or inf")
  return a.astype(np.float32)


def _train_config_size(payload: dict, name: str) -> int | None:
  config = payload.get("train_config")
  v = config.get(name) if isinstance(config, dict) else None
  return v if isinstance(v, int) and not isinstance(v, bool) else None


def from_payload(payload: Any, where: str | os.PathLike = "checkpoint") -> AuthorsModel:
  """θ from the authors' payload, after what their load does (Z rows renormalised, each
  interaction symmetrised). UserError naming the field at fault otherwise."""
  where = str(where)
  if not isinstance(payload, dict):
    raise UserError(f"{where}: the checkpoint holds a {type(payload).__name__}; expected the "
                    f"authors' payload (a dict with format_version 2)")
  if payload.get("format_version") != FORMAT_VERSION:
    raise UserError(f"{where}: field 'format_version' is {payload.get('format_version')!r}; "
                    f"this version reads the authors' format {FORMAT_VERSION}")
  names = payload.get("func_names")
  if not isinstance(names, list) or not names or not all(isinstance(t, str) for t in names):
    raise UserError(f"{where}: field 'func_names' must be a non-empty list of strings")
  if len(set(names)) != len(names):
    seen: set[str] = set()
    dup = next(t for t in names if t in seen or seen.add(t))
    raise UserError(f"{where}: field 'func_names' repeats {dup!r}; names must be distinct")
  d_z, d_r = _int(payload, "d_z", where, 1), _int(payload, "d_r", where, 1)
  m_max = _int(payload, "m_max", where, 2)
  encoder_type = payload.get("encoder_type")
  if encoder_type not in ENCODER_TYPES:
    raise UserError(f"{where}: field 'encoder_type' is {encoder_type!r}; expected one of "
                    f"{', '.join(ENCODER_TYPES)}")
  state = payload.get("scorer_state")
  if not isinstance(state, dict):
    raise UserError(f"{where}: field 'scorer_state' must be the scorer's state_dict")
  want = ["Z.weight", "P.weight"] + [f"interactions.{m}" for m in range(2, m_max + 1)]
  missing = [k for k in want if k not in state]
  extra = [str(k) for k in state if k not in want]
  if missing or extra:
    raise UserError(f"{where}: scorer_state must hold exactly {', '.join(want)} (m_max = "
                    f"{m_max}); " + "; ".join(
                        part for part in (missing and f"missing {', '.join(missing)}",
                                          extra and f"unexpected {', '.join(extra)}") if part))
  n = len(names)
  z = _tensor(state, "Z.weight", (n, d_z), "len(func_names), d_z", where)
  p = _tensor(state, "P.weight", (d_r, d_z), "d_r, d_z", where)
  ms = [_tensor(state, f"interactions.{m}", (d_z, d_z), "d_z, d_z", where)
        for m in range(2, m_max + 1)]
  # What HYSETScorer.project_constraints_ does on load, in float32 as there.
  norms = np.linalg.norm(z, axis=1, keepdims=True)
  z = (z / np.maximum(norms, np.float32(NORMALIZE_EPS))).astype(np.float32)
  sym = np.stack([np.float32(0.5) * (m + m.T) for m in ms]).astype(np.float32)
  return AuthorsModel(HysetParams(z, p, sym), tuple(names), m_max, encoder_type,
                      _train_config_size(payload, "k1"), _train_config_size(payload, "k_pool"))


# --------------------------------------------------------------------------- tool names

_RESERVED = frozenset({"from", "class", "return", "false", "true", "id", "and"})


def _standard(text: str) -> str:
  """ToolBench's identifier rule: non-word characters to "_", runs of "_" collapsed, lower
  case, outer "_" stripped, "get_" before a leading digit."""
  text = re.sub(r"_+", "_", re.sub(r"[^a-zA-Z0-9_]", "_", text)).lower().strip("_")
  return "get_" + text if text[:1].isdigit() else text


def toolbench_function_name(tool_id: str) -> str | None:
  """The function name ToolBench (and so the authors' func_names) gives ``tool::api``; None
  for an id of another form."""
  if tool_id.count("::") != 1:
    return None
  tool, api = tool_id.split("::")
  api = _standard(api)
  return f"{'is_' + api if api in _RESERVED else api}_for_{_standard(tool)}"


def _listed(items: Sequence[str], limit: int = 5) -> str:
  shown = ", ".join(repr(t) for t in items[:limit])
  return shown + (f" … ({len(items)} in all)" if len(items) > limit else "")


def match_tools(func_names: Sequence[str], library_ids: Sequence[str], where: str,
                spec: str) -> tuple[str, ...]:
  """The library's tool ids in the checkpoint's row order.

  A func_name matches a tool id equal to it, or else (a ToolBench library, ids ``tool::api``)
  the id whose ToolBench function name it is. Both sides must name the same tools.

  Raises:
    UserError: listing the func_names the library lacks and the tools the checkpoint lacks.
  """
  ids = list(library_ids)
  by_name = {t: t for t in ids}
  if not set(func_names) <= set(by_name):
    converted: dict[str, str] = {}
    for t in ids:
      name = toolbench_function_name(t)
      if name is not None:
        converted.setdefault(name, t)
    if sum(f in converted for f in func_names) > sum(f in by_name for f in func_names):
      by_name = converted
  missing = [f for f in func_names if f not in by_name]
  used = {by_name[f] for f in func_names if f in by_name}
  extra = [t for t in ids if t not in used]
  if missing or extra:
    parts = []
    if missing:
      parts.append(f"{len(missing)} of its func_names are not tools of {spec} ({_listed(missing)})")
    if extra:
      parts.append(f"{len(extra)} tools of {spec} are not among its func_names "
                   f"({_listed(extra)})")
    raise UserError(f"{where}: the checkpoint's func_names and the library's tool ids must "
                    f"name the same tools: " + "; ".join(parts))
  return tuple(by_name[f] for f in func_names)
