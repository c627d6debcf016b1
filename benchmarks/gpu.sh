#!/usr/bin/env bash
# The speed suite on a GPU, in one prepared script.
#
#   benchmarks/gpu.sh OUT_DIR               # ~15 min on one GPU
#   benchmarks/gpu.sh --cpu-smoke OUT_DIR   # seconds on a CPU: the same steps at toy sizes
#
# Installs jax[cuda12] and this repository into its own virtual environment ($HYSET_GPU_VENV,
# default .venv-gpu beside the repository; the project's own environment is not touched), checks
# that JAX sees a GPU, then writes under OUT_DIR:
#   enumerate_<impl>_<output>_b<batch>.json  every JAX method, the Pallas kernel included, both
#                                            outputs (best, scores)
#   e2e_b<batch>.json                        N = 13,860, d = 768: prepared path vs a dense pass
#   suite/speed.{md,json,png}                the full suite (sweeps, library size, training step)
#   peer.{md,json}                           with $HYSET_PEER (the authors' repository checked
#                                            out): benchmarks/peer.py, their PyTorch code (torch
#                                            on cuda, in $HYSET_PEER_VENV, default .venv-peer-gpu)
#                                            beside ours: same answers, inference and training
#                                            step speed
#   summary.md                               one table of the above
# The GPU goal (issue 13): ≥ 10⁶ queries/s best-set at K_pool = 20, M = 5.
#
# --cpu-smoke runs every step of the script with the project's Python ($HYSET_PYTHON, default
# .venv/bin/python; nothing installed) on the CPU backend: the enumerate runs at K_pool = 8,
# M = 3, batch 16, for jax-pallas only (Pallas interpret mode; each run is a fresh process that
# compiles, so one implementation keeps it short) and checks the other implementation names;
# e2e at N = 300, d = 16 with --method pallas; the suite's arguments
# parsed but the suite not run (python -m benchmarks.run_all --quick is its smoke run); the
# peer comparison's training leg, our side only (python -m benchmarks.peer_train, N = 300,
# d = 16, batch 8; the authors' side needs torch); then the same summary.md.
# tests/test_gpu_script.py runs it, so the script cannot rot unnoticed.
set -euo pipefail
smoke=0
if [ "${1:-}" = "--cpu-smoke" ]; then
  smoke=1
  shift
fi
out=${1:?usage: benchmarks/gpu.sh [--cpu-smoke] OUT_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)

impls="jax-gather jax-colex jax-matmul jax-matmul-bf16 jax-pallas"
suite_args=(--out "$out/suite" --skip allocator)
if [ "$smoke" = 1 ]; then
  py=${HYSET_PYTHON:-$root/.venv/bin/python}
  [ -x "$py" ] || py=python3
  export JAX_PLATFORMS=cpu
  all_impls=$impls
  impls="jax-pallas"
  batches="16"
  enum_args=(--k-pool 8 --max-size 3 --repeats 1)
  e2e_batches="4"
  e2e_args=(--tools 300 --dim 16 --k1 5 --k-pool 8 --max-size 3 --repeats 1 --method pallas)
  # The implementation names the real run uses must exist (imports no JAX).
  "$py" -c "import sys; from hyset_jax.benchmarking.runners import IMPLS
bad = set(sys.argv[1:]) - set(IMPLS)
sys.exit(f'unknown --impl: {sorted(bad)}' if bad else 0)" $all_impls
  echo "JAX on the CPU backend (--cpu-smoke)"
else
  venv=${HYSET_GPU_VENV:-$root/.venv-gpu}
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install -q -U pip
  "$venv/bin/pip" install -q -U "jax[cuda12]" -e "$root"
  py="$venv/bin/python"
  "$py" -c "import jax, sys; b = jax.default_backend(); print('JAX', jax.__version__, b, jax.devices()); sys.exit(b != 'gpu')" \
    || { echo "error: JAX does not see a GPU (backend above); nothing measured" >&2; exit 2; }
  batches="1024 16384"
  enum_args=()
  e2e_batches="1 256 4096"
  e2e_args=(--tools 13860 --dim 768)
fi

cd "$root"
for output in best scores; do
  for impl in $impls; do
    for batch in $batches; do
      echo "enumerate $impl $output batch $batch"
      "$py" -m hyset_jax.cli bench enumerate --impl "$impl" --output "$output" --batch "$batch" \
        ${enum_args[@]+"${enum_args[@]}"} --check --force \
        --json "$out/enumerate_${impl}_${output}_b${batch}.json" \
        || echo "  failed (recorded as missing in summary.md)"
    done
  done
done
for batch in $e2e_batches; do
  echo "e2e batch $batch"
  "$py" -m hyset_jax.cli bench e2e "${e2e_args[@]}" --batch "$batch" --force \
    --json "$out/e2e_b${batch}.json" || echo "  failed"
