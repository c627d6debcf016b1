"""hyset-jax: set-level tool retrieval (HYSET) in JAX.

The packages, one job each (README.md has the full map):

- :mod:`hyset_jax.model`       the scores (``scoring``, paper Eq. 2-6), θ (``parameters``) and the
  terms beside it (``terms``: one module each, picked by name).
- :mod:`hyset_jax.inference`   two-stage inference (``pipeline``, Eq. 12-14), the subset tables
  (``subsets``) and their exhaustive scoring (``enumeration``), backends, rankings, filters.
- :mod:`hyset_jax.training`    the training loop (``train``), batches, negatives, rewards, losses,
  checkpoints, sharding, the dry run, and what is chosen after θ (``post_theta``).
- :mod:`hyset_jax.evaluation`  metrics, their evaluation on a split, significance tests.
- :mod:`hyset_jax.io`          the model format (``model_format``, ``model_schema.json``), the model
  directory, the exports, the NumPy reference, library edits.
- :mod:`hyset_jax.data`, :mod:`hyset_jax.encoder`, :mod:`hyset_jax.retrievers` (baselines),
  :mod:`hyset_jax.serve`, :mod:`hyset_jax.commands` (the ``hyset`` console script's commands).
"""

__version__ = "0.1.0"
