"""Shared by the serving tests: a small trained model that takes real text, and a live server.

The model is trained for real (:func:`hyset_jax.training.train.train_and_evaluate` on the synthetic data
of :mod:`hyset_jax.testing`, 384-d so the default MiniLM encoder feeds it) and its manifest
names that encoder, so ``hyset predict --queries`` and ``hyset serve`` run the whole text path.

The fixtures ``model_dir``, ``library`` and ``retriever`` are shared by the serving test modules
(``from serving import library, model_dir, retriever``). The model is trained once per test
process, not once per module: the tests only read it (tests/test_serve_catalogue.py checks that
its directory is left as it was), and a module whose heavy test runs first, apart from its
other tests, would otherwise set the module fixture up twice.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]

QUERIES = ["What is the weather in Paris tomorrow?", "send an email to my boss",
           "convert 100 dollars to euros and book a flight", "translate hello into German",
           "find a pizza place nearby", "play some jazz music"]


def train_tiny_model(workdir: pathlib.Path) -> pathlib.Path:
  """A trained 40-tool model (M = 3, K1 = 4, K_pool = 8) reading MiniLM query embeddings."""
  from hyset_jax import testing
  from hyset_jax.encoder import DEFAULT_MODEL_NAME
  from hyset_jax.training.train import train_and_evaluate
  data = dataclasses.replace(testing.synthetic_data(dim=384), query_encoder=DEFAULT_MODEL_NAME)
  # One device: serving is tested here, not the sharded step (its compile is half as long).
  train_and_evaluate(testing.small_config(), workdir, data=data, progress=False, num_devices=1)
  return workdir / "final"  # after the 12 steps: trained interaction matrices


_SHARED: dict[str, pathlib.Path] = {}


def _once(name: str, tmp_path_factory, make) -> pathlib.Path:
  """``make(folder)`` the first time ``name`` is asked for in this process, its path after."""
  if name not in _SHARED:
    _SHARED[name] = make(tmp_path_factory.mktemp(name))
  return _SHARED[name]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> pathlib.Path:
  return _once("serving_model", tmp_path_factory, lambda d: train_tiny_model(d / "run"))


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> pathlib.Path:
  return _once("serving_lib", tmp_path_factory, lambda d: write_library(d / "tools.json"))


@pytest.fixture(scope="module")
def retriever(model_dir, library):
  from hyset_jax.serve.retriever import load_retriever
  return load_retriever(str(model_dir), [f"mcp:{library}"], max_batch=8, log=lambda _: None)


def predict_rows(tmp_path: pathlib.Path, model: pathlib.Path, texts: list[str],
                 *extra: str) -> list[dict]:
  """``hyset predict --queries`` of ``texts`` on the model directory ``model``: its lines, the
  answers a served model is compared with."""
  from hyset_jax import cli
  queries = tmp_path / "q.jsonl"
  queries.write_text("".join(json.dumps({"_id": f"q{i}", "text": t}) + "\n"
                             for i, t in enumerate(texts)))
  out = tmp_path / "pred.jsonl"
  assert cli.main(["predict", "--model", str(model), "--queries", str(queries),
                   "--out", str(out), "--force", *extra]) == 0
  return [json.loads(line) for line in out.read_text().splitlines()]


def write_library(path: pathlib.Path, n: int = 40) -> pathlib.Path:
  """An MCP tools/list result naming the model's tools t0..t{n-1}."""
  tools = [{"name": f"t{i}", "description": f"Tool number {i}.",
            "inputSchema": {"type": "object", "properties": {"x": {"type": "integer"}},
                            "required": ["x"]}} for i in range(n)]
  path.write_text(json.dumps({"tools": tools}), encoding="utf-8")
  return path


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def env() -> dict[str, str]:
  return {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}


def post(url: str, body, timeout: float = 60.0) -> tuple[int, dict]:
  data = body if isinstance(body, bytes) else json.dumps(body).encode()
  req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
  try:
    with urllib.request.urlopen(req, timeout=timeout) as r:
      return r.status, json.loads(r.read())
  except urllib.error.HTTPError as e:
    return e.code, json.loads(e.read())


def get(url: str, timeout: float = 60.0) -> tuple[int, dict]:
  with urllib.request.urlopen(url, timeout=timeout) as r:
    return r.status, json.loads(r.read())


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 240.0) -> None:
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if proc.poll() is not None:
      raise RuntimeError(f"server exited with {proc.returncode}: {proc.stderr.read()[-3000:]}")
    try:
      with urllib.request.urlopen(url + "/healthz", timeout=2) as r:
        if r.status == 200:
          return
    except OSError:
      time.sleep(0.3)
  raise RuntimeError(f"server at {url} not healthy after {timeout} s")


@contextlib.contextmanager
def server_process(args: list[str], port: int, health: bool = True):
  """``hyset serve ARGS --port PORT`` as a real process on 127.0.0.1; killed if still alive."""
  proc = subprocess.Popen([sys.executable, "-m", "hyset_jax.cli", "serve", *args,
                           "--host", "127.0.0.1", "--port", str(port)],
                          cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
  try:
    if health:
      wait_healthy(f"http://127.0.0.1:{port}", proc)
    yield proc
  finally:
    if proc.poll() is None:
      proc.kill()
    proc.wait(timeout=30)
