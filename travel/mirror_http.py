"""The collateral mirror's HTTP face (``gpucc collateral serve``): a small Starlette app.

It lives beside the holder because it runs on the holder's hardened HTTP/1.1 server
(:mod:`gpucc.core.httpserver`: deadlines, connection caps, TLS, trusted proxies); the engine
it serves (:mod:`gpucc.gpuattest.mirror`) knows nothing of HTTP serving. It answers:

* the vendors' paths (:func:`gpucc.gpuattest.mirror.item_for`) with the vendor's bytes and
  headers, plus ``Gpucc-Mirror: hit|miss|stale|pass`` and, for a stale answer,
  ``Gpucc-Mirror-Stale: 1`` and ``Warning: 110 - "Response is Stale"``;
* ``404`` with a JSON error when the vendor has no such item (a RIM not published yet) or the
  path is not one the mirror serves; ``400`` for a malformed request; ``503`` (with
  ``Retry-After``) when the item is not held and cannot be had now;
* ``GET /healthz`` and ``GET /metrics`` (Prometheus text: per vendor hits, misses, stale
  answers, upstream requests, errors and latency; entries held).

Every answer is one JSON access-log line (the server's) and upstream requests are logged by
the engine; no log line holds a service key or a body.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucc.core.errors import EnvironmentProblemError, FileAccessError, MalformedInputError
from gpucc.core.files import write_atomic
from gpucc.gpuattest.mirror import (
    VENDORS,
    Mirror,
    MirrorNotFoundError,
    MirrorRequestError,
    MirrorUnavailableError,
    item_for,
)

if TYPE_CHECKING:
    from starlette.responses import Response

__all__ = ["build_app", "render_metrics", "serve_mirror"]

_log = logging.getLogger("gpucc.mirror")


def render_metrics(mirror: Mirror) -> str:
    """The Prometheus text exposition of ``mirror``'s counters."""
    rows: list[str] = []

    def family(name: str, kind: str, doc: str, values: dict[str, float]) -> None:
        rows.append(f"# HELP {name} {doc}")
        rows.append(f"# TYPE {name} {kind}")
        for vendor, value in values.items():
            rows.append(f'{name}{{vendor="{vendor}"}} {value:g}')

    s = mirror.stats
    family(
        "gpucc_mirror_hits_total",
        "counter",
        "Answers from a fresh held entry",
        {v: s[v].hits for v in VENDORS},
    )
    family(
        "gpucc_mirror_misses_total",
        "counter",
        "Items fetched from the vendor for a client",
        {v: s[v].misses for v in VENDORS},
    )
    family(
        "gpucc_mirror_coalesced_total",
        "counter",
        "Answers that waited for another client's request to the vendor (single flight)",
        {v: s[v].coalesced for v in VENDORS},
    )
    family(
        "gpucc_mirror_stale_total",
        "counter",
        "Stale entries served within the grace",
        {v: s[v].stale for v in VENDORS},
    )
    family(
        "gpucc_mirror_upstream_requests_total",
        "counter",
        "Requests to the vendor",
        {v: s[v].upstream_requests for v in VENDORS},
    )
    family(
        "gpucc_mirror_upstream_errors_total",
        "counter",
        "Vendor requests that failed or answered unusably",
        {v: s[v].upstream_errors for v in VENDORS},
    )
    family(
        "gpucc_mirror_upstream_seconds_sum",
        "counter",
        "Time spent on vendor requests",
        {v: round(s[v].upstream_seconds, 6) for v in VENDORS},
    )
    family(
        "gpucc_mirror_refreshes_total",
        "counter",
        "Entries renewed in the background",
        {v: s[v].refreshes for v in VENDORS},
    )
    rows.append("# HELP gpucc_mirror_entries Entries held")
    rows.append("# TYPE gpucc_mirror_entries gauge")
    rows.append(f"gpucc_mirror_entries {len(mirror.store)}")
    return "\n".join(rows) + "\n"


