"""The data holder's key-release service: challenges, verified offers, signed answers.

An ASGI application (Starlette) served by :mod:`gpucc.core.httpserver`. Endpoints:

* ``POST /v1/challenge``: a fresh one-time challenge with its expiry, kept server-side.
* ``POST /v1/offer``: a host's offer (``gpucc.session-offer/v1``) for one of those
  challenges. The challenge is consumed before anything else is checked, so a second offer
  for it is refused whatever happens to the first. The offer's evidence passes the full
  gpucc verification and the holder's policy, or the offer is refused; the answer wraps the
  holder's dataset keys to that session only and is signed with the holder's long-term key
  (:mod:`gpucc.travel.signing`).
* ``GET /healthz``.

Requests larger than the limit are refused before they are parsed, each client has a
token bucket and a cap on its outstanding challenges, every refusal is the JSON error
body, and every request leaves one JSON access-log line without secrets.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import secrets
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gpucc.assembly import PlatformResult, PlatformVerifier
from gpucc.core.errors import (
    EnvironmentProblemError,
    FileAccessError,
    GpuccError,
    MalformedInputError,
    UsageError,
)
from gpucc.core.files import write_atomic
from gpucc.core.httpserver import ServerLimits, run_server
from gpucc.keyrelease.protocol import CHALLENGE_SIZE, DatasetKey, Offer, session_nonce
from gpucc.keyrelease.replay import (
    ChallengeReplayError,
    DeviceReportReplayError,
    MemoryReplayStore,
    ReplayStore,
    claim_device_reports,
)
from gpucc.staging.errors import ProtocolError
from gpucc.travel.client import WITHHELD_HEADER
from gpucc.travel.receipt import Receipt
from gpucc.travel.signing import key_id

from .audit import audit_document
from .decide import (
    DatasetsRefused,
    HolderConfig,
    Released,
    ReleasePolicy,
    answer_offer,
    failed_checks,
    one_line,
    released_devices,
    whole_refusal,
)
from .housekeeping import Housekeeper
from .refusals import (
    BAD_OFFER,
    BAD_RECEIPT,
    BODY_TIMEOUT,
    CHALLENGE_REFUSED,
    HOLDER_OUTCOMES,
    INTERNAL,
    NOT_KEPT,
    NOT_STORED,
    RATE_LIMITED,
    TOO_LARGE,
    UNKNOWN_SESSION,
    http_error_for_status,
)
from .state import (
    HOUSEKEEPING_MARGIN_S,
    PostgresState,
    SqliteState,
    StateUnavailableError,
)

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from gpucc.core.outcomes import HttpAnswer

__all__ = [
    "ChallengeStore",
    "HolderConfig",
    "LiveConfig",
    "ReleasePolicy",
    "RateLimiter",
    "RequestHandlers",
    "build_app",
    "load_datasets",
    "load_named_datasets",
    "serve",
    "store_receipt",
]

_access = logging.getLogger("gpucc.holder.access")
#: one line per key-release decision: what was released under which trust record, or why not
_decisions = logging.getLogger("gpucc.holder")
#: receipts accepted per answered session (without a pinned orchestrator key)
_RECEIPTS_PER_SESSION = 4


class ChallengeRefused(Exception):  # noqa: N818 - an outcome, mapped to HTTP 409
    """A challenge that is unknown, used or expired."""


class SharedChallenges(Protocol):
    """Issued challenges kept where every holder process sharing the state can take them
    (:class:`gpucc.holder.state.SqliteState`, ``PostgresState``)."""

    def issue(self, challenge: bytes, ttl_s: float) -> None: ...

    def take(self, challenge: bytes) -> bool | None: ...


class ChallengeStore:
    """One-time challenges with expiry; the ones used are claimed in the key-release
    protocol's replay store (:mod:`gpucc.keyrelease.replay`), the one record of answered
    challenges.

    Thread-safe; open challenges are bounded (``limit``), oldest first out, and one client
    holds at most ``per_client`` of them.
    """

    def __init__(
        self,
        ttl: float,
        limit: int,
        clock: Callable[[], float] = time.monotonic,
        per_client: int | None = None,
        replay: ReplayStore | None = None,
        shared: SharedChallenges | None = None,
    ):
        self._ttl = ttl
        self._limit = limit
        self._per_client = per_client
        self._clock = clock
        self._open: OrderedDict[bytes, tuple[float, str]] = OrderedDict()
        self._replay: ReplayStore = replay or MemoryReplayStore(
            ttl=dt.timedelta(seconds=ttl), clock=clock
        )
        self._shared = shared
        self._held: Counter[str] = Counter()
        self._lock = threading.Lock()

    def issue(self, client: str = "") -> tuple[bytes, float]:
        """A new challenge for ``client`` and its lifetime in seconds.

        Raises:
            ChallengeRefused: ``client`` already holds its share of open challenges.
        """
        challenge = secrets.token_bytes(CHALLENGE_SIZE)
        with self._lock:
            self._expire()
            if self._per_client is not None and self._held[client] >= self._per_client:
                raise ChallengeRefused("too many outstanding challenges for this client")
            self._open[challenge] = (self._clock() + self._ttl, client)
            self._held[client] += 1
            while len(self._open) > self._limit:
                _, (_, old) = self._open.popitem(last=False)
                self._release(old)
        if self._shared is not None:  # another process may take the offer (or this one, later)
            self._shared.issue(challenge, self._ttl)
        return challenge, self._ttl

    def _release(self, client: str) -> None:
        self._held[client] -= 1
        if self._held[client] <= 0:
            del self._held[client]

    def consume(self, challenge: bytes) -> None:
        """Take ``challenge`` for one offer; it can never be taken again.

        Raises:
            ChallengeRefused: unknown, already used, or expired.
        """
        with self._lock:
            now = self._clock()
            held = self._open.pop(challenge, None)
            if held is not None:
                self._release(held[1])
        fresh = held is not None and now <= held[0]
        if self._shared is not None:
            shared = self._shared.take(challenge)
            if held is None and shared is not None:
                held, fresh = (0.0, ""), shared
        if held is None:
            if self._replay.answered(challenge):
                raise ChallengeRefused("the challenge was already used (replay)")
            raise ChallengeRefused("unknown challenge")
        try:
            self._replay.claim(challenge)
        except ChallengeReplayError:
            raise ChallengeRefused("the challenge was already used (replay)") from None
        if not fresh:
            raise ChallengeRefused("the challenge expired")

    def claim_devices(self, devices: list[str], nonce: bytes) -> None:
        """Record the devices' reports over ``nonce`` as accepted, in the store that
        records answered challenges (shared when the state is).

        Raises:
            DeviceReportReplayError: one was accepted before (or is repeated), named.
        """
        claim_device_reports(self._replay, devices, nonce)

    def _expire(self) -> None:
        now = self._clock()
        for c in [c for c, (e, _) in self._open.items() if e < now]:
            self._release(self._open.pop(c)[1])


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


def load_named_datasets(
    directory: Path, key_file: Path
) -> tuple[tuple[str, ...], tuple[DatasetKey, ...]]:
    """Each sealed dataset's name (its file's stem) and key; see :func:`load_datasets`."""
    names = tuple(p.stem for p in sorted(directory.glob("*.gcc")))
    return names, load_datasets(directory, key_file)


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


def _allowed_relaxations(verifier: PlatformVerifier) -> list[str]:
    """The relaxations the holder's policy allows (used ones are logged per release)."""
    policy = verifier.settings.policy
    allowed = []
    if not policy.require_ocsp:
        allowed.append("ocsp.require: false")
    if not policy.require_nonce:
        allowed.append("nonce.require: false")
    cvm = policy.cvm
    for name in ("allow_gpu_only", "allow_unpinned", "allow_debug"):
        if getattr(cvm, name):
            allowed.append(f"cvm.{name}: true")
    return allowed


