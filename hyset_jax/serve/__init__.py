"""Serving a trained model to agents: ``hyset serve`` (HTTP API or MCP server).

- :mod:`hyset_jax.serve.retriever`   text queries -> prediction rows with tool definitions.
- :mod:`hyset_jax.serve.batching`    micro-batching of concurrent requests into one device call.
- :mod:`hyset_jax.serve.catalogue`   a tool library that changes while serving (atomic swaps).
- :mod:`hyset_jax.serve.app`         the FastAPI app (``POST /v1/retrieve``, ``/v1/tools``).
- :mod:`hyset_jax.serve.policies`    API keys and the tool policies they map to (``--policies``).
- :mod:`hyset_jax.serve.mcp_server`  the MCP server: ``search_tools`` (and ``update_tools``).
"""
