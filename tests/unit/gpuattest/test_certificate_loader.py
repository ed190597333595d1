"""Certificates gpucc did not make: one loader reads every field cryptography parses lazily,
and the chain validator answers (never raises) for a certificate that does not parse.

The certificates are the crash corpus's (tests/data/crash-corpus): mutations of real samples
whose fields fail late, each with another exception class.
"""

from __future__ import annotations

import datetime as dt
import re

import pytest
from cryptography import x509

from gpucc.core.errors import MalformedCertificateError, MalformedEvidenceError
from gpucc.gpuattest.cvm.snp_roots import load_vcek
from gpucc.gpuattest.cvm.tdx import intel_sgx_root
from gpucc.gpuattest.cvm.tdx_offline import PCK_CHAIN
from gpucc.gpuattest.x509chain import (
    ChainFault,
    ChainStatus,
    load_certificate,
    load_certificates,
    unparseable,
    validate_chain,
)
from tests.support.paths import DATA

CORPUS = DATA / "crash-corpus"
AT = dt.datetime(2025, 6, 19, 11, 16, 3, tzinfo=dt.UTC)
_PEM = re.compile(rb"-----BEGIN CERTIFICATE-----.*-----END CERTIFICATE-----\n?", re.DOTALL)


def _pck_pem(name: str) -> bytes:
    """The PCK chain (PEM) inside a corpus TDX quote."""
    found = _PEM.search((CORPUS / name).read_bytes())
    assert found is not None
    return found.group(0)


@pytest.mark.parametrize(
    ("name", "position", "cause"),
    [
        ("tdx-quote-nocoll--DuplicateExtension-x509chain-359.bin", 2, "DuplicateExtension"),
        ("tdx-quote-nocoll--UnsupportedAlgorithm-tdx_offline-98.bin", 1, "UnsupportedAlgorithm"),
        ("tdx-quote-nocoll--ValueError-tdx_offline-98.bin", 1, "Invalid key"),
        ("tdx-quote-nocoll--InvalidVersion-tdx_offline-86.bin", 2, "not a valid X509 version"),
        ("tdx-quote--InvalidVersion-tdx-272.bin", 1, "not a valid X509 version"),
    ],
)
def test_a_late_failing_field_is_the_documents_malformed_input_with_its_position(
    name: str, position: int, cause: str
) -> None:
    with pytest.raises(MalformedEvidenceError) as raised:
        load_certificates(_pck_pem(name), what="the PCK chain", error=MalformedEvidenceError)
    text = str(raised.value)
    assert text.startswith("the PCK chain")
    assert f"certificate {position} of 3" in text and cause in text


def test_the_validator_answers_for_a_certificate_whose_fields_do_not_parse() -> None:
    # cryptography loads these (lazily); reading the extensions raises DuplicateExtension
    certs = x509.load_pem_x509_certificates(
        _pck_pem("tdx-quote-nocoll--DuplicateExtension-x509chain-359.bin")
    )
    assert unparseable(certs[1]) is not None
    result = validate_chain(certs, intel_sgx_root(), AT, PCK_CHAIN)
    assert result.status is ChainStatus.INVALID
    assert result.fault is ChainFault.MALFORMED and result.position == 1
    assert "DuplicateExtension" in result.reason


@pytest.mark.parametrize(
    "name",
    [
        "snp-vcek--UnsupportedAlgorithm-curve-snp_roots-219.bin",
        "snp-vcek--UnsupportedAlgorithm-snp_roots-219.bin",
    ],
)
def test_a_vcek_whose_key_does_not_parse_is_a_malformed_certificate(name: str) -> None:
    with pytest.raises(MalformedCertificateError, match="VCEK certificate is malformed"):
        load_vcek((CORPUS / name).read_bytes())


def test_the_good_samples_load_whole() -> None:
    vcek = load_vcek((DATA / "cpu-tee" / "snp" / "vcek.der").read_bytes())
    assert unparseable(vcek) is None
    chain = (DATA / "nvidia-samples" / "set-a-h100-545.00" / "cert-chain.pem").read_bytes()
    assert len(load_certificates(chain, what="chain")) == 5


@pytest.mark.parametrize(
    "data", [b"", b"\x30\x03\x02\x01\x00", b"-----BEGIN CERTIFICATE-----\nAA==\n-----END"]
)
def test_what_is_not_a_certificate_is_refused_typed(data: bytes) -> None:
    with pytest.raises(MalformedCertificateError, match="^the thing"):
        load_certificate(data, what="the thing")


def test_der_only_refuses_pem() -> None:
    pem = (DATA / "nvidia-samples" / "set-a-h100-545.00" / "cert-chain.pem").read_bytes()
    first = pem[: pem.index(b"-----END CERTIFICATE-----") + 26]
    assert unparseable(load_certificate(first, what="one")) is None
    with pytest.raises(MalformedCertificateError):
        load_certificate(first, what="one", pem=False)
