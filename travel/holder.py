"""The data holder's key-release service: challenges, verified offers, signed answers.

An ASGI application (Starlette) served by :mod:`gpucc.travel.httpserver`. Endpoints:

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from cryptography.hazmat.primitives.asymmetric import ec

from gpucc.assembly import PlatformResult, PlatformVerifier
from gpucc.assembly.record import TrustRecord, release_record
from gpucc.core.errors import (
    CollateralUnavailableError,
    EnvironmentProblemError,
    FileAccessError,
    GpuccError,
    MalformedInputError,
    UsageError,
)
from gpucc.core.files import write_atomic
from gpucc.staging.errors import ProtocolError
from gpucc.staging.release import CHALLENGE_SIZE, DatasetKey, Offer, accept_offer
from gpucc.staging.replay import ChallengeReplayError, MemoryReplayStore, ReplayStore
from gpucc.staging.requester import RequesterSignatureError, requester_key_id
from gpucc.staging.statedb import PostgresState, SqliteState, StateUnavailableError

from .audit import audit_document
from .httpserver import ServerLimits, run_server
from .receipt import Receipt
from .signing import key_id, sign_answer

__all__ = [
    "ChallengeStore",
    "HolderConfig",
    "LiveConfig",
    "ReleasePolicy",
    "RateLimiter",
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


@dataclass(frozen=True)
class ReleasePolicy:
    """A group of datasets and what their requester must meet (as a key broker's resource
    policy): ``verifier`` is built once from that group's attestation policy (None: the
    holder's own), and ``requesters``, when not empty, are the key ids of which one must have
    signed the offer (:mod:`gpucc.staging.requester`)."""

    name: str
    datasets: tuple[str, ...]
    verifier: PlatformVerifier | None = field(default=None, repr=False)
    requesters: frozenset[str] = frozenset()


@dataclass(frozen=True)
class HolderConfig:
    """Everything the service needs.

    Attributes:
        datasets: the dataset keys this holder releases (never in a repr).
        signing_key: the long-term answer-signing key (never in a repr).
        verifier: the platform verifier (``gpucc.assembly``): GPU and CVM evidence, the
            holder's policy, its roots and collateral; GPU-only offers only under the
            policy's relaxation ``cvm.allow_gpu_only``.
        challenge_ttl: seconds a challenge stays valid.
        max_request_bytes: larger request bodies are refused before parsing.
        rate_per_s, burst: each client's token bucket.
        max_outstanding: challenges kept at most (oldest evicted first).
        max_challenges_per_client: outstanding challenges one client address may hold.
        body_timeout_s: a whole request must arrive within this many seconds.
        receipt_dir: where receipts of visits are kept as files (``None``: not as files).
        dataset_names: each dataset's name (the sealed file's stem), in ``datasets``' order.
        releases: per-dataset release policies: a dataset named in one is released only to
            offers that pass that policy's verifier; the others under ``verifier``.
        state: the durable state (:mod:`gpucc.staging.statedb`): answered and issued
            challenges, receipts and an audit record per decision (``None``: memory only).
        orchestrator_key: receipts are accepted only when signed by this key (``None``:
            by any key, a few per session).
    """

    datasets: tuple[DatasetKey, ...] = field(repr=False)
    signing_key: ec.EllipticCurvePrivateKey = field(repr=False)
    verifier: PlatformVerifier = field(repr=False)
    challenge_ttl: float = 120.0
    max_request_bytes: int = 256 * 1024
    rate_per_s: float = 20.0
    burst: int = 40
    max_outstanding: int = 10_000
    max_challenges_per_client: int = 64
    body_timeout_s: float = 30.0
    receipt_dir: Path | None = None
    orchestrator_key: ec.EllipticCurvePublicKey | None = None
    state: SqliteState | PostgresState | None = field(default=None, repr=False)
    dataset_names: tuple[str, ...] = ()
    releases: tuple[ReleasePolicy, ...] = ()


class ChallengeRefused(Exception):  # noqa: N818 - an outcome, mapped to HTTP 409
    """A challenge that is unknown, used or expired."""


class SharedChallenges(Protocol):
    """Issued challenges kept where every holder process sharing the state can take them
    (:class:`gpucc.staging.statedb.SqliteState`, ``PostgresState``)."""

    def issue(self, challenge: bytes, ttl_s: float) -> None: ...

    def take(self, challenge: bytes) -> bool | None: ...


class ChallengeStore:
    """One-time challenges with expiry; the ones used are claimed in the key-release
    protocol's replay store (:mod:`gpucc.staging.replay`), the one record of answered
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


