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
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from pydantic import BaseModel, Field

from hyset_jax.serve.batching import MicroBatcher
from hyset_jax.serve.retriever import FieldError, Retriever, check_text

log = logging.getLogger("hyset.serve")

SERVER_NAME = "hyset"
TOOL_NAME = "search_tools"
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
                                         "ranking method (greedy, logit, set-first, set-mean or set-max)")


def mcp_tool(definition: dict) -> RetrievedTool:
  """A tool definition (:func:`hyset_jax.data.tooltext.definition`) in MCP's terms."""
  schema = definition.get("parameters")
  return RetrievedTool(id=definition["id"], name=definition["name"],
                       description=definition["description"],
                       inputSchema=schema if isinstance(schema, dict) and schema else EMPTY_SCHEMA)


def build_server(retriever: Retriever, *, max_batch: int = 64, max_wait_ms: float = 5.0,
                 request_timeout_s: float = 30.0):
  """An ``MCPServer`` with the ``search_tools`` tool over ``retriever``."""
  from mcp.server.mcpserver import MCPServer
  from mcp.server.mcpserver.exceptions import ToolError

  batcher = MicroBatcher(retriever.retrieve_batch, max_batch=max_batch,
                         max_wait_s=max_wait_ms / 1000)
  server = MCPServer(SERVER_NAME, instructions=(
      "Call search_tools with the user's request to get the set of tools that together "
      "accomplish it, with their input schemas."))

  @server.tool(name=TOOL_NAME, structured_output=True, description=(
      "Find the set of tools that together accomplish a request (set-level retrieval). "
      "query: the request in natural language; max_size: the most tools to return "
      f"(2 to {retriever.model.max_set_size}; default {retriever.model.max_set_size}). "
      "Returns the tools with their names, descriptions and input schemas."))
  async def search_tools(query: str, max_size: int | None = None) -> SearchResult:
    if not query.strip():
      raise ToolError("query: is empty; expected the request text")
    try:
      check_text("query", query)
      options = retriever.options(max_size=max_size)
    except FieldError as e:
      raise ToolError(str(e)) from None
    try:
      row, = await asyncio.wait_for(batcher.submit([query], options), request_timeout_s)
    except asyncio.TimeoutError:
      raise ToolError(f"the call was not answered within the server's limit of "
                      f"{request_timeout_s:g} s; retry later") from None
    except Exception as e:  # noqa: BLE001 - the SDK would put the exception's text in the reply
      request_id = uuid.uuid4().hex[:16]
      log.error("search_tools failed (request id %s)", request_id, exc_info=e)
      raise ToolError(f"internal error (request id {request_id}; the details are in the "
                      f"server's log)") from None
    return SearchResult(tools=[mcp_tool(d) for d in row["tools"]], set_score=row["set_score"],
                        ranking=row["ranking"])

  @server.custom_route("/healthz", methods=["GET"])
  async def healthz(request):  # streamable HTTP only: a probe for orchestrators and tests
    from starlette.responses import JSONResponse
    return JSONResponse({"status": "ok", "tools": retriever.num_tools, "mcp_tool": TOOL_NAME})

  return server


def run_mcp(retriever: Retriever, *, transport: str, host: str = "127.0.0.1", port: int = 8080,
            max_batch: int = 64, max_wait_ms: float = 5.0,
            request_timeout_s: float = 30.0) -> None:
  """Serve until the client hangs up (stdio) or SIGTERM/Ctrl-C (streamable HTTP at /mcp)."""
  server = build_server(retriever, max_batch=max_batch, max_wait_ms=max_wait_ms,
                        request_timeout_s=request_timeout_s)
  if transport == "stdio":
    server.run("stdio")
  else:
    server.run("streamable-http", host=host, port=port)
