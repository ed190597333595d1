"""XML RIM entries for opaque data: index 0x1000 + type, ``minSvn``, ``includeInResult``.

The evidence's opaque entry must be present, of the SVN value type and at least the
floor; otherwise the measurement comparison fails naming the entry. Not hashed.
"""

from __future__ import annotations

import datetime as dt

import pytest

from gpucc.core.errors import CollateralUnavailableError, MalformedRimError
from gpucc.gpuattest.collateral import NoOcsp
from gpucc.gpuattest.evidence import EvidenceSet, GpuEvidence
from gpucc.gpuattest.measurements import MeasurementStatus, compare_roles
from gpucc.gpuattest.policy import Policy
from gpucc.gpuattest.report import AttestationReport
from gpucc.gpuattest.result import CheckStatus, GpuResult
from gpucc.gpuattest.rim import ReferenceManifest
from gpucc.gpuattest.simulate import Pki, _template_rim, sign_rim
from gpucc.gpuattest.trust import TrustRoots
from gpucc.gpuattest.verifier import verify
from tests.support.samples import (
    NVDAOD_H100,
    NVDAOD_H100_NONCE,
    SET_A_CHAIN,
    SET_A_REPORT,
    report_bytes,
)

AT = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
H100 = AttestationReport.parse(report_bytes(NVDAOD_H100))
DRIVER_ID = "NV_GPU_DRIVER_GH100_620.12"
VBIOS_ID = "NV_GPU_VBIOS_G520_0201_884_9600D9000F"
PKI = Pki.build(
    ["Test RIM root", "Test CA", "Test L3", "Test L4"],
    not_before=AT - dt.timedelta(days=30),
    not_after=AT + dt.timedelta(days=30),
)
GOLDEN = {i - 1: b.value for i, b in H100.blocks.items()}


def _rim(role: str, active: range, min_svns: dict[int, tuple[str, int]] | None) -> bytes:
    template = (
        "driver-rim-545.00.swidtag"
        if role == "driver"
        else ("vbios-rim-1010_0200_882_96005E0001-test.swidtag")
    )
    return sign_rim(
        template=_template_rim(template),
        colloquial_version="620.12" if role == "driver" else "96.00.D9.00.0F",
        golden=GOLDEN,
        active=frozenset(active),
        pki=PKI,
        min_svns=min_svns,
    )


def _manifests(
    driver_svns: dict[int, tuple[str, int]] | None = None,
    vbios_svns: dict[int, tuple[str, int]] | None = None,
) -> dict[str, bytes]:
    return {
        DRIVER_ID: _rim("driver", range(16, 64), driver_svns),
        VBIOS_ID: _rim("vbios", range(0, 16), vbios_svns),
    }


def test_opaque_entries_parse() -> None:
    rim = ReferenceManifest.parse(_rim("driver", range(16, 64), {37: ("GSP_SVN", 1)}))
    entry = rim.entry(0x1025)
    assert entry is not None
    assert (entry.opaque_type, entry.min_svn, entry.name) == (37, 1, "GSP_SVN")
    assert entry.include_in_result and entry.values == ()


def _compare(driver: dict[int, tuple[str, int]] | None, report: AttestationReport = H100):  # type: ignore[no-untyped-def]
    rims = {k: ReferenceManifest.parse(v) for k, v in _manifests(driver).items()}
    return compare_roles(
        {"driver": rims[DRIVER_ID], "vbios": rims[VBIOS_ID]},
        report.runtime_measurements(),
        report.nvdec0_disabled,
        report.opaque_data,
    )


def test_svn_at_the_floor_passes() -> None:
    result = _compare({37: ("GSP_SVN", 0)})
    assert result.status is MeasurementStatus.SUCCESS, result.reason
    assert result.compared_count == 65


def test_svn_below_the_floor_is_a_named_mismatch() -> None:
    result = _compare({37: ("GSP_SVN", 1)})
    assert result.status is MeasurementStatus.FAIL
    (m,) = result.mismatches
    assert (m.index, m.name, m.reason, m.runtime_value) == (
        0x1025,
        "GSP_SVN",
        "svn-below-minimum",
        "0000",
    )
    assert m.golden_values == ("svn>=1",) and m.spdm_index is None
    assert m.to_dict()["name"] == "GSP_SVN"


def test_absent_or_untyped_opaque_entries_fail() -> None:
    result = _compare({99: ("FUTURE_SVN", 0), 3: ("DRIVER_AS_SVN", 0)})
    reasons = {m.name: m.reason for m in result.mismatches}
    assert reasons == {"FUTURE_SVN": "missing", "DRIVER_AS_SVN": "not-svn"}


def test_legacy_opaque_data_has_no_svn() -> None:
    legacy = AttestationReport.parse(report_bytes(SET_A_REPORT))
    result = _compare({37: ("GSP_SVN", 0)}, legacy)
    assert any(m.name == "GSP_SVN" and m.reason == "missing" for m in result.mismatches)


