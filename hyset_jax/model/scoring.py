"""The HYSET set score F(x, E) = F_set(E) + F_align(x, E) (paper Eq. 2-6), as pure functions.

Notation (docs/model.md): r = r(x) ∈ R^{d_r} the frozen query embedding, Z ∈ R^{N×d_z} the tool
embeddings (unit rows), P ∈ R^{d_r×d_z} the projection, M_2..M_M ∈ R^{d_z×d_z} the symmetric
cardinality-specific interaction matrices, stored stacked as ``interactions[m - 2]``.

- ℓ(x, t) = q(r)ᵀ P z_t                               (matching score, Eq. 5)

q is the query tower: a residual MLP q(r) = h_L with h_0 = r, h_{l+1} = h_l + relu(h_l W_l + b_l)
U_l + c_l. Depth L = 0 (``tower=None``) is the paper's ℓ = rᵀ P z_t exactly; with U_l = 0 at
initialisation a deeper tower starts there too. ReLU, not GELU: every stack we export to
(NumPy, StableHLO, ONNX) computes it bit-for-bit the same way.
- F_align(x, E) = Σ_k softmax_E(ℓ)_k ℓ_k              (Eq. 4-6)
- F_set(E) = Σ_{a<b} z_aᵀ M_{|E|} z_b, 0 for |E| = 1  (Eq. 3)

Candidate sets are padded to a fixed width with a boolean ``mask``; padding never changes a score.
Every function here is pure and jit-friendly; shapes are in the docstrings.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from hyset_jax.model import keyed as keyed_lib


class QueryTower(NamedTuple):
  """The residual MLP q(r) in front of P, its L layers stacked.

  Attributes:
    w_in: f32[L, d_r, H].
    b_in: f32[L, H].
    w_out: f32[L, H, d_r].
    b_out: f32[L, d_r].
  """
  w_in: jax.Array
  b_in: jax.Array
  w_out: jax.Array
  b_out: jax.Array


class QueryInteraction(NamedTuple):
  """A query-conditioned set term beside M_m (not in the paper; off by default).

  For a set E of size m ≥ 2 and q = q(r):
    F_cond(x, E) = Σ_{a<b} Σ_r c_{m,r} (z_a·u_{m,r})(z_b·u_{m,r}) + β_m,
    c_m = q W_m (a low-rank, query-dependent interaction), β_m = q·v_m + b_m (a query-dependent
    preference for sets of size m over singletons).
  Both fold into the pair matrices G_m of stage 2 (β_m spread over the C(m, 2) pairs), so the
  exhaustive enumeration is unchanged. W, v, b start at 0: the paper's model.

  Attributes:
    u: f32[M - 1, d_z, R].
    w: f32[M - 1, d_r, R].
    v: f32[M - 1, d_r].
    b: f32[M - 1].
  """
  u: jax.Array
  w: jax.Array
  v: jax.Array
  b: jax.Array


class Abstention(NamedTuple):
  """Abstention beside F (not in the paper; off by default; :mod:`hyset_jax.model.terms.abstain`):
  the empty set is delivered when the query's no-tool score u(r) = r · w + b (the log-odds of a
  logistic classifier on the query embedding r) is at least τ.

  Attributes:
    w: f32[d_r].
    b: f32[].
    threshold: f32[] τ.
  """
  w: jax.Array
  b: jax.Array
  threshold: jax.Array


def no_tool(abstention: Abstention, query_emb: jax.Array) -> jax.Array:
  """bool[B]: the queries f32[B, d_r] abstention answers with the empty set."""
  return query_emb @ abstention.w + abstention.b >= abstention.threshold


class RowBlend(NamedTuple):
  """Z blended toward the tool encoder's embeddings after θ (not in the paper; off by default;
  :mod:`hyset_jax.model.terms.row_blend`). Scoring reads ``HysetParams.tool_embeddings``, which
  already holds the blend normalize(α·Z + (1 − α)·E); this keeps what a refit needs to undo it.

  Attributes:
    trained: f32[N, d_z] Z as training left it (unit rows).
    alpha: f32[] α ∈ [0, 1], the trained rows' share.
  """
  trained: jax.Array
  alpha: jax.Array


class SetPrior(NamedTuple):
  """The seen-set prior beside F (not in the paper; off by default; :mod:`hyset_jax.model.set_prior`).

  F'(x, E) = F(x, E) + λ · max(0, log p(E | r) − log τ) for E one of the S training gold sets,
  p a softmax over them on the query embedding r; F' = F for every other set.

  Attributes:
    members: int32[S, M] tool rows of each seen set, ascending, padded with -1.
    w: f32[S, d_r].
    b: f32[S].
    weight: f32[] λ ≥ 0.
    floor: f32[] log τ.
  """
  members: jax.Array
  w: jax.Array
  b: jax.Array
  weight: jax.Array
  floor: jax.Array


class HysetParams(NamedTuple):
  """θ = (Z, {M_m}, P, q) as a pytree of arrays.

  Attributes:
    tool_embeddings: Z, f32[N, d_z], unit rows.
    projection: P, f32[d_r, d_z].
    interactions: M_2..M_M stacked, f32[M - 1, d_z, d_z]; ``interactions[m - 2]`` is M_m.
    tower: the query tower, or None for depth 0 (the paper's model).
    conditioned: the query-conditioned set term, or None (the paper's model).
    prior: the seen-set prior, or None (the paper's model). Not trained with θ: fitted after
      it (:mod:`hyset_jax.model.set_prior`).
    lexical_weight: β ≥ 0 of the lexical term, f32[], or None (the paper's model): ℓ' = ℓ +
      β · b(x, t) with b the query's BM25 scores over its best (:mod:`hyset_jax.model.lexical`).
      Chosen on validation after θ, like the prior.
    abstain: abstention, or None (the paper's model: a set is always delivered). Fitted after θ
      (:mod:`hyset_jax.model.terms.abstain`).
    set_weight: γ ≥ 0, f32[], or None (the paper's model: γ = 1): stage 2 scores
      F_align + γ·(F_set + F_cond), the expansion keeps M_M as trained. Chosen on validation
      after θ (:mod:`hyset_jax.model.terms.set_weight`).
    row_blend: Z as trained and its share α when ``tool_embeddings`` holds Z blended toward the
      encoder's rows after θ, or None (the paper's model: Z as trained). Read by no scoring
      function (:class:`RowBlend`).
  """
  tool_embeddings: jax.Array
  projection: jax.Array
  interactions: jax.Array
  tower: QueryTower | None = None
  conditioned: QueryInteraction | None = None
  prior: SetPrior | None = None
  lexical_weight: jax.Array | None = None
  abstain: Abstention | None = None
  set_weight: jax.Array | None = None
  row_blend: RowBlend | None = None

  @property
  def max_set_size(self) -> int:
    return self.interactions.shape[0] + 1


def query_tower(tower: QueryTower | None, query_emb: jax.Array) -> jax.Array:
  """q(r): f32[B, d_r] -> f32[B, d_r]; the identity for ``tower=None`` (depth 0).

  >>> import numpy as np
  >>> t = QueryTower(np.ones((1, 2, 3)), np.zeros((1, 3)), np.ones((1, 3, 2)), np.zeros((1, 2)))
  >>> query_tower(t, np.array([[1., -2.]])).tolist()  # relu(-1) = 0: the residual alone
  [[1.0, -2.0]]
  """
  h = query_emb
  if tower is None:
    return h
  for layer in range(tower.w_in.shape[0]):
    h = h + jax.nn.relu(h @ tower.w_in[layer] + tower.b_in[layer]) @ tower.w_out[layer] \
        + tower.b_out[layer]
  return h


def query_vectors(params: HysetParams, query_emb: jax.Array) -> jax.Array:
  """q(r)ᵀ P, the query side of ℓ: f32[B, d_r] -> f32[B, d_z]."""
  return query_tower(params.tower, query_emb) @ params.projection


def query_logits(params: HysetParams, query_emb: jax.Array) -> jax.Array:
  """ℓ(x, t) for every query and tool of the library: f32[B, d_r] -> f32[B, N]."""
  return query_vectors(params, query_emb) @ params.tool_embeddings.T


def with_lexical(params: HysetParams, logits: jax.Array, lexical: jax.Array | None) -> jax.Array:
  """ℓ' = ℓ + β · b for a model with the lexical term, ℓ itself for one without.

  Args:
    params: θ; ``params.lexical_weight`` is β or None.
    logits: f32[B, N] ℓ.
    lexical: f32[B, N] b(x, t) (:meth:`hyset_jax.model.lexical.LexicalIndex.scores`); required when
      the model has the term, ignored when it has not.
  """
  if params.lexical_weight is None:
    return logits
  if lexical is None:
    raise ValueError("this model has a lexical term: pass the queries' lexical scores "
                     "(hyset_jax.model.lexical.LexicalIndex.scores of the query texts)")
  return logits + params.lexical_weight * lexical


def tool_logits(query_emb: jax.Array, projection: jax.Array, tool_emb: jax.Array) -> jax.Array:
  """ℓ(x, t) = r(x)ᵀ P z_t for every query and tool (Eq. 12), for an already-towered r.

  Args:
    query_emb: f32[B, d_r].
    projection: f32[d_r, d_z].
    tool_emb: f32[N, d_z].

  Returns:
    f32[B, N].

  >>> import numpy as np
  >>> np.round(tool_logits(np.eye(2), np.eye(2), np.array([[1., 0.], [0., 1.], [.6, .8]])), 3)
  array([[1. , 0. , 0.6],
         [0. , 1. , 0.8]])
  """
  return (query_emb @ projection) @ tool_emb.T


def symmetrize(m: jax.Array) -> jax.Array:
  """½(M + Mᵀ) over the last two axes: f32[..., d, d] -> f32[..., d, d], exactly symmetric."""
  return 0.5 * (m + jnp.swapaxes(m, -1, -2))


def align_scores(logits: jax.Array, mask: jax.Array) -> jax.Array:
  """F_align = Σ_k α_k ℓ_k with α = softmax over the members of each set (Eq. 4-6).

  The softmax is shifted by each set's own maximum, so it is exact for any logit range.

  Args:
    logits: f32[..., m], ℓ of each member slot.
    mask: bool[..., m], True for members, False for padding. Every set needs ≥ 1 member.

  Returns:
    f32[...].

  >>> import numpy as np
  >>> float(align_scores(np.array([2., 0., 99.]), np.array([True, True, False])))  # doctest: +ELLIPSIS
  1.76159...
  """
  shifted_max = jnp.max(jnp.where(mask, logits, -jnp.inf), axis=-1, keepdims=True)
  w = jnp.where(mask, jnp.exp(jnp.where(mask, logits - shifted_max, 0.0)), 0.0)
  return jnp.sum(w * jnp.where(mask, logits, 0.0), axis=-1) / jnp.sum(w, axis=-1)


def interaction_scores(member_emb: jax.Array, member_keyed: jax.Array, mask: jax.Array) -> jax.Array:
  """F_set = Σ_{a<b} z_aᵀ M z_b for padded sets, with M already applied to one side (Eq. 3).

  Computed as ½ [(Σ_a z_a M)·(Σ_b z_b) − Σ_a (z_a M)·z_a] over the set's members: for symmetric
  M this equals the sum over a<b, and the gradient with respect to M, ½ (s sᵀ − Σ_a z_a z_aᵀ)
  with s = Σ_a z_a, is itself symmetric, so gradient steps keep the M_m symmetric without a
  projection. Sums and elementwise products over d, not each set's m×m block of dot products:
  the training step's pools are thousands of sets, and XLA's CPU backend runs a batch of tiny
  matrix products far below its speed (with their gradients, ~24 ms of the paper-scale step at
  batch 32 on 2 cores).

  Args:
    member_emb: f32[..., m, d], z of each member slot.
    member_keyed: f32[..., m, d], z M_{|E|} of each member slot (the set's own cardinality).
    mask: bool[..., m].

  Returns:
    f32[...]; 0 for singletons.

  >>> import numpy as np
  >>> z = np.array([[1., 0.], [0., 1.], [1., 1.]])
  >>> float(interaction_scores(z, z, np.array([True, True, True])))  # identity M: 0 + 1 + 1
  2.0
  """
  w = jnp.where(mask, 1.0, 0.0)[..., None]  # weakly typed: keeps the rows' dtype
  emb, keyed = member_emb * w, member_keyed * w
  total = jnp.sum(jnp.sum(keyed, axis=-2) * jnp.sum(emb, axis=-2), axis=-1)
  return 0.5 * (total - jnp.sum(keyed * emb, axis=(-2, -1)))


@jax.custom_vjp
def symmetric_interaction_scores(member_emb: jax.Array, member_keyed: jax.Array,
                                 mask: jax.Array) -> jax.Array:
  """:func:`interaction_scores` for keyed rows z M with M symmetric, whose gradient flows to z
  through ``member_emb`` only.

  ∂F_set/∂z_a = Σ_{b≠a} z_b M = K − k_a (K = Σ_b k_b over the set, k_a = z_a M): twice the
  gradient of :func:`interaction_scores` through ``member_emb``, ½ (K − k_a); the other half is
  the one through ``member_keyed`` (½ (S − z_a) Mᵀ, S = Σ_b z_b), equal to it when M = Mᵀ. So
  the cotangent of ``member_emb`` is K − k_a, and that of ``member_keyed``, ½ (S − z_a), serves
  M's gradient only (the caller stops z's gradient through the keyed rows).
  Shapes as :func:`interaction_scores`.
  """
  return interaction_scores(member_emb, member_keyed, mask)


def _symmetric_interaction_fwd(member_emb, member_keyed, mask):
  return interaction_scores(member_emb, member_keyed, mask), (member_emb, member_keyed, mask)


def _symmetric_interaction_bwd(res, g):
  emb, keyed, mask = res
  w = jnp.where(mask, 1.0, 0.0)[..., None]
  emb, keyed = emb * w, keyed * w
  g = g[..., None, None]
  d_emb = g * (jnp.sum(keyed, axis=-2, keepdims=True) - keyed) * w
  d_keyed = 0.5 * g * (jnp.sum(emb, axis=-2, keepdims=True) - emb) * w
  return d_emb, d_keyed, None


symmetric_interaction_scores.defvjp(_symmetric_interaction_fwd, _symmetric_interaction_bwd)


def gram_is_cheaper(num_matrices: int, num_tools: int, tool_dim: int, members_shape) -> bool:
  """:func:`set_scores`' "auto": the library Gram matrices ((M−1)·N²) cost no more than the
  gathered rows of a batch of sets (2·B·C·m·d). ``members_shape``: (B, C, m)."""
  b, c, m = members_shape
  return num_matrices * num_tools * num_tools <= 2 * b * c * m * tool_dim


def set_scores(params: HysetParams, query_emb: jax.Array, members: jax.Array,
               mask: jax.Array, method: str = "auto") -> jax.Array:
  """F(x, E) for a batch of queries, each with its own candidate sets of tools from the library.

  Three evaluation orders of the same sums; ``method="auto"`` takes "gram" where it is cheaper
  (:func:`gram_is_cheaper`), else "keyed":

  - ``"gram"``: ℓ for every tool and the library Gram matrices Z M_m Zᵀ once, then gather
    scalars per member and pair. Cost ~ (M−1)·N²·d, independent of the batch: the fast
    choice for small libraries (ToolLens: N = 464), whose backward pass scatters scalars.
  - ``"keyed"``: gather each member's z and z M_{|E|}, then contract, with z M_m computed once
    per distinct (cardinality, tool) pair of the batch (:mod:`hyset_jax.model.keyed`). Cost
    ~ B·C·m·d + (pairs)·d², for large libraries where an N×N Gram matrix would not fit.
  - ``"gather"``: the same with Z M_m for the whole library, (M−1)·N·d²: fixed shapes, no
    data-dependent loop (XLA's cost analysis counts "keyed"'s loop body once).

  Args:
    params: θ.
    query_emb: f32[B, d_r].
    members: int[B, C, m] tool rows of each candidate set; padding slots may hold any valid row.
    mask: bool[B, C, m]; 1 ≤ Σ mask ≤ M for every set.
    method: ``"auto"``, ``"gram"``, ``"keyed"`` or ``"gather"``.

  Returns:
    f32[B, C].
  """
  z = params.tool_embeddings
  n, d = z.shape
  b, c, m = members.shape
  k = params.interactions.shape[0]
  if method == "auto":
    method = "gram" if gram_is_cheaper(k, n, d, members.shape) else "keyed"
  size = jnp.sum(mask, axis=-1)                                      # [B, C]
  card = jnp.clip(size - 2, 0, k - 1)
  if method == "gram":
    logits_all = query_vectors(params, query_emb) @ z.T                # [B, N]
    logits = jnp.take_along_axis(logits_all, members.reshape(b, c * m), 1).reshape(b, c, m)
    gram = jnp.einsum("nd,kde,me->knm", z, params.interactions, z)     # [M-1, N, N]
    pair = gram[card[..., None, None], members[..., :, None], members[..., None, :]]
    pair_mask = mask[..., :, None] & mask[..., None, :] & ~jnp.eye(m, dtype=bool)
    f_set = 0.5 * jnp.sum(jnp.where(pair_mask, pair, 0.0), axis=(-2, -1))
    return f_set + align_scores(logits, mask) + conditioned_scores(params, query_emb, members,
                                                                   mask)
  emb = z[members]                                                   # [B, C, m, d]
  # A product and a sum over d, not an einsum: as a batched matrix product XLA's CPU backend
  # first copies emb into a transposed layout (~9 ms of the paper-scale training step).
  logits = jnp.sum(query_vectors(params, query_emb)[:, None, None, :] * emb, axis=-1)
  if method == "keyed":
    # F_set reads only M's symmetric part (½ Σ_{a≠b} z_a M z_b); with it, a member's gradient
    # through its keyed row z_a M_s equals the one through z_a itself, so the keyed rows are
    # differentiated for M only and z's gradient is taken twice through emb
    # (:func:`symmetric_interaction_scores`): a [rows, d]·[d, d] product per chunk fewer in the
    # backward pass. M_s = ½ (M + Mᵀ) is M itself, bit for bit, for the symmetric M training keeps.
    keyed = keyed_lib.member_products(z, symmetrize(params.interactions), members, card,
                                      mask & (size >= 2)[..., None])
    f_set = symmetric_interaction_scores(emb, keyed, mask)
  elif method == "gather":
    keyed_all = jnp.einsum("nd,kde->kne", z, params.interactions)    # [M-1, N, d]
    f_set = interaction_scores(emb, keyed_all[card[..., None], members], mask)
  else:
    raise ValueError(f"unknown set_scores method {method!r}")
  return f_set + align_scores(logits, mask) + conditioned_scores(params, query_emb, members, mask)


def _conditioning(params: HysetParams, query_emb: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(c f32[B, M-1, R], β f32[B, M-1]) of :class:`QueryInteraction` for each query."""
  qi = params.conditioned
  q = query_tower(params.tower, query_emb)
  return jnp.einsum("bd,kdr->bkr", q, qi.w), q @ qi.v.T + qi.b


def conditioned_scores(params: HysetParams, query_emb: jax.Array, members: jax.Array,
                       mask: jax.Array) -> jax.Array:
  """F_cond(x, E) of :class:`QueryInteraction` (0 when ``params.conditioned`` is None).

  Args:
    params: θ.
    query_emb: f32[B, d_r].
    members: int[B, C, m].
    mask: bool[B, C, m].

  Returns:
    f32[B, C]; 0 for singletons.
  """
  qi = params.conditioned
  if qi is None:
    return jnp.zeros(members.shape[:2], params.tool_embeddings.dtype)
  size = jnp.sum(mask, axis=-1)                                        # [B, C]
  card = jnp.clip(size - 2, 0, qi.u.shape[0] - 1)
  c, beta = _conditioning(params, query_emb)                           # [B, K, R], [B, K]
  by_slot = members.size < params.tool_embeddings.shape[0]
  p = jnp.where(mask[..., None], member_factors(params.tool_embeddings, qi.u, members, card,
                                                by_slot), 0.0)         # [B, C, m, R]
  # Σ_{a<b} p_a p_b = ½((Σ p)² − Σ p²), per rank component.
  pairs = 0.5 * (jnp.sum(p, axis=-2) ** 2 - jnp.sum(p ** 2, axis=-2))  # [B, C, R]
  rows = jnp.arange(card.shape[0])[:, None]
  c_set, beta_set = c[rows, card], beta[rows, card]                    # [B, C, R], [B, C]
  return jnp.where(size >= 2, jnp.sum(c_set * pairs, axis=-1) + beta_set, 0.0)


def member_factors(z: jax.Array, u: jax.Array, members: jax.Array, card: jax.Array,
                   by_slot: bool) -> jax.Array:
  """z_t U_{card} for every member slot: f32[B, C, m, R] from Z f32[N, d], U f32[K, d, R],
  members int[B, C, m] and each set's factor card int[B, C] in [0, K).

  ``by_slot``: project the slots' rows (K·B·C·m·d·R flops) instead of every tool's
  (K·N·d·R) and gather — the cheaper one when the batch holds fewer member slots than the
  library has tools (a training step at 10⁵ tools: ~half the step's flops were Z U_m).
  The same products either way, so the same values up to rounding.
  """
  if not by_slot:
    return jnp.einsum("nd,kdr->knr", z, u)[card[..., None], members]  # [K, N, R] gathered
  emb = z[members]                                                    # [B, C, m, d]
  out = jnp.zeros(members.shape + u.shape[-1:], z.dtype)
  for j in range(u.shape[0]):  # K = M − 1 products of the slots' rows, each kept where it applies
    out = jnp.where((card == j)[..., None, None], emb @ u[j], out)
  return out


def shortlist_pairs(params: HysetParams, query_emb: jax.Array, tools: jax.Array) -> jax.Array:
  """The stage-2 pair matrices G_m of a shortlist, the query-conditioned term included.

  Summing G_m over the pairs a<b of a set of size m gives its F_set (plus F_cond).

  Args:
    params: θ with M − 1 interaction matrices.
    query_emb: f32[Q, d_r].
    tools: int[Q, K] the shortlist's tool rows.

  Returns:
    f32[Q, M − 1, K, K], symmetric in the last two axes.
  """
  z = params.tool_embeddings
  emb = z[tools]                                                       # [Q, K, d]
  q, k = tools.shape
  # (A symbolic batch — jax.export's "q" — cannot be compared at trace time: per shortlist.)
  if isinstance(q, int) and q * k > z.shape[0]:
    # More shortlist slots than tools (training batches, batched predict on a small library):
    # Z M_m once for the library, then gathered — the same products, computed once per tool.
    keyed = jnp.einsum("nd,mde->mne", z, params.interactions)[:, tools]  # [M-1, Q, K, d]
    pairs = jnp.einsum("mqie,qje->qmij", keyed, emb)
  else:
    pairs = pair_matrices(emb, params.interactions)
  qi = params.conditioned
  if qi is None:
    return pairs
  k_sizes = params.interactions.shape[0]
  c, beta = _conditioning(params, query_emb)
  p = jnp.einsum("qid,mdr->qmir", emb, qi.u)                           # [Q, M-1, K, R]
  n_pairs = jnp.asarray([(m * (m - 1)) // 2 for m in range(2, k_sizes + 2)], pairs.dtype)
  return pairs + jnp.einsum("qmir,qmr,qmjr->qmij", p, c, p) \
      + (beta / n_pairs)[..., None, None]


def pair_matrices(member_emb: jax.Array, interactions: jax.Array) -> jax.Array:
  """G_m[i, j] = z_iᵀ M_m z_j among the tools of a shortlist, for every cardinality m.

  Args:
    member_emb: f32[Q, K, d], the shortlist's tool embeddings.
    interactions: f32[M - 1, d, d].

  Returns:
    f32[Q, M - 1, K, K], symmetric in the last two axes up to rounding.
  """
  keyed = jnp.einsum("qid,mde->qmie", member_emb, interactions)
  return jnp.einsum("qmie,qje->qmij", keyed, member_emb)
