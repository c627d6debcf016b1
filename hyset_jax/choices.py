"""The named choices of the inference path, in one place: enumeration methods, tool-ranking
methods and the two stage-2 outputs.

Each is a ``Literal`` type (for signatures) with its tuple of names (for ``argparse`` choices and
validation) and its default. No JAX import here: the CLI builds ``--help`` from these names
without loading JAX, and every module that needs a list of names takes it from here.

>>> ENUMERATION_METHODS
('gather', 'colex', 'matmul', 'matmul_bf16')
>>> RANKINGS
('greedy', 'logit', 'set-first', 'set-mean')
"""
from __future__ import annotations

from typing import Literal, get_args

from hyset_jax.errors import UserError

# Subset-enumeration implementations (hyset_jax.enumeration.SCORERS). "gather" is the default:
# chosen from benchmarks/results (K_pool = 20, M = 5 on XLA:CPU); see benchmarks/README.md.
EnumerationMethod = Literal["gather", "colex", "matmul", "matmul_bf16"]
ENUMERATION_METHODS: tuple[str, ...] = get_args(EnumerationMethod)
DEFAULT_METHOD: EnumerationMethod = "gather"

# How the K_pool shortlist tools are ranked (hyset_jax.inference.rank_tools). The delivered set
# is the exact argmax of Eq. 14 under every ranking; only the ranked list differs.
Ranking = Literal["greedy", "logit", "set-first", "set-mean"]
RANKINGS: tuple[str, ...] = get_args(Ranking)
DEFAULT_RANKING: Ranking = "greedy"

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
