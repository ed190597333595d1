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
    HolderProtocolError,
    HolderRefusedError,
    HolderUnreachableError,
)
from .receipt import Receipt
from .signing import MAX_ENVELOPE_BYTES, Envelope

__all__ = ["HolderClient"]

_MAX_SMALL_REPLY = 64 * 1024


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

    def _post(self, path: str, body: bytes, limit: int) -> tuple[int, bytes]:
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
            kind = type(exc).__name__
            raise HolderUnreachableError(f"holder {self.url}: connection failed ({kind})") from None
        if len(data) > limit:
            raise HolderUnreachableError(
                f"holder {self.url} sent a reply larger than {limit} bytes"
            )
        return status, data

    @staticmethod
    def _error(status: int, data: bytes) -> str:
        try:
            doc: Any = loads_untrusted(data, what="error reply", error=MalformedInputError)
            message = doc.get("message", "") if isinstance(doc, dict) else ""
        except MalformedInputError:
            message = ""
        message = message if isinstance(message, str) else ""
        return " ".join(message.split())[:300] or f"HTTP {status}"

    def challenge(self) -> bytes:
        """A fresh challenge from the holder.

        Raises:
            HolderUnreachableError: no proper answer.
            HolderProtocolError: the holder refused (rate limit).
        """
        status, data = self._post("/v1/challenge", b"{}", _MAX_SMALL_REPLY)
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
            HolderUnreachableError: no proper answer in time.
            HolderRefusedError: the holder did not trust the GPU (HTTP 403).
            HolderCannotDecideError: the holder could not decide (HTTP 503).
            HolderProtocolError: another refusal (challenge used or unknown, rate limit, …).
            MalformedEnvelopeError: a 200 reply that is not an envelope.
        """
        status, data = self._post("/v1/offer", offer.to_json(), MAX_ENVELOPE_BYTES)
        if status == 403:
            raise HolderRefusedError(
                f"holder {self.url} refused the GPU: {self._error(status, data)}"
            )
        if status == 503:
            raise HolderCannotDecideError(
                f"holder {self.url} could not decide: {self._error(status, data)}"
            )
        if status != 200:
            raise HolderProtocolError(
                f"holder {self.url} refused the offer (HTTP {status}): {self._error(status, data)}"
            )
        return Envelope.from_json(data)

    def receipt(self, receipt: Receipt) -> bool:
        """Give the holder the receipt of its visit; whether it says it kept it.

        Raises:
            HolderUnreachableError: no proper answer in time.
        """
        status, _ = self._post("/v1/receipt", receipt.to_json(), _MAX_SMALL_REPLY)
        return status == 200
