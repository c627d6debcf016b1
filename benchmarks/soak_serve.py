"""A soak of ``hyset serve``: N clients for M minutes, HTTP and MCP mixed, bad requests,
catalogue updates every minute; every request accounted for, memory and latency over time.

Starts two real server processes on 127.0.0.1 over the same model — the HTTP API
(``hyset serve``, with ``--persist`` so every update is also written to disk) and the MCP server
(``hyset serve --mcp http --mcp-update-tools``, streamable HTTP at ``/mcp``): one process serves
one protocol. Then ``--clients`` closed-loop client threads each send, one after another,

- ``http``: ``POST /v1/retrieve {"query": text}`` (200 with one result expected);
- ``mcp``: a ``tools/call`` of ``search_tools`` in the client's own MCP session (a result that
  is not ``isError``, holding the retrieved tools);
- ``http_bad`` / ``mcp_bad`` (``--bad-share`` of the requests): an empty query, ``max_size`` 99,
  a body that is not JSON, an unknown field, a catalogue update removing an unknown id, an
  unknown path; an MCP call with an empty query, ``max_size`` 99 or an update removing an
  unknown id. Each has its expected answer (a 4xx naming the field; an MCP tool error naming
  the argument); getting it is counted as ``ok``.

Every ``--update-every`` seconds the same catalogue update goes to both servers (``POST
/v1/tools``; MCP ``update_tools``): two tools added, the two the previous update added
removed, so the library keeps one size after the first update (whose new shapes compile
during the warm-up). Each request is ``ok`` (the expected answer), an ``error`` (another answer:
a 5xx, a wrong status, a malformed body, a catalogue version that is not the latest one
answered or a later one) or ``lost`` (no answer: a reset connection, a timeout).

Each server's resident memory (``VmRSS`` from ``/proc/PID/status``) is sampled every
``--sample-every`` seconds; the baseline is taken when the warm-up (``--warmup`` seconds of the
same load, the first two updates included) ends. Reported: requests by kind, memory at the baseline
and at the end, the largest growth, p50 / p99 latency per ``--bucket`` seconds; at the end the
persisted model directory must hold the library the HTTP server serves. Writes
``<out>.json`` (with provenance), ``<out>.md`` and ``<out>.png`` (latency and memory over time).
Exit status 1 when any request was an error or lost.

  python -m benchmarks.soak_serve --minutes 30              # the README's run (16 clients)
  python -m benchmarks.soak_serve --quick                   # 0.2 min, 4 clients: a smoke run

Without ``--model`` it serves ``runs/soak-tiny``, training it first when missing (``hyset train
--config tiny --workdir runs/soak-tiny``, ~30 s on 2 cores).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import http.client
import json
import math
import pathlib
import random
import subprocess
import sys
import tempfile
import threading
import time

from benchmarks import provenance
from benchmarks.serve_load import (DEFAULT_QUERIES, free_port, health, percentile, read_texts,
                                   stop_server)

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_MODEL = REPO / "runs" / "soak-tiny"
MCP_PROTOCOL = "2025-06-18"
GOOD_KINDS = ("http", "mcp")
KINDS = ("http", "mcp", "http_bad", "mcp_bad", "update_http", "update_mcp")


# --------------------------------------------------------------------------- clients

class Lost(Exception):
  """No answer: the connection broke or timed out."""


# uvicorn closes a keep-alive connection idle for 5 s; a client reopens one idle for longer than
# this (as HTTP client libraries do) rather than count the server's close as a lost request.
IDLE_REOPEN_S = 2.0


class Connection:
  """One keep-alive connection to 127.0.0.1:``port``, reopened when idle or broken."""

  def __init__(self, port: int, timeout: float):
    self.port, self.timeout = port, timeout
    self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    self.last_used = time.monotonic()

  def send(self, method: str, path: str, body: bytes | None,
           headers: dict) -> http.client.HTTPResponse:
    """The response, its body read (``.payload``); Lost when no answer came."""
    if time.monotonic() - self.last_used > IDLE_REOPEN_S:
      self.conn.close()  # http.client connects again on the next request
    try:
      self.conn.request(method, path, body, headers)
      resp = self.conn.getresponse()
      resp.payload = resp.read()
    except (OSError, http.client.HTTPException) as e:
      self.conn.close()
      raise Lost(repr(e)) from None
    finally:
      self.last_used = time.monotonic()
    return resp

  def close(self) -> None:
    self.conn.close()


class HttpClient(Connection):
  """The HTTP API over one :class:`Connection`."""

  def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, object]:
    """(status, parsed JSON body or None); Lost when no answer came."""
    resp = self.send(method, path, body, {"Content-Type": "application/json"})
    try:
      return resp.status, json.loads(resp.payload)
    except ValueError:
      return resp.status, None


class McpClient:
  """An MCP session over streamable HTTP (``/mcp``), spoken directly: ``initialize``, the
  ``initialized`` notification, then ``tools/call`` requests whose answers come as JSON or as
  one server-sent event. The SDK's client is asynchronous; a thread per client keeps this
  soak's clients alike."""

  def __init__(self, port: int, timeout: float):
    self.conn = Connection(port, timeout)
    self.next_id = 0
    self._connect()

  def _connect(self) -> None:
    self.session = None
    init = self._rpc("initialize", {"protocolVersion": MCP_PROTOCOL, "capabilities": {},
                                    "clientInfo": {"name": "soak", "version": "1"}})
    if "result" not in init:
      raise Lost(f"initialize answered {init}")
    self._post({"jsonrpc": "2.0", "method": "notifications/initialized"})

  def _post(self, message: dict) -> tuple[int, bytes, str]:
    headers = {"Content-Type": "application/json", "mcp-protocol-version": MCP_PROTOCOL,
               "Accept": "application/json, text/event-stream"}
    if self.session:
      headers["mcp-session-id"] = self.session
    resp = self.conn.send("POST", "/mcp", json.dumps(message).encode(), headers)
    self.session = resp.getheader("mcp-session-id") or self.session
    return resp.status, resp.payload, resp.getheader("content-type") or ""

  def _rpc(self, method: str, params: dict) -> dict:
    self.next_id += 1
    status, payload, kind = self._post({"jsonrpc": "2.0", "id": self.next_id,
                                        "method": method, "params": params})
    if kind.startswith("text/event-stream"):
      for line in payload.decode("utf-8", "replace").splitlines():
        if line.startswith("data:"):
          message = json.loads(line[5:])
          if message.get("id") == self.next_id:
            return message
      return {"http_status": status, "body": payload[:200].decode("utf-8", "replace")}
    try:
      return json.loads(payload)
    except ValueError:
      return {"http_status": status, "body": payload[:200].decode("utf-8", "replace")}

  def call_tool(self, name: str, arguments: dict) -> dict:
    """The JSON-RPC answer to ``tools/call``; Lost (and a new session next time) when none."""
    try:
      return self._rpc("tools/call", {"name": name, "arguments": arguments})
    except Lost:
      self._connect()  # the next call gets a fresh session
      raise

  def close(self) -> None:
    self.conn.close()


