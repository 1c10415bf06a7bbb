"""opsbot's HTTP server: health, readiness, metrics, and the routes adapters and receivers bring.

One aiohttp application serves ``/healthz`` (the process is alive), ``/readyz`` (engine loaded
and database reachable, with the reason when not), ``/metrics`` (Prometheus text format: opsbot's
metrics and, on the GPU, vLLM's own), plus Slack events, Mattermost slash commands and actions,
and the Alertmanager webhook, each mounted by its owner via ``http_routes()``.
"""

from __future__ import annotations

import json
import logging
import socket
import weakref
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from bot import metrics
from bot.store import Store
from inference.admission import LANE_ORDER, AdmittedEngine
from inference.engine import Engine
from inference.engine_set import DEFAULT_ENGINE, EngineSet

logger = logging.getLogger(__name__)

ENGINE_KEY = web.AppKey("engine", Engine)
STORE_KEY = web.AppKey("store", Store)
MAX_BODY_KEY = web.AppKey("max_body_bytes", int)
MAX_BODY_BYTES = 4 * 1024 * 1024
"""Default largest request body (``http.max_body_bytes``)."""
_CLOSE = {"Connection": "close"}  # the rest of an oversized body is never read: end the connection

_Handler = TypeVar("_Handler", bound=Callable[..., Awaitable[web.StreamResponse]])


def accepts(*content_types: str) -> Callable[[_Handler], _Handler]:
    """Declare the media types a POST handler takes; others are answered 415 before the body is read.

    ``@accepts("application/json")`` on an adapter's handler; :func:`body_guard` applies it.
    """

    def mark(handler: _Handler) -> _Handler:
        handler.accepted_content_types = frozenset(content_types)  # type: ignore[attr-defined]
        return handler

    return mark


