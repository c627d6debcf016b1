"""Sub-commands of the ``hyset`` console script, one module each (see :mod:`hyset_jax.cli`)."""
