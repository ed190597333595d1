"""Remote verification through NVIDIA's Remote Attestation Service (NRAS).

:class:`NrasClient` posts the evidence of one host, as NRAS v4 expects::

    POST <base>/v4/attest/gpu
    {"nonce": "<hex>", "arch": "HOPPER", "claims_version": "3.0",
     "evidence_list": [{"evidence": "<base64 report>", "certificate": "<base64 PEM chain>"}]}

(claims version 4.0 where a report is in a current format: versioned opaque data,
none at all, or Rubin; NVIDIA's service needs it for such evidence), and accepts the
answer, a detached EAT ``[["JWT", overall], {"GPU-0": token, ...}]``,
only when every check holds:

* every token's header says ``alg: ES384`` (checked before any key is touched)
  and names a ``kid`` found in NVIDIA's key set (``<base>/.well-known/jwks.json``,
  fetched through the HTTP layer and cached, see :mod:`gpuattest.jwks`), whose
  ``x5c`` chain validates to the pinned roots when roots are given;
* every signature verifies;
* ``iss`` equals the expected issuer (the base URL unless told otherwise);
* ``exp``, ``nbf`` and ``iat`` hold at ``now`` within the clock skew (120 s);
* the overall ``eat_nonce`` equals the nonce sent (and a device token's, where it has one);
* there is exactly one device token per GPU in the evidence (``GPU-0`` ... ``GPU-n-1``),
  each listed in the overall ``submods`` with the SHA-256 of its compact text.

The evidence is posted to, and the key set fetched from, the configured origin only: a
redirect to another scheme, host or port is refused (exit 3) unless that origin is named
(``allowed_origins``); the verdict says which origin served the key set (``key_origin``).

Outcomes are kept apart:

* the service could not be reached, answered an error status, or answered
  something that is not a detached EAT: :class:`~gpuattest.errors.NetworkError`
  or :class:`~gpuattest.jwks.RemoteServiceError` (both exit 3, "collateral
  unavailable"): never a verdict on the GPU;
* a token failed a check: :class:`~gpuattest.jws.TokenCheckError` (exit 1)
  naming the check;
* every check held: a :class:`RemoteVerdict`, whose ``trusted`` is NRAS's own
  overall result (``x-nvidia-overall-att-result``), false as well when any device
  token reports ``x-nvidia-error-details``, a ``measres`` other than ``success`` or a
  mismatch record (``x-nvidia-mismatch-measurement-records``, or claims 4.0's
  ``x-nvidia-mismatch-opaque-data-records``).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import types
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from cryptography import x509

from gpucc.core.errors import MalformedEvidenceError, UsageError
from gpucc.core.origins import OriginGuard, parse_origin
from gpucc.core.transport import Fetcher, safe_url

from .evidence import EvidenceSet
from .jwks import JwksClient, JwksDiskCache, RemoteServiceError, SigningKey
from .jws import (
    DEFAULT_CLOCK_SKEW,
    MalformedTokenError,
    TokenCheckError,
    check_detached,
    check_issuer,
    check_nonce,
    check_times,
    parse_detached,
    read_header,
    require_es384,
    verify_es384,
)
from .netconfig import NetworkSettings, build_fetcher

__all__ = [
    "ATTEST_GPU_PATH",
    "CLAIMS_VERSION",
    "DEFAULT_NRAS_BASE_URL",
    "JWKS_PATH",
    "MAX_NRAS_RESPONSE_BYTES",
    "NRAS_URL_ENV",
    "NrasClient",
    "RemoteGpuResult",
    "RemoteVerdict",
    "build_nras_client",
    "claims_version_for",
    "verdict_claims",
]

DEFAULT_NRAS_BASE_URL = "https://nras.attestation.nvidia.com"
ATTEST_GPU_PATH = "/v4/attest/gpu"
JWKS_PATH = "/.well-known/jwks.json"
NRAS_URL_ENV = "NVAT_NRAS_BASE_URL"
CLAIMS_VERSION = "3.0"
# 64 GPUs' tokens of a few KiB each, with room to spare.
MAX_NRAS_RESPONSE_BYTES = 2 * 1024 * 1024
_OVERALL_RESULT = "x-nvidia-overall-att-result"
_ERROR_DETAILS = "x-nvidia-error-details"
_ARCHES = frozenset({"HOPPER", "BLACKWELL", "RUBIN"})
#: The claims version NRAS needs for current evidence (versioned opaque data, reports
#: without opaque data such as Blackwell FSP's, Rubin's).
CURRENT_CLAIMS_VERSION = "4.0"
#: NRAS's mismatch claims: measurement blocks, and opaque-data records (claims 4.0).
_MISMATCH_CLAIMS = (
    "x-nvidia-mismatch-measurement-records",
    "x-nvidia-mismatch-opaque-data-records",
)


def claims_version_for(evidence: EvidenceSet, default: str = CLAIMS_VERSION) -> str:
    """The claims version to ask NRAS for: 4.0 when any report is in a current format
    (versioned opaque data, no opaque data, Rubin), else ``default``.

    A report gpucc cannot read leaves the choice to the others (NRAS judges it); one in
    a newer format than gpucc reads is current.
    """
    from gpucc.core.errors import MalformedReportError, UnsupportedFormatError

    from .report import SpdmEnvelope

    for gpu in evidence.gpus:
        if gpu.arch.strip().upper() == "RUBIN":
            return CURRENT_CLAIMS_VERSION
        try:
            env = SpdmEnvelope.parse(gpu.report)
        except UnsupportedFormatError:
            return CURRENT_CLAIMS_VERSION
        except MalformedReportError:
            continue
        if env.opaque_data.layout == "versioned" or not env.opaque:
            return CURRENT_CLAIMS_VERSION
    return default


@dataclass(frozen=True)
class RemoteGpuResult:
    """One GPU's verified NRAS token.

    Attributes:
        name: the submodule name (``GPU-0`` ...), in evidence order.
        claims: the token's claims, with NVIDIA's names (read-only).
        token: the compact token as NRAS sent it.
        kid: the key that signed it.
    """

    name: str
    claims: Mapping[str, Any] = field(repr=False)
    token: str = field(repr=False)
    kid: str = ""

    @property
    def error_details(self) -> Any:
        """NRAS's ``x-nvidia-error-details`` for this GPU, or None."""
        return self.claims.get(_ERROR_DETAILS)

    @property
    def mismatches(self) -> tuple[Any, ...]:
        """Every mismatch record NRAS reports for this GPU: measurement blocks, then
        opaque-data records (claims 4.0); a claim that is not a list counts as one."""
        out: list[Any] = []
        for name in _MISMATCH_CLAIMS:
            value = self.claims.get(name)
            if value is None:
                continue
            out.extend(value if isinstance(value, list) else [value])
        return tuple(out)


