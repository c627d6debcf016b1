"""``hyset serve``: a trained model as an HTTP API (FastAPI + uvicorn) or an MCP server.

HTTP (default)::

  POST /v1/retrieve   {"query": "..."} | {"queries": [...]}, optional max_size, k_pool, ranking
  GET  /v1/tools      the tool library and its catalogue version
  POST /v1/tools      {"add": [definition, ...], "remove": [id, ...]}: change the library while
                      serving (atomic; an added id that exists is updated)
  GET  /healthz       status, sizes, batching counters
  GET  /docs          OpenAPI documentation

MCP (--mcp stdio | --mcp http): one tool, ``search_tools(query)``, whose structured result is
the retrieved set with each tool's name, description and input schema; ``http`` serves MCP's
streamable HTTP transport at /mcp on --host/--port. --mcp-update-tools adds a second tool,
``update_tools(add, remove)``, doing what POST /v1/tools does.

--precision bf16 prepares the model's products in bfloat16, as hyset predict --precision does
(approximate; every catalogue update prepares its library the same way; /healthz reports it).

Catalogue updates re-index the model in memory; the model directory on disk is left as it was
unless --persist DIR names a directory each update writes the edited model to (atomically; an
existing directory that is not a model directory is refused at start-up).

Tool definitions (names, descriptions, schemas) come from --tools SPEC (any data spec, e.g.
mcp:tools.json, openai:tools.json; repeatable, later ones win), else from the training run's
data spec. Concurrent requests are micro-batched (--max-batch, --max-wait-ms). SIGTERM or
Ctrl-C stops accepting connections, answers the requests in flight, then exits.

API keys: --policies FILE ({"keys": {KEY: {"allow", "deny", "tags", "update_tools"}},
"default": {...}}) maps each key (Authorization: Bearer KEY, or X-API-Key: KEY) to the tools
it may see; without "default" every request needs a key (401 otherwise). A request's own
"tools" filter only narrows its policy. MCP over stdio uses --mcp-policy KEY's policy (else the
default).

Security: the server listens on 127.0.0.1 unless --host says otherwise (another address is
warned about on stderr when no --policies file requires keys); bodies over --max-body-bytes get 413,
requests with more than --max-queries texts 422, requests not answered within
--request-timeout 503; no CORS headers are sent; error bodies hold no traceback or path.
"""
from __future__ import annotations

import argparse
import ipaddress
import math
import socket
import sys

from hyset_jax import choices
from hyset_jax.commands import int_at_least
from hyset_jax.errors import UserError


