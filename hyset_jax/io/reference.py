"""A dependency-free NumPy reference of ``hyset predict`` (NumPy and the standard library only).

It reproduces the two-stage path of :func:`hyset_jax.inference.pipeline.predict` (paper Eq. 12-14;
the contracts are in docs/contracts.md) from exported files alone, so other stacks can check
their port against it, or simply use it. This file imports neither JAX nor the rest of
``hyset_jax`` nor ``safetensors``: copy it anywhere together with ``model_format.py`` (the one
reader of the model format) and ``model_schema.json`` (the tensors of the format) and run::

    python reference.py --model DIR --query-embeddings queries.npy --out predictions.jsonl [--force]
        [--allow FILE] [--deny FILE]

DIR is a model directory of any version (``params.safetensors`` is parsed by hand: an
8-byte little-endian header length, a JSON header, raw little-endian tensors), an ``npz`` export
(``model.npz`` or its directory) or a ``hyset train`` workdir (its ``best/``). The output has
the lines ``hyset predict --query-embeddings`` writes: ``query_id`` (the row), ``set``,
``set_score``, ``ranking``, ``shortlist``.

It checks what ``hyset predict`` checks (shapes, ``len(tool_ids) = N`` and distinct ids,
finite values, symmetric interaction matrices, unit rows of Z, manifest field types, the sizes
1 ≤ K1 < K_pool ≤ N and 2 ≤ M ≤ K_pool, finite query embeddings of the right width) with the
same tolerances, and the output rules of the ``hyset`` commands: an existing ``--out`` is replaced only
with ``--force``, never one of its inputs, never into a missing folder. Errors print
``error: …`` and exit 2.

The rules, float32 throughout as in JAX:

- Query tower (term ``tower``, depth L ≥ 1): q(r) = h_L with h_0 = r and
  h_{l+1} = h_l + relu(h_l W_l + b_l) U_l + c_l; without one q(r) = r.
- Stage 1: ℓ = (q(r) P) Zᵀ; S0 = the K1 largest ℓ, ties to the lower row.
- Lexical term (``lexical``, tensor ``lexical_weight`` β): ℓ' = ℓ + β · b replaces ℓ everywhere,
  b f32[Q, N] given with ``--lexical-scores`` (the query's BM25 scores over the tool texts
  divided by its largest, as ``lexical.json`` describes; this file does not tokenise text).
- Expansion: g(t) = max_{i∈S0} z_tᵀ M_M z_i for t ∉ S0; the K_pool − K1 tools first by
  descending g, then descending ℓ, then ascending row; shortlist = S0 (by ℓ) then these (by g).
- Stage 2: every subset of the shortlist of size 1..M, sizes ascending and colex order within a
  size; F = Σ_{a<b} G_m[a, b] + softmax-weighted mean of ℓ with G_m = Z_S M_m Z_Sᵀ (plus, for a
  model with the ``conditioned`` term, the query-conditioned term of
  :func:`conditioned_pairs`); the first
  maximum in that order wins (so the smallest set on an exact tie). The set's tools are listed in
  ascending shortlist position.
- Row blend (``row_blend``: ``row_blend_trained``, ``row_blend_alpha``): nothing to do here;
  ``tool_embeddings`` already holds the blended rows, and the trained ones are kept only so that
  training can choose again.
- Set weight (``set_weight``, tensor ``set_weight`` γ): every G_m above (the conditioned term
  included) is multiplied by γ before stage 2 and the rankings read it: F = F_align + γ·F_set;
  the expansion keeps M_M as it is.
- Seen-set prior (``prior``, ``prior_*`` tensors): F' = F + λ · max(0, log p(s | r) − log τ) for
  each subset that is one of the prior's sets s (p = softmax(r wᵀ + b) over them, r the query
  embedding itself), F' = F for the others; the best set is the first maximum of F' in the
  order above (``hyset predict`` keeps the argmax of F unless a prior set is strictly above it:
  the two differ only on exact ties). ``set-mean`` and ``set-max`` use F'; ``greedy`` is refused.
- Abstention (``abstain``: ``abstain_w`` w, ``abstain_b`` b, ``abstain_threshold`` τ): the set
  is empty where r · w + b ≥ τ, r the query embedding ("no tool needed"); ``set_score`` and the
  ranking are reported as without it.
- Ranking (``--ranking``, default the manifest's ``ranking``, else ``greedy``): ``greedy`` is M
  greedy picks (A_k = A_{k−1} ∪ argmax_t F(A_{k−1} ∪ {t}), ties to the earlier shortlist
  position), then the rest of the shortlist by descending ℓ (ties: earlier position); ``logit``
  is the shortlist order itself; ``set-first`` is the best set, then the rest, each by
  descending ℓ (ties: earlier position); ``set-mean`` is the shortlist by the mean F of the
  subsets above that contain each tool, descending (ties: higher ℓ, then earlier position);
  ``set-max`` the same by the largest F of those subsets — except, with a seen-set prior, for
  a query whose shortlist holds an allowed tool that none of the prior's sets contains: that
  query is ranked ``set-first``.
- Filters (``--allow FILE`` / ``--deny FILE``: one tool id a line, ``prefix*`` for every id
  that starts with ``prefix``, blank lines and ``#`` comments skipped; an id the model lacks is
  an error; a tool is allowed when it matches the allow list (every tool without one) and not
  the deny list): stage 1 takes the K1 largest ℓ among the allowed tools; the expansion takes
  allowed tools by the rules above, then, when fewer than K_pool are allowed, disallowed ones
  by ascending row. Stage 2 and every ranking consider only the subsets whose members are all
  allowed (``set-mean`` averages over those; ``greedy`` picks only allowed tools); the
  disallowed tools are left out of ``ranking`` and ``shortlist`` (-1 in :func:`stage2`'s
  rows). Every query must keep at least one allowed tool.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import pathlib
import stat
import sys
import tempfile

import numpy as np

try:  # in the package, or copied beside model_format.py (and model_schema.json)
  from hyset_jax.io.model_format import (FORMAT, FORMATS, NORM_ATOL, RANKINGS,  # noqa: F401
                                      SYMMETRY_RTOL, Model, ModelError, allowed_rankings,
                                      check_sizes, load_model, read_safetensors)
except ImportError:
  from model_format import (FORMAT, FORMATS, NORM_ATOL, RANKINGS, SYMMETRY_RTOL,  # noqa: F401
                            Model, ModelError, allowed_rankings, check_sizes, load_model,
                            read_safetensors)


def query_tower(model: Model, queries: np.ndarray) -> np.ndarray:
  """q(r) = h_L, h_0 = r, h_{l+1} = h_l + relu(h_l W_l + b_l) U_l + c_l: f32[Q, d_r]."""
  h = queries.astype(np.float32)
  if model.tower is None:
    return h
  w_in, b_in, w_out, b_out = model.tower
  for layer in range(w_in.shape[0]):
    h = h + np.maximum(h @ w_in[layer] + b_in[layer], 0) @ w_out[layer] + b_out[layer]
  return h


def load_queries(path: str | pathlib.Path, dim: int) -> np.ndarray:
  """A float [Q, dim] .npy of finite values, as float32 (``hyset predict`` reads its
  ``--query-embeddings`` with this too: one rule for both)."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise ModelError(f"query embeddings file {path} does not exist")
  try:
    x = np.load(path, allow_pickle=False)
  except (ValueError, OSError, EOFError) as e:
    raise ModelError(f"{path}: not a readable .npy array ({e})") from None
  if not isinstance(x, np.ndarray):  # np.load gives an archive for a .npz: close it, refuse
    x.close()
    raise ModelError(f"{path}: an .npz archive, not an .npy array; expected a float array "
                     f"[Q, {dim}] saved with np.save")
  if x.ndim != 2 or not np.issubdtype(x.dtype, np.floating):
    raise ModelError(f"{path}: expected a float array [Q, {dim}], got {x.dtype} {x.shape}")
  if x.shape[1] != dim:
    raise ModelError(f"{path}: query embeddings have dimension {x.shape[1]}, the model's "
                     f"projection expects d_r = {dim}")
  if x.shape[0] == 0:
    raise ModelError(f"{path}: no query embeddings (0 rows)")
  bad = np.flatnonzero(~np.all(np.isfinite(x), axis=1))
  if bad.size:
    raise ModelError(f"{path}: row {int(bad[0])} contains NaN or inf ({bad.size} bad rows)")
  return x.astype(np.float32)


