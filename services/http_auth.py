"""The token check of mvlog's HTTP servers: reading is open, changing state needs ``Settings.http_token``.

Servers bind ``Settings.bind_host`` (127.0.0.1 by default), so by default nothing is reachable from
another machine. Any endpoint that changes state (POST, PUT, PATCH, DELETE: pause a view, reset
something) must pass :func:`authorize`; with no token configured such endpoints are refused
outright, so exposing a dashboard never exposes control by accident.

Use it from any framework with :func:`authorize`, or in aiohttp (Faust's web server, the dashboard)
with ``web.Application(middlewares=[token_middleware(settings)])``. Clients send
``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from mvlog.config import Settings

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass(frozen=True)
class Decision:
    allowed: bool
    status: int  # 200, 401 (no or wrong token) or 403 (no token configured)
    reason: str


def authorize(settings: Settings, method: str, authorization: str | None) -> Decision:
    """Whether a request may proceed; the reason never contains the token."""
    if method.upper() in SAFE_METHODS:
        return Decision(True, 200, "read-only request")
    if settings.http_token is None:
        return Decision(False, 403, "this server is read-only: set MVLOG_HTTP_TOKEN to allow changes")
    scheme, _, given = (authorization or "").partition(" ")
    expected = settings.http_token.get_secret_value().encode()
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
        return Decision(False, 401, "a valid 'Authorization: Bearer <token>' header is required")
    return Decision(True, 200, "token accepted")


def token_middleware(settings: Settings) -> Callable[..., Awaitable[Any]]:
    """aiohttp middleware applying :func:`authorize` to every request."""
    from aiohttp import web

    @web.middleware
    async def check_token(request: web.Request, handler: Callable[[web.Request], Awaitable[Any]]) -> Any:
        decision = authorize(settings, request.method, request.headers.get("Authorization"))
        if not decision.allowed:
            return web.json_response({"error": decision.reason}, status=decision.status)
        return await handler(request)

    return check_token
