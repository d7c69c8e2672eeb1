"""The dashboard's web server (aiohttp): the page, its JSON API and ``/metrics``. Read-only: no route
changes anything, so exposing it shows state but cannot alter the pipeline.

Routes:

* ``/``: the page (static HTML, CSS and JS from ``static/``; no build step).
* ``/api/status``: the pipeline snapshot (:class:`PipelineSnapshot` as JSON): views, edges, lag, health;
  epochs as decimal strings (int64 epochs exceed what a JavaScript number holds exactly).
* ``/api/history?points=N``: each view's last N lag samples: ``{view: [[ts_ms, epochs, seconds,
  records, mce], ...]}``.
* ``/metrics``: Prometheus text format.
* ``/healthz``: ``ok`` when Redis answers.

Redis is read in a worker thread per request (the client is synchronous), so a slow Redis never stalls
the event loop.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import redis
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from mvlog.config import Settings, redact_url
from mvlog.connectors.kafka.broker_probe import unreachable_broker
from mvlog.connectors.redis import redis_client
from mvlog.connectors.redis.catalog_store import CatalogStore
from mvlog.connectors.redis.lag_store import LagStore
from mvlog.services.dashboard.metrics import pipeline_registry
from mvlog.services.status_snapshot import take_snapshot

STATIC_DIR = Path(__file__).with_name("static")
MAX_POINTS = 3600

SETTINGS_KEY: web.AppKey[Settings] = web.AppKey("settings", Settings)
REDIS_KEY: web.AppKey[redis.Redis] = web.AppKey("redis", redis.Redis)


def _no_cache(response: web.StreamResponse) -> web.StreamResponse:
    response.headers["Cache-Control"] = "no-store"
    return response


#: The page's files, served by name only (no directory listing or path from the request reaches the disk).
STATIC_FILES = ("dashboard.css", "dashboard.js")


async def index(request: web.Request) -> web.StreamResponse:
    return _no_cache(web.FileResponse(STATIC_DIR / "index.html"))


async def static_file(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    if name not in STATIC_FILES:
        raise web.HTTPNotFound()
    return _no_cache(web.FileResponse(STATIC_DIR / name))


#: Keys whose values are epochs: int64 above 2**53, which JavaScript numbers cannot hold exactly.
EPOCH_KEYS = frozenset({"mce", "upstream_mce"})


def epochs_as_strings(document: Any) -> Any:
    """The API's JSON with every epoch as a decimal string, so the page shows it to the last digit."""
    if isinstance(document, dict):
        return {k: (str(v) if k in EPOCH_KEYS and isinstance(v, int) else epochs_as_strings(v))
                for k, v in document.items()}
    if isinstance(document, list):
        return [epochs_as_strings(v) for v in document]
    return document


async def api_status(request: web.Request) -> web.Response:
    settings, client = request.app[SETTINGS_KEY], request.app[REDIS_KEY]
    snapshot = await asyncio.to_thread(take_snapshot, settings, client)
    document = epochs_as_strings(snapshot.to_json())
    document["sample_interval_ms"] = settings.lag_sample_interval_ms
    problem = await asyncio.to_thread(unreachable_broker, settings.bootstrap_servers, 1.0)
    document["broker"] = "ok" if problem is None else f"unreachable at {settings.bootstrap_servers}: {problem}"
    return web.json_response(document, headers={"Cache-Control": "no-store"})


def _history(settings: Settings, client: redis.Redis, points: int) -> dict[str, list[list[Any]]]:
    views = [e.name for e in CatalogStore(settings, client).all() if e.kind == "view"]
    histories = LagStore(client, settings.topic_prefix, settings.lag_history).histories(views, points)
    return {view: [[s.ts_ms, s.epochs, s.seconds, s.records, str(s.mce) if s.mce is not None else None]
                   for s in samples]
            for view, samples in histories.items()}


async def api_history(request: web.Request) -> web.Response:
    try:
        points = min(MAX_POINTS, max(1, int(request.query.get("points", "300"))))
    except ValueError:
        raise web.HTTPBadRequest(text="points must be an integer") from None
    document = await asyncio.to_thread(_history, request.app[SETTINGS_KEY], request.app[REDIS_KEY], points)
    return web.json_response(document, headers={"Cache-Control": "no-store"})


async def metrics(request: web.Request) -> web.Response:
    settings, client = request.app[SETTINGS_KEY], request.app[REDIS_KEY]
    registry = pipeline_registry(lambda: take_snapshot(settings, client))
    body = await asyncio.to_thread(generate_latest, registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def healthz(request: web.Request) -> web.Response:
    await asyncio.to_thread(request.app[REDIS_KEY].ping)
    return web.Response(text="ok")


@web.middleware
async def redis_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Redis down: a 503 with the reason (the page shows it) instead of a stack trace."""
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except redis.RedisError as error:
        settings = request.app[SETTINGS_KEY]
        return web.json_response({"error": f"waiting for Redis at {redact_url(settings.redis_url)}: {error}"},
                                 status=503)


def create_app(settings: Settings, client: redis.Redis | None = None) -> web.Application:
    app = web.Application(middlewares=[redis_errors])
    app[SETTINGS_KEY] = settings
    # A page waits a few seconds for a restarting Redis, then says so (503), rather than hanging.
    app[REDIS_KEY] = client or redis_client.connect(settings, outage_timeout_s=5.0, socket_timeout=5.0)
    app.router.add_get("/", index)
    app.router.add_get("/api/status", api_status)
    app.router.add_get("/api/history", api_history)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/static/{name}", static_file)
    return app
