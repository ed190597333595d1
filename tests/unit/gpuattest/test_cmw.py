"""NVIDIA's CMW evidence files: read by content wherever evidence JSON is read."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucc.core.errors import GpuccError, MalformedEvidenceError, UnsupportedFormatError
from gpucc.gpuattest.evidence import dump_cmw, load_cmw, load_evidence_file, load_evidence_json
from tests.support.samples import FSP, FSP_NONCE, RUBIN, RUBIN_NONCE

RUBIN_CMW = (RUBIN / "evidence.cmw.json").read_bytes()
FSP_CMW = (FSP / "evidence.cmw.json").read_bytes()


def _doc(data: bytes = RUBIN_CMW) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(data)
    return doc


def test_rubin_cmw_holds_the_same_evidence_as_the_raw_files() -> None:
    cmw = load_evidence_file(RUBIN / "evidence.cmw.json")
    raw = load_evidence_file(RUBIN / "attestation-report.hex", RUBIN / "cert-chain.pem")
    (gpu,) = cmw.gpus
    assert gpu.report == raw.gpus[0].report
    assert gpu.cert_chain_pem == raw.gpus[0].cert_chain_pem
    assert gpu.arch == "RUBIN"  # from the leaf certificate
    assert gpu.nonce == bytes.fromhex(RUBIN_NONCE)
    assert gpu.hints is None


def test_fsp_cmw_keeps_its_unsigned_hints_apart() -> None:
    (gpu,) = load_evidence_json(FSP_CMW).gpus
    assert gpu.arch == "BLACKWELL"
    assert gpu.nonce is None
    assert dict(gpu.hints or {}) == {"fwversion": "01.00.00.00.01"}
    raw = load_evidence_file(FSP / "attestation-report.hex", FSP / "cert-chain.pem")
    assert gpu.report == raw.gpus[0].report
    assert FSP_NONCE  # the nonce travels apart from this CMW file


def test_dump_and_load_round_trip() -> None:
    evidence = load_evidence_json(RUBIN_CMW)
    again = load_cmw(json.loads(dump_cmw(evidence)))
    assert again.gpus[0].report == evidence.gpus[0].report
    assert again.gpus[0].nonce == evidence.gpus[0].nonce
    assert json.loads(dump_cmw(evidence))["nonce"] == _doc()["nonce"]


def test_another_collection_type_is_unsupported() -> None:
    doc = _doc()
    doc["__cmwc_t"] = "tag:example.com,2030:other"
    with pytest.raises(UnsupportedFormatError, match="not NVIDIA's verifier input"):
        load_cmw(doc)


def test_another_media_type_is_unsupported() -> None:
    doc = _doc()
    doc["gpu_0"]["evidence"][0] = "application/vnd.nvidia.future-report"
    with pytest.raises(UnsupportedFormatError, match="future-report"):
        load_cmw(doc)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["gpu_0"].pop("certificate"), "lacks its evidence or certificate"),
        (lambda d: d["gpu_0"].__setitem__("nonce", ["application/octet-stream", "AAAA"]), "not 32"),
        (lambda d: d["gpu_0"]["evidence"].__setitem__(1, "a+b/"), "base64, not base64url"),
        (lambda d: d["gpu_0"]["evidence"].__setitem__(1, "abcde"), "not valid base64url"),
        (lambda d: d["gpu_0"].__setitem__("evidence", "x"), "not a \\[media type, value\\]"),
        (lambda d: d.pop("gpu_0"), "no device item"),
    ],
)
def test_malformed_cmw(change: Any, message: str) -> None:
    doc = _doc()
    change(doc)
    with pytest.raises(MalformedEvidenceError, match=message):
        load_cmw(doc)


def test_a_nonce_other_than_the_collections_is_malformed() -> None:
    doc = _doc()
    other = base64.urlsafe_b64encode(bytes(32)).rstrip(b"=").decode()
    doc["gpu_0"]["nonce"] = ["application/octet-stream", other]
    with pytest.raises(MalformedEvidenceError, match="other than the collection's"):
        load_cmw(doc)


@settings(max_examples=200, deadline=None)
@given(
    seed=st.sampled_from([RUBIN_CMW, FSP_CMW]),
    pos=st.integers(0, 20000),
    byte=st.integers(0, 127),
    cut=st.integers(0, 20000),
)
def test_fuzz_cmw_raises_only_gpucc_errors(seed: bytes, pos: int, byte: int, cut: int) -> None:
    data = bytearray(seed[:cut] if cut < len(seed) else seed)
    if data:
        data[pos % len(data)] = byte
    try:
        load_evidence_json(bytes(data))
    except GpuccError:
        pass


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(
    path=st.sampled_from(
        [("gpu_0",), ("gpu_0", "evidence"), ("gpu_0", "nonce"), ("nonce",), ("gpu_0", "hints")]
    ),
    value=_JSON,
)
def test_fuzz_cmw_structure_raises_only_gpucc_errors(path: tuple[str, ...], value: Any) -> None:
    doc = _doc(FSP_CMW)
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    try:
        load_cmw(doc)
    except GpuccError:
        pass