def test_the_same_opaque_record_in_both_rims_is_a_conflict() -> None:
    manifests = {
        k: ReferenceManifest.parse(v)
        for k, v in _manifests({37: ("GSP_SVN", 0)}, {37: ("GSP_SVN", 0)}).items()
    }
    result = compare_roles(
        {"driver": manifests[DRIVER_ID], "vbios": manifests[VBIOS_ID]},
        H100.runtime_measurements(),
        None,
        H100.opaque_data,
    )
    assert result.status is MeasurementStatus.FAIL
    assert result.conflicts == (0x1025,)


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"index": "5", "minSvn": "1"}, "has minSvn but is not an opaque-data entry"),
        ({"index": "4133"}, "has no minSvn"),
        ({"index": "4133", "minSvn": "-1"}, "is not an SVN"),
        ({"index": "4133", "minSvn": "1", "includeInResult": "maybe"}, "includeInResult"),
        ({"index": "9999", "minSvn": "1"}, "outside"),
        ({"index": "0x1025", "minSvn": "1", "hash": "00"}, "cannot carry hashes"),
    ],
)
def test_malformed_opaque_entries(attrs: dict[str, str], message: str) -> None:
    from lxml import etree

    root = etree.fromstring(_rim("driver", range(16, 64), None))
    swid = "http://standards.iso.org/iso/19770/-2/2015/schema.xsd"
    hash_ns = "http://www.w3.org/2001/04/xmlenc#sha384"
    res = root.find(f"{{{swid}}}Payload/{{{swid}}}Resource")
    assert res is not None
    if "hash" not in attrs and int(attrs["index"], 0) >= 0x1000:
        del res.attrib[f"{{{hash_ns}}}Hash0"]
    for key, value in attrs.items():
        if key != "hash":
            res.set(key, value)
    with pytest.raises(MalformedRimError, match=message):
        ReferenceManifest.parse(etree.tostring(root))


def test_hex_opaque_index_reads() -> None:
    from lxml import etree

    root = etree.fromstring(_rim("driver", range(16, 64), {37: ("GSP_SVN", 3)}))
    swid = "http://standards.iso.org/iso/19770/-2/2015/schema.xsd"
    for res in root.iter(f"{{{swid}}}Resource"):
        if res.get("index") == "4133":
            res.set("index", "0x1025")
    entry = ReferenceManifest.parse(etree.tostring(root)).entry(0x1025)
    assert entry is not None and entry.min_svn == 3


class _Rims:
    def __init__(self, rims: dict[str, bytes]) -> None:
        self.rims = rims

    def get_rim(self, rim_id: str) -> bytes:
        if rim_id not in self.rims:
            raise CollateralUnavailableError(f"no RIM {rim_id} here")
        return self.rims[rim_id]


def _verify(driver: dict[int, tuple[str, int]]) -> GpuResult:
    # The H100 620.12 transcript has no chain of its own: set A's stands in, so the
    # signature fails; the measurement step is what this test reads.
    evidence = EvidenceSet(
        gpus=(GpuEvidence(report_bytes(NVDAOD_H100), SET_A_CHAIN.read_bytes(), "HOPPER"),)
    )
    result = verify(
        evidence,
        expected_nonce=bytes.fromhex(NVDAOD_H100_NONCE),
        roots=TrustRoots(device_root=TrustRoots.nvidia().device_root, rim_root=PKI.root),
        now=AT,
        rims=_Rims(_manifests(driver)),
        ocsp=NoOcsp("offline"),
        policy=Policy(require_ocsp=False),
    )
    return result.gpus[0]


def test_verify_fails_measurements_naming_the_record() -> None:
    gpu = _verify({37: ("GSP_SVN", 2)})
    check = gpu.check("measurements")
    assert check.status is CheckStatus.FAIL
    assert "index 4133 GSP_SVN (driver): golden svn>=2, runtime 0000" in check.reason
    assert gpu.check("report-signature").status is CheckStatus.FAIL  # the stand-in chain
    assert gpu.claims["x-nvidia-mismatch-measurement-records"] == []
    assert gpu.claims["x-nvidia-mismatch-opaque-data-records"] == [
        {
            "id": 37,
            "name": "GSP_SVN",
            "goldenType": "MIN_SVN",
            "goldenValue": 2,
            "runtimeType": "MIN_SVN",
            "runtimeValue": 0,
        }
    ]
    assert gpu.claims["measres"] == "fail"
    assert _verify({37: ("GSP_SVN", 0)}).check("measurements").status is CheckStatus.PASS


def test_policy_can_pin_a_minimum_svn() -> None:
    from gpucc.core.errors import MalformedPolicyError
    from gpucc.gpuattest.policy import parse_policy

    policy = parse_policy({"versions": {"min_svn": {37: 1}}})
    assert policy.to_dict()["versions"]["min_svn"] == {"37": 1}
    assert "min_svn" not in Policy().to_dict()["versions"]  # earlier output unchanged
    evidence = EvidenceSet(
        gpus=(GpuEvidence(report_bytes(NVDAOD_H100), SET_A_CHAIN.read_bytes(), "HOPPER"),)
    )
    gpu = verify(
        evidence,
        expected_nonce=bytes.fromhex(NVDAOD_H100_NONCE),
        roots=TrustRoots(device_root=TrustRoots.nvidia().device_root, rim_root=PKI.root),
        now=AT,
        rims=_Rims(_manifests()),
        ocsp=NoOcsp("offline"),
        policy=parse_policy({"versions": {"min_svn": {37: 1, 99: 0}}, "ocsp": {"require": False}}),
    ).gpus[0]
    check = gpu.check("versions-policy")
    assert check.status is CheckStatus.FAIL
    assert "opaque entry 37 SVN 0 is below 1" in check.reason
    assert "opaque entry 99 is not an SVN" in check.reason
    for bad in ({0: 1}, {37: -1}, {"37": 1}, {37: True}):
        with pytest.raises(MalformedPolicyError, match="min_svn"):
            parse_policy({"versions": {"min_svn": bad}})
