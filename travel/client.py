"""The orchestrator's HTTP client for a holder service: bounded reads, timeouts, one-line errors."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from gpucc.core.errors import MalformedInputError
from gpucc.core.jsonio import loads_untrusted
from gpucc.keyrelease.protocol import CHALLENGE_SIZE, Offer

from .errors import (
    HolderCannotDecideError,
    HolderConnectionError,
    HolderProtocolError,
    HolderRefusedError,
    HolderUnreachableError,
)
from .receipt import Receipt
from .signing import MAX_ENVELOPE_BYTES, Envelope

__all__ = ["HolderClient", "connection_cause"]

_MAX_SMALL_REPLY = 64 * 1024
#: The reply header in which a holder names the datasets its release policies withheld
#: (JSON: dataset, policy, check); informative only, the answer itself holds no key for them.
WITHHELD_HEADER = "gpucc-withheld"
_MAX_WITHHELD_HEADER = 4096


def connection_cause(exc: BaseException) -> str:
    """Why a connection failed, in words: the TLS verification message (a certificate not
    valid for the name, an unknown issuer), the TLS alert, or the operating system's
    reason (connection refused, name not known); the exception's type name at worst."""
    import ssl

    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    tls = system = None
    while todo:
        err = todo.pop(0)
        if id(err) in seen:
            continue
        seen.add(id(err))
        if isinstance(err, ssl.SSLCertVerificationError):
            return f"TLS certificate not accepted: {err.verify_message or err.reason}"
        if isinstance(err, ssl.SSLError):
            tls = tls or f"TLS failed: {err.reason or err.strerror or type(err).__name__}"
        elif isinstance(err, OSError) and err.strerror:
            system = system or err.strerror
        more = (getattr(err, "reason", None), err.__cause__, err.__context__, *err.args)
        todo += [m for m in more if isinstance(m, BaseException)]
    if tls or system:
        return str(tls or system)
    text = str(exc)
    if "Caused by " in text:  # urllib3 names the cause in text only
        return text.rsplit("Caused by ", 1)[1].split("(", 1)[0]
    return type(exc).__name__


