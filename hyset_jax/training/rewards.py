"""Reward providers ρ(x, Ê) ∈ [0, 1] for the self-training loss (paper Eq. 9, A.9).

- :class:`FileRewards` — cached rewards from an earlier agent run: JSONL lines
  ``{"query_id", "tools", "reward"}`` (e.g. DFSDT on StableToolBench).
- :class:`CommandRewards` — an external command that runs the agent: it receives
  ``{"query": text, "tools": [ids]}`` as JSON on stdin and prints one number in [0, 1].
- :class:`CoverageProxy` — no agent at all: ρ = |Ê ∩ E*| / |E*|, the fraction of the annotated
  tools the selected set covers. A *proxy* for execution success, not a measurement of it.

Rewards are refreshed on a schedule (paper: N_sub = 5,000 queries every T_ref = 20,000 steps);
see :func:`refresh`.
"""
from __future__ import annotations

import json
import math
import pathlib
import shlex
import subprocess
from collections.abc import Sequence
from typing import Protocol

from hyset_jax.errors import UserError


class RewardProvider(Protocol):
  def __call__(self, query_id: str, query: str, tools: Sequence[str],
               gold: Sequence[str]) -> float:
    ...


def _check_reward(value, where: str) -> float:
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
      or not 0.0 <= value <= 1.0:
    raise UserError(f"{where}: reward must be a number in [0, 1], got {value!r}")
  return float(value)


class CoverageProxy:
  """ρ = |Ê ∩ E*| / |E*| (a proxy; documented as such)."""

  def __call__(self, query_id, query, tools, gold):
    return len(set(tools) & set(gold)) / max(1, len(gold))


class FileRewards:
  """Rewards looked up by (query_id, set of tools); unknown pairs count as 0 and are tallied."""

  def __init__(self, path: str | pathlib.Path):
    path = pathlib.Path(path)
    if not path.is_file():
      raise UserError(f"rewards file {path} does not exist")
    self.table: dict[tuple[str, frozenset], float] = {}
    self.misses = 0
    try:
      lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
      raise UserError(f"{path}: not UTF-8 ({e.reason} at byte {e.start})") from None
    for n, line in enumerate(lines, 1):
      if not line.strip():
        continue
      where = f"{path}:{n}"
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise UserError(f"{where}: malformed JSON ({e.msg})") from None
      if not isinstance(row, dict) or not {"query_id", "tools", "reward"} <= row.keys():
        raise UserError(f"{where}: expected an object with query_id, tools, reward")
      if not isinstance(row["tools"], list) or not all(isinstance(t, str) for t in row["tools"]):
        raise UserError(f"{where}: 'tools' must be a list of tool ids")
      self.table[(str(row["query_id"]), frozenset(row["tools"]))] = _check_reward(
          row["reward"], where)

  def __call__(self, query_id, query, tools, gold):
    value = self.table.get((query_id, frozenset(tools)))
    if value is None:
      self.misses += 1
      return 0.0
    return value


class CommandRewards:
  """Runs ``command`` once per (query, set); its stdout must be one number in [0, 1]."""

  def __init__(self, command: str, timeout_s: float = 600.0):
    self.argv = shlex.split(command)
    if not self.argv:
      raise UserError("rewards.command is empty")
    self.timeout_s = timeout_s

  def __call__(self, query_id, query, tools, gold):
    payload = json.dumps({"query": query, "tools": list(tools)})
    where = f"reward command {' '.join(self.argv)!r} on query {query_id!r}"
    try:
      proc = subprocess.run(self.argv, input=payload, capture_output=True, text=True,
                            timeout=self.timeout_s)
    except FileNotFoundError:
      raise UserError(f"{where}: command not found") from None
    except subprocess.TimeoutExpired:
      raise UserError(f"{where}: no answer within {self.timeout_s:.0f} s") from None
    if proc.returncode != 0:
      raise UserError(f"{where}: exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    try:
      value = float(proc.stdout.strip())
    except ValueError:
      raise UserError(f"{where}: expected one number on stdout, got {proc.stdout.strip()[:200]!r}"
                      ) from None
    return _check_reward(value, where)


def make_provider(kind: str, path: str = "", command: str = "") -> RewardProvider | None:
  """The provider named by ``rewards.provider`` (None for ``none``)."""
  if kind == "none":
    return None
  if kind == "proxy":
    return CoverageProxy()
  if kind == "file":
    return FileRewards(path)
  if kind == "command":
    return CommandRewards(command)
  raise UserError(f"unknown reward provider {kind!r}; choose none, proxy, file or command")


def refresh(provider: RewardProvider, params, queries, tool_ids: Sequence[str], mc, tc,
            refresh_size: int, step: int) -> dict[int, tuple[tuple[int, ...], float]]:
  """Score ``refresh_size`` training queries' pools, take Ê = argmax (Eq. 7), ask ρ of it.

  Args:
    provider: the reward provider.
    params: the current θ (:class:`hyset_jax.model.scoring.HysetParams`).
    queries: the training split (:class:`hyset_jax.training.train_data.QuerySet`).
    tool_ids: the library's ids, in row order.
    mc, tc: the model and train configs.
    refresh_size: N_sub.
    step: the training step (seeds which queries and which pools).

  Returns:
    The reward cache: training-query row -> (Ê as tool rows, ρ).
  """
  import numpy as np
  from hyset_jax.model import scoring
  from hyset_jax.training import batches, negatives
  rng = np.random.default_rng((tc.seed, 0xBEEF, step))
  rows = rng.choice(len(queries.ids), size=min(refresh_size, len(queries.ids)), replace=False)
  gold = [queries.gold[r] for r in rows]
  cache = {}
  for start in range(0, len(rows), tc.eval_batch_size):
    chunk = list(range(start, min(start + tc.eval_batch_size, len(rows))))
    nb = np.zeros((len(gold), mc.max_set_size, tc.hard_neighbors), np.int32)
    nb[chunk] = batches.set_neighbors(params.tool_embeddings, [gold[j] for j in chunk],
                                      mc.max_set_size, tc.hard_neighbors)
    pools = negatives.sample_pools(gold, chunk, num_tools=len(tool_ids), k_neg=tc.k_neg,
                                   max_size=mc.max_set_size, mix=tc.negative_mix, neighbors=nb,
                                   seed=tc.seed ^ 0xBEEF, step=step)
    scores = np.asarray(scoring.set_scores(params, queries.embeddings[rows[chunk]],
                                           pools.members, pools.mask))
    for i, j in enumerate(chunk):
      best = int(np.argmax(scores[i]))
      e_hat = tuple(int(t) for t in pools.members[i, best][pools.mask[i, best]])
      r = int(rows[j])
      rho = provider(queries.ids[r], queries.texts[r], [tool_ids[t] for t in e_hat],
                     [tool_ids[t] for t in queries.gold[r]])
      cache[r] = (e_hat, float(rho))
  return cache
