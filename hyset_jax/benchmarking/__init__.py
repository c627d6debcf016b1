"""Subset-enumeration benchmarks: workloads, reference implementations, timing, hardware probes.

Used by ``hyset bench`` (:mod:`hyset_jax.commands.bench`) and by the full suite in the
repository's ``benchmarks/`` folder. It lives in the package, not in ``benchmarks/``, because the
console script must run where only the installed package is.

- :mod:`.workload`: random inputs and the minimal floating-point work per query.
- :mod:`.references`: NumPy, naive-loop and PyTorch implementations of the same scores.
- :mod:`.runners`: one timing protocol for every implementation.
- :mod:`.hardware`: the machine's measured matmul peak and output-write floor.
"""