@dataclass(frozen=True)
class RemoteVerdict:
    """NRAS's answer after every gpucc check held.

    Attributes:
        trusted: NRAS's overall result is ``true``, every GPU's ``measres`` is
            ``success``, no GPU reports an NRAS error and none a mismatch record
            (measurement or opaque data).
        overall_result: the ``x-nvidia-overall-att-result`` claim as sent (True or False).
        nonce: the nonce sent and found in ``eat_nonce``.
        issuer: the ``iss`` every token carried.
        kid: the key that signed the overall token.
        overall_claims: the overall token's claims (read-only).
        overall_token: the overall compact token.
        gpus: one result per GPU, in evidence order.
        url: where the evidence was posted.
        verified_at: the verification time the checks used.
        key_anchor: ``x5c-chain`` when keys were checked to pinned roots,
            ``tls`` when the key set was trusted for coming over TLS from the service.
        key_origin: the origin (``https://host[:port]``) that served the key set
            holding the overall token's key.
    """

    trusted: bool
    overall_result: bool
    nonce: bytes
    issuer: str
    kid: str
    overall_claims: Mapping[str, Any] = field(repr=False)
    overall_token: str = field(repr=False)
    gpus: tuple[RemoteGpuResult, ...]
    url: str
    verified_at: dt.datetime
    key_anchor: str
    key_origin: str = ""

    def detached_eat(self) -> list[Any]:
        """The answer in NVIDIA's detached-EAT shape, as received."""
        return [["JWT", self.overall_token], {g.name: g.token for g in self.gpus}]

    def to_dict(self) -> dict[str, Any]:
        """JSON form: what was checked, NRAS's claims, and the tokens as received."""
        return {
            "verifier": "remote",
            "url": self.url,
            "trusted": self.trusted,
            "overall_result": self.overall_result,
            "issuer": self.issuer,
            "kid": self.kid,
            "key_anchor": self.key_anchor,
            "key_origin": self.key_origin,
            "nonce": self.nonce.hex(),
            "verified_at": self.verified_at.isoformat().replace("+00:00", "Z"),
            "overall_claims": json.loads(json.dumps(dict(self.overall_claims))),
            "claims": verdict_claims(self),
            "detached_eat": self.detached_eat(),
        }

    ATTEST_SCHEMA: ClassVar[str] = "gpucc.attest/v1"

    def attest_document(self, evidence: EvidenceSet) -> dict[str, Any]:
        """The ``gpucc.attest/v1`` document for this verdict on ``evidence`` (NVIDIA's claim
        names; ``verifier: remote``), its exit status the outcome table's."""
        from gpucc.core.outcomes import NOT_TRUSTED, OK

        claims = verdict_claims(self)
        gpus = []
        for index, (gpu, gpu_claims) in enumerate(zip(evidence.gpus, claims, strict=True)):
            trusted = gpu_claims.get("measres") == "success"
            gpus.append(
                {
                    "index": index,
                    "uuid": gpu.uuid,
                    "arch": gpu.arch,
                    "verdict": "trusted" if trusted else "not-trusted",
                    "evidence_sha256": hashlib.sha256(gpu.report).hexdigest(),
                    "claims": gpu_claims,
                }
            )
        outcome = OK if self.trusted else NOT_TRUSTED
        return {
            "schema": self.ATTEST_SCHEMA,
            "verifier": "remote",
            "verdict": "trusted" if self.trusted else "not-trusted",
            "trusted": self.trusted,
            "exit_code": outcome.code,
            "x-nvidia-overall-att-result": self.overall_result,
            "verified_at": self.verified_at.isoformat().replace("+00:00", "Z"),
            "nonce": self.nonce.hex(),
            "evidence_source": evidence.source,
            "remote": self.to_dict(),
            "gpus": gpus,
        }


