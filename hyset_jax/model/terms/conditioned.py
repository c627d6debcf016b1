"""The query-conditioned set term (not in the paper; off by default), folded into the pair
matrices G_m of stage 2 (:class:`hyset_jax.model.scoring.QueryInteraction`). Its tensors are over
d_z and d_r, not over tools: it follows any change of the library as it is.
"""
from hyset_jax.model.scoring import QueryInteraction
from hyset_jax.model.terms.base import Term

TERM = Term(name="conditioned", acts_on="pairs", container=QueryInteraction)