# --------------------------------------------------------------------------- the maths

def colex_subsets(k_pool: int, size: int) -> np.ndarray:
  """int[C(K, size), size]: the size-subsets of range(K), colex order, members ascending."""
  level = [(c,) for c in range(k_pool)]
  for k in range(2, size + 1):
    level = [p + (c,) for c in range(k - 1, k_pool) for p in level[:math.comb(c, k - 1)]]
  return np.asarray(level, np.int64).reshape(-1, size)


def align_scores(logits: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
  """F_align: Σ softmax(ℓ)·ℓ over the last axis (members where ``mask``), max-shifted."""
  if mask is None:
    mask = np.ones(logits.shape, bool)
  shifted_max = np.max(np.where(mask, logits, np.finfo(logits.dtype).min), -1, keepdims=True)
  w = np.where(mask, np.exp(np.where(mask, logits - shifted_max, 0)), 0).astype(logits.dtype)
  return np.sum(w * np.where(mask, logits, 0), -1) / np.sum(w, -1)


def _order(*keys: np.ndarray) -> np.ndarray:
  """Row-wise argsort by several keys, the first key most significant, each ascending."""
  return np.lexsort(tuple(reversed(keys)), axis=-1)


def shortlist(model: Model, queries: np.ndarray, k1: int, k_pool: int, max_size: int,
              lexical: np.ndarray | None = None, allowed: np.ndarray | None = None):
  """Stage 1 and expansion: (tools int[Q, K_pool], their ℓ f32[Q, K_pool]); ℓ' with the
  lexical term (``lexical``: b f32[Q, N], required for a model with the lexical term);
  ``allowed`` bool[Q, N]: the filter (None: every tool), -inf ℓ at disallowed slots."""
  z, p = model.tool_embeddings, model.projection
  logits = (query_tower(model, queries) @ p) @ z.T                     # [Q, N]
  if model.lexical_weight is not None:
    if lexical is None:
      raise ModelError("this model has a lexical term: pass its lexical scores "
                       "(--lexical-scores)")
    logits = logits + np.float32(model.lexical_weight) * np.asarray(lexical, np.float32)
  q, n = logits.shape
  ok = np.ones((q, n), bool) if allowed is None else np.asarray(allowed, bool)
  logits = np.where(ok, logits, -np.inf).astype(np.float32)
  rows = np.broadcast_to(np.arange(n), (q, n))
  s0 = _order(~ok, -np.where(ok, logits, 0), rows)[:, :k1]             # [Q, K1]
  keyed = z[s0] @ model.interactions[max_size - 2]                     # [Q, K1, d]
  g = np.max(np.einsum("nd,qkd->qnk", z, keyed), axis=-1)              # [Q, N]
  # Allowed tools outside S0 first, then disallowed ones by row; S0 never again.
  group = np.where(ok, 0, 1)
  np.put_along_axis(group, s0, 2, axis=1)
  extra = _order(group, -np.where(ok, g, 0), -np.where(ok, logits, 0), rows)[:, :k_pool - k1]
  tools = np.concatenate([s0, extra], axis=1)
  return tools, np.take_along_axis(logits, tools, axis=1)


def pair_matrices(member_emb: np.ndarray, interactions: np.ndarray) -> np.ndarray:
  """G_m = Z_S M_m Z_Sᵀ: f32[Q, M - 1, K, K]."""
  keyed = np.einsum("qid,mde->qmie", member_emb, interactions)
  return np.einsum("qmie,qje->qmij", keyed, member_emb)


def best_sets(logits: np.ndarray, pairs: np.ndarray, max_size: int):
  """Exhaustive stage 2: (positions list per query, best score f32[Q])."""
  scores, members = subset_scores(logits, pairs, max_size)
  best = np.argmax(scores, axis=1)                                     # first maximum
  return [members[i] for i in best], scores[np.arange(len(scores)), best]


def subset_scores(logits: np.ndarray, pairs: np.ndarray, max_size: int):
  """F of every subset of the shortlist: (f32[Q, n] in table order, the n position lists)."""
  q, k = logits.shape
  scores, members = [], []
  for m in range(1, max_size + 1):
    idx = colex_subsets(k, m)                                          # [n_m, m]
    f = align_scores(logits[:, idx])                                   # [Q, n_m]
    if m >= 2:
      a, b = np.triu_indices(m, 1)
      flat = idx[:, a] * k + idx[:, b]
      f = f + np.sum(pairs[:, m - 2].reshape(q, k * k)[:, flat], axis=-1)
    scores.append(f)
    members.extend(idx.tolist())
  return np.concatenate(scores, axis=1), members


def set_mean(logits: np.ndarray, pairs: np.ndarray, max_size: int) -> np.ndarray:
  """f32[Q, K]: the mean F of the shortlist subsets that contain each shortlist position."""
  scores, members = subset_scores(logits, pairs, max_size)
  return _mean_per_tool(scores, members, logits.shape[1])


def _incidence(members: list, k: int) -> np.ndarray:
  """bool[n, K]: whether subset i (table order) contains shortlist position t."""
  incidence = np.zeros((len(members), k), bool)
  for i, positions in enumerate(members):
    incidence[i, positions] = True
  return incidence


def _mean_per_tool(scores: np.ndarray, members: list, k: int) -> np.ndarray:
  """f32[Q, K]: the mean score of the subsets that contain each shortlist position, over the
  subsets with a finite score (a filter's -inf ones left out; -inf where none is left)."""
  incidence = _incidence(members, k).astype(np.float32)
  finite = np.isfinite(scores)
  if finite.all():
    return (scores @ incidence) / incidence[:, 0].sum()
  count = finite.astype(np.float32) @ incidence
  total = np.where(finite, scores, 0).astype(np.float32) @ incidence
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(count > 0, total / np.maximum(count, 1), -np.inf).astype(np.float32)


def _max_per_tool(scores: np.ndarray, members: list, k: int) -> np.ndarray:
  """f32[Q, K]: the largest score of the subsets that contain each shortlist position."""
  incidence = _incidence(members, k)
  return np.stack([np.max(scores[:, incidence[:, t]], axis=1) for t in range(k)], axis=1)


def prior_bonus(model: Model, queries: np.ndarray, tools: np.ndarray,
                max_size: int) -> np.ndarray:
  """The seen-set prior's bonus on every subset of each shortlist, f32[Q, n] in table order
  (0 for the subsets that are none of the prior's sets)."""
  members, w, b, weight, floor = model.prior
  logits = queries @ w.T + b                                           # [Q, S]
  logits = logits - logits.max(1, keepdims=True)
  logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
  bonus = (weight * np.maximum(logp - floor, 0)).astype(np.float32)
  k = tools.shape[1]
  index, offset = {}, 0
  for m in range(1, max_size + 1):
    for row, subset in enumerate(colex_subsets(k, m).tolist()):
      index[tuple(subset)] = offset + row
    offset += math.comb(k, m)
  out = np.zeros((len(tools), offset), np.float32)
  for qi, row in enumerate(tools.tolist()):
    where = {t: i for i, t in enumerate(row)}
    for s, tools_s in enumerate(members.tolist()):
      real = [t for t in tools_s if t >= 0]
      if len(real) <= max_size and all(t in where for t in real):
        out[qi, index[tuple(sorted(where[t] for t in real))]] += bonus[qi, s]
  return out


def greedy_ranking(logits: np.ndarray, pairs: np.ndarray, steps: int,
                   allowed: np.ndarray | None = None) -> np.ndarray:
  """Greedy marginal gain under F: int[Q, steps] shortlist positions in pick order; with
  ``allowed`` (bool[Q, K]) only allowed positions while any is left, then the others by
  position."""
  q, k = logits.shape
  ok = np.ones((q, k), bool) if allowed is None else allowed
  logits = np.where(ok, logits, 0).astype(logits.dtype)  # a disallowed candidate is not scored
  chosen = np.zeros((q, k), bool)
  eye = np.eye(k, dtype=bool)
  picks = []
  for size in range(1, steps + 1):
    cand = chosen[:, None, :] | eye[None]                              # [Q, K(t), K]
    f = align_scores(np.broadcast_to(logits[:, None, :], cand.shape), cand)
    if size >= 2:
      gm = np.where(eye, 0, pairs[:, size - 2]).astype(logits.dtype)
      c = cand.astype(logits.dtype)
      f = f + 0.5 * np.einsum("qti,qij,qtj->qt", c, gm, c)
    f = np.where(ok, f, np.finfo(np.float32).min)
    pick = np.argmax(np.where(chosen, -np.inf, f), axis=1)
    picks.append(pick)
    chosen[np.arange(q), pick] = True
  return np.stack(picks, axis=1)


def conditioned_pairs(model: Model, queries: np.ndarray, member_emb: np.ndarray,
                      max_size: int) -> np.ndarray:
  """The query-conditioned set term (term ``conditioned``) as pair matrices added to G_m:
  Σ_r c_{m,r} (z_a·u_{m,r})(z_b·u_{m,r}) + β_m / C(m, 2) with c_m = q W_m, β_m = q·v_m + b_m,
  q = q(r). f32[Q, M − 1, K, K]."""
  u, w, v, b = (a[:max_size - 1] for a in model.conditioned)
  q = query_tower(model, queries)
  c = np.einsum("qd,mdr->qmr", q, w)
  beta = q @ v.T + b                                                    # [Q, M-1]
  proj = np.einsum("qid,mdr->qmir", member_emb, u)
  n_pairs = np.asarray([m * (m - 1) // 2 for m in range(2, max_size + 1)], np.float32)
  return np.einsum("qmir,qmr,qmjr->qmij", proj, c, proj) + (beta / n_pairs)[..., None, None]


def _first_then_by_logit(first: np.ndarray, logits: np.ndarray) -> np.ndarray:
  """Shortlist positions int[Q, K]: those marked in ``first`` by descending ℓ, then the others
  by descending ℓ; equal ℓ keeps shortlist order."""
  k = logits.shape[1]
  pos = np.broadcast_to(np.arange(k), logits.shape)
  return _order(~first, -logits, pos)


def _set_first(sets: list[list[int]], logits: np.ndarray) -> np.ndarray:
  """The ``set-first`` order: each query's best set (shortlist positions), then the rest."""
  in_set = np.zeros(logits.shape, bool)
  for i, s in enumerate(sets):
    in_set[i, s] = True
  return _first_then_by_logit(in_set, logits)


def stage2(model: Model, tools: np.ndarray, logits: np.ndarray, max_size: int,
           queries: np.ndarray | None = None, ranking: str | None = None,
           allowed: np.ndarray | None = None):
  """Stage 2 and the ranking for given shortlists (from :func:`shortlist`, or from a vector
  index such as FAISS).

  Args:
    tools: int[Q, K] tool rows in shortlist order; logits: f32[Q, K] their ℓ.
    queries: f32[Q, d_r], needed only by a model with the query-conditioned set term, the
      seen-set prior or abstention.
    ranking: ``greedy`` (M greedy picks under F, then the rest by ℓ), ``logit`` (the shortlist
      order), ``set-first`` (the best set, then the rest, each by ℓ) or ``set-mean`` (by the
      mean F of the subsets containing each tool); default: the model's
      manifest field, else greedy.
    allowed: bool[Q, K], the shortlist slots a filter allows (None: all): only subsets of
      allowed slots are candidates, and the others read -1 in the rankings.

  Returns:
    (best sets as lists of tool rows in shortlist order, their scores f32[Q],
     rankings int[Q, K] of tool rows).
  """
  ranking = ranking or model.ranking or "greedy"
  supported = allowed_rankings(model.terms)
  if ranking not in supported:
    raise ModelError(f"ranking {ranking!r}: a model with the terms "
                     f"{', '.join(model.terms) or 'none'} supports {', '.join(supported)}")
  q, k = tools.shape
  logits = np.asarray(logits, np.float32)
  emb = model.tool_embeddings[tools]
  pairs = pair_matrices(emb, model.interactions[:max_size - 1])
  if model.conditioned is not None:
    if queries is None:
      raise ModelError("this model has a query-conditioned set term: stage2 needs the queries")
    pairs = pairs + conditioned_pairs(model, np.asarray(queries, np.float32), emb, max_size)
  if model.set_weight is not None:
    pairs = (pairs * np.float32(model.set_weight)).astype(np.float32)
  ok = np.ones((q, k), bool) if allowed is None else np.asarray(allowed, bool)
  if allowed is not None:
    logits = np.where(ok, logits, -np.inf).astype(np.float32)
  if model.prior is not None or allowed is not None:
    safe = np.where(ok, logits, 0).astype(np.float32)  # a disallowed slot's ℓ is never read
    every, members = subset_scores(safe, pairs, max_size)
    if model.prior is not None:
      if queries is None:
        raise ModelError("this model has a seen-set prior: stage2 needs the queries")
      every = every + prior_bonus(model, np.asarray(queries, np.float32), tools, max_size)
    valid = _incidence(members, k)[None] <= ok[:, None, :]            # [Q, n, K]
    every = np.where(valid.all(-1), every, -np.inf)
    best = np.argmax(every, axis=1)                                    # first maximum
    sets, scores = [members[i] for i in best], every[np.arange(q), best]
  else:
    sets, scores = best_sets(logits, pairs, max_size)
  if ranking == "logit":
    order = np.broadcast_to(np.arange(k), (q, k))
  elif ranking == "set-first":
    order = _set_first(sets, logits)
  elif ranking in ("set-mean", "set-max"):
    if model.prior is None and allowed is None:
      every, members = subset_scores(logits, pairs, max_size)
    per_tool = (_mean_per_tool if ranking == "set-mean" else _max_per_tool)(every, members, k)
    order = _order(-per_tool, -logits, np.broadcast_to(np.arange(k), (q, k)))
    if ranking == "set-max" and model.prior is not None:
      # A shortlist holding an allowed tool no prior set names is ranked set-first.
      named = np.isin(tools, model.prior[0][model.prior[0] >= 0]) | ~ok
      order = np.where(named.all(1)[:, None], order, _set_first(sets, logits))
  else:
    picks = greedy_ranking(logits, pairs, max_size, None if allowed is None else ok)
    picked = np.zeros((q, k), bool)
    np.put_along_axis(picked, picks, True, axis=1)
    order = np.concatenate([picks, _first_then_by_logit(~picked, logits)[:, :k - max_size]],
                           axis=1)
  ranking_rows = np.where(np.take_along_axis(ok, order, axis=1),
                          np.take_along_axis(tools, order, axis=1), -1)
  if model.abstain is not None:  # no tool for these queries; the ranking stays
    if queries is None:
      raise ModelError("this model abstains (term abstain): stage2 needs the queries")
    w, b, tau = model.abstain
    none = np.asarray(queries, np.float32) @ w + np.float32(b) >= np.float32(tau)
    sets = [[] if none[i] else s for i, s in enumerate(sets)]
  return [[int(tools[i, pos]) for pos in s] for i, s in enumerate(sets)], scores, ranking_rows


def predict(model: Model, queries: np.ndarray, *, k1: int | None = None,
            k_pool: int | None = None, max_size: int | None = None,
            query_ids: list[str] | None = None, ranking: str | None = None,
            lexical: np.ndarray | None = None,
            allowed: np.ndarray | None = None) -> list[dict]:
  """``hyset predict`` rows for f32[Q, d_r] query embeddings (``lexical``: f32[Q, N] b for a
  model with the lexical term; ``allowed``: bool[Q, N] or bool[N], the tools each query may
  use, None: all)."""
  k1 = model.k1 if k1 is None else k1
  k_pool = model.k_pool if k_pool is None else k_pool
  max_size = model.max_set_size if max_size is None else max_size
  check_sizes(model, k1, k_pool, max_size)
  queries = np.asarray(queries, np.float32)
  slots = None
  if allowed is not None:
    allowed = np.broadcast_to(np.asarray(allowed, bool), (len(queries), len(model.tool_ids)))
    if not allowed.any(axis=1).all():
      raise ModelError("the filter allows no tool of the model's library")
  tools, logits = shortlist(model, queries, k1, k_pool, max_size, lexical, allowed)
  if allowed is not None:
    slots = np.take_along_axis(allowed, tools, axis=1)
  sets, scores, ranking = stage2(model, tools, logits, max_size, queries, ranking, slots)
  ids = model.tool_ids
  query_ids = query_ids or [str(i) for i in range(len(queries))]
  listed = slots if slots is not None else np.ones(tools.shape, bool)
  return [{"query_id": qid,
           "set": [ids[t] for t in sets[i]],
           "set_score": float(scores[i]),
           "ranking": [ids[t] for t in ranking[i] if t >= 0],
           "shortlist": [ids[t] for t, keep in zip(tools[i], listed[i]) if keep]}
          for i, qid in enumerate(query_ids)]


def read_id_list(path: str) -> list[str]:
  """The tool ids (or ``prefix*`` patterns) of a file, one a line; blank lines and lines
  starting with ``#`` skipped, surrounding spaces stripped."""
  try:
    with open(path, encoding="utf-8") as f:
      lines = [line.strip() for line in f]
  except (OSError, UnicodeDecodeError) as e:
    raise ModelError(f"{path}: cannot read the id list ({e})") from None
  return [line for line in lines if line and not line.startswith("#")]


def id_mask(patterns: list[str], tool_ids, where: str) -> np.ndarray:
  """bool[N]: the tools an id list names (``prefix*`` matches every id starting with the
  prefix; a prefix may match nothing); ModelError naming an exact id the library lacks."""
  index = {t: i for i, t in enumerate(tool_ids)}
  mask = np.zeros(len(tool_ids), bool)
  for pattern in patterns:
    if pattern.endswith("*"):
      mask |= np.array([t.startswith(pattern[:-1]) for t in tool_ids], bool)
    elif pattern in index:
      mask[index[pattern]] = True
    else:
      raise ModelError(f"{where}: tool {pattern!r} is not in the model's library")
  return mask


# --------------------------------------------------------------------------- command line

def check_output(out: str, force: bool, inputs: tuple[str, ...]) -> pathlib.Path:
  """The output rules of hyset_jax.io_utils.output_file, restated here because this file
  imports nothing of hyset_jax: not a directory, not an input, not existing without ``force``,
  in an existing writable folder."""
  path = pathlib.Path(out)
  if path.is_dir():
    raise ModelError(f"--out {path} is a directory; --out takes a file name")
  for given in inputs:
    source = pathlib.Path(given)
    if source.exists() and (path.resolve() == source.resolve() or (
        source.is_dir() and source.resolve() in path.resolve().parents and path.exists())):
      raise ModelError(f"--out {path} is (inside) one of this command's inputs ({source}); "
                       f"refusing to overwrite it (also with --force)")
  if path.exists() and not force:
    raise ModelError(f"--out {path} already exists; pass --force to overwrite it")
  parent = path.parent
  if not parent.is_dir():
    raise ModelError(f"--out {path}: folder {parent} does not exist or is not a folder")
  if not os.access(parent, os.W_OK | os.X_OK):
    raise ModelError(f"--out {path}: folder {parent} is not writable")
  return path


def write_atomic(path: pathlib.Path, text: str) -> None:
  """Write via a temporary file and a rename, with the umask's permissions (or the replaced
  file's)."""
  try:
    mode = stat.S_IMODE(path.stat().st_mode)
  except OSError:
    mask = os.umask(0o022)
    os.umask(mask)
    mode = 0o666 & ~mask
  fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
  try:
    os.fchmod(fd, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      f.write(text)
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.unlink(tmp)
    raise


def _positive(text: str) -> int:
  try:
    value = int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
  if value < 1:
    raise argparse.ArgumentTypeError(f"expected an integer ≥ 1, got {value}")
  return value


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="reference.py", description=__doc__.split("\n\n")[0])
  p.add_argument("--model", required=True, metavar="DIR",
                 help="model directory, npz export (model.npz or its folder), or a hyset "
                      "train workdir (its best/)")
  p.add_argument("--query-embeddings", required=True, metavar="FILE.npy",
                 help="float [Q, d_r] .npy; query_id = row index")
  p.add_argument("--out", required=True, metavar="FILE.jsonl",
                 help="output JSONL ('-' for stdout)")
  p.add_argument("--k1", type=_positive, metavar="N", help="stage-1 size K1 (default: the model's)")
  p.add_argument("--k-pool", type=_positive, metavar="N",
                 help="shortlist size K_pool (default: the model's)")
  p.add_argument("--max-size", type=_positive, metavar="N",
                 help="largest set size M, at most the model's (default: the model's)")
  p.add_argument("--ranking", choices=RANKINGS, default=None,
                 help="how the shortlist is ranked (default: the model's, else greedy)")
  p.add_argument("--lexical-scores", metavar="FILE.npy",
                 help="float [Q, N] lexical scores b, needed for a model with the lexical term")
  p.add_argument("--allow", metavar="FILE",
                 help="only these tools (one id a line, prefix* for a prefix)")
  p.add_argument("--deny", metavar="FILE",
                 help="never these tools (one id a line, prefix* for a prefix)")
  p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
  args = p.parse_args(argv)
  try:
    out = None if args.out == "-" else check_output(
        args.out, args.force, (args.model, args.query_embeddings,
                               *(f for f in (args.allow, args.deny) if f)))
    model = load_model(args.model)
    queries = load_queries(args.query_embeddings, model.projection.shape[0])
    lexical = None
    if args.lexical_scores:
      lexical = load_queries(args.lexical_scores, len(model.tool_ids))
      if len(lexical) != len(queries):
        raise ModelError(f"{args.lexical_scores}: {len(lexical)} rows of lexical scores for "
                         f"{len(queries)} queries")
    elif model.lexical_weight is not None:
      raise ModelError(f"{args.model}: this model has a lexical term; pass "
                       f"--lexical-scores FILE.npy (f32[Q, {len(model.tool_ids)}])")
    allowed = None
    if args.allow or args.deny:
      allowed = np.ones(len(model.tool_ids), bool)
      if args.allow:
        allowed &= id_mask(read_id_list(args.allow), model.tool_ids, args.allow)
      if args.deny:
        allowed &= ~id_mask(read_id_list(args.deny), model.tool_ids, args.deny)
    rows = predict(model, queries, k1=args.k1, k_pool=args.k_pool, max_size=args.max_size,
                   ranking=args.ranking, lexical=lexical, allowed=allowed)
    # allow_nan=False: NaN is not JSON; validated inputs never produce it, so this is a bug.
    text = "".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in rows)
    if out is None:
      sys.stdout.write(text)
    else:
      write_atomic(out, text)
  except ModelError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  except OSError as e:
    print(f"error: {e.filename or args.out}: {e.strerror or e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