def verdict_claims(verdict: RemoteVerdict) -> list[dict[str, Any]]:
    """Per-GPU claim dicts (NVIDIA's names), in evidence order, for ``gpucc.attest/v1``.

    Each is a deep copy of the device token's claims; ``eat_nonce`` is added from
    the overall token where a device token does not carry it.
    """
    out: list[dict[str, Any]] = []
    for gpu in verdict.gpus:
        claims: dict[str, Any] = json.loads(json.dumps(dict(gpu.claims)))
        claims.setdefault("eat_nonce", verdict.nonce.hex())
        out.append(claims)
    return out


def _freeze(claims: dict[str, Any]) -> Mapping[str, Any]:
    return types.MappingProxyType(claims)


class NrasClient:
    """Posts evidence to NRAS and checks its answer; see the module docstring.

    Args:
        fetcher: the HTTP layer.
        jwks: the key set NRAS signs with.
        base_url: NRAS base URL; the attest URL is ``base_url + ATTEST_GPU_PATH``.
        issuer: the ``iss`` every token must carry (default: ``base_url``).
        service_key: NVIDIA service key, sent as ``Authorization: Bearer``.
        clock_skew: tolerance on ``exp``/``nbf``/``iat``.
        claims_version: the claims version asked for.
        allow_hold: ask NRAS to accept OCSP ``certificateHold`` (its own header).
        allowed_origins: origins besides the base URL's that the attest request may be
            redirected to (the key set has its own, see :class:`JwksClient`).

    Raises:
        UsageError: an allowed origin that is not an origin.
    """

    def __init__(
        self,
        *,
        fetcher: Fetcher,
        jwks: JwksClient,
        base_url: str = DEFAULT_NRAS_BASE_URL,
        issuer: str | None = None,
        service_key: str | None = None,
        clock_skew: dt.timedelta = DEFAULT_CLOCK_SKEW,
        claims_version: str = CLAIMS_VERSION,
        allow_hold: bool = False,
        allowed_origins: Iterable[str] = (),
    ) -> None:
        self.allowed_origins = tuple(parse_origin(o) for o in allowed_origins)
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + ATTEST_GPU_PATH
        self.issuer = issuer if issuer is not None else self.base_url
        self.jwks = jwks
        self.clock_skew = clock_skew
        self.claims_version = claims_version
        self.allow_hold = allow_hold
        self._fetcher = fetcher
        self._service_key = service_key

    def __repr__(self) -> str:
        return f"NrasClient({safe_url(self.url)!r}, issuer={self.issuer!r})"

    def request_body(self, evidence: EvidenceSet, nonce: bytes) -> bytes:
        """The JSON NRAS expects for ``evidence`` and ``nonce``.

        Raises:
            UsageError: a nonce that is not 32 bytes.
            MalformedEvidenceError: no GPU, or GPUs of different or unsupported architectures.
        """
        if len(nonce) != 32:
            raise UsageError("the nonce must be 32 bytes")
        if not evidence.gpus:
            raise MalformedEvidenceError("the evidence holds no GPU")
        arches = {g.arch.upper() for g in evidence.gpus}
        if len(arches) != 1 or not arches <= _ARCHES:
            raise MalformedEvidenceError(
                f"NRAS takes one architecture per request (HOPPER or BLACKWELL), "
                f"got {', '.join(sorted(arches))}"
            )
        doc = {
            "nonce": nonce.hex(),
            "arch": arches.pop(),
            "claims_version": claims_version_for(evidence, self.claims_version),
            "evidence_list": [
                {
                    "evidence": base64.b64encode(g.report).decode("ascii"),
                    "certificate": base64.b64encode(g.cert_chain_pem).decode("ascii"),
                }
                for g in evidence.gpus
            ],
        }
        return json.dumps(doc, separators=(",", ":")).encode("ascii")

    def attest(self, evidence: EvidenceSet, nonce: bytes, *, now: dt.datetime) -> RemoteVerdict:
        """Post ``evidence`` with ``nonce`` and return the checked verdict.

        Raises:
            NetworkError, OfflineError: the service could not be reached, answered
                an error status or redirected to an origin not allowed (exit 3).
            RemoteServiceError: the answer is not a detached EAT, or the key set is
                unusable (exit 3).
            TokenCheckError: a token failed a check (exit 1), the check named.
            UsageError, MalformedEvidenceError: see :meth:`request_body`.
        """
        body = self.request_body(evidence, nonce)
        headers = {"Accept": "application/json"}
        if self.allow_hold:
            headers["X-NVIDIA-OCSP-ALLOW-CERT-HOLD"] = "true"
        answer = self._fetcher.post(
            self.url,
            body,
            content_type="application/json",
            max_bytes=MAX_NRAS_RESPONSE_BYTES,
            headers=headers,
            bearer=self._service_key,
            guard=OriginGuard(self.url, self.allowed_origins),
        )
        return self.check_answer(answer, gpu_count=len(evidence.gpus), nonce=nonce, now=now)

    def check_answer(
        self, answer: bytes, *, gpu_count: int, nonce: bytes, now: dt.datetime
    ) -> RemoteVerdict:
        """Check an NRAS answer (a detached EAT) for ``gpu_count`` GPUs and ``nonce``.

        Raises:
            RemoteServiceError: the answer is not a detached EAT of compact tokens.
            TokenCheckError: a token failed a check.
        """
        try:
            overall_token, device_tokens = parse_detached(answer, "the NRAS answer")
            for token in (overall_token, *device_tokens.values()):
                read_header(token, "an NRAS token")
        except MalformedTokenError as exc:
            raise RemoteServiceError(str(exc)) from None
        overall, key = self._verify(overall_token, "overall token", nonce, now, need_nonce=True)
        expected = [f"GPU-{i}" for i in range(gpu_count)]
        missing = [name for name in expected if name not in device_tokens]
        if missing:
            raise TokenCheckError("device-token", f"NRAS sent no token for {', '.join(missing)}")
        unexpected = sorted(set(device_tokens) - set(expected))
        if unexpected:
            names = ", ".join(repr(name[:32]) for name in unexpected[:4])
            more = f" and {len(unexpected) - 4} more" if len(unexpected) > 4 else ""
            raise TokenCheckError(
                "device-token", f"NRAS sent tokens for {names}{more}, not in the evidence"
            )
        if len(set(device_tokens.values())) != len(device_tokens):
            raise TokenCheckError("device-token", "NRAS sent one token for several GPUs")
        check_detached(overall, device_tokens)
        gpus: list[RemoteGpuResult] = []
        for name in expected:
            token = device_tokens[name]
            claims, gpu_key = self._verify(token, f"{name} token", nonce, now, need_nonce=False)
            gpus.append(
                RemoteGpuResult(name=name, claims=_freeze(claims), token=token, kid=gpu_key.kid)
            )
        result = overall.get(_OVERALL_RESULT)
        if not isinstance(result, bool):
            raise TokenCheckError(
                "overall-result", f"the overall token has no boolean '{_OVERALL_RESULT}'"
            )
        trusted = result and all(
            g.error_details is None and g.claims.get("measres") == "success" and not g.mismatches
            for g in gpus
        )
        return RemoteVerdict(
            trusted=trusted,
            overall_result=result,
            nonce=nonce,
            issuer=self.issuer,
            kid=key.kid,
            overall_claims=_freeze(overall),
            overall_token=overall_token,
            gpus=tuple(gpus),
            url=self.url,
            verified_at=now,
            key_anchor="x5c-chain" if self.jwks.roots else "tls",
            key_origin=key.origin,
        )

    def _verify(
        self, token: str, what: str, nonce: bytes, now: dt.datetime, *, need_nonce: bool
    ) -> tuple[dict[str, Any], SigningKey]:
        try:
            header = read_header(token, what)
            require_es384(header, what)
        except MalformedTokenError as exc:
            raise RemoteServiceError(str(exc)) from None
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise TokenCheckError("kid", f"{what}: no 'kid' in the header")
        key = self.jwks.key_for(kid, now=now)
        try:
            claims = verify_es384(token, key.public_key, what)
        except MalformedTokenError as exc:
            raise RemoteServiceError(str(exc)) from None
        check_issuer(claims, self.issuer, what)
        check_times(claims, now=now, skew=self.clock_skew, what=what)
        if need_nonce or "eat_nonce" in claims:
            check_nonce(claims, nonce, what)
        if not claims:
            raise TokenCheckError("claims", f"{what}: no claims")
        return claims, key