class DatasetsRefused(ProtocolError):  # noqa: N818 - an outcome: no dataset may be released
    """The offer met no dataset's release policy; ``reasons`` name each dataset and rule."""

    def __init__(
        self, message: str, reasons: list[dict[str, str]], requester: str | None = None
    ) -> None:
        super().__init__(message)
        self.reasons = reasons
        self.requester = requester


@dataclass(frozen=True)
class _Released:
    """An answered offer: the signed answer, and what the decision was."""

    envelope: bytes
    transcript_hash: bytes
    record: TrustRecord
    released: list[tuple[str, str]]  # (dataset, policy)
    withheld: list[dict[str, str]]
    requester: str | None


def _groups(
    config: HolderConfig,
) -> list[tuple[str, PlatformVerifier, frozenset[str], list[int]]]:
    """(policy name, verifier, requester key ids, indexes into ``config.datasets``) for each
    release policy that governs at least one dataset; ``default`` for the datasets no policy
    names."""
    names = _names(config)
    claimed: set[str] = set()
    groups = []
    for policy in config.releases:
        chosen = [i for i, n in enumerate(names) if n in policy.datasets and n not in claimed]
        claimed.update(names[i] for i in chosen)
        if chosen:
            verifier = policy.verifier or config.verifier
            groups.append((policy.name, verifier, policy.requesters, chosen))
    rest = [i for i, n in enumerate(names) if n not in claimed]
    if rest:
        groups.insert(0, ("default", config.verifier, frozenset[str](), rest))
    return groups


def _names(config: HolderConfig) -> tuple[str, ...]:
    return config.dataset_names or tuple(d.dataset_id.hex() for d in config.datasets)


def _identity_unmet(requesters: frozenset[str], requester: str | None) -> str | None:
    """Why the offer's requester does not meet a policy that names ``requesters``."""
    if not requesters or requester in requesters:
        return None
    if requester is None:
        return "the offer is not signed by a requester this policy names"
    return f"the offer is signed by requester {requester[:16]}…, not one this policy names"


def _answer_offer(config: HolderConfig, offer: Offer, results: list[PlatformResult]) -> _Released:
    """Verify ``offer`` through each release policy's platform verifier (every result
    appended to ``results``), wrap the keys of the datasets whose policy it meets (its
    attestation policy, and its requester identity when it names requesters) to its
    session, and sign the answer with the release's trust record.

    Raises:
        DatasetsRefused: no dataset's policy was met, or the offer's requester signature
            does not verify.
        ProtocolError: the one policy of a holder without release policies was not met.
    """
    names = _names(config)
    groups = _groups(config)
    try:
        requester = requester_key_id(offer)
    except RequesterSignatureError as exc:
        reasons = [
            {"dataset": names[i], "policy": policy, "check": "requester identity",
             "detail": _one_line(exc)}
            for policy, _, _, chosen in groups for i in chosen
        ]  # fmt: skip
        raise DatasetsRefused(str(exc), reasons) from None
    released: list[tuple[int, str]] = []
    withheld: list[dict[str, str]] = []
    holder = None
    records: list[Any] = []
    for policy, verifier, requesters, chosen in groups:
        unmet_identity = _identity_unmet(requesters, requester)
        if unmet_identity is not None:
            for i in chosen:
                withheld.append(
                    {"dataset": names[i], "policy": policy, "check": "requester identity",
                     "detail": unmet_identity}
                )  # fmt: skip
            continue
        mine: list[PlatformResult] = []
        try:
            session = accept_offer(
                offer,
                challenge=offer.challenge,
                attest=verifier.gpu_attester(mine.append),
                attest_cvm=verifier.cvm_attester(mine.append),
                allow_gpu_only=verifier.allow_gpu_only,
            )
        except ProtocolError as exc:
            results.extend(mine)
            if len(groups) == 1 and not config.releases:  # one policy: its refusal as it is
                raise
            unmet = _failed_checks(mine) or [{"check": "offer", "detail": _one_line(exc)}]
            for i in chosen:
                for rule in unmet:
                    withheld.append({"dataset": names[i], "policy": policy, **rule})
            continue
        results.extend(mine)
        holder = holder or session
        records += [r.record for r in mine]
        released += [(i, policy) for i in chosen]
    if holder is None:
        raise DatasetsRefused("the offer meets no dataset's release policy", withheld, requester)
    record = release_record(records, gpu_only=holder.version == 1)
    released.sort()
    keys = [config.datasets[i] for i, _ in released]
    answer = holder.answer([holder.wrap(d) for d in keys]).to_json()
    envelope = sign_answer(
        config.signing_key, answer, holder.transcript_hash, record.to_dict()
    ).to_json()
    return _Released(
        envelope,
        holder.transcript_hash,
        record,
        [(names[i], policy) for i, policy in released],
        withheld,
        requester,
    )


