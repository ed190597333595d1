"""An Azure TDX confidential VM's TD quote, from the paravisor's quote endpoint.

On Azure's TDX CVMs the guest cannot ask the TDX module for a quote: the paravisor keeps the
TDREPORT in its HCL report (:mod:`.hcl`, the vTPM's NV index 0x01400001), and the platform
turns a TDREPORT into a quote signed by the TD quoting enclave through a local HTTP endpoint
of the instance metadata service, ``http://169.254.169.254/acc/tdquote`` (the endpoint
Microsoft's own guest attestation library calls):

* request: ``POST`` with ``Content-Type: application/json`` and the body
  ``{"report": BASE64URL(TDREPORT)}`` (the 1024-byte TDREPORT, base64url without padding);
* answer: ``200`` with ``{"quote": BASE64URL(QUOTE)}``.

The endpoint is link-local: the request never goes through a proxy (``HTTP_PROXY`` is not
read) and follows no redirect to another origin. The answer is checked before it is used:
a JSON object with a base64url ``quote`` (padding optional), a TDX quote of a layout gpucc
reads (:func:`.tdx.check_layout`; zero padding after it, as Azure's quotes carry, is kept),
whose report data is the TDREPORT's. Anything else, or an endpoint that cannot be reached,
is :class:`~gpucc.core.errors.EnvironmentProblemError` naming the endpoint: collection failed
on this machine. Nothing here judges the quote; the verifier does, with the rest of the
vTPM evidence (:mod:`.vtpm`).
"""

from __future__ import annotations

import base64
import binascii
import json
import re

from gpucc.core.errors import EnvironmentProblemError, MalformedEvidenceError, NetworkError
from gpucc.core.origins import OriginGuard
from gpucc.core.transport import Fetcher, RequestsFetcher, safe_url

from .hcl import TDREPORT_SIZE

__all__ = ["AZURE_TD_QUOTE_URL", "MAX_ANSWER_BYTES", "fetch_td_quote", "td_quote_request"]

#: Azure's paravisor quote endpoint (instance metadata service, link-local).
AZURE_TD_QUOTE_URL = "http://169.254.169.254/acc/tdquote"
#: A quote with its PCK chain is about 5 KiB; base64 and JSON add a third.
MAX_ANSWER_BYTES = 256 * 1024
_TDREPORT_DATA = slice(128, 192)  # REPORTMACSTRUCT.REPORTDATA
_B64URL = re.compile(r"[A-Za-z0-9_-]+={0,2}")


def td_quote_request(td_report: bytes) -> bytes:
    """The request body for ``td_report`` (1024 bytes, type 0x81)."""
    if len(td_report) != TDREPORT_SIZE or td_report[0] != 0x81:
        raise ValueError("a TDREPORT is 1024 bytes of type 0x81")
    encoded = base64.urlsafe_b64encode(td_report).rstrip(b"=").decode()
    return json.dumps({"report": encoded}).encode()


def _bad(url: str, what: str) -> EnvironmentProblemError:
    return EnvironmentProblemError(f"the paravisor's TD quote endpoint {safe_url(url)} {what}")


def _quote_of(answer: bytes, url: str) -> bytes:
    try:
        doc = json.loads(answer)
    except (ValueError, UnicodeDecodeError):
        raise _bad(url, "did not answer with JSON") from None
    value = doc.get("quote") if isinstance(doc, dict) else None
    if not isinstance(value, str) or not _B64URL.fullmatch(value):
        raise _bad(url, "answered without a base64url 'quote'")
    try:
        return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    except (ValueError, binascii.Error):
        raise _bad(url, "answered without a base64url 'quote'") from None


def fetch_td_quote(
    td_report: bytes, *, url: str = AZURE_TD_QUOTE_URL, fetcher: Fetcher | None = None
) -> bytes:
    """The TD quote of ``td_report`` from the paravisor's endpoint at ``url``.

    Args:
        td_report: the TDREPORT from the HCL report (1024 bytes).
        url: the endpoint; Azure's by default (tests point it at a loopback stand-in).
        fetcher: the HTTP layer; by default one that reads no proxy settings.

    Raises:
        ValueError: ``td_report`` is not a TDREPORT.
        EnvironmentProblemError: the endpoint cannot be reached, refuses, or answers with
            anything but a TDX quote of this TDREPORT's report data.
    """
    from .tdx import check_layout, td_report_span

    body = td_quote_request(td_report)
    owned = fetcher is None
    http = fetcher if fetcher is not None else RequestsFetcher(trust_env=False, retries=2)
    try:
        answer = http.post(
            url,
            body,
            content_type="application/json",
            max_bytes=MAX_ANSWER_BYTES,
            guard=OriginGuard(url),
        )
    except NetworkError as exc:
        raise _bad(url, f"could not be used: {exc}") from None
    finally:
        if owned and isinstance(http, RequestsFetcher):
            http.close()
    quote = _quote_of(answer, url)
    try:
        check_layout(quote)
        _, _, start, _ = td_report_span(quote)
    except MalformedEvidenceError as exc:
        raise _bad(url, f"answered with no TDX quote: {exc}") from None
    if quote[start + 520 : start + 584] != td_report[_TDREPORT_DATA]:
        raise _bad(url, "answered with a quote of other report data than the TDREPORT's")
    return quote
