"""Policy parsing, pinned roots, evidence formats and the chain parser under fuzzing."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucc.core.errors import (
    MalformedCertificateError,
    MalformedEvidenceError,
    MalformedPolicyError,
)
from gpucc.gpuattest.chain import ChainStatus, load_pem_chain, validate_chain
from gpucc.gpuattest.evidence import (
    dump_evidence_json,
    load_evidence_file,
    load_evidence_json,
    load_raw_evidence,
    parse_nonce_hex,
)
from gpucc.gpuattest.policy import load_policy, parse_policy
from gpucc.gpuattest.trust import DEVICE_ROOT_SHA256, RIM_ROOT_SHA256, TrustRoots
from tests.support.samples import HEAD_CHAIN, SET_A_CHAIN, SET_A_NONCE, SET_A_REPORT, report_bytes


def test_pinned_root_fingerprints() -> None:
    roots = TrustRoots.nvidia()
    for cert, pin in ((roots.device_root, DEVICE_ROOT_SHA256), (roots.rim_root, RIM_ROOT_SHA256)):
        der = cert.public_bytes(serialization.Encoding.DER)
        assert hashlib.sha256(der).hexdigest() == pin
    # Written out here, independently of the code, from the roots NVIDIA's verifiers ship.
    assert DEVICE_ROOT_SHA256 == "102bf659d5419614c9d8e6aecebc80454eb26b1df6a769ac720b9a690b167b48"
    assert RIM_ROOT_SHA256 == "12977b5115acb0381179279fffeb5a8c4d264971ebb32298023a465fa41df5d1"
    assert "NVIDIA Device Identity CA" in roots.device_root.subject.rfc4514_string()
    assert "NVIDIA CoRIM signing Root CA" in roots.rim_root.subject.rfc4514_string()


def test_altered_embedded_root_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpucc.gpuattest import trust

    monkeypatch.setattr(trust, "DEVICE_ROOT_SHA256", "00" * 32)
    with pytest.raises(trust.TrustRootError, match="pinned fingerprint"):
        trust.TrustRoots.nvidia()


def test_real_device_chains_validate() -> None:
    roots = TrustRoots.nvidia()
    for path in (SET_A_CHAIN, HEAD_CHAIN):
        chain = load_pem_chain(path.read_bytes())
        result = validate_chain(
            chain, roots.device_root, dt.datetime.now(dt.UTC), expected_length=5
        )
        assert result.status is ChainStatus.VALID, result.reason
        before = validate_chain(chain, roots.device_root, dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
        assert before.status is ChainStatus.EXPIRED


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"nonse": {}}, "unknown policy key 'nonse'"),
        ({"ocsp": {"requre": False}}, "ocsp.requre"),
        ({"ocsp": {"require": "no"}}, "wrong type"),
        ({"rim": {"expired_signer_grace_days": True}}, "must be a number"),
        ({"rim": {"expired_signer_grace_days": -1}}, "0..3650"),
        ({"measurements": {"allow_mismatch": ["9"]}}, "indices"),
        ({"ocsp": {"allow_hold": ["everything"]}}, "unknown chains"),
        ({"versions": {"min_driver": "abc"}}, "not a version"),
        ({"version": 2}, "version"),
        (["a"], "mapping"),
    ],
)
def test_bad_policies_are_malformed(doc: object, message: str) -> None:
    with pytest.raises(MalformedPolicyError, match=message):
        parse_policy(doc)


def test_policy_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        "ocsp:\n  require: false\n  allow_hold: [vbios-rim]\n"
        "measurements:\n  allow_mismatch: [9]\nversions:\n  min_driver: '550.0'\n"
    )
    policy = load_policy(path)
    assert not policy.require_ocsp and policy.allow_hold == {"vbios-rim"}
    assert policy.allow_mismatch == {9} and policy.min_driver == "550.0"
    assert policy.require_nonce
    path.write_text("ocsp: [unclosed\n")
    with pytest.raises(MalformedPolicyError, match="not YAML"):
        load_policy(path)


def test_nonce_parsing() -> None:
    assert parse_nonce_hex(SET_A_NONCE.upper()).hex() == SET_A_NONCE
    for bad in ("abc", "zz" * 32, SET_A_NONCE + "00"):
        with pytest.raises(MalformedEvidenceError):
            parse_nonce_hex(bad)


def test_evidence_json_round_trip_and_nvattest_shapes(tmp_path: Path) -> None:
    ev = load_raw_evidence(SET_A_REPORT, SET_A_CHAIN)
    assert ev.gpus[0].report == report_bytes(SET_A_REPORT)
    data = dump_evidence_json(ev)
    back = load_evidence_json(data)
    assert back.gpus[0].report == ev.gpus[0].report
    assert back.gpus[0].cert_chain_pem == SET_A_CHAIN.read_bytes()
    wrapped = json.dumps({"result_code": 0, "evidences": json.loads(data)}).encode()
    assert load_evidence_json(wrapped).gpus[0].report == ev.gpus[0].report
    binary = tmp_path / "report.bin"
    binary.write_bytes(report_bytes(SET_A_REPORT))
    assert load_evidence_file(binary, SET_A_CHAIN).gpus[0].report == ev.gpus[0].report


@pytest.mark.parametrize(
    "blob",
    [
        b"not json",
        b"{}",
        b"[]",
        b"[1]",
        b'[{"evidence": "AAAA"}]',
        b'[{"evidence": "!!!", "certificate": "AAAA"}]',
        b'[{"evidence": "AAAA", "certificate": "AAAA", "nonce": "xyz"}]',
        b'[{"evidence": 5, "certificate": "AAAA"}]',
    ],
)
def test_malformed_evidence_json(blob: bytes) -> None:
    with pytest.raises(MalformedEvidenceError):
        load_evidence_json(blob)


def test_oversized_evidence_is_refused() -> None:
    with pytest.raises(MalformedEvidenceError, match="larger"):
        load_evidence_json(b"[" + b" " * (5 * 1024 * 1024) + b"]")


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_fuzz_chain_parser(data: st.DataObject) -> None:
    pem = bytearray(SET_A_CHAIN.read_bytes())
    for _ in range(data.draw(st.integers(1, 6))):
        pos = data.draw(st.integers(0, len(pem) - 1))
        pem[pos] = data.draw(st.sampled_from(b"ABCD+/=\n-x"))
    try:
        chain = load_pem_chain(bytes(pem))
    except MalformedCertificateError:
        return
    roots = TrustRoots.nvidia()
    result = validate_chain(chain, roots.device_root, dt.datetime.now(dt.UTC), expected_length=5)
    assert result.status in set(ChainStatus)


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=3000))
def test_fuzz_evidence_json(blob: bytes) -> None:
    doc = json.dumps([{"evidence": base64.b64encode(blob).decode(), "certificate": "QUJD"}])
    try:
        load_evidence_json(doc.encode())
    except MalformedEvidenceError:
        pass