# --------------------------------------------------------------------------- requests

def _http_bad(case: int) -> tuple[str, str, bytes, int, str | None]:
  """(method, path, body, expected status, expected error field) of bad HTTP request ``case``."""
  cases = [("POST", "/v1/retrieve", {"query": ""}, 422, "query"),
           ("POST", "/v1/retrieve", {"query": "find a recipe", "max_size": 99}, 422,
            "max_size"),
           ("POST", "/v1/retrieve", b"{not json", 400, "body"),
           ("POST", "/v1/retrieve", {"qeury": "typo"}, 422, "qeury"),
           ("POST", "/v1/tools", {"remove": ["no-such-tool"]}, 422, "remove[0]"),
           ("GET", "/v1/nothing", None, 404, None)]
  method, path, body, status, field = cases[case % len(cases)]
  raw = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
  return method, path, raw, status, field


def _mcp_bad(case: int) -> tuple[str, dict, str]:
  """(tool, arguments, a word the tool error must hold) of bad MCP call ``case``."""
  cases = [("search_tools", {"query": "   "}, "query"),
           ("search_tools", {"query": "find a recipe", "max_size": 99}, "max_size"),
           ("update_tools", {"remove": ["no-such-tool"]}, "remove[0]")]
  return cases[case % len(cases)]