def _require_web_stack() -> None:
    """The holder service's optional dependencies, or a clear error naming the extra."""
    import importlib.util

    missing = [m for m in ("starlette", "h11") if importlib.util.find_spec(m) is None]
    if missing:
        raise EnvironmentProblemError(
            f"the holder service needs {' and '.join(missing)}: pip install 'gpucc[holder]'"
        )


class LiveConfig:
    """The configuration requests are answered with; replaced whole on reload (SIGHUP).
    Challenges issued, answered challenges and connections are the service's, not the
    configuration's: a reload keeps them."""

    def __init__(self, config: HolderConfig) -> None:
        self.current = config


def build_app(config: HolderConfig, live: LiveConfig | None = None) -> Any:
    """The Starlette application for ``config``: the routes of :class:`RequestHandlers`.

    Every answer other than a success is ``{"error": kind, "message": one line}`` (404 and
    405 included; :mod:`gpucc.holder.refusals`). The outcome of each request is left in
    ``scope["state"]["outcome"]`` for the access log.

    Raises:
        EnvironmentProblemError: Starlette is not installed (the ``holder`` extra).
        UsageError: the state forgets answered challenges before their challenges expire.
    """
    _require_web_stack()
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.routing import Route

    handlers = RequestHandlers(config, live or LiveConfig(config))
    return Starlette(
        routes=[
            Route("/healthz", handlers.healthz, methods=["GET"]),
            Route("/v1/challenge", handlers.challenge, methods=["POST"]),
            Route("/v1/offer", handlers.offer, methods=["POST"]),
            Route("/v1/receipt", handlers.receipt, methods=["POST"]),
        ],
        exception_handlers={HTTPException: handlers.http_error, Exception: handlers.internal},
    )


