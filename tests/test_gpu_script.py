"""benchmarks/gpu.sh --cpu-smoke: every step of the GPU script (the enumerate runs, the Pallas
kernel's included, the end-to-end run, the suite's arguments, the summary table) at toy sizes on
the CPU, so that the script works the day a GPU is available; and the peer comparison's training
leg, our side (benchmarks/peer_train.py)."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.heavy
def test_gpu_script_cpu_smoke(tmp_path):
  out = tmp_path / "gpu"
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one real CPU device
  env["HYSET_PYTHON"] = sys.executable
  done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh"), "--cpu-smoke", str(out)],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
  assert "failed" not in done.stdout, done.stdout
  for output in ("best", "scores"):
    r = json.loads((out / f"enumerate_jax-pallas_{output}_b16.json").read_text())
    assert r["status"] == "ok" and r["method"] == "pallas" and r["output"] == output
    assert (r["k_pool"], r["max_size"], r["batch"]) == (8, 3, 16)
    assert r["queries_per_s"] > 0 and r["max_abs_diff_vs_numpy"] < 1e-5
  e2e = json.loads((out / "e2e_b4.json").read_text())
  assert e2e["method"] == "pallas" and e2e["ms_per_query"] > 0 and e2e["num_tools"] == 300
  summary = (out / "summary.md").read_text()
  assert summary.startswith("# hyset-jax speed (cpu backend)")
  assert "| jax-pallas | pallas | best | 8 | 3 | 16 |" in summary
  assert "| jax-pallas | pallas | scores | 8 | 3 | 16 |" in summary
  assert "| 4 | pallas | 300 | 16 |" in summary
  assert "Full suite: not run" in summary
  # The peer comparison's training leg, our side (the authors' needs torch).
  train = json.loads((out / "peer_train_ours.json").read_text())
  assert (train["batch_size"], train["k_neg"], train["max_size"]) == (8, 64, 5)
  assert len(train["s_per_step"]) == 1 and train["s_per_step"][0] > 0
  assert train["peak_rss_bytes"] > 0
  assert "Peer training leg (ours only, batch 8):" in summary


def test_gpu_script_rejects_a_missing_out_dir():
  done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh"), "--cpu-smoke"], cwd=ROOT,
                        capture_output=True, text=True, timeout=60)
  assert done.returncode != 0 and "usage: benchmarks/gpu.sh" in done.stderr