@dataclasses.dataclass
class Tally:
  """Counts per kind, latencies of the good requests and the first few errors (thread-safe)."""
  counts: dict = dataclasses.field(default_factory=lambda: {
      k: {"sent": 0, "ok": 0, "errors": 0, "lost": 0} for k in KINDS})
  latencies: list = dataclasses.field(default_factory=list)  # (t since start, s, kind)
  examples: list = dataclasses.field(default_factory=list)
  lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

  def add(self, kind: str, outcome: str, t: float, latency: float, detail: str = "") -> None:
    with self.lock:
      self.counts[kind]["sent"] += 1
      self.counts[kind][outcome] += 1
      if outcome == "ok" and kind in GOOD_KINDS:
        self.latencies.append((t, latency, kind))
      if outcome != "ok" and len(self.examples) < 20:
        self.examples.append(f"{kind} at {t:.1f} s: {outcome}: {detail[:300]}")


class Versions:
  """The catalogue versions the updates have reached on each server (answers must not be
  older than the latest update answered before they were sent)."""

  def __init__(self):
    self.done = {"http": 1, "mcp": 1}


def check_http(status: int, body, sent_version: int) -> str | None:
  """None for a good /v1/retrieve answer, else what is wrong with it."""
  if status != 200 or not isinstance(body, dict):
    return f"status {status}: {str(body)[:200]}"
  results = body.get("results")
  if not isinstance(results, list) or len(results) != 1 or "set" not in results[0]:
    return f"malformed answer {str(body)[:200]}"
  if body.get("catalogue_version", 0) < sent_version:
    return f"catalogue version {body.get('catalogue_version')} < {sent_version}, answered " \
           f"before the request was sent"
  return None


def check_mcp(answer: dict) -> str | None:
  result = answer.get("result")
  if not isinstance(result, dict) or result.get("isError"):
    return f"answer {str(answer)[:300]}"
  content = result.get("structuredContent") or {}
  if not isinstance(content.get("tools"), list) or not isinstance(content.get("ranking"), list):
    return f"malformed result {str(result)[:300]}"
  return None


def client_loop(k: int, ports: dict, texts: list[str], tally: Tally, versions: Versions,
                start: float, stop: threading.Event, bad_share: float, timeout: float) -> None:
  """Client ``k``: closed-loop requests of every kind until ``stop``."""
  rng = random.Random(k)
  web = HttpClient(ports["http"], timeout)
  try:
    mcp = McpClient(ports["mcp"], timeout)
  except Lost as e:
    tally.add("mcp", "lost", time.monotonic() - start, 0.0, f"initialize: {e}")
    return
  try:
    while not stop.is_set():
      bad = rng.random() < bad_share
      kind = ("http" if rng.random() < 0.5 else "mcp") + ("_bad" if bad else "")
      text = rng.choice(texts)
      t0 = time.monotonic()
      version = versions.done["http"]
      try:
        problem = _one(kind, web, mcp, text, rng.randrange(1 << 30), version)
      except Lost as e:
        tally.add(kind, "lost", t0 - start, 0.0, str(e))
        continue
      tally.add(kind, "errors" if problem else "ok", t0 - start, time.monotonic() - t0,
                problem or "")
  finally:
    web.close()
    mcp.close()


