"""A small synthetic training run for the multi-process tests (no encoder, no data files).

    python tests/distributed_train_script.py WORKDIR [NUM_STEPS [STOP_AFTER]] [--set KEY=VALUE ...]
    python tests/distributed_train_script.py train --workdir WORKDIR [--config C] [--data D]
        [--no-progress] [--set KEY=VALUE ...]

Run it alone (one process, however many devices XLA_FLAGS gives) or under ``launch/local.py``
(each rank builds the same data deterministically; train_and_evaluate joins the job from the
launcher's environment). The second form takes ``hyset train``'s arguments, so the cluster
templates' simulations (tests/test_launch.py) can run it where they run ``hyset``: ``--config``
and ``--data`` are accepted and ignored (the data is synthetic), ``--set`` applies to
``hyset_jax.testing.small_config`` (8 steps unless ``--set train.num_steps=N``). Importing this
file does nothing.
"""
from __future__ import annotations

import argparse
import json
import sys


def parse(argv: list[str]) -> argparse.Namespace:
  p = argparse.ArgumentParser()
  p.add_argument("--set", dest="overrides", action="append", default=[])
  if argv[:1] == ["train"]:
    p.add_argument("command")
    p.add_argument("--workdir", required=True)
    p.add_argument("--config")
    p.add_argument("--data")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    args.steps, args.stop_after = 8, None
  else:
    p.add_argument("workdir")
    p.add_argument("steps", type=int, nargs="?", default=8)
    p.add_argument("stop_after", type=int, nargs="?")
    args = p.parse_args(argv)
  return args


def main(argv: list[str]) -> int:
  from hyset_jax import config as config_lib
  from hyset_jax.training import train
  from hyset_jax.testing import small_config, synthetic_data
  args = parse(argv)
  config = config_lib.validate(config_lib.apply_overrides(small_config(num_steps=args.steps),
                                                          args.overrides))
  summary = train.train_and_evaluate(config, args.workdir, data=synthetic_data(),
                                     progress=False, stop_after=args.stop_after)
  import jax
  print(json.dumps({"process": jax.process_index(), "processes": jax.process_count(),
                    "devices": jax.device_count(), **summary}))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
