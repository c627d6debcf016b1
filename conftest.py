"""Before jax is imported anywhere in the test run (tests/ and the doctests in the packages):
eight fake CPU devices, so data-parallel code paths run on any machine."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