def build_nras_client(
    settings: NetworkSettings,
    *,
    roots: Sequence[x509.Certificate],
    nras_url: str | None = None,
    environ: Mapping[str, str] | None = None,
    fetcher: Fetcher | None = None,
    issuer: str | None = None,
    allow_hold: bool = False,
    clock_skew: dt.timedelta = DEFAULT_CLOCK_SKEW,
    allowed_origins: Sequence[str] = (),
) -> NrasClient:
    """An :class:`NrasClient` for ``settings``.

    The base URL is ``nras_url`` if given, else ``environ["NVAT_NRAS_BASE_URL"]``
    (the CLI passes ``os.environ``), else NVIDIA's. The key set comes from
    ``<base>/.well-known/jwks.json``; ``roots`` pins its ``x5c`` chains (empty:
    the key set is trusted for coming over TLS from the service). With roots and
    ``settings.use_cache``, the key set is also cached on disk in the cache
    directory (``jwks/``) until it expires. ``clock_skew``
    is the token-time tolerance (``settings.clock_skew`` is OCSP's, not used here).
    Both requests stay on the base URL's origin unless redirected to one of
    ``allowed_origins`` (``https://host[:port]``, named by the user).

    Raises:
        UsageError: a timeout or retry count that makes no sense, or an allowed
            origin that is not an origin.
        RemoteServiceError: no roots and a plain-http key-set URL, or allowed origin,
            to a remote host.
    """
    env = environ if environ is not None else {}
    base = (nras_url or env.get(NRAS_URL_ENV) or DEFAULT_NRAS_BASE_URL).strip().rstrip("/")
    fetch = fetcher if fetcher is not None else build_fetcher(settings)
    cache = settings.cache()
    jwks = JwksClient(
        fetcher=fetch,
        url=base + JWKS_PATH,
        roots=roots,
        service_key=settings.service_key,
        disk=JwksDiskCache(cache.directory) if cache is not None and roots else None,
        allowed_origins=allowed_origins,
    )
    return NrasClient(
        fetcher=fetch,
        jwks=jwks,
        base_url=base,
        issuer=issuer,
        service_key=settings.service_key,
        clock_skew=clock_skew,
        allow_hold=allow_hold,
        allowed_origins=allowed_origins,
    )
