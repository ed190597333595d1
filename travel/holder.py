"""The data holder's key-release service: challenges, verified offers, signed answers.

An ASGI application (Starlette) served by Uvicorn. Endpoints:

* ``POST /v1/challenge``: a fresh one-time challenge with its expiry, kept server-side.
* ``POST /v1/offer``: a host's offer (``gpucc.session-offer/v1``) for one of those
  challenges. The challenge is consumed before anything else is checked, so a second offer
  for it is refused whatever happens to the first. The offer's evidence passes the full
  gpucc verification and the holder's policy, or the offer is refused; the answer wraps the
  holder's dataset keys to that session only and is signed with the holder's long-term key
  (:mod:`gpucc.travel.signing`).
* ``GET /healthz``.

Requests larger than the limit are refused before they are parsed, each client has a
token bucket, and every request leaves one JSON access-log line without secrets.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from gpucc.gpuattest.errors import (
    CollateralUnavailableError,
    EnvironmentProblemError,
    GpuccError,
    MalformedInputError,
    UsageError,
)
from gpucc.staging.errors import ProtocolError
from gpucc.staging.release import (
    CHALLENGE_SIZE,
    Attester,
    CvmAttester,
    DatasetKey,
    Offer,
    accept_offer,
)

from .signing import key_id, sign_answer

__all__ = [
    "ChallengeStore",
    "HolderConfig",
    "RateLimiter",
    "build_app",
    "directory_attester",
    "load_datasets",
    "make_attester",
    "serve",
]

_access = logging.getLogger("gpucc.holder.access")


@dataclass(frozen=True)
class HolderConfig:
    """Everything the service needs.

    Attributes:
        datasets: the dataset keys this holder releases (never in a repr).
        signing_key: the long-term answer-signing key (never in a repr).
        attest: the full verification and policy (``staging.release.Attester``).
        challenge_ttl: seconds a challenge stays valid.
        max_request_bytes: larger request bodies are refused before parsing.
        rate_per_s, burst: each client's token bucket.
        max_outstanding: challenges kept at most (oldest evicted first).
        body_timeout_s: a request body must arrive within this many seconds.
        attest_cvm: the CVM verifier and policy for version-2 offers (None: none accepted).
        allow_gpu_only: the named relaxation that accepts GPU-only (version 1) offers.
    """

    datasets: tuple[DatasetKey, ...] = field(repr=False)
    signing_key: ec.EllipticCurvePrivateKey = field(repr=False)
    attest: Attester = field(repr=False)
    challenge_ttl: float = 120.0
    max_request_bytes: int = 256 * 1024
    rate_per_s: float = 20.0
    burst: int = 40
    max_outstanding: int = 10_000
    body_timeout_s: float = 30.0
    attest_cvm: CvmAttester | None = field(default=None, repr=False)
    allow_gpu_only: bool = False


class ChallengeRefused(Exception):  # noqa: N818 - an outcome, mapped to HTTP 409
    """A challenge that is unknown, used or expired."""


class ChallengeStore:
    """One-time challenges with expiry, and a replay cache of the ones used.

    Thread-safe; both maps are bounded (``limit``), oldest first out.
    """

    def __init__(self, ttl: float, limit: int, clock: Callable[[], float] = time.monotonic):
        self._ttl = ttl
        self._limit = limit
        self._clock = clock
        self._open: OrderedDict[bytes, float] = OrderedDict()
        self._used: OrderedDict[bytes, float] = OrderedDict()
        self._lock = threading.Lock()

    def issue(self) -> tuple[bytes, float]:
        """A new challenge and its lifetime in seconds."""
        challenge = secrets.token_bytes(CHALLENGE_SIZE)
        with self._lock:
            self._expire()
            self._open[challenge] = self._clock() + self._ttl
            while len(self._open) > self._limit:
                self._open.popitem(last=False)
        return challenge, self._ttl

    def consume(self, challenge: bytes) -> None:
        """Take ``challenge`` for one offer; it can never be taken again.

        Raises:
            ChallengeRefused: unknown, already used, or expired.
        """
        with self._lock:
            now = self._clock()
            if challenge in self._used:
                raise ChallengeRefused("the challenge was already used (replay)")
            expiry = self._open.pop(challenge, None)
            if expiry is None:
                raise ChallengeRefused("unknown challenge")
            self._used[challenge] = expiry
            while len(self._used) > self._limit:
                self._used.popitem(last=False)
            if now > expiry:
                raise ChallengeRefused("the challenge expired")

    def _expire(self) -> None:
        now = self._clock()
        for store in (self._open, self._used):
            for c in [c for c, e in store.items() if e < now]:
                del store[c]


class RateLimiter:
    """A token bucket per client address (at most ``clients`` remembered)."""

    def __init__(self, rate: float, burst: int, clients: int = 4096) -> None:
        self._rate = rate
        self._burst = float(burst)
        self._clients = clients
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def allow(self, client: str) -> bool:
        """Take one token for ``client``; False when its bucket is empty."""
        now = time.monotonic()
        with self._lock:
            tokens, last = self._buckets.pop(client, (self._burst, now))
            tokens = min(self._burst, tokens + (now - last) * self._rate)
            allowed = tokens >= 1.0
            self._buckets[client] = (tokens - 1.0 if allowed else tokens, now)
            while len(self._buckets) > self._clients:
                self._buckets.popitem(last=False)
            return allowed


def load_datasets(directory: Path, key_file: Path) -> tuple[DatasetKey, ...]:
    """The keys of every sealed dataset (``*.gcc``) in ``directory``, opened with ``key_file``.

    Raises:
        UsageError: no sealed dataset in the directory.
        KeyFileError, KeyUnwrapError, MalformedDatasetError: as :func:`staging.open_sealed`.
    """
    from gpucc.staging import open_sealed, read_key_file

    kek = read_key_file(key_file)
    keys = []
    for path in sorted(directory.glob("*.gcc")):
        sealed = open_sealed(path)
        keys.append(DatasetKey(sealed.dataset_id, sealed.header_digest, sealed.unwrap(kek)))
    if not keys:
        raise UsageError(f"{directory} holds no sealed dataset (*.gcc)")
    return tuple(keys)


def make_attester(
    *, roots: Any, rims: Any, ocsp: Any, policy: Any, clock: Callable[[], dt.datetime]
) -> Attester:
    """``gpuattest.verifier.verify`` with these roots, collateral and policy, as an Attester."""
    from gpucc.gpuattest.verifier import verify

    def attest(evidence: Any, nonce: bytes) -> Any:
        return verify(
            evidence,
            expected_nonce=nonce,
            roots=roots,
            now=clock(),
            rims=rims,
            ocsp=ocsp,
            policy=policy,
        )

    return attest


def directory_attester(directory: Path, policy: Any) -> Attester:
    """Tests and demos: trust a simulated GPU whose anchors and RIMs are in ``directory``.

    ``device_root.pem``, ``rim_root.pem`` and ``rims/*.xml`` are read at every offer, so
    the simulated GPU may be replaced while the service runs. OCSP is not consulted.
    """
    from gpucc.gpuattest.collateral import DirectoryRimSource, NoOcsp
    from gpucc.gpuattest.trust import TrustRoots
    from gpucc.gpuattest.verifier import verify

    def attest(evidence: Any, nonce: bytes) -> Any:
        roots = TrustRoots.from_pem(
            (directory / "device_root.pem").read_bytes(),
            (directory / "rim_root.pem").read_bytes(),
        )
        return verify(
            evidence,
            expected_nonce=nonce,
            roots=roots,
            now=dt.datetime.now(dt.UTC),
            rims=DirectoryRimSource(directory / "rims"),
            ocsp=NoOcsp("simulated GPU: no OCSP responder"),
            policy=policy,
        )

    return attest


def _answer_offer(config: HolderConfig, offer: Offer) -> bytes:
    holder = accept_offer(
        offer,
        challenge=offer.challenge,
        attest=config.attest,
        attest_cvm=config.attest_cvm,
        allow_gpu_only=config.allow_gpu_only,
    )
    answer = holder.answer([holder.wrap(d) for d in config.datasets]).to_json()
    return sign_answer(config.signing_key, answer, holder.transcript_hash).to_json()


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, GpuccError):
        return exc.diagnostics()[:500]
    return " ".join(str(exc).split())[:500]


def _require_web_stack() -> None:
    """The holder service's optional dependencies, or a clear error naming the extra."""
    import importlib.util

    missing = [m for m in ("starlette", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise EnvironmentProblemError(
            f"the holder service needs {' and '.join(missing)}: pip install 'gpucc[holder]'"
        )


def build_app(config: HolderConfig) -> Any:
    """The Starlette application for ``config``.

    Raises:
        EnvironmentProblemError: Starlette is not installed (the ``holder`` extra).
    """
    _require_web_stack()
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    store = ChallengeStore(config.challenge_ttl, config.max_outstanding)
    limiter = RateLimiter(config.rate_per_s, config.burst)
    holder_key_id = key_id(config.signing_key)

    def refuse(request: Request, status: int, kind: str, message: str) -> Response:
        request.state.outcome = kind
        return JSONResponse({"error": kind, "message": message}, status_code=status)

    async def read_body(request: Request) -> bytes | None:
        chunks: list[bytes] = []
        size = 0
        async with asyncio.timeout(config.body_timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > config.max_request_bytes:
                    return None
                chunks.append(chunk)
        return b"".join(chunks)

    def limited(request: Request) -> bool:
        client = request.client.host if request.client else "?"
        return not limiter.allow(client)

    async def healthz(request: Request) -> Response:
        request.state.outcome = "ok"
        return JSONResponse({"status": "ok", "holder_key_id": holder_key_id})

    async def challenge(request: Request) -> Response:
        if limited(request):
            return refuse(request, 429, "rate-limited", "too many requests")
        value, ttl = store.issue()
        request.state.outcome = "issued"
        return JSONResponse({"challenge": value.hex(), "expires_in": ttl})

    async def offer(request: Request) -> Response:
        if limited(request):
            return refuse(request, 429, "rate-limited", "too many requests")
        try:
            body = await read_body(request)
        except TimeoutError:
            return refuse(request, 408, "timeout", "the request body did not arrive in time")
        if body is None:
            return refuse(request, 413, "too-large", "the request body is too large")
        try:
            parsed = Offer.from_json(body)
        except (MalformedInputError, ProtocolError) as exc:
            return refuse(request, 400, "malformed", _one_line(exc))
        try:
            store.consume(parsed.challenge)
        except ChallengeRefused as exc:
            return refuse(request, 409, "challenge-refused", str(exc))
        try:
            envelope = await run_in_threadpool(_answer_offer, config, parsed)
        except ProtocolError as exc:
            return refuse(request, 403, "not-trusted", _one_line(exc))
        except MalformedInputError as exc:
            return refuse(request, 400, "malformed", _one_line(exc))
        except CollateralUnavailableError as exc:
            return refuse(request, 503, "collateral-unavailable", _one_line(exc))
        except GpuccError as exc:
            return refuse(request, 403, "refused", _one_line(exc))
        request.state.outcome = "answered"
        return Response(envelope, media_type="application/json")

    app = Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET"]),
            Route("/v1/challenge", challenge, methods=["POST"]),
            Route("/v1/offer", offer, methods=["POST"]),
        ]
    )
    return _Guard(app, config.max_request_bytes)


class _Guard:
    """ASGI middleware: refuse oversized declared bodies early; one access-log line each."""

    def __init__(self, app: Any, limit: int) -> None:
        self._app = app
        self._limit = limit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        start = time.perf_counter()
        scope.setdefault("state", {})
        status = {"code": 0, "bytes": 0}

        async def send_logged(message: Any) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            elif message["type"] == "http.response.body":
                status["bytes"] += len(message.get("body", b""))
            await send(message)

        declared = dict(scope.get("headers") or []).get(b"content-length")
        try:
            too_large = declared is not None and int(declared) > self._limit
        except ValueError:
            too_large = True
        try:
            if too_large:
                scope["state"]["outcome"] = "too-large"
                body = b'{"error":"too-large","message":"the request body is too large"}'
                await send_logged(
                    {
                        "type": "http.response.start",
                        "status": 413,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"),
                        ],
                    }
                )
                await send_logged({"type": "http.response.body", "body": body})
            else:
                await self._app(scope, receive, send_logged)
        finally:
            client = scope.get("client") or ("?", 0)
            _access.info(
                json.dumps(
                    {
                        "event": "access",
                        "time": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
                        "client": client[0],
                        "method": scope.get("method"),
                        "path": scope.get("path"),
                        "status": status["code"],
                        "outcome": scope["state"].get("outcome", ""),
                        "bytes_out": status["bytes"],
                        "ms": round((time.perf_counter() - start) * 1000, 2),
                    },
                    sort_keys=True,
                )
            )


def serve(
    config: HolderConfig,
    *,
    host: str,
    port: int,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
    drain_s: float = 20.0,
    max_connections: int = 512,
) -> None:
    """Run the service until SIGINT or SIGTERM; in-flight requests are drained first.

    Beyond ``max_connections`` open connections and tasks, new requests get HTTP 503.

    Raises:
        EnvironmentProblemError: Starlette or Uvicorn is not installed (the ``holder`` extra).
    """
    _require_web_stack()
    import uvicorn

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    for name in ("gpucc.holder.access", "gpucc.holder"):
        log = logging.getLogger(name)
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    server = uvicorn.Server(
        uvicorn.Config(
            build_app(config),
            host=host,
            port=port,
            ssl_certfile=str(tls_cert) if tls_cert else None,
            ssl_keyfile=str(tls_key) if tls_key else None,
            log_config=None,
            access_log=False,
            server_header=False,
            date_header=False,
            timeout_keep_alive=5,
            timeout_graceful_shutdown=int(drain_s),
            h11_max_incomplete_event_size=16 * 1024,
            limit_concurrency=max_connections,
            lifespan="off",
        )
    )
    logging.getLogger("gpucc.holder").info(
        json.dumps(
            {
                "event": "start",
                "listen": f"{host}:{port}",
                "tls": tls_cert is not None,
                "holder_key_id": key_id(config.signing_key),
                "datasets": len(config.datasets),
            },
            sort_keys=True,
        )
    )
    try:
        asyncio.run(server.serve())
    finally:
        logging.getLogger("gpucc.holder").info(json.dumps({"event": "stopped"}))