def _one(kind: str, web: HttpClient, mcp: McpClient, text: str, case: int,
         version: int) -> str | None:
  """Send one request of ``kind``; None when it got its expected answer, else the problem."""
  if kind == "http":
    status, body = web.request("POST", "/v1/retrieve", json.dumps({"query": text}).encode())
    return check_http(status, body, version)
  if kind == "mcp":
    return check_mcp(mcp.call_tool("search_tools", {"query": text}))
  if kind == "http_bad":
    method, path, body, expected, field = _http_bad(case)
    status, answer = web.request(method, path, body)
    got = answer.get("error", {}).get("field") if isinstance(answer, dict) else None
    if status != expected or (field is not None and got != field):
      return f"{method} {path} {body!r}: expected {expected} ({field}), got {status} {answer}"
    return None
  tool, arguments, word = _mcp_bad(case)
  answer = mcp.call_tool(tool, arguments)
  result = answer.get("result") or {}
  message = " ".join(c.get("text", "") for c in result.get("content", []))
  if not result.get("isError") or word not in message or "internal error" in message:
    return f"{tool} {arguments}: expected a tool error naming {word}, got {str(answer)[:300]}"
  return None


def update_body(u: int) -> dict:
  """Update ``u``: two tools added, the two of update ``u - 1`` removed (so the library keeps
  one size after the first update and no new shape compiles)."""
  add = [{"id": f"soak{u}_{j}", "name": f"soak_tool_{u}_{j}",
          "description": f"Plan a meal with recipes using the ingredient number {u}.",
          "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}
         for j in range(2)]
  return {"add": add, **({"remove": [f"soak{u - 1}_{j}" for j in range(2)]} if u else {})}


def apply_update(u: int, web: HttpClient, mcp: McpClient, tally: Tally, versions: Versions,
                 start: float) -> None:
  """Update ``u`` on both servers; each must answer version ``u + 2``."""
  body = update_body(u)
  t0 = time.monotonic()
  try:
    status, answer = web.request("POST", "/v1/tools", json.dumps(body).encode())
    ok = status == 200 and isinstance(answer, dict) and answer.get("version") == u + 2
    tally.add("update_http", "ok" if ok else "errors", t0 - start, time.monotonic() - t0,
              f"{status} {answer}")
    if ok:
      versions.done["http"] = u + 2
  except Lost as e:
    tally.add("update_http", "lost", t0 - start, 0.0, str(e))
  t0 = time.monotonic()
  try:
    answer = mcp.call_tool("update_tools", body)
    content = (answer.get("result") or {}).get("structuredContent") or {}
    ok = not (answer.get("result") or {}).get("isError") and content.get("version") == u + 2
    tally.add("update_mcp", "ok" if ok else "errors", t0 - start, time.monotonic() - t0,
              str(answer)[:300])
    if ok:
      versions.done["mcp"] = u + 2
  except Lost as e:
    tally.add("update_mcp", "lost", t0 - start, 0.0, str(e))


# --------------------------------------------------------------------------- servers, memory

def rss_mib(pid: int) -> float | None:
  """Resident memory of process ``pid`` in MiB (``VmRSS``), None once it is gone."""
  try:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) / 1024
  except (OSError, ValueError):
    pass
  return None