class RequestHandlers:
    """The service's request handlers, one method per endpoint, and what they share.

    What a reload replaces (datasets, policies, keys) is read from ``live`` once per
    request; issued challenges, the rate limiter and the sessions answered are the
    service's and outlive a reload. Needs Starlette (the ``holder`` extra).
    """

    def __init__(self, config: HolderConfig, live: LiveConfig) -> None:
        state = config.state
        if state is not None and state.ttl_s <= config.challenge_ttl + HOUSEKEEPING_MARGIN_S:
            # a claim must outlive every copy of its challenge (gpucc.holder.state_retention)
            raise UsageError(
                f"the state remembers answered challenges for {state.ttl_s:g} s: not longer "
                f"than the challenge TTL ({config.challenge_ttl:g} s) and "
                f"{HOUSEKEEPING_MARGIN_S:g} s"
            )
        self.live = live
        self.state = state
        self.store = ChallengeStore(
            config.challenge_ttl,
            config.max_outstanding,
            per_client=config.max_challenges_per_client,
            replay=state,
            shared=state,
        )
        self.limiter = RateLimiter(config.rate_per_s, config.burst)
        self.holder_key_id = key_id(config.signing_key)
        # transcript hashes answered (bounded) -> receipts still accepted for that session
        self.answered: OrderedDict[str, int] = OrderedDict()
        self.answered_lock = threading.Lock()
        # the request-independent parts of the server's reply limits
        self.body_timeout_s = config.body_timeout_s
        self.max_request_bytes = config.max_request_bytes

    # --- endpoints ----------------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        from starlette.responses import JSONResponse

        request.state.outcome = "ok"
        return JSONResponse({"status": "ok", "holder_key_id": self.holder_key_id})

    async def challenge(self, request: Request) -> Response:
        """``POST /v1/challenge``: a fresh challenge for this client, kept server-side."""
        from starlette.concurrency import run_in_threadpool
        from starlette.responses import JSONResponse

        if self._limited(request):
            return _refuse(request, RATE_LIMITED, "too many requests")
        try:
            value, ttl = await run_in_threadpool(self.store.issue, _client_of(request))
        except ChallengeRefused as exc:
            return _refuse(request, RATE_LIMITED, str(exc))
        except StateUnavailableError as exc:
            return _refuse_for(request, exc)
        request.state.outcome = "issued"
        return JSONResponse({"challenge": value.hex(), "expires_in": ttl})

    async def offer(self, request: Request) -> Response:
        """``POST /v1/offer``: the challenge consumed, then the release decision, signed."""
        from starlette.concurrency import run_in_threadpool
        from starlette.responses import Response

        config = self.live.current  # the datasets and policies as of this request
        body = await self._body_or_refusal(request)
        if isinstance(body, Response):
            return body
        try:
            parsed = Offer.from_json(body)
        except (MalformedInputError, ProtocolError) as exc:
            return _refuse(request, BAD_OFFER, one_line(exc))
        try:
            await run_in_threadpool(self.store.consume, parsed.challenge)
        except ChallengeRefused as exc:
            await self._audit_whole(request, parsed, "challenge", str(exc))
            return _refuse(request, CHALLENGE_REFUSED, str(exc))
        except StateUnavailableError as exc:  # nothing is answered without its record
            return _refuse_for(request, exc)
        results: list[PlatformResult] = []
        try:
            done = await run_in_threadpool(answer_offer, config, parsed, results)
        except ProtocolError as exc:
            return await self._not_trusted(request, config, parsed, exc, results)
        except GpuccError as exc:
            answer = HOLDER_OUTCOMES.http_for(exc)
            if answer.decided:  # a decision is recorded; a 400 or a 503 decided nothing
                await self._audit_whole(request, parsed, "offer", one_line(exc))
            return _refuse(request, answer, one_line(exc))
        try:  # a device's report over this nonce is accepted once, whatever the policies
            nonce = session_nonce(parsed.challenge, parsed.host_public_key)
            await run_in_threadpool(self.store.claim_devices, released_devices(results), nonce)
        except DeviceReportReplayError as exc:
            await self._audit_whole(request, parsed, "device report", str(exc))
            return _refuse(request, HOLDER_OUTCOMES.http_for(exc), str(exc))
        except StateUnavailableError as exc:
            return _refuse_for(request, exc)
        await self._released(request, parsed, done)
        # the datasets withheld, named for the client (its refusal stands on the missing key)
        named = [{k: r[k] for k in ("dataset", "policy", "check") if k in r} for r in done.withheld]
        told = {WITHHELD_HEADER: json.dumps(named[:20], separators=(",", ":"))} if named else {}
        return Response(done.envelope, media_type="application/json", headers=told)

    async def receipt(self, request: Request) -> Response:
        """``POST /v1/receipt``: the orchestrator's receipt for a session answered here."""
        from starlette.concurrency import run_in_threadpool
        from starlette.responses import JSONResponse, Response

        config = self.live.current
        state = self.state
        body = await self._body_or_refusal(request)
        if isinstance(body, Response):
            return body
        if config.receipt_dir is None and state is None:
            return _refuse(request, NOT_KEPT, "this holder keeps no receipts")
        try:
            parsed = Receipt.from_json(body)
            parsed.verify(config.orchestrator_key)
        except GpuccError as exc:
            return _refuse(request, BAD_RECEIPT, one_line(exc))
        # Anyone who saw the transcript hash could post a receipt first; without a pinned
        # orchestrator key a few are kept per session (by signer), so none can crowd out
        # the orchestrator's own.
        with self.answered_lock:
            left = self.answered.get(parsed.transcript_hash, 0)
            if left > 0:
                self.answered[parsed.transcript_hash] = left - 1
        try:
            if left <= 0 and state is not None:  # answered by another process sharing it
                left = await run_in_threadpool(_receipts_left, state, parsed.transcript_hash)
            if left <= 0:
                return _refuse(request, UNKNOWN_SESSION, "no answered session awaits this receipt")
            if state is not None:
                await run_in_threadpool(
                    state.put_record,
                    "receipt",
                    f"{parsed.transcript_hash}:{parsed.orchestrator_key_id}:{parsed.seq}",
                    json.loads(parsed.to_json()),
                )
            if config.receipt_dir is not None:
                await run_in_threadpool(store_receipt, config.receipt_dir, parsed)
        except GpuccError as exc:
            return _refuse(request, NOT_STORED, one_line(exc))
        request.state.outcome = "receipt-stored"
        return JSONResponse({"stored": True})

    async def http_error(self, request: Request, exc: Exception) -> Response:
        """A path or method the router does not serve (404, 405, ...)."""
        from starlette.exceptions import HTTPException
        from starlette.responses import JSONResponse

        assert isinstance(exc, HTTPException)
        answer = http_error_for_status(exc.status_code)
        request.state.outcome = answer.error
        return JSONResponse(
            {"error": answer.error, "message": " ".join(str(exc.detail).split())[:200]},
            status_code=answer.status,
            headers=exc.headers,
        )

    async def internal(self, request: Request, exc: Exception) -> Response:
        """A bug: the error's type and nothing of its message."""
        return _refuse(request, INTERNAL, f"internal error ({type(exc).__name__})")

    # --- what the endpoints share ---------------------------------------------------------

    def _limited(self, request: Request) -> bool:
        return not self.limiter.allow(_client_of(request))

    async def _body_or_refusal(self, request: Request) -> bytes | Response:
        if self._limited(request):
            return _refuse(request, RATE_LIMITED, "too many requests")
        try:
            body = await self._read_body(request)
        except TimeoutError:
            return _refuse(request, BODY_TIMEOUT, "the request body did not arrive in time")
        if body is None:
            return _refuse(request, TOO_LARGE, "the request body is too large")
        return body

    async def _read_body(self, request: Request) -> bytes | None:
        chunks: list[bytes] = []
        size = 0
        async with asyncio.timeout(self.body_timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > self.max_request_bytes:
                    return None
                chunks.append(chunk)
        return b"".join(chunks)

    async def _not_trusted(
        self,
        request: Request,
        config: HolderConfig,
        offer: Offer,
        exc: ProtocolError,
        results: list[PlatformResult],
    ) -> Response:
        """An offer the release policies refused: logged, audited, answered with reasons."""
        reasons = exc.reasons if isinstance(exc, DatasetsRefused) else failed_checks(results)
        decision: dict[str, Any] = {
            "event": "refusal",
            "client": _client_of(request),
            "reasons": reasons,
        }
        _decisions.info(json.dumps(decision, sort_keys=True))
        refused = (
            reasons if isinstance(exc, DatasetsRefused) else whole_refusal(config, exc, reasons)
        )
        requester = exc.requester if isinstance(exc, DatasetsRefused) else None
        request.state.withheld = refused
        await self._audit(
            audit_document(
                client=_client_of(request),
                requester=requester,
                challenge=offer.challenge,
                released=[],
                refused=refused,
            )
        )
        return _refuse_for(request, exc, reasons)

    async def _released(self, request: Request, offer: Offer, done: Released) -> None:
        """An answered offer: its session remembered for receipts, logged, audited."""
        transcript = done.transcript_hash
        with self.answered_lock:
            self.answered[transcript.hex()] = _RECEIPTS_PER_SESSION
            while len(self.answered) > self.live.current.max_outstanding:
                self.answered.popitem(last=False)
        decision = {
            "event": "release",
            "client": _client_of(request),
            "transcript_hash": transcript.hex(),
            "datasets": len(done.released),
            "released": [name for name, _ in done.released],
            "trusted_with": done.record.to_dict(),
        }
        if done.requester is not None:
            decision["requester"] = done.requester
        if done.withheld:
            decision["withheld"] = done.withheld
        _decisions.info(json.dumps(decision, sort_keys=True))
        await self._audit(
            audit_document(
                client=_client_of(request),
                requester=done.requester,
                challenge=offer.challenge,
                released=done.released,
                refused=done.withheld,
                trusted_with=done.record.to_dict(),
                transcript_hash=transcript.hex(),
            )
        )
        request.state.outcome = "answered"
        request.state.withheld = done.withheld

    async def _audit(self, doc: dict[str, Any]) -> None:
        """The decision's audit record in the state (a log line says when it cannot be kept:
        the decision is made and answered either way)."""
        from starlette.concurrency import run_in_threadpool

        if self.state is None:
            return
        try:
            await run_in_threadpool(self.state.put_audit, doc)
        except GpuccError as exc:
            _decisions.warning(
                json.dumps({"event": "audit-not-kept", "error": one_line(exc)}, sort_keys=True)
            )

    async def _audit_whole(self, request: Request, offer: Offer, rule: str, detail: str) -> None:
        """A refusal of the whole offer before any dataset was considered."""
        reasons = [{"dataset": "*", "policy": "", "check": rule, "detail": detail}]
        await self._audit(
            audit_document(
                client=_client_of(request),
                requester=None,
                challenge=offer.challenge,
                released=[],
                refused=reasons,
            )
        )


def _client_of(request: Request) -> str:
    return request.client.host if request.client else "?"


def _refuse(
    request: Request,
    answer: HttpAnswer,
    message: str,
    reasons: list[dict[str, str]] | None = None,
) -> Response:
    """The refusal ``answer`` with its one-line ``message``; its name is the outcome logged."""
    from starlette.responses import JSONResponse

    request.state.outcome = answer.error
    body: dict[str, Any] = {"error": answer.error, "message": message}
    if reasons:
        body["reasons"] = reasons
    return JSONResponse(body, status_code=answer.status)


def _refuse_for(
    request: Request, exc: GpuccError, reasons: list[dict[str, str]] | None = None
) -> Response:
    """The refusal the outcome table gives ``exc``."""
    return _refuse(request, HOLDER_OUTCOMES.http_for(exc), one_line(exc), reasons)


def _receipts_left(state: SqliteState | PostgresState, transcript_hash: str) -> int:
    """Receipts still accepted for a session answered by any process sharing ``state``."""
    if not state.released(transcript_hash):
        return 0
    return _RECEIPTS_PER_SESSION - state.count_records("receipt", transcript_hash)


def store_receipt(directory: Path, receipt: Receipt) -> Path:
    """Keep ``receipt`` in ``directory`` as
    ``receipt-<seq>-<transcript hash prefix>-<orchestrator key id prefix>.json``.

    Raises:
        FileAccessError: it cannot be written (an existing receipt is never replaced).
    """
    name = (
        f"receipt-{receipt.seq:06d}-{receipt.transcript_hash[:32]}-"
        f"{receipt.orchestrator_key_id[:16]}.json"
    )
    path = directory / name
    write_atomic(path, receipt.to_json() + b"\n", mode=0o644, what="receipt")
    return path


_PLAIN = logging.Formatter("%(message)s")


class _MarkedFormatter(logging.Formatter):
    """Adds ``fields`` to every JSON log line (``"simulated": true`` for a holder that trusts
    a simulation's roots: no line of its log can be read without it)."""

    def __init__(self, fields: dict[str, Any]) -> None:
        super().__init__("%(message)s")
        self.fields = fields

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        try:
            doc = json.loads(line)
        except ValueError:
            doc = {"message": line}
        if not isinstance(doc, dict):
            doc = {"message": doc}
        return json.dumps({**doc, **self.fields}, sort_keys=True)


def serve(
    config: HolderConfig,
    *,
    host: str,
    port: int,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
    drain_s: float = 20.0,
    limits: ServerLimits | None = None,
    reload: Callable[[], HolderConfig] | None = None,
    metrics: bool = False,
    address_file: Path | None = None,
) -> int | None:
    """Run the service until SIGINT, SIGTERM or SIGHUP; in-flight requests are drained first.

    ``port`` 0 listens on a port the system chooses; the start record of the log names the
    address listened on, and ``address_file`` (when given, and not existing) receives it as
    ``HOST:PORT`` once connections are accepted, for scripts to wait on.

    ``limits`` is the connection policy (:class:`gpucc.core.httpserver.ServerLimits`):
    deadlines, per-client and total connection caps, trusted proxies. On SIGHUP ``reload``
    (when given) makes the configuration later requests are answered with (datasets, release
    policies, receipts); when it raises, the service goes on with the one it has.

    Returns:
        The signal that stopped the service (the CLI re-raises it), or None.

    Raises:
        EnvironmentProblemError: Starlette or h11 is not installed (the ``holder`` extra).
    """
    _require_web_stack()
    import ssl

    handler = logging.StreamHandler()
    simulated = config.verifier.settings.simulated
    handler.setFormatter(_MarkedFormatter({"simulated": True}) if simulated else _PLAIN)
    for name in ("gpucc.holder.access", "gpucc.holder"):
        log = logging.getLogger(name)
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    tls = None
    if tls_cert is not None and tls_key is not None:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            tls.load_cert_chain(str(tls_cert), str(tls_key))
        except ssl.SSLError as exc:
            raise MalformedInputError(
                f"--tls-cert/--tls-key are not a PEM certificate and its key: {exc.reason}"
            ) from None
        except OSError as exc:
            raise FileAccessError(
                f"--tls-cert/--tls-key cannot be read: {exc.strerror or exc}"
            ) from None
    limits = limits or ServerLimits(max_body=config.max_request_bytes)

    def started(bound: int) -> None:
        address = f"[{host}]:{bound}" if ":" in host else f"{host}:{bound}"
        if address_file is not None:
            write_atomic(address_file, f"{address}\n".encode(), what="address file")
        logging.getLogger("gpucc.holder").info(
            json.dumps(
                {
                    "event": "start",
                    "listen": address,
                    "tls": tls is not None,
                    "holder_key_id": key_id(config.signing_key),
                    "datasets": len(config.datasets),
                    "roots": str(config.verifier.roots),
                    "policy_relaxations_allowed": _allowed_relaxations(config.verifier),
                },
                sort_keys=True,
            )
        )

    live = LiveConfig(config)

    def reloaded() -> None:
        if reload is None:
            return
        live.current = reload()
        logging.getLogger("gpucc.holder").info(
            json.dumps(
                {
                    "event": "reloaded",
                    "datasets": len(live.current.datasets),
                    "release_policies": [p.name for p in live.current.releases],
                },
                sort_keys=True,
            )
        )

    app = build_app(config, live)
    watch: Callable[[Any], None] = lambda acceptor: None  # noqa: E731
    if metrics:
        from .metrics import Metrics

        registry = Metrics()
        app, watch = registry.wrap(app), registry.watch
    housekeeper = None
    if config.state is not None:  # expired replay rows go in the background
        housekeeper = Housekeeper(
            config.state,
            lambda record: logging.getLogger("gpucc.holder").info(
                json.dumps(record, sort_keys=True)
            ),
        )
        housekeeper.start()
    try:
        return run_server(
            app,
            host=host,
            port=port,
            limits=limits,
            tls=tls,
            drain_s=drain_s,
            on_start=started,
            on_reload=reloaded,
            on_listen=watch,
        )
    except OSError as exc:
        raise EnvironmentProblemError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}"
        ) from None
    finally:
        if housekeeper is not None:
            housekeeper.stop()
        logging.getLogger("gpucc.holder").info(json.dumps({"event": "stopped"}))
