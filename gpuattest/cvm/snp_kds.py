"""A chip's VCEK from AMD's Key Distribution Service (KDS), through gpucc's collateral layer.

``GET {base}/vcek/v1/{product}/{hwid}?blSPL=..&teeSPL=..&snpSPL=..&ucodeSPL=..`` answers the
DER VCEK of chip ``hwid`` (the report's CHIP_ID in hex) at that TCB (the report's
REPORTED_TCB). Turin's KDS takes the first 8 bytes of the chip ID and an ``fmcSPL`` first.

Requests go through a :class:`~gpuattest._internal.transport.Fetcher` (deadlines, size cap,
retries, proxies, offline refusal) and, when a :class:`~gpuattest.cache.CollateralCache`
is given, through its ``snp-vcek`` entries (same file format and integrity rules as RIMs).
Nothing fetched or cached is trusted: :func:`~.snp.verify_snp_report` checks the VCEK's
chain, validity and extensions every time. Before a fetched VCEK is returned or cached,
it must parse and name the chip and TCB that were asked for.

Every failure is a :class:`~gpuattest.errors.CollateralUnavailableError` (exit 3), never a
verdict: unreachable or slow service, HTTP errors (404: AMD has no VCEK for this chip and
TCB), oversized or unusable answers, a report whose chip ID is masked, and with an offline
fetcher, a cache miss.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence

from gpucc.core.errors import (
    CollateralUnavailableError,
    MalformedCertificateError,
    NetworkError,
    UsageError,
)
from gpucc.core.transport import Fetcher, HttpStatusError, safe_url

from ..cache import CollateralCache
from .snp_report import SnpProduct, SnpReport, SnpTcb, parse_snp_report
from .snp_roots import MAX_VCEK_BYTES, load_vcek, product_of_issuer, vcek_info

__all__ = [
    "DEFAULT_KDS_URL",
    "KdsError",
    "fetch_vcek",
    "vcek_url",
]

_log = logging.getLogger(__name__)

DEFAULT_KDS_URL = "https://kdsintf.amd.com"
_CACHE_KIND = "snp-vcek"
# A version 2 report does not name its product line; these are asked in turn (Turin's
# firmware writes version 3 reports, whose CPUID names the line).
_V2_PRODUCTS = (SnpProduct.MILAN, SnpProduct.GENOA)


class KdsError(NetworkError):
    """AMD's KDS answered, but not with a usable VCEK (not a verdict on the report)."""

    hint = "AMD's KDS misbehaved or has no VCEK for this chip; try later or pass the VCEK as a file"


def _hwid(chip_id: bytes, product: SnpProduct) -> bytes:
    return chip_id[:8] if product is SnpProduct.TURIN else chip_id


def vcek_url(
    chip_id: bytes, tcb: SnpTcb, product: SnpProduct, *, base_url: str = DEFAULT_KDS_URL
) -> str:
    """The KDS URL of the VCEK for ``chip_id`` (64 bytes) at ``tcb`` on ``product``.

    Raises:
        ValueError: ``chip_id`` is not 64 bytes, or a Turin TCB has no FMC SPL.
    """
    if len(chip_id) != 64:
        raise ValueError("chip_id must be 64 bytes")
    params = [("blSPL", tcb.bootloader), ("teeSPL", tcb.tee), ("snpSPL", tcb.snp)]
    params.append(("ucodeSPL", tcb.microcode))
    if product is SnpProduct.TURIN:
        if tcb.fmc is None:
            raise ValueError("a Turin TCB has an FMC SPL")
        params.insert(0, ("fmcSPL", tcb.fmc))
    query = "&".join(f"{name}={value:02d}" for name, value in params)
    hwid = _hwid(chip_id, product).hex()
    return f"{base_url.rstrip('/')}/vcek/v1/{product.value}/{hwid}?{query}"


def _products(report: SnpReport, product: SnpProduct | None) -> Sequence[SnpProduct]:
    named = report.cpuid_product
    if named is not None and product is not None and named is not product:
        raise UsageError(f"the report comes from a {named} CPU, not {product}")
    if named is not None:
        return (named,)
    if product is not None:
        return (product,)
    if report.cpuid_family is not None:
        raise CollateralUnavailableError(
            f"the report's CPUID (family 0x{report.cpuid_family:02X}, model "
            f"0x{report.cpuid_model or 0:02X}) names no product line AMD's KDS serves"
        )
    return _V2_PRODUCTS


