"""Intel's TDX collateral from the Provisioning Certification Service (PCS) or a PCCS.

For a quote's platform (its FMSPC and PCK CA, read from the quote's PCK certificate) the PCS
v4 API serves the PCK CRL, the TDX TCB info and the TDX QE identity, each with its issuer
chain in a response header; the root CA CRL comes from Intel's certificate site (PCS) or the
PCCS's ``rootcacrl``. Everything goes through gpucc's HTTP transport (deadlines, size caps,
offline refusal) and the persistent cache, which serves an entry until its earliest next
update. What a server sends is checked only for shape here: the verifier checks signatures and
validity, so a hostile server can withhold collateral (exit 3) but not forge it.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Collection
from typing import TYPE_CHECKING, Protocol
from urllib.parse import unquote

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from gpucc.core.errors import MalformedCertificateError, MalformedEvidenceError, NetworkError
from gpucc.core.jsonio import loads_untrusted

from ..x509chain import load_certificates
from .tdx import TdxCollateral, platform_of

if TYPE_CHECKING:
    from ..cache import CollateralCache

__all__ = [
    "INTEL_PCS_URL",
    "INTEL_ROOT_CA_CRL_URL",
    "fetch_tdx_collateral",
    "tdx_collateral_for",
]

INTEL_PCS_URL = "https://api.trustedservices.intel.com"
INTEL_ROOT_CA_CRL_URL = "https://certificates.trustedservices.intel.com/IntelSGXRootCA.der"
MAX_CRL_BYTES = 4 * 1024 * 1024
MAX_JSON_BYTES = 1024 * 1024


class HeaderFetcher(Protocol):
    """What this module needs of the transport (``RequestsFetcher`` fits)."""

    def get_with_headers(
        self, url: str, *, max_bytes: int, accept: Collection[int] = (200,)
    ) -> tuple[bytes, dict[str, str]]:
        """The body and the response headers (lower-case names)."""
        ...


def _bad(url: str, what: str) -> NetworkError:
    return NetworkError(f"{url} answered malformed collateral: {what}")


def _chain(headers: dict[str, str], names: tuple[str, ...], url: str) -> str:
    for name in names:
        if name in headers:
            pem = unquote(headers[name])
            try:
                load_certificates(pem.encode(), what=f"the {name} header")
            except (MalformedCertificateError, UnicodeEncodeError):
                break
            return pem
    raise _bad(url, f"no issuer chain in the {names[0]} header")


def _signed_json(body: bytes, key: str, url: str) -> tuple[str, str]:
    """The exact text of ``key``'s value (the signed bytes) and the signature (hex).

    The body is read with the strict reader (one value per key, bounded depth and numbers),
    and the text cut out must parse to the value the document holds under ``key``.
    """
    doc = loads_untrusted(body, what=f"{key} document", error=lambda m: _bad(url, m))
    value = doc.get(key) if isinstance(doc, dict) else None
    try:
        text = body.decode("utf-8")
        start = text.index(f'"{key}"')
        start = text.index(":", start) + 1
        while text[start] in " \t\r\n":
            start += 1
        _, end = json.JSONDecoder().raw_decode(text, start)
    except (ValueError, RecursionError, IndexError):
        raise _bad(url, f"no {key}") from None
    cut = loads_untrusted(text[start:end], what=key, error=lambda m: _bad(url, m))
    if value is None or cut != value:
        raise _bad(url, f"no {key}")
    signature = doc.get("signature") if isinstance(doc, dict) else None
    if not isinstance(signature, str):
        raise _bad(url, "no signature")
    return text[start:end], signature


def _crl_der(body: bytes, url: str) -> bytes:
    """A CRL as DER, whether served as DER, PEM or hex (PCCS serves the root CA CRL in hex)."""
    data = body.strip()
    try:
        if data.startswith(b"-----BEGIN"):
            return x509.load_pem_x509_crl(data).public_bytes(serialization.Encoding.DER)
        if data[:1] != b"\x30":
            data = bytes.fromhex(data.decode("ascii"))
        x509.load_der_x509_crl(data)
    except (ValueError, UnicodeDecodeError):
        raise _bad(url, "not a CRL") from None
    return data


def fetch_tdx_collateral(
    quote: bytes, fetcher: HeaderFetcher, *, base_url: str = INTEL_PCS_URL
) -> TdxCollateral:
    """Intel's collateral for ``quote``'s platform from a PCS or PCCS at ``base_url``.

    Raises:
        MalformedEvidenceError: the quote names no platform (FMSPC, PCK CA).
        NetworkError, OfflineError: the service cannot be reached or answers badly.
    """
    fmspc, ca = platform_of(quote)
    base = base_url.rstrip("/")
    url = f"{base}/sgx/certification/v4/pckcrl?ca={ca}&encoding=der"
    body, headers = fetcher.get_with_headers(url, max_bytes=MAX_CRL_BYTES)
    pck_crl = _crl_der(body, url)
    pck_chain = _chain(headers, ("sgx-pck-crl-issuer-chain",), url)
    url = f"{base}/tdx/certification/v4/tcb?fmspc={fmspc.upper()}"
    body, headers = fetcher.get_with_headers(url, max_bytes=MAX_JSON_BYTES)
    tcb_info, tcb_sig = _signed_json(body, "tcbInfo", url)
    tcb_chain = _chain(headers, ("tcb-info-issuer-chain", "sgx-tcb-info-issuer-chain"), url)
    url = f"{base}/tdx/certification/v4/qe/identity"
    body, headers = fetcher.get_with_headers(url, max_bytes=MAX_JSON_BYTES)
    qe_identity, qe_sig = _signed_json(body, "enclaveIdentity", url)
    qe_chain = _chain(headers, ("sgx-enclave-identity-issuer-chain",), url)
    url = (
        INTEL_ROOT_CA_CRL_URL if base == INTEL_PCS_URL else f"{base}/sgx/certification/v4/rootcacrl"
    )
    body, _ = fetcher.get_with_headers(url, max_bytes=MAX_CRL_BYTES)
    root_crl = _crl_der(body, url)
    fields = {
        "pck_crl_issuer_chain": pck_chain,
        "root_ca_crl": root_crl.hex(),
        "pck_crl": pck_crl.hex(),
        "tcb_info_issuer_chain": tcb_chain,
        "tcb_info": tcb_info,
        "tcb_info_signature": tcb_sig,
        "qe_identity_issuer_chain": qe_chain,
        "qe_identity": qe_identity,
        "qe_identity_signature": qe_sig,
    }
    try:
        return TdxCollateral.from_json(json.dumps(fields).encode())
    except MalformedEvidenceError as exc:
        raise _bad(base, str(exc)) from None


def cache_key(quote: bytes) -> str:
    """The cache key of a quote's platform collateral (``tdx-<fmspc>-<ca>``).

    Raises:
        MalformedEvidenceError: the quote names no platform.
    """
    fmspc, ca = platform_of(quote)
    return f"tdx-{fmspc.lower()}-{ca}"


def next_update(collateral: TdxCollateral) -> dt.datetime:
    """The earliest time a piece of ``collateral`` is due for renewal."""
    from .tdx import validity_windows

    return min(end for _, _, end in validity_windows(collateral))


def tdx_collateral_for(
    quote: bytes,
    fetcher: HeaderFetcher,
    *,
    now: dt.datetime,
    cache: CollateralCache | None = None,
    base_url: str = INTEL_PCS_URL,
) -> TdxCollateral:
    """The quote's collateral from the cache while it is current, else fetched (and cached).

    Raises:
        MalformedEvidenceError: the quote names no platform.
        NetworkError, OfflineError: not cached and the service cannot give it.
    """
    # Keyed by platform only: whichever service gave it, it is Intel's signed data.
    key = cache_key(quote)
    if cache is not None:
        cached = cache.get_tdx(key, now=now)
        if cached is not None:
            try:
                return TdxCollateral.from_json(cached)
            except MalformedEvidenceError:
                pass  # not ours or damaged: fetch again
    collateral = fetch_tdx_collateral(quote, fetcher, base_url=base_url)
    if cache is not None:
        try:
            expires = next_update(collateral)
        except MalformedEvidenceError as exc:
            raise _bad(base_url, str(exc)) from None
        if now < expires:
            cache.put_tdx(key, collateral.to_json(), expires=expires)
    return collateral
