"""A small synthetic training run for the multi-process tests (no encoder, no data files).

    python tests/distributed_train_script.py WORKDIR [NUM_STEPS [STOP_AFTER]]

Run it alone (one process, however many devices XLA_FLAGS gives) or under
``launch/local.py`` (each rank builds the same data deterministically; train_and_evaluate joins
the job from the launcher's environment). Importing this file does nothing.
"""
from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
  from hyset_jax import train
  from hyset_jax.testing import small_config, synthetic_data
  workdir = argv[0]
  steps = int(argv[1]) if len(argv) > 1 else 8
  stop_after = int(argv[2]) if len(argv) > 2 else None
  summary = train.train_and_evaluate(small_config(num_steps=steps), workdir, data=synthetic_data(),
                                     progress=False, stop_after=stop_after)
  import jax
  print(json.dumps({"process": jax.process_index(), "processes": jax.process_count(),
                    "devices": jax.device_count(), **summary}))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
