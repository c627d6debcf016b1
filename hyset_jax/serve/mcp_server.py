"""``hyset serve --mcp stdio|http``: the retriever as an MCP server (official ``mcp`` SDK).

It exposes one tool, ``search_tools``: argument ``query`` (and optionally ``max_size``); its
result is structured content (with an output schema) holding the retrieved set — each tool's
``id``, ``name``, ``description`` and ``inputSchema`` — plus ``set_score`` and the ``ranking``
of tool ids; the text content is the same JSON, for clients that read only text. A bad
argument is a tool error (``isError``) naming it, never a dead server; an unexpected failure is
a tool error saying only "internal error" with a request id (the details go to the log, stderr),
and a call not answered within ``request_timeout_s`` is a tool error saying so.

Calls share the HTTP server's micro-batcher design: concurrent calls (streamable HTTP serves
many clients) are answered by one device call.

With ``update_tool`` (``hyset serve --mcp … --mcp-update-tools``) a second tool,
``update_tools(add, remove)``, changes the library as ``POST /v1/tools`` does (the same
:class:`~hyset_jax.serve.catalogue.Catalogue`: atomic, versioned, ``--persist``). It is off by
default because an MCP server's tools are offered to the model itself: a catalogue change is
an operator's decision, which text a model reads (a prompt injection) should not be able to
make.

Tool filters and API keys: ``search_tools`` takes an optional ``tools`` argument
(``{"allow", "deny", "tags"}``, as ``/v1/retrieve``'s field), intersected with the caller's
policy (:mod:`.policies`): over streamable HTTP the key comes in the same headers as for the
HTTP API (``Authorization: Bearer KEY`` or ``X-API-Key``); over stdio there are no headers, and
the policy is that of the key ``stdio_key`` names (``hyset serve --mcp-policy KEY``), else the
default. A refused key is a tool error; ``update_tools`` needs a policy with
``"update_tools": true`` once a policies file is in use.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from typing import Any

import dataclasses

from mcp.server.mcpserver import Context
from pydantic import BaseModel, Field

from hyset_jax.errors import FieldError
from hyset_jax.serve import policies as policies_lib
from hyset_jax.serve.batching import MicroBatcher
from hyset_jax.serve.policies import ToolsFilter
from hyset_jax.serve.catalogue import (Catalogue, PersistError, Ticket, ToolIn, batch_key,
                                       run_batch)
from hyset_jax.serve.retriever import Retriever, check_text

log = logging.getLogger("hyset.serve")

SERVER_NAME = "hyset"
TOOL_NAME = "search_tools"
UPDATE_TOOL_NAME = "update_tools"
# MCP requires an object schema; a tool the library gave no schema takes no declared input.
EMPTY_SCHEMA = {"type": "object", "properties": {}}


class RetrievedTool(BaseModel):
  id: str = Field(description="tool id in the model's library")
  name: str
  description: str
  inputSchema: dict[str, Any] = Field(description="the tool's JSON input schema")


class SearchResult(BaseModel):
  tools: list[RetrievedTool] = Field(description="the retrieved set: the tools to use together")
  set_score: float = Field(description="the set's score F(x, E)")
  ranking: list[str] = Field(description="the shortlist's tool ids, best first, by the model's "
                                         "ranking method (greedy, logit, set-first, set-mean "
                                         "or set-max)")


def mcp_tool(definition: dict) -> RetrievedTool:
  """A tool definition (:func:`hyset_jax.data.tooltext.definition`) in MCP's terms."""
  schema = definition.get("parameters")
  return RetrievedTool(id=definition["id"], name=definition["name"],
                       description=definition["description"],
                       inputSchema=schema if isinstance(schema, dict) and schema else EMPTY_SCHEMA)


class UpdateResult(BaseModel):
  version: int = Field(description="the new catalogue version (the start-up library is 1)")
  count: int = Field(description="tools in the new library")
  previous_count: int
  added: int
  updated: int
  removed: int
  ids: dict[str, list[str]] = Field(description="the ids added, updated and removed")


def internal_error(what: str, e: Exception):
  """A ToolError saying only "internal error" and a request id; the details go to the log."""
  from mcp.server.mcpserver.exceptions import ToolError
  request_id = uuid.uuid4().hex[:16]
  log.error("%s failed (request id %s)", what, request_id, exc_info=e)
  return ToolError(f"internal error (request id {request_id}; the details are in the "
                   f"server's log)")


def caller_access(policies: policies_lib.Policies, stdio_key: str | None,
                  ctx: Context | None) -> policies_lib.Access:
  """The calling client's access: by its key header over HTTP, by ``stdio_key`` where the
  transport has no headers (stdio). A ToolError naming ``authorization`` when refused."""
  from mcp.server.mcpserver.exceptions import ToolError
  try:  # None on stdio; a call made in process, outside any request, has no context
    headers = None if ctx is None else ctx.headers
  except ValueError:
    headers = None
  try:
    key = stdio_key if headers is None else policies_lib.key_from_headers(headers)
    return policies.resolve(key)
  except policies_lib.AuthError as e:
    raise ToolError(f"authorization: {e.message}") from None


