"""API keys and the tool policies they map to (``hyset serve --policies FILE``).

The file is JSON::

  {"keys": {"<api key>": {"allow": [...], "deny": [...], "tags": [...],
                          "update_tools": false}, ...},
   "default": {"allow": [...], ...}}

Each key's policy is a filter (:mod:`hyset_jax.inference.filters`: ids or ``prefix*``, tags) plus
``update_tools`` (may change the catalogue: ``POST /v1/tools``, MCP ``update_tools``; default
false). ``default`` is the policy of a request without a key; without ``default`` every request
needs a key. Without a policies file the server has no keys and every request sees every tool
(as before policies existed).

A key comes in ``Authorization: Bearer KEY`` or ``X-API-Key: KEY``. It is compared with every
configured key by :func:`hmac.compare_digest` (all of them, whatever matches), so the time an
answer takes does not tell how much of a key was right. An unknown key, or no key where one is
required, is refused (401). A request's own filter is intersected with its policy: it can only
narrow what the policy allows.
"""
from __future__ import annotations

import dataclasses
import hmac
import json
import pathlib
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from hyset_jax.inference import filters
from hyset_jax.errors import FieldError, UserError


class ToolsFilter(BaseModel):
  # The docstring is the field's description in the published JSON schemas (OpenAPI, MCP
  # tools/list): user-facing text, no module paths.
  """The tools a request may be answered with (allow, deny, tags), within its API key's
  policy; the answer is the exact best set over those tools."""
  model_config = ConfigDict(extra="forbid")
  allow: list[StrictStr] | None = Field(None, description="tool ids, or 'prefix*'; only these")
  deny: list[StrictStr] | None = Field(None, description="tool ids, or 'prefix*'; never these")
  tags: list[StrictStr] | None = Field(None, description="only tools with one of these tags "
                                                         "(category, server, domain, ...)")

  def as_filter(self) -> filters.ToolFilter:
    return filters.from_json(self.model_dump(), "tools")


class AuthError(Exception):
  """A request refused: ``status`` 401 (no or unknown key) or 403 (not allowed to do this)."""

  def __init__(self, status: int, message: str):
    super().__init__(message)
    self.status = status
    self.message = message


@dataclasses.dataclass(frozen=True)
class Access:
  """What a caller may do: the tools it may see and whether it may change the catalogue."""
  tools: filters.ToolFilter = filters.EVERYTHING
  update_tools: bool = False


OPEN = Access(filters.EVERYTHING, True)  # a server without a policies file


@dataclasses.dataclass(frozen=True)
class Policies:
  """The configured keys (each with its :class:`Access`) and the keyless default (None: a
  key is required)."""
  keys: tuple[tuple[bytes, Access], ...] = ()
  default: Access | None = OPEN

  def resolve(self, key: str | None) -> Access:
    """The access of ``key`` (None: the request named none); AuthError 401 otherwise."""
    if key is None:
      if self.default is None:
        raise AuthError(401, "this server requires an API key (Authorization: Bearer KEY or "
                             "X-API-Key: KEY)")
      return self.default
    given = key.encode("utf-8", "surrogatepass")
    found = None
    for configured, access in self.keys:  # every key, whether or not one matched already
      if hmac.compare_digest(given, configured) and found is None:
        found = access
    if found is None:
      raise AuthError(401, "unknown API key")
    return found


def _access(obj: Any, where: str) -> Access:
  if not isinstance(obj, Mapping):
    raise UserError(f"{where}: expected an object with allow, deny, tags, update_tools")
  update = obj.get("update_tools", False)
  if not isinstance(update, bool):
    raise UserError(f"{where}.update_tools: expected true or false")
  rest = {k: v for k, v in obj.items() if k != "update_tools"}
  try:
    return Access(filters.from_json(rest, where), update)
  except FieldError as e:
    raise UserError(f"{e.field}: {e.message} (expected allow, deny, tags, update_tools)"
                    ) from None


def load(path: str | pathlib.Path, index: filters.FilterIndex | None = None) -> Policies:
  """The policies of a JSON file; UserError naming the file and entry for a bad one. With
  ``index`` (the served library) every policy's ids and tags are checked against it, and a
  policy that allows no tool is refused: a typo in a policy would silently shut a client out."""
  path = pathlib.Path(path)
  try:
    data = json.loads(path.read_text(encoding="utf-8"))
  except (OSError, UnicodeDecodeError) as e:
    raise UserError(f"--policies {path}: cannot read it ({e})") from None
  except json.JSONDecodeError as e:
    raise UserError(f"--policies {path}: not valid JSON ({e})") from None
  if not isinstance(data, dict) or not set(data) <= {"keys", "default"}:
    raise UserError(f"--policies {path}: expected {{\"keys\": {{KEY: policy}}, \"default\": "
                    f"policy}} (default optional)")
  keys = data.get("keys") or {}
  if not isinstance(keys, dict):
    raise UserError(f"--policies {path}: keys: expected an object mapping API keys to policies")
  parsed = []
  for i, (key, policy) in enumerate(keys.items()):
    if len(key) < 16:
      raise UserError(f"--policies {path}: keys: key #{i + 1} is {len(key)} characters; use "
                      f"at least 16 (random) characters")
    parsed.append((key.encode("utf-8", "surrogatepass"), _access(policy, f"keys[#{i + 1}]")))
  default = _access(data["default"], "default") if data.get("default") is not None else None
  policies = Policies(tuple(parsed), default)
  if index is not None:
    named = [(f"keys[#{i + 1}]", a) for i, (_, a) in enumerate(parsed)]
    for where, access in named + ([("default", default)] if default else []):
      try:
        index.mask(access.tools, where)
      except FieldError as e:
        raise UserError(f"--policies {path}: {e.field}: {e.message}") from None
  return policies


def key_from_headers(headers: Mapping[str, str] | None) -> str | None:
  """The API key of a request's headers (``Authorization: Bearer KEY``, else ``X-API-Key``);
  None when neither is there. AuthError 401 for an Authorization header of another scheme."""
  if not headers:
    return None
  auth = headers.get("authorization")
  if auth is not None:
    scheme, _, token = auth.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
      raise AuthError(401, "the Authorization header must be 'Bearer KEY'")
    return token.strip()
  key = headers.get("x-api-key")
  return key.strip() if key is not None else None