def _cache_key(product: SnpProduct, report: SnpReport) -> str:
    return f"{product.value}-{_hwid(report.chip_id, product).hex()}-{report.reported_tcb_raw:016x}"


def _usable(data: bytes, product: SnpProduct, report: SnpReport) -> str:
    """Empty when ``data`` is a VCEK for this chip and TCB on ``product``, else why not."""
    try:
        cert = load_vcek(data)
    except MalformedCertificateError as exc:
        return str(exc)
    if product_of_issuer(cert) is not product:
        return f"the certificate is not issued by SEV-{product.value}"
    info = vcek_info(cert)
    hwid = _hwid(report.chip_id, product)
    if info.hwid not in (hwid, report.chip_id):
        return "the certificate is for another chip"
    tcb = info.tcb()
    if tcb is None or tcb.to_dict() != report.tcb("reported", product).to_dict():
        return "the certificate is for another TCB"
    return ""


def fetch_vcek(
    report: bytes | SnpReport,
    *,
    fetcher: Fetcher,
    product: SnpProduct | None = None,
    cache: CollateralCache | None = None,
    base_url: str = DEFAULT_KDS_URL,
) -> bytes:
    """The DER VCEK for the chip and reported TCB of ``report``, from the cache or the KDS.

    Args:
        report: the report (bytes are parsed strictly first).
        fetcher: the HTTP layer (an offline fetcher serves from the cache only).
        product: the product line, needed only when the report does not name it (version 2);
            without it Milan, then Genoa, is asked.
        cache: where VCEKs are remembered (None: no cache).
        base_url: the KDS (or a mirror serving the same paths).

    Raises:
        MalformedSnpReportError: ``report`` is not a report (exit 4).
        UsageError: ``product`` contradicts the report's CPUID.
        KdsError: AMD has no VCEK for this chip and TCB (404), or answered something else.
        NetworkError: the KDS is unreachable, slow, oversized, or answered an HTTP error.
        OfflineError: offline and not cached.
        CollateralUnavailableError: the report's chip ID is masked, or its CPU is unknown.
    """
    parsed = report if isinstance(report, SnpReport) else parse_snp_report(report)
    if not any(parsed.chip_id):
        raise CollateralUnavailableError(
            "the report masks its chip ID, so its VCEK cannot be looked up; pass it as a file"
        )
    candidates = _products(parsed, product)
    if cache is not None:
        for line in candidates:
            cached = _cache_get(cache, line, parsed)
            if cached is not None:
                return cached
    missing: list[str] = []
    for line in candidates:
        url = vcek_url(parsed.chip_id, parsed.tcb("reported", line), line, base_url=base_url)
        try:
            body = fetcher.get(url, max_bytes=MAX_VCEK_BYTES)
        except HttpStatusError as exc:
            if exc.status not in (400, 404):
                raise
            missing.append(f"{safe_url(url)} answered HTTP {exc.status}")
            continue
        problem = _usable(body, line, parsed)
        if problem:
            raise KdsError(f"AMD's KDS answer from {safe_url(url)} is not usable: {problem}")
        if cache is not None:
            cache.put_blob(_CACHE_KIND, _cache_key(line, parsed), body, cap=MAX_VCEK_BYTES)
        return body
    raise KdsError("AMD's KDS has no VCEK for this chip at the reported TCB: " + "; ".join(missing))


def _cache_get(cache: CollateralCache, product: SnpProduct, report: SnpReport) -> bytes | None:
    key = _cache_key(product, report)
    data = cache.get_blob(_CACHE_KIND, key, cap=MAX_VCEK_BYTES)
    if data is None:
        return None
    if _usable(data, product, report):
        _log.debug("discarding an unusable cached VCEK %s", hashlib.sha256(data).hexdigest())
        cache.discard_blob(_CACHE_KIND, key)
        return None
    return data
