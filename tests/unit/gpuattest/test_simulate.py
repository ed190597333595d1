"""The simulator's RIM signer, checked by gpucc's verifier and by an independent XML-DSig library."""

from __future__ import annotations

import datetime as dt

from cryptography.hazmat.primitives import serialization
from signxml.algorithms import DigestAlgorithm, SignatureMethod
from signxml.verifier import SignatureConfiguration, XMLVerifier

from gpucc.gpuattest.rim import ReferenceManifest
from gpucc.gpuattest.simulate import DRIVER_ACTIVE, SimulatedGpu

NOW = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)


def _rim() -> tuple[SimulatedGpu, bytes]:
    gpu = SimulatedGpu.create(now=NOW)
    return gpu, gpu.rims[gpu.driver_rim_id()]


def test_a_simulated_rim_verifies_with_gpucc_and_with_signxml() -> None:
    gpu, rim = _rim()
    manifest = ReferenceManifest.parse(rim)
    assert manifest.validate_schema().ok
    result = manifest.verify_signature(anchor=gpu.rim_pki.root, now=NOW)
    assert result.ok, result.signature_reason
    leaf = gpu.rim_pki.certs[0].public_bytes(serialization.Encoding.PEM).decode()
    config = SignatureConfiguration(
        signature_methods=frozenset({SignatureMethod.ECDSA_SHA384}),
        digest_algorithms=frozenset({DigestAlgorithm.SHA384}),
    )
    verified = XMLVerifier().verify(rim, x509_cert=leaf, expect_config=config)
    assert not isinstance(verified, list) and verified.signed_xml is not None


def test_a_changed_measurement_breaks_both_verifiers() -> None:
    gpu, rim = _rim()
    index = min(DRIVER_ACTIVE)
    golden = gpu.golden[index].hex().encode()
    forged = rim.replace(golden, bytes(len(golden)).hex().encode()[: len(golden)], 1)
    assert forged != rim
    result = ReferenceManifest.parse(forged).verify_signature(anchor=gpu.rim_pki.root, now=NOW)
    assert not result.signature_valid and "digest" in result.signature_reason
    leaf = gpu.rim_pki.certs[0].public_bytes(serialization.Encoding.PEM).decode()
    try:
        XMLVerifier().verify(forged, x509_cert=leaf)
    except Exception as exc:  # signxml raises InvalidDigest
        assert "Digest" in type(exc).__name__ or "digest" in str(exc).lower()
    else:
        raise AssertionError("signxml accepted a forged RIM")
