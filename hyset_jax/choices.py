"""The named choices of the inference path, in one place: enumeration methods, tool-ranking
methods and the two stage-2 outputs.

Each is a ``Literal`` type (for signatures) with its tuple of names (for ``argparse`` choices and
validation) and its default. No JAX import here: the CLI builds ``--help`` from these names
without loading JAX, and every module that needs a list of names takes it from here.

>>> ENUMERATION_METHODS
('gather', 'colex', 'matmul', 'matmul_bf16', 'native', 'pallas')
>>> METHOD_CHOICES
('auto', 'gather', 'colex', 'matmul', 'matmul_bf16', 'native', 'pallas')
>>> RANKINGS
('greedy', 'logit', 'set-first', 'set-mean', 'set-max')
"""
from __future__ import annotations

from typing import Literal, get_args

from hyset_jax.errors import UserError

# Subset-enumeration implementations (hyset_jax.inference.enumeration.SCORERS): four JAX forms, the
# native CPU kernel (hyset_jax/inference/native; XLA FFI) and the Pallas kernel for GPU/TPU
# (hyset_jax/inference/pallas_stage2.py; interpret mode on a CPU). "auto", the default wherever a method
# is chosen, resolves when a program is traced (enumeration.resolve_method): "native" on the
# CPU backend when the kernel can be built there, "pallas" on GPU/TPU, else "gather", the
# fastest pure-JAX form on XLA:CPU (benchmarks/README.md). Training's differentiable
# enumeration always uses "gather".
EnumerationMethod = Literal["gather", "colex", "matmul", "matmul_bf16", "native", "pallas"]
ENUMERATION_METHODS: tuple[str, ...] = get_args(EnumerationMethod)
MethodChoice = Literal["auto", EnumerationMethod]
METHOD_CHOICES: tuple[str, ...] = ("auto",) + ENUMERATION_METHODS
DEFAULT_METHOD: MethodChoice = "auto"
# What "auto" falls back to where the native kernel cannot run; the exported programs
# (StableHLO, ONNX) use it too, since a custom call does not travel to other stacks.
PORTABLE_METHOD: EnumerationMethod = "gather"

# How the K_pool shortlist tools are ranked (hyset_jax.inference.rankings.rank_tools). The delivered set
# is the exact argmax of Eq. 14 under every ranking; only the ranked list differs.
Ranking = Literal["greedy", "logit", "set-first", "set-mean", "set-max"]
RANKINGS: tuple[str, ...] = get_args(Ranking)
DEFAULT_RANKING: Ranking = "greedy"

# The dtype of the prepared products (hyset_jax.inference.pipeline.prepare): P Zᵀ (stage 1) and
# Z M_m (the pair matrices G_m, the expansion's g). "bf16" stores them in bfloat16 and multiplies
# bf16 operands with f32 accumulation; stage 2 sums in f32 either way. For accelerators, where
# it halves the bytes of the library's products; approximate (docs/speed.md, "Precision").
Precision = Literal["f32", "bf16"]
PRECISIONS: tuple[str, ...] = get_args(Precision)
DEFAULT_PRECISION: Precision = "f32"

# How stage 1 and the expansion find their candidates (hyset_jax.inference.ann): the exact
# scan of every tool (the default), or an ANN index over Z (approximate, for very large
# libraries; opt-in per model through the manifest's "first_stage", or --first-stage).
FirstStage = Literal["exact", "ann"]
FIRST_STAGES: tuple[str, ...] = get_args(FirstStage)

# What stage 2 returns: the best set per query (what predict runs) or every subset's score.
Stage2Output = Literal["best", "scores"]
STAGE2_OUTPUTS: tuple[str, ...] = get_args(Stage2Output)
DEFAULT_STAGE2_OUTPUT: Stage2Output = "best"


def check(kind: str, value: str, names: tuple[str, ...]) -> str:
  """``value`` if it is one of ``names``; a UserError naming the choices otherwise.

  >>> check("ranking", "logit", RANKINGS)
  'logit'
  """
  if value not in names:
    raise UserError(f"unknown {kind} {value!r}; choose one of {', '.join(names)}")
  return value