@web.middleware
async def body_guard(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """The rules every request body meets before a handler parses it, in one place.

    Too large: 413 at once when ``Content-Length`` says so (nothing is read); a chunked body is
    cut off by aiohttp's ``client_max_size`` as soon as it passes the limit, also 413. Wrong media
    type for the route (:func:`accepts`): 415. Undecodable input (bad UTF-8, unknown charset,
    malformed JSON) that a handler did not catch itself: 400, not a 500 with a traceback.
    """
    limit = request.app[MAX_BODY_KEY]
    if request.content_length is not None and request.content_length > limit:
        logger.warning(
            "HTTP %s %s refused (413): Content-Length %d bytes > %d bytes",
            request.method,
            request.path,
            request.content_length,
            limit,
        )
        return web.json_response(
            {"error": f"request body too large (limit {limit} bytes)"}, status=413, headers=_CLOSE
        )
    accepted = getattr(handler, "accepted_content_types", None)
    if accepted is not None and request.content_type not in accepted:
        expected = " or ".join(sorted(accepted))
        return web.json_response(
            {"error": f"unsupported content type {request.content_type!r}; expected {expected}"}, status=415
        )
    try:
        return await handler(request)
    except web.HTTPRequestEntityTooLarge:
        logger.warning("HTTP %s %s refused (413): body over %d bytes", request.method, request.path, limit)
        return web.json_response(
            {"error": f"request body too large (limit {limit} bytes)"}, status=413, headers=_CLOSE
        )
    except (UnicodeDecodeError, LookupError, json.JSONDecodeError) as exc:
        logger.warning("HTTP %s %s refused (400): %s", request.method, request.path, type(exc).__name__)
        return web.json_response({"error": "malformed request body"}, status=400)


_preemptions_seen: weakref.WeakKeyDictionary[Engine, int] = weakref.WeakKeyDictionary()
"""Each engine's preemption count at the last scrape (it reports a running total; the metric counts)."""


def refresh_engine_metrics(engine: Engine) -> None:
    """Copy each engine's current stats into the exported gauges (labelled by engine name) and its
    preemptions into the counter."""
    members = engine.items() if isinstance(engine, EngineSet) else [(DEFAULT_ENGINE, engine)]
    for name, member in members:
        _refresh_one(name, member)
    if isinstance(engine, EngineSet):
        engine = engine.get(engine.default)  # the SLO guard tunes the default engine's lanes
    if isinstance(engine, AdmittedEngine):
        for lane in LANE_ORDER:
            limit = engine.controller.limit(lane)
            if limit is not None:
                metrics.LANE_LIMIT.labels(lane.value).set(limit)


def _refresh_one(name: str, engine: Engine) -> None:
    stats = engine.stats()
    # Every engine exports every series (0 where it reports nothing, as before the engine label):
    # a labelled child only exists once touched, and dashboards and alert rules expect the series.
    metrics.ENGINE_PREEMPTIONS.labels(name)
    metrics.ENGINE_PREFIX_HIT_RATE.labels(name)
    metrics.ENGINE_KV_CACHE_USAGE.labels(name)
    metrics.ENGINE_READY.labels(name).set(1 if engine.health().ready else 0)
    metrics.ENGINE_RUNNING.labels(name).set(stats.running)
    metrics.ENGINE_WAITING.labels(name).set(stats.waiting)
    if stats.kv_cache_usage is not None:
        metrics.ENGINE_KV_CACHE_USAGE.labels(name).set(stats.kv_cache_usage)
    if stats.prefix_cache_hit_rate is not None:
        metrics.ENGINE_PREFIX_HIT_RATE.labels(name).set(stats.prefix_cache_hit_rate)
    if stats.preemptions is not None:
        seen = _preemptions_seen.get(engine, 0)
        # A restarted engine counts from zero again: then everything it reports is new.
        metrics.ENGINE_PREEMPTIONS.labels(name).inc(
            stats.preemptions - seen if stats.preemptions >= seen else stats.preemptions
        )
        _preemptions_seen[engine] = stats.preemptions


async def healthz(request: web.Request) -> web.Response:
    """Liveness: the process and its event loop answer."""
    return web.json_response({"status": "alive"})


async def readyz(request: web.Request) -> web.Response:
    """Readiness: 200 when the engine (every engine of a set) takes requests and the database
    answers, else 503 + reason."""
    engine = request.app[ENGINE_KEY]
    store = request.app[STORE_KEY]
    health = engine.health()
    reasons: list[str] = []
    if not health.ready:
        reasons.append(f"engine not ready: {health.reason or 'starting'}")
    if not await store.ping():
        reasons.append(f"database unreachable ({store.buffered} rows buffered)")
    if reasons:
        return web.json_response({"ready": False, "reason": "; ".join(reasons)}, status=503)
    return web.json_response({"ready": True})


async def metrics_view(request: web.Request) -> web.Response:
    """Prometheus exposition of the default registry."""
    refresh_engine_metrics(request.app[ENGINE_KEY])
    body = generate_latest(REGISTRY)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def build_http_app(
    *,
    engine: Engine,
    store: Store,
    routes: Iterable[web.RouteDef] = (),
    max_body_bytes: int = MAX_BODY_BYTES,
) -> web.Application:
    """The aiohttp application with the built-in endpoints plus ``routes``; bodies over
    ``max_body_bytes`` get 413 (see :func:`body_guard`)."""
    app = web.Application(client_max_size=max_body_bytes, middlewares=[body_guard])
    app[MAX_BODY_KEY] = max_body_bytes
    app[ENGINE_KEY] = engine
    app[STORE_KEY] = store
    app.add_routes(
        [
            web.get("/healthz", healthz),
            web.get("/readyz", readyz),
            web.get("/metrics", metrics_view),
            *routes,
        ]
    )
    return app


async def start_http(
    app: web.Application, host: str, port: int, *, sock: socket.socket | None = None
) -> tuple[web.AppRunner, int]:
    """Serve ``app`` (on ``sock`` when one was bound already); returns the runner and the bound
    port (useful with port 0)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site: web.BaseSite = web.SockSite(runner, sock) if sock is not None else web.TCPSite(runner, host, port)
    await site.start()
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    bound = sockets[0].getsockname()[1] if sockets else port
    logger.info("HTTP server listening on %s:%d", host, bound)
    return runner, int(bound)
