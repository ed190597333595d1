"""Loading NVIDIA's PEM certificate chains; validation is :mod:`gpuattest.x509chain`'s.

NVIDIA's chains are leaf-first lists that end in a self-signed root. The chain supplied with
evidence (or embedded in a RIM) is untrusted input: it is parsed here, strictly and within
size limits, and validated against the pinned anchor at an explicit time by
:func:`~gpuattest.x509chain.validate_chain`, the one rule set every chain in gpucc goes
through (its result types are re-exported here).
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Sequence

from cryptography import x509

from gpucc.core.errors import MalformedCertificateError

from . import x509chain
from .x509chain import MAX_CHAIN_CERTS, ChainResult, ChainStatus

__all__ = [
    "MAX_CHAIN_CERTS",
    "MAX_PEM_CHAIN_BYTES",
    "ChainResult",
    "ChainStatus",
    "load_pem_chain",
    "validate_chain",
]

# A PEM bundle larger than this is not a certificate chain (NVML's buffer is 0x1400 bytes).
MAX_PEM_CHAIN_BYTES = 64 * 1024


def load_pem_chain(data: bytes) -> tuple[x509.Certificate, ...]:
    """Parse a concatenated PEM bundle, leaf first.

    The certificates of the same bytes are parsed once for the process (a GPU sends the
    same chain with every piece of evidence); what is kept is the parse alone, never a
    check of trust (the chain is validated, at its time, by :func:`validate_chain`).

    Raises:
        MalformedCertificateError: empty, oversized or unparseable input (never kept).
    """
    if len(data) > MAX_PEM_CHAIN_BYTES:
        raise MalformedCertificateError(
            f"certificate bundle is {len(data)} bytes, more than {MAX_PEM_CHAIN_BYTES}"
        )
    return _parse_pem_chain(bytes(data))


@functools.lru_cache(maxsize=64)
def _parse_pem_chain(data: bytes) -> tuple[x509.Certificate, ...]:
    # every field cryptography parses lazily is read now (x509chain.load_certificates), so a
    # corrupt certificate is malformed input here rather than an error mid-validation
    return x509chain.load_certificates(data, what="the certificate chain")


def validate_chain(
    chain: Sequence[x509.Certificate],
    anchor: x509.Certificate,
    now: dt.datetime,
    *,
    expected_length: int | None = None,
) -> ChainResult:
    """:func:`gpuattest.x509chain.validate_chain` for an NVIDIA chain of ``expected_length``.

    Any signature algorithm cryptography verifies, at most :data:`MAX_CHAIN_CERTS`
    certificates, exactly ``expected_length`` when given.
    """
    profile = x509chain.ChainProfile("NVIDIA", expected_length=expected_length)
    return x509chain.validate_chain(chain, anchor, now, profile)
