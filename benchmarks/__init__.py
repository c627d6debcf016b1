"""Benchmarks run from the repository (``python -m benchmarks.<module>``).

``run_all`` is the speed suite (``make bench``; see benchmarks/README.md). Its implementations
and timing protocol live in :mod:`hyset_jax.benchmarking`, shared with ``hyset bench``.
"""
