"""Fuzzing the CBOR, COSE and CoRIM readers from NVIDIA's real CoRIMs: whatever the bytes,
gpucc either reads them or raises one of its own errors (never a cbor2, ValueError,
TypeError, KeyError or RecursionError)."""

from __future__ import annotations

import datetime as dt

import cbor2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucc.core.errors import GpuccError
from gpucc.gpuattest.cbor_strict import decode_strict
from gpucc.gpuattest.corim import CORIM_TAGS, CorimPolicy, read_corim
from gpucc.gpuattest.corim_appraise import toc_evidence
from gpucc.gpuattest.spdm_toc import parse_toc
from tests.support.corimpki import DATA, corim_bytes, sign_corim
from tests.support.rimpki import RimPki, make_rim_pki
from tests.support.spdmblocks import read_blocks, read_report_hex

NOW = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
RELAXED = CorimPolicy(allow_unsigned=True)
SEEDS = [
    corim_bytes(n) for n in ("rubin_driver_example", "rubin_vbios_example", "blackwell_fsp_real")
]
PKI: RimPki = make_rim_pki()
SIGNED = [sign_corim(SEEDS[2], pki=PKI), sign_corim(SEEDS[1], pki=PKI, unprotected_chain=True)]
BLOCKS = read_blocks(read_report_hex(DATA / "rubin-gr100-620.54" / "attestation-report.hex"))
TOC = BLOCKS[0xFD].value


@st.composite
def mutated(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    """A seed with a few byte flips, insertions, deletions or a truncation."""
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 4))):
        if not data:
            break
        pos = draw(st.integers(0, len(data) - 1))
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        if op == "flip":
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "set":
            data[pos] = draw(st.integers(0, 255))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=9))
        elif op == "delete":
            del data[pos : pos + draw(st.integers(1, 16))]
        else:
            del data[pos:]
    return bytes(data)


def _read(data: bytes) -> None:
    try:
        read_corim(data, anchor=PKI.root, now=NOW, policy=RELAXED)
    except GpuccError:
        pass


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(SEEDS))
def test_unsigned_corim_mutations_raise_only_gpucc_errors(data: bytes) -> None:
    _read(data)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(SIGNED))
def test_signed_corim_mutations_raise_only_gpucc_errors(data: bytes) -> None:
    _read(data)


@settings(max_examples=300, deadline=None)
@given(mutated([TOC]))
def test_toc_mutations_raise_only_gpucc_errors(data: bytes) -> None:
    try:
        toc_evidence(parse_toc(data, BLOCKS), BLOCKS)
    except GpuccError:
        pass


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_gpucc_errors(data: bytes) -> None:
    try:
        decode_strict(data, what="fuzz", allowed_tags=CORIM_TAGS)
    except GpuccError:
        pass
    _read(data)


_LEAF = st.one_of(
    st.integers(-(2**64), 2**64 - 1),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.booleans(),
    st.none(),
)


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        _LEAF,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.dictionaries(st.one_of(st.integers(0, 12), st.text(max_size=4)), inner, max_size=4),
            st.builds(cbor2.CBORTag, st.sampled_from(sorted(CORIM_TAGS)), inner),
        ),
        max_leaves=30,
    )
)
def test_well_formed_corim_shapes_raise_only_gpucc_errors(body: object) -> None:
    _read(bytes(cbor2.dumps(cbor2.CBORTag(501, body))))
    _read(
        bytes(cbor2.dumps(cbor2.CBORTag(501, {0: "c", 1: [cbor2.CBORTag(506, cbor2.dumps(body))]})))
    )


def test_the_seeds_themselves_are_read() -> None:
    for seed in SEEDS:
        assert read_corim(seed, anchor=PKI.root, now=NOW, policy=RELAXED).comids
    for signed in SIGNED:
        assert read_corim(signed, anchor=PKI.root, now=NOW).signed
    with pytest.raises(GpuccError):
        read_corim(SEEDS[0][:-1], anchor=PKI.root, now=NOW, policy=RELAXED)
