#!/usr/bin/env bash
# The speed suite on a GPU, in one prepared script.
#
#   benchmarks/gpu.sh OUT_DIR            # ~15 min on one GPU
#
# Installs jax[cuda12] and this repository into its own virtual environment ($HYSET_GPU_VENV,
# default .venv-gpu beside the repository; the project's own environment is not touched), checks
# that JAX sees a GPU, then writes under OUT_DIR:
#   enumerate_<impl>_<output>_b<batch>.json  every JAX method, both outputs (best, scores)
#   e2e_b<batch>.json                        N = 13,860, d = 768: prepared path vs a dense pass
#   suite/speed.{md,json,png}                the full suite (sweeps, library size, training step)
#   summary.md                               one table of the above
# The GPU goal (issue 13): ≥ 10⁶ queries/s best-set at K_pool = 20, M = 5.
set -euo pipefail
out=${1:?usage: benchmarks/gpu.sh OUT_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${HYSET_GPU_VENV:-$root/.venv-gpu}
mkdir -p "$out"
out=$(cd "$out" && pwd)

[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q -U pip
"$venv/bin/pip" install -q -U "jax[cuda12]" -e "$root"
py="$venv/bin/python"
"$py" -c "import jax, sys; b = jax.default_backend(); print('JAX', jax.__version__, b, jax.devices()); sys.exit(b != 'gpu')" \
  || { echo "error: JAX does not see a GPU (backend above); nothing measured" >&2; exit 2; }

cd "$root"
for output in best scores; do
  for impl in jax-gather jax-colex jax-matmul jax-matmul-bf16; do
    for batch in 1024 16384; do
      echo "enumerate $impl $output batch $batch"
      "$py" -m hyset_jax.cli bench enumerate --impl "$impl" --output "$output" --batch "$batch" \
        --check --json "$out/enumerate_${impl}_${output}_b${batch}.json" \
        || echo "  failed (recorded as missing in summary.md)"
    done
  done
done
for batch in 1 256 4096; do
  echo "e2e batch $batch"
  "$py" -m hyset_jax.cli bench e2e --tools 13860 --dim 768 --batch "$batch" \
    --json "$out/e2e_b${batch}.json" || echo "  failed"
done
echo "full suite"
"$py" -m benchmarks.run_all --out "$out/suite" --skip allocator || echo "  suite failed"

"$py" - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
lines = ["# hyset-jax on GPU", ""]
rows = [json.loads(p.read_text()) for p in sorted(out.glob("enumerate_*.json"))]
if rows:
  lines += [f"Machine: {rows[0]['machine']}", "",
            "| impl | output | batch | queries/s | subsets/s | compile s | max diff vs NumPy |",
            "|---|---|---:|---:|---:|---:|---:|"]
  for r in rows:
    lines.append(f"| {r['impl']} | {r['output']} | {r['batch']} | {r.get('queries_per_s', 0):,.0f} "
                 f"| {r.get('subsets_per_s', 0):,.0f} | {r.get('compile_s') or 0:.2f} | "
                 f"{r.get('max_abs_diff_vs_numpy', float('nan')):.1e} |")
e2e = [json.loads(p.read_text()) for p in sorted(out.glob("e2e_*.json"))]
if e2e:
  lines += ["", "| e2e batch | ms / query | dense ms / query | × dense |", "|---:|---:|---:|---:|"]
  for r in sorted(e2e, key=lambda r: r["batch"]):
    lines.append(f"| {r['batch']} | {r['ms_per_query']:.4f} | {r['dense_ms_per_query']:.4f} | "
                 f"{r['ratio_to_dense']:.2f} |")
(out / "summary.md").write_text("\n".join(lines) + "\n")
print(f"wrote {out / 'summary.md'}")
PY