def start(servers: dict[str, list[str]], workdir: pathlib.Path,
          timeout: float = 600) -> dict[str, tuple[subprocess.Popen, int]]:
  """``hyset serve ARGS`` for each name's ARGS, started together, each on a free port with its
  output to ``workdir/NAME.log`` (a pipe would fill up and stall a server in a long run);
  returns {name: (process, port)} once every ``/healthz`` answers."""
  started = {}
  for name, args in servers.items():
    port = free_port()
    with open(workdir / f"{name}.log", "w") as out:
      started[name] = (subprocess.Popen(
          [sys.executable, "-m", "hyset_jax.cli", "serve", *args, "--host", "127.0.0.1",
           "--port", str(port)], cwd=REPO, stdout=out, stderr=subprocess.STDOUT), port)
  deadline = time.monotonic() + timeout
  waiting = dict(started)
  while waiting and time.monotonic() < deadline:
    for name, (proc, port) in list(waiting.items()):
      if proc.poll() is not None:
        for other, _ in started.values():
          stop_server(other)
        raise SystemExit(f"hyset serve ({name}) exited with {proc.returncode}:\n"
                         f"{(workdir / f'{name}.log').read_text()[-3000:]}")
      with contextlib.suppress(OSError):
        health(f"http://127.0.0.1:{port}")
        del waiting[name]
    time.sleep(0.3)
  if waiting:
    for proc, _ in started.values():
      stop_server(proc)
    raise SystemExit(f"hyset serve ({', '.join(waiting)}) did not answer /healthz in "
                     f"{timeout:.0f} s")
  return started


def sample_memory(pids: dict, samples: list, start_t: float, every: float,
                  stop: threading.Event) -> None:
  while True:
    samples.append((time.monotonic() - start_t, *(rss_mib(p) for p in pids.values())))
    if stop.wait(every):
      samples.append((time.monotonic() - start_t, *(rss_mib(p) for p in pids.values())))
      return


def ensure_model(model: str | None) -> str:
  """``model``, or runs/soak-tiny (trained with the tiny ToolLens preset when missing)."""
  if model:
    return model
  if not (DEFAULT_MODEL / "best" / "manifest.json").exists():
    print(f"training {DEFAULT_MODEL} (hyset train --config tiny) ...", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "hyset_jax.cli", "train", "--config", "tiny",
                    "--workdir", str(DEFAULT_MODEL), "--no-progress"], cwd=REPO, check=True)
  return str(DEFAULT_MODEL)


# --------------------------------------------------------------------------- the run

def soak(model: str, tools: list[str], texts: list[str], *, minutes: float, clients: int,
         warmup: float, update_every: float, sample_every: float, bad_share: float,
         timeout: float, warm_up: bool, workdir: pathlib.Path) -> dict:
  """Run the soak; returns counts, memory samples, latencies and update times."""
  common = ["--model", model, *sum((["--tools", t] for t in tools), []),
            "--max-batch", "32", "--max-wait-ms", "5", *(() if warm_up else ("--no-warm-up",))]
  persist = workdir / "persisted"
  print("starting the HTTP and MCP servers ...", file=sys.stderr, flush=True)
  started = start({"http": [*common, "--persist", str(persist)],
                   "mcp": [*common, "--mcp", "http", "--mcp-update-tools"]}, workdir)
  procs = {name: proc for name, (proc, _) in started.items()}
  ports = {name: port for name, (_, port) in started.items()}
  web_port, mcp_port = ports["http"], ports["mcp"]
  tally, versions, samples = Tally(), Versions(), []
  stop, stop_memory = threading.Event(), threading.Event()
  t_start = time.monotonic()
  sampler = threading.Thread(target=sample_memory, daemon=True,
                             args=({k: p.pid for k, p in procs.items()}, samples, t_start,
                                   sample_every, stop_memory))
  threads = [threading.Thread(target=client_loop, args=(k, ports, texts, tally, versions,
                                                        t_start, stop, bad_share, timeout))
             for k in range(clients)]
  update_times: list[float] = []
  exits = {}
  try:
    sampler.start()
    for t in threads:
      t.start()
    web, mcp = HttpClient(web_port, timeout), McpClient(mcp_port, timeout)
    # The warm-up holds updates 0 and 1: update 0 compiles the new library size, update 1 is
    # the first to replace a library of that size (an earlier run, whose baseline came before
    # it, saw the servers' memory step up once there and then stay flat). The memory baseline
    # is taken after both.
    update_times.append(time.monotonic() - t_start)
    apply_update(0, web, mcp, tally, versions, t_start)
    while time.monotonic() < t_start + warmup / 2:
      time.sleep(0.2)
    update_times.append(time.monotonic() - t_start)
    apply_update(1, web, mcp, tally, versions, t_start)
    while time.monotonic() < t_start + warmup:
      time.sleep(0.2)
    baseline_t = time.monotonic() - t_start
    end = time.monotonic() + minutes * 60
    u = 2
    next_update = time.monotonic() + update_every
    while time.monotonic() < end:
      if time.monotonic() >= next_update:
        update_times.append(time.monotonic() - t_start)
        apply_update(u, web, mcp, tally, versions, t_start)
        u += 1
        next_update += update_every
      time.sleep(0.2)
    stop.set()
    for t in threads:
      t.join(timeout=timeout + 30)
    end_t = time.monotonic() - t_start
    stop_memory.set()
    sampler.join(timeout=30)
    served = web.request("GET", "/v1/tools")[1]
    mcp_health = health(f"http://127.0.0.1:{mcp_port}")
    web.close()
    mcp.close()
  finally:
    stop.set()
    stop_memory.set()
    for name, proc in procs.items():
      stop_server(proc)
      exits[name] = proc.returncode
  from hyset_jax.io import modeldir
  on_disk = list(modeldir.load_model_dir(persist).tool_ids)
  served_ids = [t["id"] for t in served["tools"]]
  if on_disk != served_ids:
    tally.examples.append(f"persisted model: {len(on_disk)} tools, ending {on_disk[-3:]}; "
                          f"served: {len(served_ids)}, ending {served_ids[-3:]}")
  return {"counts": tally.counts, "examples": tally.examples, "latencies": tally.latencies,
          "samples": samples, "baseline_t": baseline_t, "end_t": end_t,
          "update_times": update_times, "updates": u,
          "final_versions": {"http": served["version"], "mcp": mcp_health["catalogue_version"]},
          "persisted_matches": on_disk == served_ids, "tools": len(served_ids),
          "server_exits": exits}


