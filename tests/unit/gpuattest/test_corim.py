"""CoRIM reference values: NVIDIA's Rubin and Blackwell FSP examples signed under a test root,
appraised against the real evidence; the envelope, profile and reject rules."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import cbor2
import pytest
from cryptography import x509

from gpucc.core.errors import MalformedInputError, MalformedReportError, NotTrustedError
from gpucc.gpuattest.cbor_strict import StrictCborError, decode_strict
from gpucc.gpuattest.corim import (
    MAX_TAGS,
    RELAXATION_UNSIGNED,
    CorimNotAcceptedError,
    CorimPolicy,
    Environment,
    MalformedCorimError,
    read_corim,
)
from gpucc.gpuattest.corim_appraise import (
    CorimAppraisal,
    EvidenceValues,
    MalformedTocError,
    appraise_corim_files,
    block_evidence,
    device_evidence,
    merge_evidence,
    tcbinfo_evidence,
    toc_evidence,
)
from gpucc.gpuattest.cose import CoseCheckError, MalformedCoseError
from gpucc.gpuattest.spdm_toc import parse_toc
from tests.support.corimpki import (
    DATA,
    ES256,
    NV,
    comid,
    corim_bytes,
    edit_comids,
    flip_digest,
    layer0_svn,
    oid,
    read_pem_chain,
    reference_triple,
    sign_corim,
    small_corim,
)
from tests.support.rimpki import RimPki, make_rim_pki
from tests.support.spdmblocks import Block, read_blocks, read_report_hex

NOW = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
SIGNED = CorimPolicy()
UNSIGNED = CorimPolicy(allow_unsigned=True)
GSP_L0 = Environment(vendor="NVIDIA", model="GR100 A01 GSP", layer=0)


@pytest.fixture(scope="module")
def pki() -> RimPki:
    return make_rim_pki()


@pytest.fixture(scope="module")
def rubin_blocks() -> dict[int, Block]:
    return read_blocks(read_report_hex(DATA / "rubin-gr100-620.54" / "attestation-report.hex"))


def rubin_evidence(blocks: dict[int, Block]) -> EvidenceValues:
    leaf = read_pem_chain(DATA / "rubin-gr100-620.54" / "cert-chain.pem")[0]
    return device_evidence(blocks, leaf)


def fsp_evidence(blocks: dict[int, Block] | None = None) -> EvidenceValues:
    base = DATA / "blackwell-gb100-fsp"
    blocks = blocks or read_blocks(read_report_hex(base / "attestation-report.hex"))
    return device_evidence(blocks, read_pem_chain(base / "cert-chain.pem")[0])


def test_device_evidence_takes_the_table_where_there_is_one(
    rubin_blocks: dict[int, Block],
) -> None:
    leaf = read_pem_chain(DATA / "rubin-gr100-620.54" / "cert-chain.pem")[0]
    by_hand = merge_evidence(
        toc_evidence(parse_toc(rubin_blocks[0xFD].value, rubin_blocks), rubin_blocks),
        tcbinfo_evidence(leaf),
    )
    assert rubin_evidence(rubin_blocks) == by_hand
    assert by_hand.purpose is not None and by_hand.purpose[1] == "CC MPT"
    assert by_hand.locators[1].endswith("NV_GPU_DRIVER_GR100_620.54")
    sources = {e.source for e in by_hand.entries}
    assert "spdm-block-54" in sources and "tcbinfo" in sources and "spdm-toc" in sources
    fsp = fsp_evidence()
    base = DATA / "blackwell-gb100-fsp"
    tcb = tcbinfo_evidence(read_pem_chain(base / "cert-chain.pem")[0])
    layer1 = Environment(vendor="NVIDIA", model="GB100 A01 FSP", layer=1)
    blocks = read_blocks(read_report_hex(base / "attestation-report.hex"))
    assert fsp == merge_evidence(tcb, block_evidence(layer1, blocks))
    assert len(fsp.entries) == 53 and fsp.purpose is None


def test_a_hopper_fwid_extension_is_not_a_tcbinfo() -> None:
    from gpucc.gpuattest.samples import nvidia_h100_sample

    leaf = read_pem_chain(nvidia_h100_sample().cert_chain_path)[0]
    with pytest.raises(MalformedTocError, match="not a DICE TcbInfo"):
        tcbinfo_evidence(leaf)


def appraise_signed(
    pki: RimPki, evidence: EvidenceValues, corims: list[bytes], policy: CorimPolicy = SIGNED
) -> CorimAppraisal:
    signed = [sign_corim(c, pki=pki) for c in corims]
    return appraise_corim_files(evidence, signed, policy=policy, anchor=pki.root, now=NOW)


RUBIN = ["rubin_driver_example", "rubin_vbios_example"]


def rubin_corims(
    driver: Callable[[list[dict[int, Any]]], None] | None = None,
    vbios: Callable[[list[dict[int, Any]]], None] | None = None,
) -> list[bytes]:
    d, v = corim_bytes(RUBIN[0]), corim_bytes(RUBIN[1])
    return [edit_comids(d, driver) if driver else d, edit_comids(v, vbios) if vbios else v]


# --- the real evidence, appraised ----------------------------------------------------------


def test_rubin_with_its_signed_corims_is_trusted_on_cc_mpt(
    pki: RimPki, rubin_blocks: dict[int, Block]
) -> None:
    result = appraise_signed(pki, rubin_evidence(rubin_blocks), rubin_corims())
    assert result.trusted, [str(m) for m in result.mismatches]
    assert result.purpose == "CC MPT"
    assert result.relaxations == ()
    assert [c for c, _ in result.skipped] == ["corim-signer-revocation"]
    assert [len(chain) for chain in result.signer_chains] == [4, 4]
    assert [signer for _, signer in result.corims] == ["gpucc test RIM L4 Signer"] * 2
    # The CC MPT subtree: the GSP's layer 0, 20 driver and 8 VBIOS measurements, the root.
    assert len(result.matched) == 30
    assert f"{GSP_L0} [-]" in result.matched
    assert any("FFMC" in m for m in result.matched)
    # The CC SPT leg (.100.15 and .100.19) and the VBIOS's JTGS/BOOTS are outside it.
    assert not any(m.startswith(f"oid:{NV}11.1.11.100.15 ") for m in result.matched)
    assert not any("JTGS" in m or "BOOTS" in m for m in result.matched)


@pytest.mark.parametrize(
    ("driver", "vbios", "environment", "key"),
    [
        (flip_digest("11.1.11.100.2"), None, f"oid:{NV}11.1.11.100.2", "-"),
        (flip_digest("11.1.11.100.16"), None, f"oid:{NV}11.1.11.100.16", "-"),
        (layer0_svn(552, 2), None, str(GSP_L0), "-"),
        (layer0_svn(553, 2), None, str(GSP_L0), "-"),
        (None, flip_digest("11.1.10.100.4"), f"oid:{NV}11.1.10.100.4", "FFMC"),
        (None, flip_digest("11.1.10.100.5", 1), f"oid:{NV}11.1.10.100.5", "BCRD"),
    ],
    ids=["driver-digest", "mpt-only-digest", "svn-exact", "svn-minimum", "vbios-FFMC", "BCRD"],
)
def test_rubin_mutated_reference_is_not_trusted_and_named(
    pki: RimPki,
    rubin_blocks: dict[int, Block],
    driver: Callable[[list[dict[int, Any]]], None] | None,
    vbios: Callable[[list[dict[int, Any]]], None] | None,
    environment: str,
    key: str,
) -> None:
    result = appraise_signed(pki, rubin_evidence(rubin_blocks), rubin_corims(driver, vbios))
    assert not result.trusted
    assert [(m.environment, m.key) for m in result.mismatches] == [(environment, key)]
    assert result.mismatches[0].evidence not in ("", "absent")


def test_minimum_svn_at_or_below_the_evidence_passes(
    pki: RimPki, rubin_blocks: dict[int, Block]
) -> None:
    corims = rubin_corims(layer0_svn(553, 1))
    assert appraise_signed(pki, rubin_evidence(rubin_blocks), corims).trusted


def test_references_outside_the_purpose_subtree_do_not_count(
    pki: RimPki, rubin_blocks: dict[int, Block]
) -> None:
    # .100.15 belongs to CC SPT only; the VBIOS's JTGS to no purpose at all.
    def jtgs(comids: list[dict[int, Any]]) -> None:
        reference_triple(comids, "11.1.10.100.13")[1][0][1][4] = cbor2.CBORTag(560, b"\x07")

    result = appraise_signed(
        pki, rubin_evidence(rubin_blocks), rubin_corims(flip_digest("11.1.11.100.15"), jtgs)
    )
    assert result.trusted


def test_alternatives_need_one_match(pki: RimPki, rubin_blocks: dict[int, Block]) -> None:
    """.100.10 has two reference triples (the real digest and zeros): one must match."""

    def only_zeros(comids: list[dict[int, Any]]) -> None:
        triples = comids[0][4][0]
        real = next(t for t in triples if t[0][0].get(0) == oid(NV + "11.1.11.100.10"))
        triples.remove(real)

    result = appraise_signed(pki, rubin_evidence(rubin_blocks), rubin_corims(only_zeros))
    assert [(m.environment, m.reference) for m in result.mismatches] == [
        (f"oid:{NV}11.1.11.100.10", "digest 7:" + "00" * 48)
    ]


def test_mutated_evidence_block_is_named(pki: RimPki, rubin_blocks: dict[int, Block]) -> None:
    blocks = dict(rubin_blocks)
    old = blocks[54]
    blocks[54] = Block(54, old.value_type, bytes([old.value[0] ^ 0x80]) + old.value[1:])
    result = appraise_signed(pki, rubin_evidence(blocks), rubin_corims())
    assert [m.environment for m in result.mismatches] == [f"oid:{NV}11.1.11.100.16"]


def test_a_required_purpose_other_than_the_evidences_is_not_trusted(
    pki: RimPki, rubin_blocks: dict[int, Block]
) -> None:
    policy = CorimPolicy(required_purpose="CC SPT")
    result = appraise_signed(pki, rubin_evidence(rubin_blocks), rubin_corims(), policy)
    assert not result.trusted
    assert [(m.key, m.reference, m.evidence) for m in result.mismatches] == [
        ("purpose", "'CC SPT'", "'CC MPT'")
    ]
    same = CorimPolicy(required_purpose="CC MPT")
    assert appraise_signed(pki, rubin_evidence(rubin_blocks), rubin_corims(), same).trusted


def test_no_root_names_the_evidences_purpose(pki: RimPki, rubin_blocks: dict[int, Block]) -> None:
    def rename(comids: list[dict[int, Any]]) -> None:
        reference_triple(comids, "11.1.11.1.2")[1][0][1][11] = "CC XYZ"

    result = appraise_signed(pki, rubin_evidence(rubin_blocks), rubin_corims(rename))
    assert not result.trusted
    assert [m.key for m in result.mismatches] == ["purpose"]
    assert "0 root(s)" in result.mismatches[0].evidence


def test_the_driver_corim_alone_lacks_the_vbios_references(
    pki: RimPki, rubin_blocks: dict[int, Block]
) -> None:
    result = appraise_signed(pki, rubin_evidence(rubin_blocks), rubin_corims()[:1])
    assert not result.trusted
    assert {m.evidence for m in result.mismatches} == {"not appraised"}
    assert len(result.mismatches) == 6  # the six VBIOS environments of the CC MPT subtree


def test_blackwell_fsp_with_its_corim_and_tcbinfo_is_trusted(pki: RimPki) -> None:
    result = appraise_signed(pki, fsp_evidence(), [corim_bytes("blackwell_fsp_real")])
    assert result.trusted, [str(m) for m in result.mismatches]
    assert result.purpose is None
    assert len(result.matched) == 14  # layer 0 (TcbInfo) and 13 SPDM blocks
    assert "NVIDIA GB100 A01 FSP layer 0 [-]" in result.matched


def test_blackwell_fsp_mutated_block_is_named(pki: RimPki) -> None:
    base = DATA / "blackwell-gb100-fsp"
    blocks = read_blocks(read_report_hex(base / "attestation-report.hex"))
    for index in (3, 1, 52):
        changed = dict(blocks)
        old = changed[index]
        changed[index] = Block(index, old.value_type, old.value[:-1] + bytes([old.value[-1] ^ 1]))
        result = appraise_signed(pki, fsp_evidence(changed), [corim_bytes("blackwell_fsp_real")])
        assert [(m.environment, m.key) for m in result.mismatches] == [
            ("NVIDIA GB100 A01 FSP layer 1", str(index))
        ]


@pytest.mark.parametrize(("mask", "trusted"), [(b"\xff\xff\xff\xfc", True), (b"\xff" * 4, False)])
def test_masked_raw_values(pki: RimPki, mask: bytes, trusted: bool) -> None:
    def masked(comids: list[dict[int, Any]]) -> None:
        block1 = comids[0][4][0][1][1][0]
        assert block1[0] == 1
        block1[1][4] = cbor2.CBORTag(563, [b"\x00\x00\x00\x03", mask])

    corim = edit_comids(corim_bytes("blackwell_fsp_real"), masked)
    assert appraise_signed(pki, fsp_evidence(), [corim]).trusted is trusted


def test_tcbinfo_of_the_real_leaves() -> None:
    for folder, model, svn in (
        ("rubin-gr100-620.54", "GR100 A01 GSP", 1),
        ("blackwell-gb100-fsp", "GB100 A01 FSP", 3),
    ):
        leaf = read_pem_chain(DATA / folder / "cert-chain.pem")[0]
        (entry,) = tcbinfo_evidence(leaf).entries
        assert entry.environment == Environment(vendor="NVIDIA", model=model, layer=0)
        assert entry.values.svn is not None and entry.values.svn.value == svn
        assert [d.alg for d in entry.values.digests] == [7, 7]


def test_toc_naming_a_missing_block_is_malformed(rubin_blocks: dict[int, Block]) -> None:
    blocks = dict(rubin_blocks)
    toc = parse_toc(blocks[0xFD].value, blocks)
    del blocks[54]
    with pytest.raises(MalformedTocError, match="block 54"):
        toc_evidence(toc, blocks)
    with pytest.raises(MalformedReportError, match="block 54"):
        device_evidence(blocks, read_pem_chain(DATA / "rubin-gr100-620.54" / "cert-chain.pem")[0])


# --- unsigned, and the envelope -----------------------------------------------------------


def test_unsigned_corims_are_refused_by_default(
    pki: RimPki, rubin_blocks: dict[int, Block]
) -> None:
    with pytest.raises(CorimNotAcceptedError, match=RELAXATION_UNSIGNED) as caught:
        appraise_corim_files(
            rubin_evidence(rubin_blocks), rubin_corims(), policy=SIGNED, anchor=pki.root, now=NOW
        )
    assert caught.value.reason == "unsigned"
    assert isinstance(caught.value, NotTrustedError)


def test_unsigned_corims_under_the_relaxation_show_it(
    pki: RimPki, rubin_blocks: dict[int, Block]
) -> None:
    result = appraise_corim_files(
        rubin_evidence(rubin_blocks), rubin_corims(), policy=UNSIGNED, anchor=pki.root, now=NOW
    )
    assert result.trusted
    assert result.relaxations == (RELAXATION_UNSIGNED,)
    assert result.to_dict()["relaxations"] == [RELAXATION_UNSIGNED]
    assert result.skipped == () and result.signer_chains == ()
    assert {s for _, s in result.corims} == {"unsigned"}
    mixed = [sign_corim(corim_bytes(RUBIN[0]), pki=pki), corim_bytes(RUBIN[1])]
    result = appraise_corim_files(
        rubin_evidence(rubin_blocks), mixed, policy=UNSIGNED, anchor=pki.root, now=NOW
    )
    assert result.trusted and result.relaxations == (RELAXATION_UNSIGNED,)


def test_signed_corim_reads_with_the_chain_in_either_header(pki: RimPki) -> None:
    payload = corim_bytes("blackwell_fsp_real")
    for signed in (
        sign_corim(payload, pki=pki),
        sign_corim(payload, pki=pki, chain=pki.chain),
        sign_corim(payload, pki=pki, unprotected_chain=True),
    ):
        corim = read_corim(signed, anchor=pki.root, now=NOW)
        assert corim.signed and corim.signer == "gpucc test RIM L4 Signer"
        assert corim.relaxations == ()
        assert len(corim.chain) == 4


def test_a_chain_with_a_gap_is_refused(pki: RimPki) -> None:
    signed = sign_corim(corim_bytes("blackwell_fsp_real"), pki=pki, chain=[pki.l4])
    with pytest.raises(CoseCheckError, match="not issued by") as caught:
        read_corim(signed, anchor=pki.root, now=NOW)
    assert caught.value.check == "chain"


@pytest.mark.parametrize(
    ("options", "check"),
    [
        ({"alg": ES256}, "alg"),
        ({"unprotected_chain": True, "x5t": False}, "x5t"),
        ({"unprotected_chain": True, "x5t_override": b"\0" * 48}, "x5t"),
        ({"both": True}, "x5chain"),
        ({"tamper": "signature"}, "signature"),
        ({"tamper": "payload"}, "signature"),
        ({"detached": True}, "payload"),
        ({"empty_protected": True}, "alg"),
    ],
    ids=["es256", "no-x5t", "x5t-mismatch", "both", "bad-sig", "tampered", "detached", "empty"],
)
def test_envelopes_nvidia_refuses(pki: RimPki, options: dict[str, Any], check: str) -> None:
    signed = sign_corim(corim_bytes("blackwell_fsp_real"), pki=pki, **options)
    with pytest.raises(CoseCheckError) as caught:
        read_corim(signed, anchor=pki.root, now=NOW)
    assert caught.value.check == check


def test_signer_under_another_root_or_expired_is_refused(pki: RimPki) -> None:
    other = make_rim_pki()
    signed = sign_corim(corim_bytes("blackwell_fsp_real"), pki=other)
    with pytest.raises(CoseCheckError, match="chain"):
        read_corim(signed, anchor=pki.root, now=NOW)
    ours = sign_corim(corim_bytes("blackwell_fsp_real"), pki=pki)
    with pytest.raises(CoseCheckError, match="expired"):
        read_corim(ours, anchor=pki.root, now=dt.datetime(2040, 1, 1, tzinfo=dt.UTC))


def test_a_certificate_that_is_not_der_is_refused(pki: RimPki) -> None:
    payload = corim_bytes("blackwell_fsp_real")
    signed = cbor2.loads(sign_corim(payload, pki=pki))
    header = dict(cbor2.loads(signed.value[0]))
    header[33] = b"\0" * 64
    forged = cbor2.CBORTag(18, [cbor2.dumps(header), *signed.value[1:]])
    with pytest.raises(CoseCheckError, match="x5chain entry 0 cannot be parsed as a certificate"):
        read_corim(cbor2.dumps(forged), anchor=pki.root, now=NOW)
    with pytest.raises(MalformedCoseError):
        read_corim(cbor2.dumps(cbor2.CBORTag(18, [b"", {}])), anchor=pki.root, now=NOW)


# --- NVIDIA's reject fixtures, as small CBOR ----------------------------------------------

_VALUE = [[{0: {1: "V"}}, [{1: {1: 1}}]]]


@pytest.mark.parametrize(
    ("corim", "reason"),
    [
        (small_corim(k2=[{0: cbor2.CBORTag(32, "http://example.test/dep1")}]), "dependent-rims"),
        (
            bytes(cbor2.dumps(cbor2.CBORTag(501, {0: "c", 1: [comid({0: _VALUE})] * 26}))),
            "too-many-tags",
        ),
        (
            small_corim(k3=cbor2.CBORTag(32, "http://example.test/unknown-profile")),
            "unknown-profile",
        ),
        (small_corim({0: _VALUE, 2: [[{0: {1: "V"}}, []]]}), "identity-triples"),
        (small_corim({0: _VALUE, 3: [[{0: {1: "V"}}, []]]}), "attest-key-triples"),
        (small_corim({0: _VALUE, 5: [[{0: {1: "V"}}, []]]}), "membership-triples"),
        (small_corim({0: _VALUE, 77: []}), "unknown-triples"),
        (
            small_corim({0: [[{0: {1: "V"}}, [{1: {4: cbor2.CBORTag(560, b"\1"), 5: b"\1"}}]]]}),
            "deprecated-raw-value-mask",
        ),
        (small_corim({0: [[{0: {1: "V"}}, [{1: {12: {0: [3]}}}]]]}), "evidence-only-value"),
        (small_corim({0: [[{0: {1: "V"}}, [{1: {3: {0: True}}}]]]}), "unsupported-value-kind"),
        (small_corim({0: [[{0: {1: "V"}, 1: b"\1"}, [{1: {1: 1}}]]]}), "unsupported-environment"),
        (
            bytes.fromhex("d901f5a300616301")
            + bytes(cbor2.dumps([comid({0: _VALUE})]))
            + bytes.fromhex("04a101c1fb41ce8fa0e4400000"),
            "cbor",
        ),
    ],
    ids=[
        "dependent-rims",
        "too-many-tags",
        "unknown-profile",
        "identity",
        "attest-key",
        "membership",
        "unknown-triple",
        "raw-value-mask",
        "evidence-only",
        "flags",
        "instance",
        "float-validity",
    ],
)
def test_nvidia_reject_cases(pki: RimPki, corim: bytes, reason: str) -> None:
    for data in (corim, sign_corim(corim, pki=pki)):
        with pytest.raises(MalformedCorimError) as caught:
            read_corim(data, anchor=pki.root, now=NOW, policy=UNSIGNED)
        assert caught.value.reason == reason
        if reason == "cbor":
            assert "integer number of seconds" in str(caught.value)
    assert MAX_TAGS < 26


def test_ignored_triples_and_allowed_profiles(pki: RimPki) -> None:
    corim = small_corim({0: _VALUE, 1: [], 8: "x", 10: "y"})
    read = read_corim(corim, anchor=pki.root, now=NOW, policy=UNSIGNED)
    assert read.comids[0].ignored_triples == (
        "endorsed",
        "conditional-endorsement-series",
        "conditional-endorsement",
    )
    profile = small_corim(k3=cbor2.CBORTag(32, "http://example.test/p"))
    allowed = CorimPolicy(
        allow_unsigned=True, allowed_profiles=frozenset({"uri:http://example.test/p"})
    )
    assert read_corim(profile, anchor=pki.root, now=NOW, policy=allowed).profile == (
        "uri:http://example.test/p"
    )


def test_validity_is_enforced(pki: RimPki) -> None:
    past = small_corim(k4={1: cbor2.CBORTag(1, 1_700_000_000)})
    with pytest.raises(CorimNotAcceptedError) as caught:
        read_corim(past, anchor=pki.root, now=NOW, policy=UNSIGNED)
    assert caught.value.reason == "expired"
    future = small_corim(
        k4={0: cbor2.CBORTag(1, 4_000_000_000), 1: cbor2.CBORTag(1, 4_100_000_000)}
    )
    with pytest.raises(CorimNotAcceptedError, match="not-yet-valid"):
        read_corim(future, anchor=pki.root, now=NOW, policy=UNSIGNED)
    window = small_corim(
        k4={0: cbor2.CBORTag(1, 1_700_000_000), 1: cbor2.CBORTag(1, 4_100_000_000)}
    )
    assert read_corim(window, anchor=pki.root, now=NOW, policy=UNSIGNED).not_after is not None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (corim_bytes("blackwell_fsp_real") + b"\0", "trailing"),
        (bytes.fromhex("d901f5a2006163006163"), "given twice"),
        (bytes.fromhex("d901f5bf0061636101ff"), "indefinite"),
        (bytes.fromhex("d901f5a100c24101"), "tag 2"),
        (b"", "empty"),
        (bytes.fromhex("81" * 40 + "00"), "nesting"),
    ],
    ids=["trailing", "duplicate-key", "indefinite", "bignum", "empty", "deep"],
)
def test_strict_cbor(pki: RimPki, data: bytes, message: str) -> None:
    with pytest.raises(MalformedCorimError, match=message):
        read_corim(data, anchor=pki.root, now=NOW, policy=UNSIGNED)


def test_strict_cbor_bounds() -> None:
    from gpucc.gpuattest.cbor_strict import CborLimits

    tight = CborLimits(max_bytes=64, max_items=2, max_string=4)
    for data, message in (
        (bytes(cbor2.dumps([1, 2, 3])), "more than 2"),
        (bytes(cbor2.dumps(b"12345")), "longer than 4"),
        (bytes(65), "more than 64"),
        (bytes.fromhex("fa3f800000"), "floating-point"),
    ):
        with pytest.raises(StrictCborError, match=message):
            decode_strict(data, what="x", limits=tight)
    assert issubclass(StrictCborError, MalformedInputError)
    assert decode_strict(bytes(cbor2.dumps({1: [True, None]})), what="x") == {1: (True, None)}


def test_corims_are_recognised_by_content(pki: RimPki) -> None:
    from gpucc.gpuattest.corim import looks_like_corim
    from gpucc.gpuattest.samples import nvidia_h100_sample

    unsigned = corim_bytes("blackwell_fsp_real")
    assert looks_like_corim(unsigned)
    assert looks_like_corim(sign_corim(unsigned, pki=pki))
    assert not looks_like_corim(nvidia_h100_sample().driver_rim_path.read_bytes())
    assert not looks_like_corim(b"")


def test_read_corim_needs_an_aware_time(pki: RimPki) -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        read_corim(corim_bytes("blackwell_fsp_real"), anchor=pki.root, now=dt.datetime(2026, 1, 1))
    assert isinstance(pki.root, x509.Certificate)
