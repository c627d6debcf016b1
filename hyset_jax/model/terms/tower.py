"""The query tower q(r) in front of P: a residual ReLU MLP (not in the paper; depth 0 = off).

The maths is :func:`hyset_jax.model.scoring.query_tower`; it acts on the query side only, so it never
refers to tool rows.
"""
from hyset_jax.model.scoring import QueryTower
from hyset_jax.model.terms.base import Term

TERM = Term(name="tower", acts_on="query", container=QueryTower)
