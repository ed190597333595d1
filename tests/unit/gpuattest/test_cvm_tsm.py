"""configfs-tsm collection against a fake kernel, and the SEV-SNP host certificate table."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import struct
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucc.cli.exitcodes import exit_code_for
from gpucc.core.errors import UsageError
from gpucc.gpuattest.cvm.findings import CvmKind
from gpucc.gpuattest.cvm.snp import verify_snp_report
from gpucc.gpuattest.cvm.snp_certs import (
    ARK_GUID,
    ASK_GUID,
    CERT_TABLE_MAX,
    VCEK_GUID,
    VLEK_GUID,
    MalformedCertTableError,
    parse_snp_cert_table,
    vcek_from_auxblob,
)
from gpucc.gpuattest.cvm.snp_report import MalformedSnpReportError, parse_snp_report
from gpucc.gpuattest.cvm.snp_roots import load_vcek
from gpucc.gpuattest.cvm.snp_simulate import SimulatedSnp
from gpucc.gpuattest.cvm.tsm import (
    OUTBLOB_MAX,
    MalformedTsmOutputError,
    TsmAccessError,
    TsmConflictError,
    TsmReport,
    TsmRequestError,
    TsmUnavailableError,
    UnknownTsmProviderError,
    collect_tsm_report,
)
from tests.support.paths import DATA
from tests.support.tsm import FakeTsm, MakeOutblob

REPORT_DATA = hashlib.sha512(b"gpucc configfs-tsm test").digest()
WHEN = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
REAL_VCEK = (DATA / "cpu-tee" / "snp" / "vcek.der").read_bytes()
GUID = uuid.UUID("11111111-2222-3333-4444-555555555555")


@pytest.fixture(scope="module")
def chip() -> SimulatedSnp:
    return SimulatedSnp.create(seed=b"configfs-tsm")


def der(cert: Any) -> bytes:
    data = cert.public_bytes(serialization.Encoding.DER)
    assert isinstance(data, bytes)
    return data


def cert_table(entries: list[tuple[uuid.UUID, bytes]], *, pad: int = 0) -> bytes:
    """A well-formed table: the entries, the terminator, then the certificates in order."""
    offset = (len(entries) + 1) * 24
    head, body = b"", b""
    for guid, data in entries:
        head += guid.bytes + struct.pack("<II", offset + len(body), len(data))
        body += data
    return head + bytes(24) + body + bytes(pad)


def snp_maker(chip: SimulatedSnp) -> MakeOutblob:
    return lambda inblob, level: chip.report(report_data=inblob, vmpl=level or 0)


def tdx_quote(report_data: bytes, *, version: int = 4, body_type: int = 2) -> bytes:
    """A quote-shaped outblob (header, TD report body, empty signature data): no signature."""
    header = struct.pack("<HHI", version, 2, 0x81) + bytes(40)
    size = 584 if body_type == 2 else 648
    body = bytes(520) + report_data + bytes(size - 584)
    lead = struct.pack("<HI", body_type, size) if version == 5 else b""
    return header + lead + body + struct.pack("<I", 0)


Kernel = Callable[..., FakeTsm]


@pytest.fixture
def kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Kernel]:
    made: list[FakeTsm] = []

    def make(make_outblob: MakeOutblob, **kwargs: Any) -> FakeTsm:
        fake = FakeTsm(tmp_path / "report", make_outblob, **kwargs).install(monkeypatch)
        made.append(fake)
        return fake

    yield make
    for fake in made:
        fake.close()


def collect(fake: FakeTsm, report_data: bytes = REPORT_DATA, **kwargs: Any) -> TsmReport:
    return collect_tsm_report(report_data, root=fake.root, retry_delay=0, **kwargs)


# --- collection ---------------------------------------------------------------------------


def test_snp_evidence_binds_the_report_data_and_verifies_with_the_hosts_vcek(
    kernel: Kernel, chip: SimulatedSnp
) -> None:
    table = cert_table(
        [(VCEK_GUID, chip.vcek), (ASK_GUID, der(chip.pki.ask)), (ARK_GUID, der(chip.pki.ark))]
    )
    fake = kernel(snp_maker(chip), auxblob=table + bytes(4096 - len(table)))
    got = collect(fake)
    assert (got.provider, got.kind, got.generation, got.privlevel) == ("sev_guest", "snp", 8, None)
    assert got.kind is CvmKind.SNP
    vcek = vcek_from_auxblob(got.auxblob or b"")
    assert vcek == chip.vcek
    findings = verify_snp_report(got.outblob, vcek=vcek, now=WHEN, roots=chip.roots)
    assert findings.evidence_ok, findings.checks
    assert findings.report_data == REPORT_DATA
    assert findings.claims["vmpl"] == 0
    [entry] = fake.entries
    assert entry.name.startswith("gpucc-") and entry.served
    assert entry.inblob == REPORT_DATA and entry.privlevel == b""
    fake.assert_clean()


def test_privlevel_is_written_before_inblob_and_counted_in_the_generation(
    kernel: Kernel, chip: SimulatedSnp
) -> None:
    fake = kernel(snp_maker(chip), floor=1)
    got = collect(fake, privlevel=2)
    assert (got.generation, got.privlevel, got.auxblob) == (9, 2, None)
    assert parse_snp_report(got.outblob).vmpl == 2
    assert fake.entries[0].privlevel == b"2\n"
    fake.assert_clean()


@pytest.mark.parametrize(("version", "body_type"), [(4, 2), (5, 2), (5, 3)])
def test_tdx_quotes_v4_and_v5_carry_the_report_data(
    kernel: Kernel, version: int, body_type: int
) -> None:
    fake = kernel(
        lambda inblob, _: tdx_quote(inblob, version=version, body_type=body_type),
        provider="tdx_guest",
        privlevels=False,
    )
    got = collect(fake)
    assert (got.provider, got.kind, got.auxblob) == ("tdx_guest", CvmKind.TDX, None)
    assert got.outblob == tdx_quote(REPORT_DATA, version=version, body_type=body_type)
    fake.assert_clean()


@pytest.mark.parametrize(
    "outblob",
    [
        tdx_quote(REPORT_DATA)[:40],
        tdx_quote(REPORT_DATA)[:600],
        b"\x03\x00\x02\x00" + bytes(4) + tdx_quote(REPORT_DATA)[8:],  # SGX TEE type, version 3
        struct.pack("<HHI", 4, 2, 0) + tdx_quote(REPORT_DATA)[8:],  # SGX TEE type
        struct.pack("<HHI", 6, 2, 0x81) + tdx_quote(REPORT_DATA)[8:],
        tdx_quote(REPORT_DATA, version=5)[:50],
        tdx_quote(REPORT_DATA, version=5)[:48] + struct.pack("<HI", 2, 648) + bytes(700),
        tdx_quote(REPORT_DATA, version=5)[:48] + struct.pack("<HI", 1, 584) + bytes(700),
    ],
    ids=["short", "truncated", "v3", "sgx", "v6", "v5-no-body", "v5-size", "v5-sgx-body"],
)
def test_a_tdx_outblob_that_is_not_a_td_quote_is_malformed(kernel: Kernel, outblob: bytes) -> None:
    fake = kernel(lambda _i, _p: outblob, provider="tdx_guest", privlevels=False)
    with pytest.raises(MalformedTsmOutputError) as caught:
        collect(fake)
    assert exit_code_for(caught.value) == 4
    fake.assert_clean()


def test_a_raced_request_is_retried_once_in_a_fresh_entry(
    kernel: Kernel, chip: SimulatedSnp
) -> None:
    fake = kernel(snp_maker(chip), races=[1])
    got = collect(fake)
    assert parse_snp_report(got.outblob).report_data == REPORT_DATA
    assert len(fake.entries) == 2 and all(e.served for e in fake.entries)
    assert fake.entries[0].name != fake.entries[1].name
    fake.assert_clean()


@pytest.mark.parametrize(("races", "attempts"), [([1, 1], 2), ([2, 3, 0], 2), ([1], 1)])
def test_a_request_raced_on_every_attempt_is_refused(
    kernel: Kernel, chip: SimulatedSnp, races: list[int], attempts: int
) -> None:
    fake = kernel(snp_maker(chip), races=races)
    with pytest.raises(TsmConflictError, match="another writer") as caught:
        collect(fake, attempts=attempts)
    assert exit_code_for(caught.value) == 5
    assert len(fake.entries) == attempts
    fake.assert_clean()


def test_evidence_for_other_report_data_is_refused(kernel: Kernel, chip: SimulatedSnp) -> None:
    fake = kernel(lambda _i, _p: chip.report(report_data=bytes(64)))
    with pytest.raises(TsmConflictError, match="other report data"):
        collect(fake)
    assert len(fake.entries) == 2
    fake.assert_clean()


def test_no_report_directory_names_what_to_check(tmp_path: Path) -> None:
    for root in (tmp_path / "missing", tmp_path / "file"):
        (tmp_path / "file").write_text("")
        with pytest.raises(TsmUnavailableError) as caught:
            collect_tsm_report(REPORT_DATA, root=root)
        assert exit_code_for(caught.value) == 5
        line = caught.value.diagnostics()
        assert str(root) in line and "6.7" in line and "configfs" in line
        assert "TDX or SEV-SNP guest" in line


def test_a_plain_directory_is_not_configfs_and_is_left_empty(tmp_path: Path) -> None:
    with pytest.raises(TsmUnavailableError, match="provider") as caught:
        collect_tsm_report(REPORT_DATA, root=tmp_path)
    assert exit_code_for(caught.value) == 5
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_provider_is_refused_before_anything_is_written(
    kernel: Kernel, chip: SimulatedSnp
) -> None:
    fake = kernel(snp_maker(chip), provider="acme_guest")
    with pytest.raises(UnknownTsmProviderError, match="acme_guest") as caught:
        collect(fake)
    assert exit_code_for(caught.value) == 5
    assert fake.entries[0].inblob == b"" and not fake.entries[0].served
    fake.assert_clean()


def test_permission_denied_is_a_file_access_error(kernel: Kernel, chip: SimulatedSnp) -> None:
    fake = kernel(snp_maker(chip), deny=True)
    with pytest.raises(TsmAccessError, match="permission denied") as caught:
        collect(fake)
    assert exit_code_for(caught.value) == 8
    assert "root" in caught.value.diagnostics()
    fake.assert_clean()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes read-only files")
def test_an_attribute_that_may_not_be_written_is_a_file_access_error(
    kernel: Kernel, chip: SimulatedSnp
) -> None:
    fake = kernel(snp_maker(chip), modes={"inblob": 0o444})
    with pytest.raises(TsmAccessError, match="inblob") as caught:
        collect(fake)
    assert exit_code_for(caught.value) == 8
    fake.assert_clean()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only directories")
def test_a_report_directory_that_may_not_be_written_is_a_file_access_error(
    tmp_path: Path,
) -> None:
    tmp_path.chmod(0o555)
    with pytest.raises(TsmAccessError, match="permission denied") as caught:
        collect_tsm_report(REPORT_DATA, root=tmp_path)
    assert exit_code_for(caught.value) == 8
    tmp_path.chmod(0o755)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("size", [0, 32, 63, 65, 128])
def test_report_data_must_be_64_bytes(kernel: Kernel, chip: SimulatedSnp, size: int) -> None:
    fake = kernel(snp_maker(chip))
    with pytest.raises(UsageError, match="64 bytes") as caught:
        collect(fake, bytes(size))
    assert exit_code_for(caught.value) == 2
    assert fake.entries == []


@pytest.mark.parametrize(
    ("kwargs", "privlevel", "match"),
    [
        ({}, 4, "0 to 3"),
        ({}, -1, "0 to 3"),
        ({"floor": 2}, 1, "below"),
        ({"provider": "tdx_guest", "privlevels": False}, 0, "no privilege levels"),
    ],
)
def test_an_impossible_privlevel_is_a_usage_error(
    kernel: Kernel, chip: SimulatedSnp, kwargs: dict[str, Any], privlevel: int, match: str
) -> None:
    fake = kernel(snp_maker(chip), **kwargs)
    with pytest.raises(UsageError, match=match):
        collect(fake, privlevel=privlevel)
    assert all(e.inblob == b"" and not e.served for e in fake.entries)
    fake.assert_clean()


def test_attempts_below_one_is_a_usage_error(kernel: Kernel, chip: SimulatedSnp) -> None:
    fake = kernel(snp_maker(chip))
    with pytest.raises(UsageError, match="attempts"):
        collect(fake, attempts=0)
    assert fake.entries == []


def test_an_oversized_outblob_is_refused(kernel: Kernel) -> None:
    fake = kernel(lambda _i, _p: bytes(OUTBLOB_MAX + 4096))
    with pytest.raises(MalformedTsmOutputError, match="larger than") as caught:
        collect(fake)
    assert exit_code_for(caught.value) == 4
    fake.assert_clean()


def test_a_malformed_snp_outblob_is_malformed(kernel: Kernel) -> None:
    fake = kernel(lambda inblob, _: inblob * 3)
    with pytest.raises(MalformedSnpReportError) as caught:
        collect(fake)
    assert exit_code_for(caught.value) == 4
    fake.assert_clean()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"outblob_dir": True}, TsmRequestError, "outblob"),
        ({"omit": ["inblob"]}, TsmUnavailableError, "inblob"),
        ({"omit": ["generation"]}, TsmUnavailableError, "generation"),
    ],
)
def test_kernel_failures_are_environment_errors_and_the_entry_is_removed(
    kernel: Kernel, chip: SimulatedSnp, kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    fake = kernel(snp_maker(chip), **kwargs)
    with pytest.raises(error, match=match) as caught:
        collect(fake)
    assert exit_code_for(caught.value) == 5
    fake.assert_clean()


def test_an_empty_auxblob_is_none(kernel: Kernel, chip: SimulatedSnp) -> None:
    fake = kernel(snp_maker(chip), auxblob=b"")
    assert collect(fake).auxblob is None
    fake.assert_clean()


def test_an_entry_that_cannot_be_removed_is_reported(kernel: Kernel, chip: SimulatedSnp) -> None:
    fake = kernel(snp_maker(chip), rmdir_fails=True)
    with pytest.raises(TsmRequestError, match="could not be removed") as caught:
        collect(fake)
    assert exit_code_for(caught.value) == 5
    fake.close()
    fake.assert_clean()


def test_a_failure_keeps_its_error_and_notes_an_entry_left_behind(kernel: Kernel) -> None:
    fake = kernel(lambda _i, _p: b"", provider="acme_guest", rmdir_fails=True)
    with pytest.raises(UnknownTsmProviderError) as caught:
        collect(fake)
    assert any("could not be removed" in note for note in caught.value.__notes__)
    fake.close()
    fake.assert_clean()


# --- the host's certificate table ---------------------------------------------------------


def test_the_table_gives_vcek_ask_ark_and_keeps_unknown_entries(chip: SimulatedSnp) -> None:
    ask, ark = der(chip.pki.ask), der(chip.pki.ark)
    data = cert_table(
        [(ARK_GUID, ark), (GUID, b"vendor"), (ASK_GUID, ask), (VCEK_GUID, chip.vcek)], pad=100
    )
    table = parse_snp_cert_table(data)
    assert (table.vcek, table.ask, table.ark, table.vlek) == (chip.vcek, ask, ark, None)
    assert table.guids == (ARK_GUID, GUID, ASK_GUID, VCEK_GUID)
    assert table.get(GUID) == b"vendor"
    assert vcek_from_auxblob(data) == chip.vcek


def test_guids_are_stored_in_rfc_4122_byte_order() -> None:
    data = cert_table([(VCEK_GUID, REAL_VCEK)])
    assert data[:16] == bytes.fromhex("63da758de6644564adc5f4b93be8accd")
    assert vcek_from_auxblob(data) == REAL_VCEK
    load_vcek(REAL_VCEK)


def test_zero_padding_after_a_der_certificate_is_dropped(chip: SimulatedSnp) -> None:
    data = cert_table([(VCEK_GUID, REAL_VCEK + bytes(200)), (VLEK_GUID, chip.vcek + b"\0x")])
    table = parse_snp_cert_table(data)
    assert table.vcek == REAL_VCEK
    assert table.vlek == chip.vcek + b"\0x"  # not only zeros after it: left as it is


@pytest.mark.parametrize(
    "data",
    [
        b"",
        bytes(24),
        bytes(4096),
        cert_table([(ASK_GUID, b"ask"), (ARK_GUID, b"ark")]),
    ],
    ids=["empty", "terminator", "zero-page", "no-vcek"],
)
def test_a_table_without_a_vcek_gives_none(data: bytes) -> None:
    assert vcek_from_auxblob(data) is None


def entry(guid: uuid.UUID, offset: int, length: int) -> bytes:
    return guid.bytes + struct.pack("<II", offset, length)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (entry(VCEK_GUID, 48, 10) + bytes(24) + bytes(9), "past the"),
        (entry(VCEK_GUID, 49, 8) + bytes(24) + bytes(8), "past the"),
        (entry(VCEK_GUID, 0xFFFFFFFF, 0xFFFFFFFF) + bytes(24) + bytes(8), "past the"),
        (entry(VCEK_GUID, 24, 8) + bytes(24) + bytes(8), "inside the table"),
        (entry(VCEK_GUID, 0, 8) + bytes(24) + bytes(8), "inside the table"),
        (entry(VCEK_GUID, 48, 0) + bytes(24), "is empty"),
        (entry(VCEK_GUID, 72, 1) + entry(VCEK_GUID, 73, 1) + bytes(26), "repeats"),
        (entry(VCEK_GUID, 48, 1), "no terminating"),
        (entry(VCEK_GUID, 48, 1) + bytes(23), "no terminating"),
        (b"\x01", "no terminating"),
        (entry(uuid.UUID(int=0), 48, 1) + bytes(24), "zero GUID"),
        (bytes(CERT_TABLE_MAX + 1), "more than"),
        (
            b"".join(entry(uuid.UUID(int=i + 1), 0, 0) for i in range(65)) + bytes(24),
            "more than 64 entries",
        ),
    ],
    ids=[
        "length-past-end",
        "offset-past-end",
        "huge",
        "overlaps-terminator",
        "offset-zero",
        "empty-entry",
        "duplicate",
        "no-terminator",
        "truncated-terminator",
        "one-byte",
        "zero-guid-with-data",
        "oversized",
        "too-many",
    ],
)
def test_a_malformed_table_is_refused(data: bytes, match: str) -> None:
    with pytest.raises(MalformedCertTableError, match=match) as caught:
        vcek_from_auxblob(data)
    assert exit_code_for(caught.value) == 4


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_any_bytes_parse_or_are_malformed(data: bytes) -> None:
    try:
        table = parse_snp_cert_table(data)
    except MalformedCertTableError:
        return
    for _guid, cert in table.entries:
        assert cert and len(cert) <= len(data)


@settings(max_examples=50, deadline=None)
@given(
    st.dictionaries(
        st.uuids().filter(lambda g: g.int != 0),
        st.binary(min_size=1, max_size=40).filter(lambda d: d[:1] != b"\x30"),  # not DER
        max_size=6,
    )
)
def test_well_formed_tables_round_trip(items: dict[uuid.UUID, bytes]) -> None:
    table = parse_snp_cert_table(cert_table(list(items.items()), pad=8))
    assert table.entries == tuple(items.items())