def _everything(
    config: HolderConfig, exc: BaseException, reasons: list[dict[str, str]]
) -> list[dict[str, str]]:
    """A refusal of the whole offer (the one policy of a holder without release policies)
    as a refusal of each dataset, for the audit record."""
    unmet = reasons or [{"check": "offer", "detail": _one_line(exc)}]
    return [
        {"dataset": name, "policy": "default", **{k: v for k, v in rule.items() if k != "dataset"}}
        for name in _names(config)
        for rule in unmet
    ]


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


def _failed_checks(results: list[PlatformResult]) -> list[dict[str, str]]:
    refused = [r for r in results if not r.trusted]
    return refused[-1].failed_checks() if refused else []


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, GpuccError):
        return exc.diagnostics()[:500]
    return " ".join(str(exc).split())[:500]


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
    """The Starlette application for ``config``.

    Every answer other than a success is ``{"error": kind, "message": one line}`` (404 and
    405 included). The outcome of each request is left in ``scope["state"]["outcome"]``
    for the access log.

    Raises:
        EnvironmentProblemError: Starlette is not installed (the ``holder`` extra).
    """
    _require_web_stack()
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    state = config.state
    store = ChallengeStore(
        config.challenge_ttl,
        config.max_outstanding,
        per_client=config.max_challenges_per_client,
        replay=state,
        shared=state,
    )
    limiter = RateLimiter(config.rate_per_s, config.burst)
    holder_key_id = key_id(config.signing_key)
    # transcript hashes answered (bounded) -> receipts still accepted for that session
    answered: OrderedDict[str, int] = OrderedDict()
    answered_lock = threading.Lock()

    def refuse(
        request: Request,
        status: int,
        kind: str,
        message: str,
        reasons: list[dict[str, str]] | None = None,
    ) -> Response:
        request.state.outcome = kind
        body: dict[str, Any] = {"error": kind, "message": message}
        if reasons:
            body["reasons"] = reasons
        return JSONResponse(body, status_code=status)

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

    def client_of(request: Request) -> str:
        return request.client.host if request.client else "?"

    def limited(request: Request) -> bool:
        return not limiter.allow(client_of(request))

    async def healthz(request: Request) -> Response:
        request.state.outcome = "ok"
        return JSONResponse({"status": "ok", "holder_key_id": holder_key_id})

    async def challenge(request: Request) -> Response:
        if limited(request):
            return refuse(request, 429, "rate-limited", "too many requests")
        try:
            value, ttl = await run_in_threadpool(store.issue, client_of(request))
        except ChallengeRefused as exc:
            return refuse(request, 429, "rate-limited", str(exc))
        except StateUnavailableError as exc:
            return refuse(request, 503, "state-unavailable", _one_line(exc))
        request.state.outcome = "issued"
        return JSONResponse({"challenge": value.hex(), "expires_in": ttl})

    async def body_or_refusal(request: Request) -> bytes | Response:
        if limited(request):
            return refuse(request, 429, "rate-limited", "too many requests")
        try:
            body = await read_body(request)
        except TimeoutError:
            return refuse(request, 408, "timeout", "the request body did not arrive in time")
        if body is None:
            return refuse(request, 413, "too-large", "the request body is too large")
        return body

    live = live or LiveConfig(config)

    async def offer(request: Request) -> Response:
        config = live.current  # the datasets and policies as of this request
        body = await body_or_refusal(request)
        if isinstance(body, Response):
            return body
        try:
            parsed = Offer.from_json(body)
        except (MalformedInputError, ProtocolError) as exc:
            return refuse(request, 400, "malformed", _one_line(exc))
        try:
            await run_in_threadpool(store.consume, parsed.challenge)
        except ChallengeRefused as exc:
            await audit_whole(request, parsed, "challenge", str(exc))
            return refuse(request, 409, "challenge-refused", str(exc))
        except StateUnavailableError as exc:  # nothing is answered without its record
            return refuse(request, 503, "state-unavailable", _one_line(exc))
        results: list[PlatformResult] = []
        try:
            done = await run_in_threadpool(_answer_offer, config, parsed, results)
        except ProtocolError as exc:
            reasons = exc.reasons if isinstance(exc, DatasetsRefused) else _failed_checks(results)
            decision: dict[str, Any] = {
                "event": "refusal",
                "client": client_of(request),
                "reasons": reasons,
            }
            _decisions.info(json.dumps(decision, sort_keys=True))
            refused = (
                reasons if isinstance(exc, DatasetsRefused) else _everything(config, exc, reasons)
            )
            requester = exc.requester if isinstance(exc, DatasetsRefused) else None
            await audit(
                audit_document(
                    client=client_of(request),
                    requester=requester,
                    challenge=parsed.challenge,
                    released=[],
                    refused=refused,
                )
            )
            return refuse(request, 403, "not-trusted", _one_line(exc), reasons)
        except MalformedInputError as exc:
            return refuse(request, 400, "malformed", _one_line(exc))
        except CollateralUnavailableError as exc:
            return refuse(request, 503, "collateral-unavailable", _one_line(exc))
        except GpuccError as exc:
            await audit_whole(request, parsed, "offer", _one_line(exc))
            return refuse(request, 403, "refused", _one_line(exc))
        transcript = done.transcript_hash
        with answered_lock:
            answered[transcript.hex()] = _RECEIPTS_PER_SESSION
            while len(answered) > config.max_outstanding:
                answered.popitem(last=False)
        decision = {
            "event": "release",
            "client": client_of(request),
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
        await audit(
            audit_document(
                client=client_of(request),
                requester=done.requester,
                challenge=parsed.challenge,
                released=done.released,
                refused=done.withheld,
                trusted_with=done.record.to_dict(),
                transcript_hash=transcript.hex(),
            )
        )
        request.state.outcome = "answered"
        return Response(done.envelope, media_type="application/json")

    async def receipt(request: Request) -> Response:
        config = live.current
        body = await body_or_refusal(request)
        if isinstance(body, Response):
            return body
        if config.receipt_dir is None and state is None:
            return refuse(request, 404, "not-kept", "this holder keeps no receipts")
        try:
            parsed = Receipt.from_json(body)
            parsed.verify(config.orchestrator_key)
        except GpuccError as exc:
            return refuse(request, 400, "malformed", _one_line(exc))
        # Anyone who saw the transcript hash could post a receipt first; without a pinned
        # orchestrator key a few are kept per session (by signer), so none can crowd out
        # the orchestrator's own.
        with answered_lock:
            left = answered.get(parsed.transcript_hash, 0)
            if left > 0:
                answered[parsed.transcript_hash] = left - 1
        try:
            if left <= 0 and state is not None:  # answered by another process sharing it
                left = await run_in_threadpool(_receipts_left, state, parsed.transcript_hash)
            if left <= 0:
                return refuse(
                    request, 409, "unknown-session", "no answered session awaits this receipt"
                )
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
            return refuse(request, 503, "not-stored", _one_line(exc))
        request.state.outcome = "receipt-stored"
        return JSONResponse({"stored": True})

    async def audit(doc: dict[str, Any]) -> None:
        """The decision's audit record in the state (a log line says when it cannot be kept:
        the decision is made and answered either way)."""
        if state is None:
            return
        try:
            await run_in_threadpool(state.put_audit, doc)
        except GpuccError as exc:
            _decisions.warning(
                json.dumps({"event": "audit-not-kept", "error": _one_line(exc)}, sort_keys=True)
            )

    async def audit_whole(request: Request, offer: Offer, rule: str, detail: str) -> None:
        """A refusal of the whole offer before any dataset was considered."""
        reasons = [{"dataset": "*", "policy": "", "check": rule, "detail": detail}]
        await audit(
            audit_document(
                client=client_of(request),
                requester=None,
                challenge=offer.challenge,
                released=[],
                refused=reasons,
            )
        )

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = {404: "not-found", 405: "method-not-allowed"}.get(exc.status_code, "refused")
        request.state.outcome = kind
        return JSONResponse(
            {"error": kind, "message": " ".join(str(exc.detail).split())[:200]},
            status_code=exc.status_code,
            headers=exc.headers,
        )

    async def internal_error(request: Request, exc: Exception) -> Response:
        request.state.outcome = "internal"
        message = f"internal error ({type(exc).__name__})"
        return JSONResponse({"error": "internal", "message": message}, status_code=500)

    return Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET"]),
            Route("/v1/challenge", challenge, methods=["POST"]),
            Route("/v1/offer", offer, methods=["POST"]),
            Route("/v1/receipt", receipt, methods=["POST"]),
        ],
        exception_handlers={HTTPException: http_error, Exception: internal_error},
    )


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
) -> int | None:
    """Run the service until SIGINT, SIGTERM or SIGHUP; in-flight requests are drained first.

    ``limits`` is the connection policy (:class:`gpucc.travel.httpserver.ServerLimits`):
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

    def started() -> None:
        logging.getLogger("gpucc.holder").info(
            json.dumps(
                {
                    "event": "start",
                    "listen": f"{host}:{port}",
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
        logging.getLogger("gpucc.holder").info(json.dumps({"event": "stopped"}))
