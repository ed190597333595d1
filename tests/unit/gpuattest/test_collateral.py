"""The verifier's collateral seams: RIM sources, which certificates get OCSP, NoOcsp."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from gpucc.core.errors import FileAccessError, MalformedRimError, RimNotFoundError
from gpucc.gpuattest.chain import load_pem_chain
from gpucc.gpuattest.collateral import (
    MAX_RIM_BYTES,
    ChainKind,
    CompositeRimSource,
    DirectoryRimSource,
    FileRimSource,
    NoOcsp,
    NoRimSource,
    OcspStatus,
    ocsp_targets,
    rim_sources_from_mapping,
)
from gpucc.gpuattest.rim import ReferenceManifest
from gpucc.gpuattest.trust import TrustRoots
from tests.support.samples import (
    HEAD_CHAIN,
    IN_WINDOW,
    SET_A_CHAIN,
    SET_A_DRIVER_RIM,
    SET_A_PROD_VBIOS_RIM,
    SET_A_VBIOS_RIM,
)

ROOTS = TrustRoots.nvidia()
DEVICE = load_pem_chain(SET_A_CHAIN.read_bytes())
RIM_CHAIN = ReferenceManifest.parse(SET_A_DRIVER_RIM.read_bytes()).certificates
DRIVER_ID = "NV_GPU_DRIVER_GH100_545.00"
VBIOS_ID = "NV_GPU_VBIOS_1010_0200_882_96005E0001"


# --- which certificates get OCSP ----------------------------------------------------------


def test_device_chain_targets_skip_the_per_boot_leaf_and_the_root() -> None:
    targets = ocsp_targets(DEVICE, kind=ChainKind.DEVICE, anchor=ROOTS.device_root, now=IN_WINDOW)
    assert [t.cert for t in targets] == list(DEVICE[1:4])
    assert [t.issuer for t in targets] == list(DEVICE[2:5])
    assert [t.issuer_chain for t in targets] == [DEVICE[3:], DEVICE[4:], ()]
    assert {(t.kind, t.anchor, t.now) for t in targets} == {
        (ChainKind.DEVICE, ROOTS.device_root, IN_WINDOW)
    }


def test_rim_chain_targets_include_the_signer() -> None:
    targets = ocsp_targets(
        RIM_CHAIN, kind=ChainKind.DRIVER_RIM, anchor=ROOTS.rim_root, now=IN_WINDOW
    )
    assert [t.cert for t in targets] == list(RIM_CHAIN[:3])
    assert targets[-1].issuer == ROOTS.rim_root


def test_the_pinned_anchor_replaces_the_root_a_chain_brings() -> None:
    other_root = [*DEVICE[:-1], ROOTS.rim_root]
    targets = ocsp_targets(
        other_root, kind=ChainKind.DEVICE, anchor=ROOTS.device_root, now=IN_WINDOW
    )
    assert targets[-1].issuer == ROOTS.device_root
    assert all(ROOTS.rim_root not in (t.issuer, *t.issuer_chain) for t in targets)


def test_a_lone_certificate_has_no_targets() -> None:
    assert (
        ocsp_targets(DEVICE[:1], kind=ChainKind.DEVICE, anchor=ROOTS.device_root, now=IN_WINDOW)
        == ()
    )


def test_no_ocsp_says_why_and_whether_collateral_is_missing() -> None:
    target = ocsp_targets(DEVICE, kind=ChainKind.DEVICE, anchor=ROOTS.device_root, now=IN_WINDOW)[0]
    missing = NoOcsp().check(target)
    assert missing.status is OcspStatus.NOT_CHECKED and missing.collateral_missing
    assert "no OCSP responder" in missing.reason
    off = NoOcsp("OCSP checking is disabled", collateral_missing=False).check(target)
    assert off.status is OcspStatus.NOT_CHECKED and not off.collateral_missing
    assert off.reason == "OCSP checking is disabled"
    assert off.response_valid is None


# --- RIM sources ---------------------------------------------------------------------------------


def test_file_source_answers_by_role() -> None:
    both = FileRimSource(driver=SET_A_DRIVER_RIM, vbios=SET_A_VBIOS_RIM)
    assert both.get_rim(DRIVER_ID) == SET_A_DRIVER_RIM.read_bytes()
    assert both.get_rim(VBIOS_ID) == SET_A_VBIOS_RIM.read_bytes()
    with pytest.raises(RimNotFoundError, match="no file given"):
        FileRimSource(driver=SET_A_DRIVER_RIM).get_rim(VBIOS_ID)


def test_file_source_refuses_oversized_and_unreadable_files(tmp_path: Path) -> None:
    big = tmp_path / "big.xml"
    big.write_bytes(b"<" * (MAX_RIM_BYTES + 1))
    with pytest.raises(MalformedRimError, match="larger than"):
        FileRimSource(driver=big).get_rim(DRIVER_ID)
    with pytest.raises(FileAccessError, match="does not exist"):
        FileRimSource(driver=tmp_path / "absent.xml").get_rim(DRIVER_ID)


def test_directory_source_reads_id_dot_xml(tmp_path: Path) -> None:
    (tmp_path / f"{DRIVER_ID}.xml").write_bytes(SET_A_DRIVER_RIM.read_bytes())
    source = DirectoryRimSource(tmp_path)
    assert source.get_rim(DRIVER_ID) == SET_A_DRIVER_RIM.read_bytes()
    with pytest.raises(RimNotFoundError, match=f"{VBIOS_ID}.xml is not in"):
        source.get_rim(VBIOS_ID)
    with pytest.raises(RimNotFoundError, match="not a valid RIM ID"):
        source.get_rim("../etc/passwd")


def test_composite_source_asks_in_order_and_the_first_answer_wins(tmp_path: Path) -> None:
    (tmp_path / f"{VBIOS_ID}.xml").write_bytes(SET_A_PROD_VBIOS_RIM.read_bytes())
    files = FileRimSource(vbios=SET_A_VBIOS_RIM)
    directory = DirectoryRimSource(tmp_path)
    assert CompositeRimSource([files, directory]).get_rim(VBIOS_ID) == SET_A_VBIOS_RIM.read_bytes()
    assert (
        CompositeRimSource([directory, files]).get_rim(VBIOS_ID)
        == SET_A_PROD_VBIOS_RIM.read_bytes()
    )
    # A miss moves on to the next source.
    assert CompositeRimSource([NoRimSource(), files]).get_rim(VBIOS_ID) == (
        SET_A_VBIOS_RIM.read_bytes()
    )


def test_composite_source_reports_every_miss() -> None:
    composite = CompositeRimSource([NoRimSource("first"), NoRimSource("second")])
    with pytest.raises(RimNotFoundError) as info:
        composite.get_rim(DRIVER_ID)
    assert "first" in str(info.value) and "second" in str(info.value)
    assert info.value.rim_id == DRIVER_ID


def test_composite_source_stops_at_a_source_that_fails(tmp_path: Path) -> None:
    """Only "not found" moves on; a broken source is not papered over by a later one."""
    broken = FileRimSource(driver=tmp_path / "absent.xml")
    good = FileRimSource(driver=SET_A_DRIVER_RIM)
    with pytest.raises(FileAccessError):
        CompositeRimSource([broken, good]).get_rim(DRIVER_ID)


def test_mapping_source() -> None:
    source = rim_sources_from_mapping({DRIVER_ID: b"<x/>"})
    assert source.get_rim(DRIVER_ID) == b"<x/>"
    with pytest.raises(RimNotFoundError, match="not in the supplied collateral"):
        source.get_rim(VBIOS_ID)


def test_another_gpus_device_chain_gets_three_targets_too() -> None:
    head = load_pem_chain(HEAD_CHAIN.read_bytes())
    now = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
    targets = ocsp_targets(head, kind=ChainKind.DEVICE, anchor=ROOTS.device_root, now=now)
    assert len(targets) == 3 and targets[-1].issuer == ROOTS.device_root