@dataclass(frozen=True)
class HolderClient:
    """One holder's service.

    Attributes:
        url: the base URL (``http://127.0.0.1:8443`` or ``https://…``).
        timeout: seconds to connect, to wait for each read, and for the whole reply (a
            reply trickled byte by byte is cut off after about twice this).
        verify_tls: ``True``, or a CA bundle path for a private TLS certificate.
    """

    url: str
    timeout: float = 30.0
    verify_tls: bool | str = True

    def _post(self, path: str, body: bytes, limit: int) -> tuple[int, bytes, str]:
        """The reply's status, body and the withheld datasets' header (empty without one)."""
        import requests

        started = time.monotonic()
        try:
            with requests.post(
                self.url.rstrip("/") + path,
                data=body,
                headers={"content-type": "application/json"},
                timeout=(min(self.timeout, 10.0), self.timeout),
                stream=True,
                verify=self.verify_tls,
                allow_redirects=False,
            ) as resp:
                status = resp.status_code
                headers = resp.headers
                parts: list[bytes] = []
                size = 0
                # read1 returns what has arrived; read(n) would wait for all n bytes
                read = getattr(resp.raw, "read1", resp.raw.read)
                # each read waits at most `timeout`; the whole reply must come within it too
                while size <= limit:
                    if time.monotonic() - started > self.timeout:
                        raise requests.Timeout()
                    part = read(min(65536, limit + 1 - size), decode_content=True)
                    if not part:
                        break
                    parts.append(part)
                    size += len(part)
                data = b"".join(parts)
        except requests.Timeout:
            raise HolderUnreachableError(
                f"holder {self.url} did not answer within {self.timeout:g} s"
            ) from None
        except requests.RequestException as exc:
            cause = connection_cause(exc)
            raise HolderConnectionError(f"holder {self.url}: connection failed: {cause}") from exc
        withheld = str(headers.get(WITHHELD_HEADER, ""))[:_MAX_WITHHELD_HEADER]
        if len(data) > limit:
            raise HolderUnreachableError(
                f"holder {self.url} sent a reply larger than {limit} bytes"
            )
        return status, data, withheld

    @staticmethod
    def _error(status: int, data: bytes) -> str:
        try:
            doc: Any = loads_untrusted(data, what="error reply", error=MalformedInputError)
            message = doc.get("message", "") if isinstance(doc, dict) else ""
        except MalformedInputError:
            message = ""
        message = message if isinstance(message, str) else ""
        return " ".join(message.split())[:300] or f"HTTP {status}"

    @staticmethod
    def _withheld(reasons: object) -> list[str]:
        """``dataset X (policy P): check`` for each withheld dataset a holder named."""
        found = []
        for reason in reasons if isinstance(reasons, list) else []:
            if isinstance(reason, dict) and isinstance(reason.get("dataset"), str):
                policy = reason.get("policy")
                where = f" (policy {policy})" if isinstance(policy, str) else ""
                check = reason.get("check")
                rule = check if isinstance(check, str) else "a release rule"
                found.append(" ".join(f"dataset {reason['dataset']}{where}: {rule}".split()))
        return found[:20]

    def _refusal_reasons(self, data: bytes) -> list[str]:
        try:
            doc: Any = loads_untrusted(data, what="error reply", error=MalformedInputError)
        except MalformedInputError:
            return []
        return self._withheld(doc.get("reasons") if isinstance(doc, dict) else None)

    def _withheld_header(self, value: str) -> list[str]:
        if not value:
            return []
        try:
            doc: Any = loads_untrusted(
                value.encode(), what="withheld header", error=MalformedInputError
            )
        except (MalformedInputError, UnicodeError):
            return []
        return self._withheld(doc)

    def challenge(self) -> bytes:
        """A fresh challenge from the holder.

        Raises:
            HolderUnreachableError: no proper answer.
            HolderProtocolError: the holder refused (rate limit).
        """
        status, data, _ = self._post("/v1/challenge", b"{}", _MAX_SMALL_REPLY)
        if status == 503:
            raise HolderCannotDecideError(
                f"holder {self.url} cannot serve now: {self._error(status, data)}"
            )
        if status != 200:
            raise HolderProtocolError(
                f"holder {self.url} refused a challenge: {self._error(status, data)}"
            )
        try:
            doc = loads_untrusted(data, what="challenge", error=MalformedInputError)
            value = bytes.fromhex(doc["challenge"])
        except (MalformedInputError, ValueError, KeyError, TypeError):
            raise HolderUnreachableError(f"holder {self.url} sent a malformed challenge") from None
        if len(value) != CHALLENGE_SIZE:
            raise HolderUnreachableError(f"holder {self.url} sent a malformed challenge")
        return value

    def offer(self, offer: Offer) -> Envelope:
        """Send ``offer``; the signed answer envelope (not yet verified).

        Raises:
            as :meth:`offer_reply`.
        """
        return self.offer_reply(offer)[0]

    def offer_reply(self, offer: Offer) -> tuple[Envelope, list[str]]:
        """Send ``offer``; the signed answer envelope (not yet verified), and the datasets
        the holder said its release policies withheld (``dataset X (policy P): rule``).

        Raises:
            HolderUnreachableError: no proper answer in time.
            HolderRefusedError: the holder did not trust the GPU (HTTP 403).
            HolderCannotDecideError: the holder could not decide (HTTP 503).
            HolderProtocolError: another refusal (challenge used or unknown, rate limit, …).
            MalformedEnvelopeError: a 200 reply that is not an envelope.
        """
        status, data, withheld = self._post("/v1/offer", offer.to_json(), MAX_ENVELOPE_BYTES)
        if status == 403:
            refused = self._refusal_reasons(data)
            said = f"; withheld {'; '.join(refused)}" if refused else ""
            raise HolderRefusedError(
                f"holder {self.url} refused the GPU: {self._error(status, data)}{said}"
            )
        if status == 503:
            raise HolderCannotDecideError(
                f"holder {self.url} could not decide: {self._error(status, data)}"
            )
        if status != 200:
            raise HolderProtocolError(
                f"holder {self.url} refused the offer (HTTP {status}): {self._error(status, data)}"
            )
        return Envelope.from_json(data), self._withheld_header(withheld)

    def receipt(self, receipt: Receipt) -> bool:
        """Give the holder the receipt of its visit; whether it says it kept it.

        Raises:
            HolderUnreachableError: no proper answer in time.
        """
        status, _, _ = self._post("/v1/receipt", receipt.to_json(), _MAX_SMALL_REPLY)
        return status == 200