def add_parser(sub: argparse._SubParsersAction) -> None:
  p = sub.add_parser("serve", help="serve a model over HTTP or MCP", description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--model", required=True, help="hyset model directory or `hyset train` workdir")
  p.add_argument("--tools", action="append", default=[], metavar="SPEC",
                 help="library with the tools' definitions (repeatable; default: the training "
                      "run's data spec)")
  p.add_argument("--host", default="127.0.0.1",
                 help="address to listen on (default 127.0.0.1: this machine only; any other "
                      "address is warned about, the API has no authentication)")
  p.add_argument("--port", type=int_at_least(0), default=8080, help="port (default 8080)")
  p.add_argument("--mcp", choices=("stdio", "http"),
                 help="run an MCP server (stdio, or streamable HTTP at /mcp) instead of the API")
  p.add_argument("--max-batch", type=int_at_least(1), default=64,
                 help="most queries per device call (default 64)")
  p.add_argument("--max-wait-ms", type=float, default=5.0,
                 help="longest a request waits for others to share its device call (default 5)")
  p.add_argument("--max-body-bytes", type=int_at_least(1), default=1 << 20,
                 help="largest request body (default 1 MiB; larger gets 413)")
  p.add_argument("--max-queries", type=int_at_least(1), default=256,
                 help="most queries in one request (default 256; more gets 422)")
  p.add_argument("--request-timeout", type=float, default=30.0, metavar="SECONDS",
                 help="longest a request may wait for its answer, queueing included (default "
                      "30; later gets 503)")
  p.add_argument("--method", choices=choices.METHOD_CHOICES, default=choices.DEFAULT_METHOD,
                 help="subset-enumeration implementation (default auto: the native CPU kernel "
                      "where it can run, else gather)")
  p.add_argument("--first-stage", choices=choices.FIRST_STAGES, default=None,
                 help="how stage 1 and the expansion find candidates: exact, or ann (an "
                      "approximate index over the tools, for very large libraries; built at "
                      "start-up and cached beside the model: docs/speed.md) (default: the "
                      "model's manifest, else exact)")
  p.add_argument("--precision", choices=choices.PRECISIONS, default=choices.DEFAULT_PRECISION,
                 help="dtype of the prepared products P Zᵀ and Z M_m, as hyset predict "
                      "--precision (default f32; bf16 is approximate: docs/speed.md); kept "
                      "across catalogue updates and reported by /healthz")
  p.add_argument("--no-warm-up", dest="warm_up", action="store_false",
                 help="start without compiling every batch size first (faster start, slower "
                      "first requests)")
  p.add_argument("--shutdown-timeout", type=float, default=30.0,
                 help="seconds to finish requests in flight after SIGTERM (default 30)")
  p.add_argument("--persist", metavar="DIR",
                 help="write the edited model directory here after each catalogue update "
                      "(default: updates live in memory only; never the --model directory)")
  p.add_argument("--policies", metavar="FILE",
                 help="API keys and the tools each may see (JSON; docs/serving.md); default: "
                      "no keys, every tool")
  p.add_argument("--mcp-policy", metavar="KEY",
                 help="with --mcp stdio and --policies: the key whose policy the session has "
                      "(default: the file's default policy)")
  p.add_argument("--mcp-update-tools", action="store_true",
                 help="with --mcp: also offer the update_tools tool (off by default: MCP "
                      "tools are offered to the model itself)")
  p.set_defaults(func=run)


def check_port(host: str, port: int) -> None:
  """UserError now, rather than a uvicorn log line later, if the address cannot be bound."""
  try:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
      s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      s.bind((host, port))
  except (OSError, OverflowError) as e:  # OverflowError: a port above 65535
    raise UserError(f"cannot listen on {host}:{port}: {getattr(e, 'strerror', None) or e}"
                    ) from None


def is_loopback(host: str) -> bool:
  """Whether ``host`` is an address only this machine can reach (127.0.0.0/8, ::1, localhost)."""
  if host.strip().lower() == "localhost":
    return True
  try:
    return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
  except ValueError:  # a host name: it may resolve to anything
    return False


def warn_if_exposed(host: str, keys_required: bool = False) -> None:
  """A warning on stderr when the server will be reachable from other machines without a
  key."""
  if not is_loopback(host) and not keys_required:
    print(f"warning: listening on {host}, not a loopback address: other machines can reach "
          f"this server, and it has no authentication; put it behind a proxy that checks "
          f"clients, or use --host 127.0.0.1", file=sys.stderr)


def check_persist(out: str, model: str):
  """The --persist directory, checked before anything loads, with the output rules of every
  command (:mod:`hyset_jax.io_utils`): a new or empty directory, or an earlier model directory
  (it is replaced at each update, as with --force); never another non-empty folder, and never
  the served model directory or one holding it (an output is never an input)."""
  from hyset_jax import io_utils
  from hyset_jax.io.modeldir import MANIFEST_FILE, best_model_dir
  return io_utils.output_dir(out, True, marker=MANIFEST_FILE, inputs=[best_model_dir(model)],
                             flag="--persist", what="model directory")


def run(args: argparse.Namespace) -> int:
  if not 0 <= args.max_wait_ms < math.inf:  # written so that nan is refused too
    raise UserError(f"--max-wait-ms must be ≥ 0 and finite, got {args.max_wait_ms}")
  if not 0 < args.request_timeout < math.inf:
    raise UserError(f"--request-timeout must be > 0 seconds and finite, got "
                    f"{args.request_timeout}")
  if args.mcp_update_tools and not args.mcp:
    raise UserError("--mcp-update-tools needs --mcp (the HTTP API has POST /v1/tools)")
  if args.mcp_policy is not None and not (args.mcp == "stdio" and args.policies):
    raise UserError("--mcp-policy needs --mcp stdio and --policies (over HTTP the key comes "
                    "in the request's headers)")
  persist = check_persist(args.persist, args.model) if args.persist else None
  if args.mcp != "stdio":
    check_port(args.host, args.port)
  from hyset_jax.serve.retriever import load_retriever
  retriever = load_retriever(args.model, args.tools, method=args.method,
                             max_batch=args.max_batch, first_stage=args.first_stage,
                             precision=args.precision)
  policies = None
  if args.policies:
    from hyset_jax.serve import policies as policies_lib
    policies = policies_lib.load(args.policies, retriever.filter_index)
    if args.mcp_policy is not None:
      try:
        policies.resolve(args.mcp_policy)
      except policies_lib.AuthError:
        raise UserError(f"--mcp-policy: the key is not in --policies {args.policies}"
                        ) from None
  if args.mcp != "stdio":
    warn_if_exposed(args.host, policies is not None and policies.default is None)
  if args.warm_up:
    print("compiling ...", file=sys.stderr)
    retriever.warm_up()
  if args.mcp:
    from hyset_jax.serve.mcp_server import run_mcp
    run_mcp(retriever, transport=args.mcp, host=args.host, port=args.port,
            max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
            request_timeout_s=args.request_timeout, update_tool=args.mcp_update_tools,
            warm_up=args.warm_up, persist=persist, policies=policies,
            stdio_key=args.mcp_policy)
    return 0
  import uvicorn

  from hyset_jax.serve.app import create_app
  app = create_app(retriever, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
                   max_body_bytes=args.max_body_bytes, max_queries=args.max_queries,
                   request_timeout_s=args.request_timeout, warm_up=args.warm_up,
                   persist=persist, policies=policies)
  config = uvicorn.Config(app, host=args.host, port=args.port, log_level="info",
                          timeout_graceful_shutdown=args.shutdown_timeout)
  uvicorn.Server(config).run()
  return 0