def _ms(xs: list[float], q: float) -> float | None:
  """The ``q`` quantile of ``xs`` (seconds) in ms; None for no sample (JSON has no NaN)."""
  value = percentile(xs, q)
  return None if math.isnan(value) else 1000 * value


def _fmt(ms: float | None) -> str:
  return "–" if ms is None else f"{ms:.0f}"


def summarise(run: dict, bucket: float) -> dict:
  """Totals, memory growth and latency per bucket from :func:`soak`'s record."""
  counts = run["counts"]
  total = {k: sum(c[k] for c in counts.values()) for k in ("sent", "ok", "errors", "lost")}
  memory = {}
  for i, name in enumerate(("http", "mcp"), start=1):
    after = [s[i] for s in run["samples"] if s[0] >= run["baseline_t"] and s[i] is not None]
    if not after:
      continue
    base, last, middle = after[0], after[-1], after[len(after) // 2]
    memory[name] = {"baseline_mib": base, "end_mib": last, "max_mib": max(after),
                    "growth_pct": 100 * (last - base) / base,
                    "max_growth_pct": 100 * (max(after) - base) / base,
                    # A leak keeps growing; a pool warming up flattens: the second half says.
                    "second_half_growth_pct": 100 * (last - middle) / middle}
  buckets = []
  t, end = run["baseline_t"], run["end_t"]
  while t < end - bucket / 4:  # a last sliver of a bucket is left out
    row = {"from_s": t - run["baseline_t"], "to_s": min(t + bucket, end) - run["baseline_t"]}
    for kind in GOOD_KINDS:
      lat = [x for s, x, k in run["latencies"] if k == kind and t <= s < t + bucket]
      row[kind] = {"n": len(lat), "p50_ms": _ms(lat, 0.5), "p99_ms": _ms(lat, 0.99)}
    buckets.append(row)
    t += bucket
  measured = [x for s, x, _ in run["latencies"] if s >= run["baseline_t"]]
  return {"total": total, "by_kind": counts, "memory": memory, "buckets": buckets,
          "p50_ms": _ms(measured, 0.5), "p99_ms": _ms(measured, 0.99),
          "requests_per_s": len(measured) / max(1e-9, run["end_t"] - run["baseline_t"])}


def markdown(meta: dict, summary: dict, run: dict) -> str:
  total, mem = summary["total"], summary["memory"]
  lines = [f"`{meta['command']}` — {meta['date']}, {meta['machine']}; model {meta['model']} "
           f"({run['tools']} tools after the updates); {meta['clients']} clients for "
           f"{meta['minutes']:g} min after a {meta['warmup_s']:g} s warm-up, a catalogue update "
           f"every {meta['update_every_s']:g} s ({run['updates']} in all), "
           f"{100 * meta['bad_share']:g}% bad requests. {meta['note']}", "",
           f"**{total['sent']} requests: {total['ok']} answered as expected, "
           f"{total['errors']} errors, {total['lost']} lost.** Good requests: "
           f"{summary['requests_per_s']:.1f}/s, p50 {_fmt(summary['p50_ms'])} ms, "
           f"p99 {_fmt(summary['p99_ms'])} ms. Persisted model = served library: "
           f"{run['persisted_matches']}.", "",
           "| kind | sent | ok | errors | lost |", "|---|---|---|---|---|"]
  for kind, c in summary["by_kind"].items():
    lines.append(f"| {kind} | {c['sent']} | {c['ok']} | {c['errors']} | {c['lost']} |")
  lines += ["", "| server | RSS at baseline MiB | at end MiB | max MiB | growth % | "
                "max growth % | growth in the 2nd half % |", "|---|---|---|---|---|---|---|"]
  for name, m in mem.items():
    lines.append(f"| {name} | {m['baseline_mib']:.0f} | {m['end_mib']:.0f} | "
                 f"{m['max_mib']:.0f} | {m['growth_pct']:+.1f} | {m['max_growth_pct']:+.1f} | "
                 f"{m['second_half_growth_pct']:+.1f} |")
  lines += ["", "| from s | to s | http n | http p50 ms | http p99 ms | mcp n | mcp p50 ms | "
                "mcp p99 ms |", "|---|---|---|---|---|---|---|---|"]
  for b in summary["buckets"]:
    h, m = b["http"], b["mcp"]
    lines.append(f"| {b['from_s']:.0f} | {b['to_s']:.0f} | {h['n']} | {_fmt(h['p50_ms'])} | "
                 f"{_fmt(h['p99_ms'])} | {m['n']} | {_fmt(m['p50_ms'])} | "
                 f"{_fmt(m['p99_ms'])} |")
  if run["examples"]:
    lines += ["", "First problems:", "", *[f"- {e}" for e in run["examples"]]]
  return "\n".join(lines) + "\n"


def plot(path: pathlib.Path, summary: dict, run: dict) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  base = run["baseline_t"]
  fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
  for kind, colour in (("http", "tab:blue"), ("mcp", "tab:orange")):
    mid = [(b["from_s"] + b["to_s"]) / 2 / 60 for b in summary["buckets"]]
    for q, style in (("p50", "-o"), ("p99", "--")):
      ys = [math.nan if b[kind][f"{q}_ms"] is None else b[kind][f"{q}_ms"]
            for b in summary["buckets"]]
      top.plot(mid, ys, style, color=colour, ms=3, label=f"{kind} {q}")
  top.set_ylabel("latency (ms)")
  top.set_yscale("log")
  top.legend(fontsize=8, ncol=2)
  for i, name in enumerate(("http", "mcp"), start=1):
    pts = [((s[0] - base) / 60, s[i]) for s in run["samples"] if s[i] is not None]
    bottom.plot([p[0] for p in pts], [p[1] for p in pts], label=f"{name} server RSS")
  for t in run["update_times"]:
    for ax in (top, bottom):
      ax.axvline((t - base) / 60, color="grey", lw=0.5, alpha=0.5)
  bottom.axvline(0, color="black", lw=1, label="baseline (end of warm-up)")
  bottom.set_ylabel("resident memory (MiB)")
  bottom.set_xlabel("minutes after the warm-up (grey: catalogue updates)")
  bottom.legend(fontsize=8)
  fig.suptitle("hyset serve soak: latency per bucket and memory", fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--minutes", type=float, help="measured duration (default 30; --quick 0.2)")
  p.add_argument("--quick", action="store_true",
                 help="a smoke run: 0.2 min, 4 clients, short warm-up, buckets and update "
                      "interval (flags given explicitly still win)")
  p.add_argument("--model", help="model directory or hyset train workdir (default: "
                                 "runs/soak-tiny, trained when missing)")
  p.add_argument("--tools", action="append", default=[], help="passed to hyset serve --tools")
  p.add_argument("--queries", default=str(DEFAULT_QUERIES), help="BEIR queries.jsonl")
  p.add_argument("--clients", type=int)
  p.add_argument("--warmup", type=float, help="seconds of load before the baseline (60)")
  p.add_argument("--update-every", type=float, help="seconds between catalogue updates (60)")
  p.add_argument("--bucket", type=float, help="seconds per latency bucket (60)")
  p.add_argument("--sample-every", type=float, help="seconds between RSS samples (5)")
  p.add_argument("--no-warm-up", action="store_true",
                 help="start the servers with --no-warm-up (faster start; the first requests "
                      "compile, inside the warm-up period)")
  p.add_argument("--bad-share", type=float, default=0.1)
  p.add_argument("--timeout", type=float, default=60.0, help="client timeout per request, s")
  p.add_argument("--note", default="", help="a sentence for the report (e.g. the machine was "
                                            "shared)")
  p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "soak_serve"))
  args = p.parse_args(argv)
  quick = {"minutes": 0.2, "clients": 4, "warmup": 4.0, "update_every": 4.0, "bucket": 3.0,
           "sample_every": 0.5}
  full = {"minutes": 30.0, "clients": 16, "warmup": 60.0, "update_every": 60.0,
          "bucket": 60.0, "sample_every": 5.0}
  for key, value in (quick if args.quick else full).items():
    if getattr(args, key) is None:
      setattr(args, key, value)
  if not 0 <= args.bad_share <= 1 or args.clients < 1 or args.minutes <= 0:
    p.error("--bad-share must be in [0, 1], --clients ≥ 1 and --minutes > 0")
  queries = pathlib.Path(args.queries)
  if not queries.is_file():
    p.error(f"--queries {queries}: no such file (a BEIR queries.jsonl)")
  texts = read_texts(queries)
  model = ensure_model(args.model)
  out = pathlib.Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory(prefix="soak-serve-") as tmp:
    run = soak(model, args.tools, texts, minutes=args.minutes, clients=args.clients,
               warmup=args.warmup, update_every=args.update_every,
               sample_every=args.sample_every, bad_share=args.bad_share,
               timeout=args.timeout, warm_up=not args.no_warm_up, workdir=pathlib.Path(tmp))
  summary = summarise(run, args.bucket)
  command = provenance.command(argv)
  meta = {"command": command, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
          "machine": provenance.machine(), "model": model, "clients": args.clients,
          "minutes": args.minutes, "warmup_s": args.warmup,
          "update_every_s": args.update_every, "bad_share": args.bad_share,
          "note": args.note}
  doc = {"meta": meta, "summary": summary,
         "run": {k: v for k, v in run.items() if k not in ("latencies",)}}
  provenance.write_json(out.with_suffix(".json"), doc, command)
  table = markdown(meta, summary, run)
  out.with_suffix(".md").write_text(table, encoding="utf-8")
  plot(out.with_suffix(".png"), summary, run)
  print(table)
  total = summary["total"]
  return 1 if total["errors"] or total["lost"] or not run["persisted_matches"] else 0


if __name__ == "__main__":
  sys.exit(main())