done
if [ "$smoke" = 1 ]; then
  echo "full suite: arguments checked, not run (--cpu-smoke)"
  "$py" -c "import sys; from benchmarks import run_all; run_all._parse(sys.argv[1:])" \
    "${suite_args[@]}"
else
  echo "full suite"
  "$py" -m benchmarks.run_all "${suite_args[@]}" || echo "  suite failed"
fi

if [ "$smoke" = 1 ]; then
  echo "peer: the training leg, hyset-jax's side (the authors' side needs torch)"
  "$py" -c "import json, sys, numpy as np; from benchmarks import peer
q, gold = peer.train_inputs(300, 16, 5, 16); np.save(sys.argv[1] + '/peer_q.npy', q)
z = np.random.default_rng(0).standard_normal((300, 16)).astype(np.float32)
np.save(sys.argv[1] + '/peer_z.npy', z / np.linalg.norm(z, axis=1, keepdims=True))
open(sys.argv[1] + '/peer_gold.json', 'w').write(json.dumps(gold))" "$out"
  "$py" -m benchmarks.peer_train --tools "$out/peer_z.npy" --queries "$out/peer_q.npy" \
    --gold "$out/peer_gold.json" --max-size 5 --batch-size 8 --steps 1 --warmup 1 \
    --out "$out/peer_train_ours.json" || echo "  peer training leg failed"
elif [ -n "${HYSET_PEER:-}" ]; then
  echo "peer: the authors' PyTorch code beside ours ($HYSET_PEER)"
  pvenv=${HYSET_PEER_VENV:-$root/.venv-peer-gpu}
  [ -x "$pvenv/bin/python" ] || python3 -m venv "$pvenv"
  "$pvenv/bin/pip" install -q torch numpy
  # The CPU run's settings (README): 40 paper-scale queries, two alternating training rounds
  # of 12 steps after 3.
  "$py" -m benchmarks.peer --peer "$HYSET_PEER" --python "$pvenv/bin/python" \
    --peer-device cuda --queries 40 --train-warmup 3 --train-steps 12 \
    --out "$out/peer" --force || echo "  peer comparison failed"
else
  echo "peer: not run (HYSET_PEER does not name a checkout of the authors' repository)"
fi

"$py" - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
rows = [json.loads(p.read_text()) for p in sorted(out.glob("enumerate_*.json"))]
backend = rows[0]["machine"].get("backend", "?") if rows else "?"
lines = [f"# hyset-jax speed ({backend} backend)", ""]
if rows:
  lines += [f"Machine: {rows[0]['machine']}", "",
            "| impl | method | output | K_pool | M | batch | queries/s | subsets/s | compile s "
            "| max diff vs NumPy |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
  for r in rows:
    if r.get("status", "ok") != "ok":
      lines.append(f"| {r['impl']} | {r.get('method')} | {r['output']} | {r['k_pool']} "
                   f"| {r['max_size']} | {r['batch']} | {r['status']} | | | |")
      continue
    lines.append(f"| {r['impl']} | {r.get('method')} | {r['output']} | {r['k_pool']} "
                 f"| {r['max_size']} | {r['batch']} | {r.get('queries_per_s', 0):,.0f} "
                 f"| {r.get('subsets_per_s', 0):,.0f} | {r.get('compile_s') or 0:.2f} | "
                 f"{r.get('max_abs_diff_vs_numpy', float('nan')):.1e} |")
e2e = [json.loads(p.read_text()) for p in sorted(out.glob("e2e_*.json"))]
if e2e:
  lines += ["", "| e2e batch | method | N | d | ms / query | dense ms / query | × dense |",
            "|---:|---|---:|---:|---:|---:|---:|"]
  for r in sorted(e2e, key=lambda r: r["batch"]):
    lines.append(f"| {r['batch']} | {r.get('method')} | {r['num_tools']} | {r['dim']} "
                 f"| {r['ms_per_query']:.4f} | {r['dense_ms_per_query']:.4f} "
                 f"| {r['ratio_to_dense']:.2f} |")
suite = out / "suite" / "speed.md"
lines += ["", f"Full suite: {suite}" if suite.exists() else "Full suite: not run"]
peer_md, smoke = out / "peer.md", out / "peer_train_ours.json"
if peer_md.exists():
  lines.append(f"The authors' PyTorch code beside ours: {peer_md}")
elif smoke.exists():
  r = json.loads(smoke.read_text())
  lines.append(f"Peer training leg (ours only, batch {r['batch_size']}): "
               f"{r['batch_size'] / min(r['s_per_step']):,.0f} queries/s")
else:
  lines.append("Peer comparison: not run")
(out / "summary.md").write_text("\n".join(lines) + "\n")
print(f"wrote {out / 'summary.md'}")
PY
