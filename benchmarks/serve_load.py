"""``hyset serve`` under load: N concurrent clients on 127.0.0.1 against one client at a time.

Starts ``hyset serve`` as a real process on a free port (or uses ``--url``), then for each
scenario runs closed-loop clients for ``--seconds`` — each client sends one request
(``{"query": text}``, texts cycled from a BEIR queries file), waits for the answer, sends the
next. Every request sent is accounted for: answered 200, answered with an error status
(``errors``), or never answered (connection reset, timeout: ``lost``).

Scenarios (one server process each, so batching settings differ):

- ``sequential``: 1 client, the server's default batching — the reference;
- ``concurrent, no batching``: N clients, ``--max-batch 1`` (one device call per query);
- ``concurrent, micro-batched``: N clients, ``--max-batch B --max-wait-ms W``.

Reported per scenario: requests, queries/s and its ratio to ``sequential`` (same run, same
machine: the only comparison that holds on a shared CPU), p50 / p99 latency, errors, lost, and
the mean device batch from ``/healthz``. Writes ``<out>.json`` and ``<out>.md``.

  python -m benchmarks.serve_load --model runs/toollens --clients 16 --seconds 20
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

from benchmarks import provenance

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_QUERIES = REPO / ".." / "shared" / "data" / "toollens" / "queries.jsonl"


def read_texts(path: pathlib.Path, limit: int = 2000) -> list[str]:
  texts = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      if line.strip():
        texts.append(json.loads(line)["text"])
      if len(texts) >= limit:
        break
  return texts


def free_port() -> int:
  import socket
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def health(url: str) -> dict:
  with urllib.request.urlopen(url + "/healthz", timeout=10) as r:
    return json.loads(r.read())


def start_server(model: str, tools: list[str], flags: list[str]) -> tuple[subprocess.Popen, str]:
  port = free_port()
  cmd = [sys.executable, "-m", "hyset_jax.cli", "serve", "--model", model, "--port", str(port),
         *sum((["--tools", t] for t in tools), []), *flags]
  proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
  url = f"http://127.0.0.1:{port}"
  deadline = time.monotonic() + 600
  while time.monotonic() < deadline:
    if proc.poll() is not None:
      raise SystemExit(f"server exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
    try:
      health(url)
      return proc, url
    except OSError:
      time.sleep(0.5)
  proc.kill()
  raise SystemExit("server did not come up in 600 s")


def stop_server(proc: subprocess.Popen) -> None:
  proc.terminate()
  try:
    proc.wait(timeout=60)
  except subprocess.TimeoutExpired:
    proc.kill()


def load(url: str, texts: list[str], clients: int, seconds: float, timeout: float) -> dict:
  """Closed-loop clients for ``seconds``; returns counts and latencies."""
  host, port = url.removeprefix("http://").split(":")
  stop_at = time.monotonic() + seconds
  lock = threading.Lock()
  stats = {"sent": 0, "ok": 0, "errors": 0, "lost": 0, "latencies": []}

  def client(k: int) -> None:
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    i = k * 7919
    local = {"sent": 0, "ok": 0, "errors": 0, "lost": 0, "latencies": []}
    while time.monotonic() < stop_at:
      body = json.dumps({"query": texts[i % len(texts)]})
      i += 1
      local["sent"] += 1
      start = time.perf_counter()
      try:
        conn.request("POST", "/v1/retrieve", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        payload = resp.read()
        elapsed = time.perf_counter() - start
        if resp.status == 200 and json.loads(payload)["results"]:
          local["ok"] += 1
          local["latencies"].append(elapsed)
        else:
          local["errors"] += 1
      except (OSError, http.client.HTTPException):
        local["lost"] += 1
        conn.close()
        conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    conn.close()
    with lock:
      for key in ("sent", "ok", "errors", "lost"):
        stats[key] += local[key]
      stats["latencies"].extend(local["latencies"])

  threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
  began = time.perf_counter()
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  stats["wall_s"] = time.perf_counter() - began
  return stats


def percentile(xs: list[float], q: float) -> float:
  if not xs:
    return float("nan")
  xs = sorted(xs)
  return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def scenario(name: str, model: str, tools: list[str], flags: list[str], clients: int,
             texts: list[str], seconds: float, timeout: float) -> dict:
  print(f"[{name}] starting server {' '.join(flags)}", file=sys.stderr, flush=True)
  proc, url = start_server(model, tools, flags)
  try:
    load(url, texts, clients, min(3.0, seconds), timeout)  # warm: encoder shapes compile
    before = health(url)["batching"]
    print(f"[{name}] {clients} clients for {seconds:.0f} s", file=sys.stderr, flush=True)
    s = load(url, texts, clients, seconds, timeout)
    after = health(url)["batching"]
  finally:
    stop_server(proc)
  batches = after["batches"] - before["batches"]
  queries = after["queries"] - before["queries"]
  lat = s["latencies"]
  row = {"scenario": name, "clients": clients, "flags": " ".join(flags),
         "requests": s["sent"], "ok": s["ok"], "errors": s["errors"], "lost": s["lost"],
         "queries_per_s": s["ok"] / s["wall_s"],
         "p50_ms": 1000 * percentile(lat, 0.5), "p99_ms": 1000 * percentile(lat, 0.99),
         "mean_ms": 1000 * statistics.fmean(lat) if lat else float("nan"),
         "mean_device_batch": queries / batches if batches else 0.0, "wall_s": s["wall_s"]}
  print(f"[{name}] {row['queries_per_s']:.1f} q/s, p50 {row['p50_ms']:.1f} ms, "
        f"p99 {row['p99_ms']:.1f} ms, errors {row['errors']}, lost {row['lost']}",
        file=sys.stderr, flush=True)
  return row


def markdown(rows: list[dict], meta: dict) -> str:
  ref = rows[0]["queries_per_s"]
  lines = [f"`{meta['command']}` — {meta['date']}, {meta['machine']}; model {meta['model']} "
           f"({meta['tools']} tools), {meta['seconds']:.0f} s per scenario, queries from "
           f"{meta['queries']}.", "",
           "| scenario | clients | server flags | requests | q/s | × sequential | p50 ms | "
           "p99 ms | errors | lost | mean device batch |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['scenario']} | {r['clients']} | `{r['flags']}` | {r['requests']} | "
                 f"{r['queries_per_s']:.1f} | {r['queries_per_s'] / ref:.2f} | "
                 f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['errors']} | {r['lost']} | "
                 f"{r['mean_device_batch']:.2f} |")
  return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--model", required=True, help="model directory or `hyset train` workdir")
  p.add_argument("--tools", action="append", default=[], help="passed to hyset serve --tools")
  p.add_argument("--queries", default=str(DEFAULT_QUERIES), help="BEIR queries.jsonl")
  p.add_argument("--clients", type=int, default=16)
  p.add_argument("--seconds", type=float, default=20.0)
  p.add_argument("--max-batch", type=int, default=32)
  p.add_argument("--max-wait-ms", type=float, default=5.0)
  p.add_argument("--timeout", type=float, default=60.0, help="client timeout per request, s")
  p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "serve_load"))
  args = p.parse_args(argv)

  from hyset_jax.io import modeldir
  # Read the model first: a bad path fails here, not after a minute of scenarios.
  n_tools = len(modeldir.load_model_dir(modeldir.best_model_dir(args.model)).tool_ids)
  texts = read_texts(pathlib.Path(args.queries))
  batched = ["--max-batch", str(args.max_batch), "--max-wait-ms", str(args.max_wait_ms)]
  rows = [
      scenario("sequential", args.model, args.tools, batched, 1, texts, args.seconds,
               args.timeout),
      scenario("concurrent, no batching", args.model, args.tools,
               ["--max-batch", "1", "--max-wait-ms", "0"], args.clients, texts, args.seconds,
               args.timeout),
      scenario("concurrent, micro-batched", args.model, args.tools, batched, args.clients,
               texts, args.seconds, args.timeout),
  ]
  import jax

  meta = {"command": "python -m benchmarks.serve_load " + " ".join(argv or sys.argv[1:]),
          "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
          "machine": f"{platform.processor() or platform.machine()}, "
                     f"{os.cpu_count()} CPU cores (shared), JAX backend {jax.default_backend()}",
          "model": args.model, "tools": n_tools, "seconds": args.seconds,
          "queries": args.queries}
  out = pathlib.Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  provenance.write_json(out.with_suffix(".json"), {"meta": meta, "rows": rows}, meta["command"])
  table = markdown(rows, meta)
  out.with_suffix(".md").write_text(table)
  print(table)
  return 0


if __name__ == "__main__":
  sys.exit(main())
