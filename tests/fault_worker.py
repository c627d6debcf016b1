"""A training process for the fault tests: synthetic data, run as a real subprocess.

Usage: python tests/fault_worker.py WORKDIR
"""
import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
sys.path.insert(0, os.path.dirname(__file__))

from test_train import small_config, synthetic_data  # noqa: E402

from hyset_jax import train  # noqa: E402

if __name__ == "__main__":
  config = small_config(num_steps=40, checkpoint_every=5, eval_every=10, log_every=1)
  train.train_and_evaluate(config, sys.argv[1], data=synthetic_data(), progress=False)
