"""What a verifier keeps between verifications: the parse and the time-free checks of the
same bytes (a RIM, a certificate chain), never a verdict, a time check or a nonce."""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

import pytest

from gpucc.core.errors import MalformedCertificateError
from gpucc.gpuattest import rim as rim_module
from gpucc.gpuattest import x509chain, xmldsig
from gpucc.gpuattest.chain import ChainStatus, load_pem_chain, validate_chain
from gpucc.gpuattest.collateral import NoOcsp, rim_sources_from_mapping
from gpucc.gpuattest.evidence import EvidenceSet
from gpucc.gpuattest.policy import parse_policy
from gpucc.gpuattest.simulate import SimulatedGpu
from gpucc.gpuattest.verifier import verify

NOW = dt.datetime.now(dt.UTC)
POLICY = parse_policy({"ocsp": {"require": False}}, source="test")


@pytest.fixture
def gpu() -> SimulatedGpu:
    return SimulatedGpu.create(now=NOW)  # new keys, RIMs and chains: nothing kept yet


@pytest.fixture
def rims(gpu: SimulatedGpu) -> dict[str, bytes]:
    """The GPU's RIMs, signed once (each signing gives new bytes), as a holder's files are."""
    return gpu.rims


def _verify(
    gpu: SimulatedGpu,
    rims: dict[str, bytes],
    nonce: bytes,
    *,
    expected: bytes | None = None,
    at: Any = NOW,
) -> Any:
    evidence: EvidenceSet = gpu.evidence(nonce)
    return verify(
        evidence,
        expected_nonce=expected or nonce,
        roots=gpu.roots,
        now=at,
        rims=rim_sources_from_mapping(rims),
        ocsp=NoOcsp("test"),
        policy=POLICY,
    )


def test_the_same_rims_and_chain_are_parsed_and_checked_once(
    gpu: SimulatedGpu, rims: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"signature": 0, "issued": 0}
    refusal = xmldsig.signature_refusal

    def counted_refusal(*args: Any) -> str:
        calls["signature"] += 1
        return refusal(*args)

    monkeypatch.setattr(rim_module, "signature_refusal", counted_refusal)
    check_issuer = x509chain._check_issuer

    def counted_link(*args: Any, **kwargs: Any) -> Any:
        calls["issued"] += 1
        return check_issuer(*args, **kwargs)

    monkeypatch.setattr(x509chain, "_check_issuer", counted_link)
    x509chain._links_broken.cache_clear()
    for _ in range(3):
        assert _verify(gpu, rims, os.urandom(32)).trusted
    # two RIMs (driver, VBIOS) once each, and the links of two chains once each (the
    # device's 5 certificates, the RIMs' signer's 4): not again for every verification
    assert calls == {"signature": 2, "issued": 4 + 3}


def test_a_verdict_is_never_kept(gpu: SimulatedGpu, rims: dict[str, bytes]) -> None:
    nonce = os.urandom(32)
    assert _verify(gpu, rims, nonce).trusted
    assert not _verify(gpu, rims, nonce, expected=os.urandom(32)).trusted  # another nonce
    assert not _verify(gpu, rims, os.urandom(32), at=NOW + dt.timedelta(days=365 * 40)).trusted
    assert _verify(gpu, rims, os.urandom(32)).trusted


def test_the_time_is_checked_on_every_call(gpu: SimulatedGpu, rims: dict[str, bytes]) -> None:
    from gpucc.gpuattest.rim import verify_document

    rim = rims[gpu.driver_rim_id()]
    anchor = gpu.roots.rim_root
    later = NOW + dt.timedelta(days=365 * 40)
    statuses = [
        verify_document(rim, anchor=anchor, now=at)[2].chain.status for at in (NOW, later, NOW)
    ]
    assert statuses == [ChainStatus.VALID, ChainStatus.EXPIRED, ChainStatus.VALID]
    certs = verify_document(rim, anchor=anchor, now=NOW)[0].certificates
    assert validate_chain(certs, anchor, later).status is ChainStatus.EXPIRED
    # another anchor: the kept answer for this one does not carry over
    other = SimulatedGpu.create(now=NOW).roots.rim_root
    assert validate_chain(certs, other, NOW).status is ChainStatus.INVALID


def test_changed_bytes_are_checked_afresh(gpu: SimulatedGpu, rims: dict[str, bytes]) -> None:
    from gpucc.gpuattest.rim import verify_document

    rim = rims[gpu.driver_rim_id()]
    anchor = gpu.roots.rim_root
    assert verify_document(rim, anchor=anchor, now=NOW)[2].signature_valid
    version = b'colloquialVersion="'
    start = rim.index(version) + len(version)
    altered = rim[:start] + (b"9" if rim[start : start + 1] != b"9" else b"8") + rim[start + 1 :]
    manifest, _, sig = verify_document(altered, anchor=anchor, now=NOW)
    assert not sig.signature_valid and manifest.raw == altered
    pem = gpu.evidence(os.urandom(32)).gpus[0].cert_chain_pem
    assert load_pem_chain(pem) == load_pem_chain(bytes(pem))
    with pytest.raises(MalformedCertificateError):
        load_pem_chain(pem[:40])
