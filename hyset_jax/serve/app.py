"""The HTTP API of ``hyset serve``: a FastAPI app over a :class:`.retriever.Retriever`.

=========================  =========================================================
``POST /v1/retrieve``      ``{"query": "..."}`` or ``{"queries": [...]}``, optional
                           ``max_size``, ``k_pool``, ``ranking`` -> ``{"results": [...]}``
``GET /v1/tools``          the tool library: ``{"version", "count", "tools": [definition, ...]}``
``POST /v1/tools``         ``{"add": [definition, ...], "remove": [id, ...]}``: change the
                           library while serving (:mod:`.catalogue`; atomic, versioned)
``GET /healthz``           ``{"status": "ok", ...}``: model sizes, precision, batching counters
``GET /docs``              OpenAPI documentation (``/openapi.json``)
=========================  =========================================================

A request may carry a ``tools`` filter (``{"allow", "deny", "tags"}``), applied before
retrieval and intersected with the policy of its API key (``Authorization: Bearer KEY`` or
``X-API-Key``; :mod:`.policies`): 401 for an unknown or missing key, 403 for a catalogue update
its policy does not permit.

Errors are JSON, ``{"error": {"field": "...", "message": "..."}}``: 400 for a body that is
not JSON, 413 for a body over ``max_body_bytes``, 422 for a value that is wrong (the field
names it: ``query``, ``queries[3]``, ``max_size``, …), 404 for an unknown path, 409 (field
``persist``) for a catalogue update that could not be written to ``--persist``, 503 for a
request not answered within ``request_timeout_s``, 500 (never a dead server) for anything
unexpected. An error body never holds a traceback, an exception's text or a file path: a 500
says only "internal error" and a request id, and the details go to the server's log (stderr)
under that id. No CORS middleware is installed, so no ``Access-Control-*`` header is sent and
browsers keep other origins' pages from reading answers.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import uuid
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr
from starlette.exceptions import HTTPException

from hyset_jax.errors import FieldError
from hyset_jax.serve import policies as policies_lib
from hyset_jax.serve.batching import MicroBatcher
from hyset_jax.serve.policies import ToolsFilter
from hyset_jax.serve.catalogue import (Catalogue, PersistError, Ticket, ToolIn, UpdateRequest,
                                       batch_key, run_batch)
from hyset_jax.serve.retriever import RANKINGS, Retriever, check_text

log = logging.getLogger("hyset.serve")


class RetrieveRequest(BaseModel):
  """One query (``query``) or several (``queries``), with optional per-request settings."""
  model_config = ConfigDict(extra="forbid")
  query: StrictStr | None = Field(None, description="one request text")
  queries: list[StrictStr] | None = Field(None, description="several request texts")
  max_size: StrictInt | None = Field(None, description="largest set size M (default: the "
                                                       "model's max_set_size)")
  k_pool: StrictInt | None = Field(None, description="shortlist size K_pool (default: the "
                                                     "model's)")
  ranking: StrictStr | None = Field(None, description=f"ranking method: {', '.join(RANKINGS)}")
  tools: ToolsFilter | None = Field(None, description="answer with these tools only: filtered "
                                                      "before retrieval, exact")


class ToolDefinition(BaseModel):
  id: str
  name: str
  description: str
  parameters: dict[str, Any] | None = Field(None, description="JSON schema, when known")


class Result(BaseModel):
  set: list[str] = Field(description="tool ids of the best set")
  set_score: float = Field(description="F(x, E) of the best set")
  ranking: list[str] = Field(description="tool ids in the order of the ranking method used")
  shortlist: list[str] = Field(description="tool ids: S0 by ℓ, then the expansion by g")
  tools: list[ToolDefinition] = Field(description="definitions of the set's members")


class RetrieveResponse(BaseModel):
  results: list[Result]
  catalogue_version: int = Field(description="the library version that answered")


class ChangedIds(BaseModel):
  added: list[str]
  updated: list[str]
  removed: list[str]


class UpdateResponse(BaseModel):
  version: int = Field(description="the new catalogue version (the start-up library is 1)")
  count: int = Field(description="tools in the new library")
  previous_count: int
  added: int
  updated: int = Field(description="ids in 'add' that were in the library (redefined)")
  removed: int
  ids: ChangedIds


class ErrorBody(BaseModel):
  field: str | None
  message: str
  request_id: str | None = Field(None, description="500 only: the id the server logged the "
                                                   "details under")


class ErrorResponse(BaseModel):
  error: ErrorBody


class Json(JSONResponse):
  """JSON with non-ASCII characters escaped: a lone surrogate (``"\\ud800"`` in a request's
  field name or a library's description) is data to echo back, and Starlette's UTF-8 rendering
  would fail on it (a 500) where ``\\ud800`` is valid JSON."""

  def render(self, content: Any) -> bytes:
    return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")
                      ).encode("ascii")


def error(status: int, field: str | None, message: str, **extra: Any) -> JSONResponse:
  return Json({"error": {"field": field, "message": message, **extra}}, status_code=status)


def _field(loc: tuple) -> str:
  """A pydantic error location as the request field it names: ('body', 'queries', 2) ->
  'queries[2]'."""
  parts = [p for p in loc if p != "body"]
  out = ""
  for p in parts:
    out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
  return out or "body"


class BodyLimit:
  """Refuse request bodies over ``max_bytes`` (413) — by Content-Length, or while streaming."""

  def __init__(self, app, max_bytes: int):
    self.app = app
    self.max_bytes = max_bytes

  async def __call__(self, scope, receive, send):
    if scope["type"] != "http":
      return await self.app(scope, receive, send)
    message = f"the request body is over the limit of {self.max_bytes} bytes"
    length = dict(scope.get("headers") or []).get(b"content-length")
    if length is not None and length.isdigit() and int(length) > self.max_bytes:
      return await error(413, "body", message)(scope, receive, send)
    seen = 0

    async def limited():
      nonlocal seen
      msg = await receive()
      if msg["type"] == "http.request":
        seen += len(msg.get("body", b""))
        if seen > self.max_bytes:
          raise HTTPException(413, message)
      return msg

    return await self.app(scope, limited, send)


def create_app(retriever: Retriever, *, max_batch: int = 64, max_wait_ms: float = 5.0,
               max_body_bytes: int = 1 << 20, max_queries: int = 256,
               request_timeout_s: float = 30.0, warm_up: bool = True,
               persist=None, policies: policies_lib.Policies | None = None) -> FastAPI:
  """The FastAPI app; the micro-batcher starts and drains with the app's lifespan.

  Limits (each a ``hyset serve`` flag): ``max_body_bytes`` (413), ``max_queries`` texts per
  request (422, field ``queries``), ``request_timeout_s`` from the body's arrival to the
  answer (503; the request leaves the queue, so a stalled device does not pile up work).
  ``warm_up`` and ``persist``: for libraries that ``POST /v1/tools`` builds
  (:class:`.catalogue.Catalogue`). ``policies``: API keys and the tools each may see
  (:mod:`.policies`; None: no keys, every tool)."""
  policies = policies or policies_lib.Policies()
  catalogue = Catalogue(retriever, warm_up=warm_up, persist=persist)
  batcher = MicroBatcher(run_batch, max_batch=max_batch, max_wait_s=max_wait_ms / 1000,
                         key=batch_key)

  @contextlib.asynccontextmanager
  async def lifespan(app: FastAPI):
    await batcher.start()
    yield
    await batcher.stop()  # after uvicorn has answered every request in flight
    catalogue.close()

  app = FastAPI(title="hyset", lifespan=lifespan, default_response_class=Json,
                description="Set-level tool retrieval (HYSET): the best tool set for a request.")
  app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
  app.state.batcher = batcher
  app.state.catalogue = catalogue

  _add_error_handlers(app)

  @app.post("/v1/retrieve", response_model=RetrieveResponse,
            responses={400: {"model": ErrorResponse}, 413: {"model": ErrorResponse},
                       422: {"model": ErrorResponse}})
  async def retrieve(request: RetrieveRequest, http: Request):
    """The best tool set, ranking and shortlist for each query (as `hyset predict`)."""
    snapshot = catalogue.current  # this request's library, whatever updates come meanwhile
    try:
      access = _access(policies, http)
      texts = _texts(request, max_queries)
      r = snapshot.retriever
      options = r.options(request.max_size, request.k_pool, request.ranking)
      wanted = request.tools.as_filter() if request.tools is not None else None
      options = dataclasses.replace(options, allowed=r.allowed(wanted, access.tools))
    except policies_lib.AuthError as e:
      return error(e.status, "authorization", e.message)
    except FieldError as e:
      return error(422, e.field, e.message)
    try:
      # wait_for cancels the request's future on timeout: the batcher skips it if not yet run.
      results = await asyncio.wait_for(batcher.submit(texts, Ticket(snapshot, options)),
                                       request_timeout_s)
    except asyncio.TimeoutError:
      return error(503, None, f"the request was not answered within the server's limit of "
                              f"{request_timeout_s:g} s (--request-timeout); retry later")
    return Json({"results": results, "catalogue_version": snapshot.version})

  _add_catalogue_routes(app, catalogue, batcher, policies)

  @app.get("/healthz")
  async def healthz():
    snapshot = catalogue.current
    r = snapshot.retriever
    m = r.model
    return {"status": "ok", "tools": r.num_tools, "catalogue_version": snapshot.version,
            "max_set_size": m.max_set_size, "k1": m.k1, "k_pool": m.k_pool,
            "query_encoder": m.query_encoder, "rankings": list(r.rankings),
            "precision": r.precision,  # of the prepared products (hyset serve --precision)
            "terms": list(m.terms),  # e.g. "abstain": a request may get "set": []
            "batching": batcher.stats.as_dict()}

  return app


def _add_error_handlers(app: FastAPI) -> None:
  """Every error as ``{"error": {"field", "message"}}``; a 500 with a request id only."""

  @app.exception_handler(RequestValidationError)
  async def invalid(request, exc: RequestValidationError):
    first = exc.errors()[0] if exc.errors() else {"loc": ("body",), "msg": "invalid request"}
    if first.get("type") == "json_invalid":
      return error(400, "body", f"the body is not valid JSON ({first.get('msg')})")
    field = _field(tuple(first.get("loc", ("body",))))
    if first.get("type") == "extra_forbidden":
      return error(422, field, f"unknown field; expected {_expected(request.url.path, field)}")
    return error(422, field, str(first.get("msg")))

  @app.exception_handler(HTTPException)
  async def http_error(request, exc: HTTPException):
    return error(exc.status_code, "body" if exc.status_code == 413 else None, str(exc.detail))

  @app.exception_handler(Exception)
  async def internal(request, exc: Exception):
    # The exception's text may hold paths or data; it goes to the log only, under an id the
    # client can quote.
    request_id = uuid.uuid4().hex[:16]
    log.error("request %s %s failed (request id %s)", request.method, request.url.path,
              request_id, exc_info=exc)
    return error(500, None, f"internal error (request id {request_id}; the details are in "
                            f"the server's log)", request_id=request_id)


def _access(policies: policies_lib.Policies, http: Request) -> policies_lib.Access:
  """The caller's access from its API key header (AuthError 401 for a bad or missing one)."""
  return policies.resolve(policies_lib.key_from_headers(http.headers))


def _add_catalogue_routes(app: FastAPI, catalogue: Catalogue, batcher: MicroBatcher,
                          policies: policies_lib.Policies) -> None:
  """``GET /v1/tools`` (the library and its version) and ``POST /v1/tools`` (change it)."""

  @app.get("/v1/tools")
  async def tools(http: Request):
    """The tool library, in the model's row order, and its catalogue version (with API keys:
    the tools the caller's policy allows)."""
    snapshot = catalogue.current
    r = snapshot.retriever
    try:
      mask = r.allowed(None, _access(policies, http).tools)
    except policies_lib.AuthError as e:
      return error(e.status, "authorization", e.message)
    except FieldError:  # a policy that no longer allows any tool of this library
      mask = np.zeros(r.num_tools, bool)
    defs = r.definitions if mask is None else [d for d, ok in zip(r.definitions, mask) if ok]
    return Json({"version": snapshot.version, "count": len(defs), "tools": defs})

  @app.post("/v1/tools", response_model=UpdateResponse,
            responses={400: {"model": ErrorResponse}, 409: {"model": ErrorResponse},
                       413: {"model": ErrorResponse}, 422: {"model": ErrorResponse}})
  async def update_tools(request: UpdateRequest, http: Request):
    """Add, update (an added id that exists) and remove tools while serving, atomically:
    requests in flight finish on the old library, later ones see the new one."""
    try:
      if not _access(policies, http).update_tools:
        raise policies_lib.AuthError(403, "this API key may not change the catalogue (its "
                                          "policy has no \"update_tools\": true)")
    except policies_lib.AuthError as e:
      return error(e.status, "authorization", e.message)
    try:
      return Json(await catalogue.update(request.add, request.remove, batcher))
    except FieldError as e:
      return error(422, e.field, e.message)
    except PersistError as e:  # the --persist folder was removed or replaced, the disk is full
      return error(409, "persist", str(e))


def _expected(path: str, field: str) -> str:
  """The fields a request body may hold where ``field`` was found (for an unknown field)."""
  if path == "/v1/tools":
    if field.startswith("add["):
      return ", ".join(ToolIn.model_fields)
    return "add and/or remove"
  if field.startswith("tools."):
    return ", ".join(ToolsFilter.model_fields)
  return "query or queries, and optionally max_size, k_pool, ranking, tools"


def _texts(request: RetrieveRequest, max_queries: int) -> list[str]:
  """The request's texts; FieldError for none, both, empty or too many."""
  if (request.query is None) == (request.queries is None):
    raise FieldError("query", "give exactly one of 'query' (a string) or 'queries' (a list "
                              "of strings)")
  if request.query is not None:
    if not request.query.strip():
      raise FieldError("query", "is empty; expected the request text")
    check_text("query", request.query)
    return [request.query]
  if not request.queries:
    raise FieldError("queries", "is empty; expected at least one request text")
  if len(request.queries) > max_queries:
    raise FieldError("queries", f"has {len(request.queries)} texts; at most {max_queries} "
                                f"per request")
  for i, text in enumerate(request.queries):
    if not text.strip():
      raise FieldError(f"queries[{i}]", "is empty; expected a request text")
    check_text(f"queries[{i}]", text)
  return list(request.queries)