def build_server(retriever: Retriever, *, max_batch: int = 64, max_wait_ms: float = 5.0,
                 request_timeout_s: float = 30.0, update_tool: bool = False,
                 warm_up: bool = True, persist=None,
                 policies: policies_lib.Policies | None = None, stdio_key: str | None = None):
  """An ``MCPServer`` with the ``search_tools`` tool over ``retriever`` (and ``update_tools``
  with ``update_tool``; ``warm_up``, ``persist``: as :class:`.catalogue.Catalogue`'s;
  ``policies``, ``stdio_key``: API keys, see the module docstring)."""
  policies = policies or policies_lib.Policies()
  access = functools.partial(caller_access, policies, stdio_key)
  from mcp.server.mcpserver import MCPServer
  from mcp.server.mcpserver.exceptions import ToolError

  catalogue = Catalogue(retriever, warm_up=warm_up, persist=persist)
  batcher = MicroBatcher(run_batch, max_batch=max_batch, max_wait_s=max_wait_ms / 1000,
                         key=batch_key)
  server = MCPServer(SERVER_NAME, instructions=(
      "Call search_tools with the user's request to get the set of tools that together "
      "accomplish it, with their input schemas."))

  @server.tool(name=TOOL_NAME, structured_output=True, description=(
      "Find the set of tools that together accomplish a request (set-level retrieval). "
      "query: the request in natural language; max_size: the most tools to return "
      f"(2 to {retriever.model.max_set_size}; default {retriever.model.max_set_size}); "
      "tools: optionally {allow: [ids or 'prefix*'], deny: [...], tags: [...]}, the only "
      "tools to consider. Returns the tools with their names, descriptions and input "
      "schemas."))
  async def search_tools(query: str, max_size: int | None = None,
                         tools: ToolsFilter | None = None,
                         ctx: Context | None = None) -> SearchResult:
    if not query.strip():
      raise ToolError("query: is empty; expected the request text")
    snapshot = catalogue.current  # this call's library, whatever updates come meanwhile
    policy = access(ctx).tools
    try:
      check_text("query", query)
      r = snapshot.retriever
      options = r.options(max_size=max_size)
      wanted = tools.as_filter() if tools is not None else None
      options = dataclasses.replace(options, allowed=r.allowed(wanted, policy))
    except FieldError as e:
      raise ToolError(str(e)) from None
    try:
      row, = await asyncio.wait_for(batcher.submit([query], Ticket(snapshot, options)),
                                    request_timeout_s)
    except asyncio.TimeoutError:
      raise ToolError(f"the call was not answered within the server's limit of "
                      f"{request_timeout_s:g} s; retry later") from None
    except Exception as e:  # noqa: BLE001 - the SDK would put the exception's text in the reply
      raise internal_error(TOOL_NAME, e) from None
    return SearchResult(tools=[mcp_tool(d) for d in row["tools"]], set_score=row["set_score"],
                        ranking=row["ranking"])

  if update_tool:
    @server.tool(name=UPDATE_TOOL_NAME, structured_output=True, description=(
        "Change the tool library searched by search_tools: add: tool definitions "
        "({id, name, description, parameters}; an id already in the library is updated); "
        "remove: tool ids. Atomic: calls in flight finish on the old library."))
    async def update_tools(add: list[ToolIn] | None = None,
                           remove: list[str] | None = None,
                           ctx: Context | None = None) -> UpdateResult:
      if not access(ctx).update_tools:
        raise ToolError("authorization: this API key may not change the catalogue (its "
                        "policy has no \"update_tools\": true)")
      try:
        return UpdateResult(**await catalogue.update(add, remove, batcher))
      except FieldError as e:
        raise ToolError(str(e)) from None
      except PersistError as e:
        raise ToolError(f"persist: {e}") from None
      except Exception as e:  # noqa: BLE001 - as in search_tools
        raise internal_error(UPDATE_TOOL_NAME, e) from None

  @server.custom_route("/healthz", methods=["GET"])
  async def healthz(request):  # streamable HTTP only: a probe for orchestrators and tests
    from starlette.responses import JSONResponse
    snapshot = catalogue.current
    return JSONResponse({"status": "ok", "tools": snapshot.retriever.num_tools,
                         "catalogue_version": snapshot.version, "mcp_tool": TOOL_NAME,
                         "precision": snapshot.retriever.precision})

  return server


def run_mcp(retriever: Retriever, *, transport: str, host: str = "127.0.0.1", port: int = 8080,
            max_batch: int = 64, max_wait_ms: float = 5.0, request_timeout_s: float = 30.0,
            update_tool: bool = False, warm_up: bool = True, persist=None,
            policies: policies_lib.Policies | None = None,
            stdio_key: str | None = None) -> None:
  """Serve until the client hangs up (stdio) or SIGTERM/Ctrl-C (streamable HTTP at /mcp)."""
  server = build_server(retriever, max_batch=max_batch, max_wait_ms=max_wait_ms,
                        request_timeout_s=request_timeout_s, update_tool=update_tool,
                        warm_up=warm_up, persist=persist, policies=policies,
                        stdio_key=stdio_key)
  if transport == "stdio":
    server.run("stdio")
  else:
    server.run("streamable-http", host=host, port=port)
