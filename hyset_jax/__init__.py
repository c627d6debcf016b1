"""hyset-jax: set-level tool retrieval (HYSET) in JAX.

The pieces, one job per module:

- :mod:`hyset_jax.model.scoring`      pure set-scoring functions (paper Eq. 2-6).
- :mod:`hyset_jax.model.parameters`        θ = (Z, M_2..M_M, P, q): initialisation, ablations, constraints.
- :mod:`hyset_jax.inference.enumeration`  static subset tables and exhaustive scoring of every subset.
- :mod:`hyset_jax.inference.pipeline`    two-stage inference (Eq. 12-14), the prepared fast path, ranking.
- :mod:`hyset_jax.inference.neighbors`    the per-tool neighbour table for the exact fast expansion (Eq. 13).
- :mod:`hyset_jax.choices`      the names of enumeration methods, rankings and stage-2 outputs.
- :mod:`hyset_jax.io.model_format` the model format: schema, the one reader and checker (NumPy only).
- :mod:`hyset_jax.model.terms`        the model terms beside the paper's θ, one module each, by name.
- :mod:`hyset_jax.io.modeldir`     the model directory (read, validate, write).
- :mod:`hyset_jax.cli`          the ``hyset`` console script.
"""

__version__ = "0.1.0"