def _error(status: int, kind: str, message: str) -> Response:
    from starlette.responses import Response

    headers = {"retry-after": "5"} if status == 503 else {}
    body = json.dumps({"error": kind, "message": message}, sort_keys=True)
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def build_app(mirror: Mirror, *, max_concurrency: int = 256) -> Any:
    """The ASGI app answering for ``mirror``.

    Raises:
        EnvironmentProblemError: Starlette is not installed (the ``holder`` extra).
    """
    try:
        import anyio.to_thread
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import PlainTextResponse, Response
        from starlette.routing import Route
    except ImportError:
        raise EnvironmentProblemError(
            "collateral serve needs Starlette and h11: pip install 'gpucc[holder]'"
        ) from None

    limiter = anyio.CapacityLimiter(max_concurrency)

    async def healthz(request: Request) -> Response:
        del request
        return Response(
            json.dumps({"status": "ok", "entries": len(mirror.store)}),
            media_type="application/json",
        )

    async def metrics(request: Request) -> Response:
        del request
        return PlainTextResponse(render_metrics(mirror), media_type="text/plain; version=0.0.4")

    async def answer(request: Request) -> Response:
        body = await request.body() if request.method == "POST" else b""
        try:
            item = item_for(request.method, request.url.path, request.url.query, body)
            served = await anyio.to_thread.run_sync(mirror.get, item, limiter=limiter)
        except MirrorRequestError as exc:
            return _error(400, "bad-request", str(exc))
        except MirrorNotFoundError as exc:
            return _error(404, "not-found", str(exc))
        except MirrorUnavailableError as exc:
            return _error(503, "collateral-unavailable", str(exc))
        headers = {k: v for k, v in served.headers if k != "content-type"}
        headers["gpucc-mirror"] = served.source
        if served.source == "stale":
            headers["gpucc-mirror-stale"] = "1"
            headers["warning"] = '110 - "Response is Stale"'
        media = dict(served.headers).get("content-type", "application/octet-stream")
        return Response(served.body, media_type=media, headers=headers)

    return Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/{path:path}", answer, methods=["GET", "POST"]),
        ]
    )


def _tls(cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(str(cert), str(key))
    except ssl.SSLError as exc:
        raise MalformedInputError(
            f"--tls-cert/--tls-key are not a PEM certificate and its key: {exc.reason}"
        ) from None
    except OSError as exc:
        raise FileAccessError(
            f"--tls-cert/--tls-key cannot be read: {exc.strerror or exc}"
        ) from None
    return ctx


def serve_mirror(
    mirror: Mirror,
    *,
    host: str,
    port: int,
    limits: Any,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
    address_file: Path | None = None,
    refresh_s: float = 60.0,
    drain_s: float = 10.0,
    describe: Callable[[], dict[str, Any]] = dict,
) -> int | None:
    """Serve ``mirror`` until SIGTERM or SIGINT, renewing due entries every ``refresh_s``.

    Returns:
        The signal that stopped the service (the CLI re-raises it), or None.
    """
    from gpucc.core.httpserver import run_server

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    for name in ("gpucc.holder.access", "gpucc.mirror"):
        log = logging.getLogger(name)
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    tls = _tls(tls_cert, tls_key) if tls_cert is not None and tls_key is not None else None
    app = build_app(mirror)
    stop = threading.Event()

    def refresher() -> None:
        while not stop.wait(refresh_s):
            try:
                renewed = mirror.refresh()
            except Exception as exc:  # noqa: BLE001 - the refresher must outlive any one failure
                _log.warning(json.dumps({"event": "refresh-failed", "why": type(exc).__name__}))
                continue
            if renewed:
                _log.info(json.dumps({"event": "refreshed", "entries": renewed}))

    def started(bound: int) -> None:
        address = f"[{host}]:{bound}" if ":" in host else f"{host}:{bound}"
        if address_file is not None:
            write_atomic(address_file, f"{address}\n".encode(), what="address file")
        _log.info(
            json.dumps(
                {
                    "event": "start",
                    "service": "collateral-mirror",
                    "listen": address,
                    "tls": tls is not None,
                    "entries": len(mirror.store),
                    "offline": mirror.offline,
                    "time": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                    **describe(),
                },
                sort_keys=True,
            )
        )

    thread = threading.Thread(target=refresher, name="mirror-refresh", daemon=True)
    thread.start()
    try:
        return run_server(
            app, host=host, port=port, limits=limits, tls=tls, drain_s=drain_s, on_start=started
        )
    finally:
        stop.set()
