"""The CC event log: the real td-shim and OVMF logs replay to their independently computed
RTMRs, every malformed log is one clear error, and descriptions cannot drive a terminal."""

from __future__ import annotations

import base64
import hashlib
import json
import struct
from pathlib import Path

import pytest

from gpucc.core.errors import MalformedEvidenceError
from gpucc.gpuattest.cvm.eventlog import MAX_EVENT_LOG_BYTES, parse_event_log
from gpucc.gpuattest.cvm.eventlog_build import (
    LogEvent,
    boot_events,
    build_event_log,
    build_tpm_log,
    efi_variable_data,
)
from gpucc.gpuattest.cvm.eventlog_decode import escape
from tests.support.paths import DATA

CCEL = DATA / "cloud-cvm" / "tdx-ccel"
OVMF = DATA / "cloud-cvm" / "tdx-ccel-ovmf"
#: The OVMF log's RTMRs as an independent reader and Trustee's parser replay them.
OVMF_RTMRS = {
    "rtmr0": "8566f998798db09443b244c62de9a3041fb02e2e6936c4396d784bba2e90177329ec5aba3bb484404f2ab9cc90abe193",
    "rtmr1": "775b9f6bfe99f8a31396f0d0218e67ffa796d3b96ccf961cbb0deba48c79c00f082cda1a5567c1c16305f1fc210c13c6",
    "rtmr2": "94eaf7a7bf398ed8d888c91057ae0261802e4f3df084213a76ca7f0b5055ac9d2241de43cd58d9e8b49c503bbf25f34a",
    "rtmr3": "00" * 48,
}  # fmt: skip


@pytest.fixture(scope="module")
def ccel() -> bytes:
    return (CCEL / "CCEL_data").read_bytes()


def test_the_real_log_replays_to_the_documented_rtmrs(ccel: bytes) -> None:
    expected = json.loads((CCEL / "CCEL_data.replay.json").read_text())
    log = parse_event_log(ccel)
    assert log.end == expected["log_end_offset"] == 9822
    assert log.algorithms == {"sha384": 48}
    assert log.sha256.hex() == expected["log_sha256"]
    assert {k.upper(): v.hex() for k, v in log.replay().items()} == expected["replay"]
    got = [(e.mr_index, f"{e.event_type:#x}", e.type_name, e.sha384) for e in log.events]
    want = [
        (e["mr_index"], e["type"], e["type_name"], bytes.fromhex(e["digest"]))
        for e in expected["events"]
    ]
    assert got == want
    assert [len(e.data) for e in log.events] == [e["event_size"] for e in expected["events"]]
    assert log.events[3].description == "td_payload at 0x901000, 268435456 bytes"
    doc = log.to_dict()
    assert doc["events"][1]["register"] == "rtmr0" and doc["events"][1]["type_name"] == (
        "EV_SEPARATOR"
    )


def test_the_log_may_end_exactly_at_the_buffer_end(ccel: bytes) -> None:
    assert parse_event_log(ccel[:9822]).replay() == parse_event_log(ccel).replay()


@pytest.mark.parametrize("cut", [10, 40, 70, 100, 5000, 9821])
def test_a_truncated_log_is_malformed(ccel: bytes, cut: int) -> None:
    with pytest.raises(MalformedEvidenceError, match="truncated"):
        parse_event_log(ccel[:cut])


def test_an_oversized_or_empty_log_is_malformed(ccel: bytes) -> None:
    with pytest.raises(MalformedEvidenceError, match="larger than"):
        parse_event_log(ccel + bytes(MAX_EVENT_LOG_BYTES))
    with pytest.raises(MalformedEvidenceError, match="empty"):
        parse_event_log(bytes(4096))


def _patched(data: bytes, offset: int, value: bytes) -> bytes:
    return data[:offset] + value + data[offset + len(value) :]


def test_tampered_layouts_are_malformed(ccel: bytes) -> None:
    spec_size = struct.unpack_from("<I", ccel, 28)[0]
    first = 32 + spec_size  # the first TCG_PCR_EVENT2
    cases = {
        "does not start with a Spec ID": _patched(ccel, 0, struct.pack("<I", 2)),
        "its first record has type 0xd": _patched(ccel, 4, struct.pack("<I", 0xD)),
        "not 'Spec ID Event03'": _patched(ccel, 32, b"Spec ID Event02\0"),
        "gives sha384 a 32-byte digest": _patched(ccel, 32 + 28, struct.pack("<HH", 0xC, 32)),
        "extends register index 5": _patched(ccel, first, struct.pack("<I", 5)),
        "carries 2 digests": _patched(ccel, first + 8, struct.pack("<I", 2)),
        "not declared": _patched(ccel, first + 12, struct.pack("<H", 0xB)),
        "data after its end": _patched(ccel, 9822 + 64, b"\x01"),
    }
    for message, data in cases.items():
        with pytest.raises(MalformedEvidenceError, match=message):
            parse_event_log(data)


def test_a_log_without_sha384_is_refused_for_tdx() -> None:
    log = build_event_log([LogEvent("rtmr0", 0x0D, b"x")], sha384=False)
    with pytest.raises(MalformedEvidenceError, match="no SHA-384"):
        parse_event_log(log)
    assert parse_event_log(log, require_sha384=False).events[0].digests.keys() == {"sha256"}


def test_a_built_log_replays_as_the_rule_says() -> None:
    events = boot_events(kernel_digest=b"\x42" * 48, initrd=b"initrd", cmdline="console=ttyS0")
    log = parse_event_log(build_event_log(events, with_sha256=True))
    rtmr1 = bytes(48)
    for e in events:
        if e.register == "rtmr1":
            rtmr1 = hashlib.sha384(rtmr1 + e.sha384).digest()
    assert log.replay()["rtmr1"] == rtmr1 and log.replay()["rtmr3"] == bytes(48)
    assert log.algorithms == {"sha384": 48, "sha256": 32}
    described = [e.description for e in log.events]
    assert described[0].startswith("SecureBoot (8be4df61-93ca-11d2-aa0d-00e098032b8c)")
    assert described[2] == "\\\\EFI\\\\Linux\\\\vmlinuz.efi, image of 0 bytes"
    assert described[4] == "Linux load options: console=ttyS0"


def test_descriptions_escape_what_a_terminal_acts_on() -> None:
    hostile = "SecureBoot\x1b[2J\u202eevil"
    data = efi_variable_data(b"\0" * 16, hostile, b"\x01")
    log = parse_event_log(build_event_log([LogEvent("rtmr0", 0x80000001, data)]))
    text = log.events[0].description
    assert "\x1b" not in text and "\u202e" not in text
    assert "\\x1b[2J\\u202eevil" in text
    assert escape("a\\b") == "a\\\\b" and len(escape("x" * 1000)) == 240


# --- OVMF's convention: the Spec ID event at index 1, the 0xFF fill after the last event ------


def test_the_real_ovmf_log_replays_to_its_rtmrs_and_equals_trustees_parse() -> None:
    raw = (OVMF / "CCEL_data_ovmf").read_bytes()
    assert len(raw) == 65536 and struct.unpack_from("<II", raw, 0) == (1, 3)  # index 1
    log = parse_event_log(raw)
    assert log.end == 2120 and set(raw[2120:]) == {0xFF}
    assert {k: v.hex() for k, v in log.replay().items()} == OVMF_RTMRS
    theirs = json.loads((OVMF / "CCEL_data_ovmf_out.json").read_text())["uefi_event_logs"]
    assert len(log.events) == len(theirs) == 20
    for ours, their in zip(log.events, theirs, strict=True):
        assert ours.mr_index == their["index"]
        assert ours.type_name == their["type_name"]
        assert [("SHA-384", ours.digests["sha384"].hex())] == [
            (d["alg"], d["digest"]) for d in their["digests"]
        ]
        assert ours.data == base64.b64decode(their["event"])
    # the fill ends the log wherever the buffer is cut after it, and one stray byte is data
    assert parse_event_log(raw[:2120]).replay() == parse_event_log(raw[:2125]).replay()
    with pytest.raises(MalformedEvidenceError, match="data after its end at offset 2120"):
        parse_event_log(_patched(raw, 3000, b"\0"))


@pytest.mark.parametrize(
    "ovmf", [False, True], ids=["tcg-index-0-zero-fill", "ovmf-index-1-ff-fill"]
)
def test_both_conventions_parse_to_the_same_events(ovmf: bool) -> None:
    events = boot_events(kernel_digest=b"\x42" * 48, initrd=b"initrd", cmdline="console=ttyS0")
    raw = build_event_log(events, ovmf=ovmf)
    assert struct.unpack_from("<I", raw, 0)[0] == (1 if ovmf else 0)
    assert raw[-1] == (0xFF if ovmf else 0)
    log = parse_event_log(raw)
    plain = parse_event_log(build_event_log(events))
    assert log.replay() == plain.replay()
    assert [(e.mr_index, e.event_type, e.data) for e in log.events] == [
        (e.mr_index, e.event_type, e.data) for e in plain.events
    ]


def test_only_a_spec_id_event_at_index_0_or_1_starts_a_log() -> None:
    raw = build_event_log([LogEvent("rtmr0", 0x0D, b"x")], ovmf=True)
    for index in (2, 4, 0xFFFFFFFF):
        with pytest.raises(MalformedEvidenceError, match=f"type 0x3, index {index}"):
            parse_event_log(_patched(raw, 0, struct.pack("<I", index)))
    # a log whose first record is an ordinary event, even at index 1, is refused
    event = build_event_log([LogEvent("rtmr0", 0x0D, b"x")], padding=0)
    spec_size = struct.unpack_from("<I", event, 28)[0]
    with pytest.raises(MalformedEvidenceError, match="does not start with a Spec ID"):
        parse_event_log(event[32 + spec_size :] + bytes(64))
    # a TPM measured-boot log keeps the TCG profile's index 0
    tpm = build_tpm_log([LogEvent("pcr0", 0x08, b"S-CRTM")])
    assert parse_event_log(tpm, pcrs=True).events[0].register == "pcr0"
    with pytest.raises(
        MalformedEvidenceError, match=r"index 0\); its first record has type 0x3, index 1"
    ):
        parse_event_log(_patched(tpm, 0, struct.pack("<I", 1)), pcrs=True)


def test_collection_sends_the_ovmf_log_without_its_fill(tmp_path: Path) -> None:
    from gpucc.assembly.sources import read_event_log

    ccel = tmp_path / "CCEL"
    ccel.write_bytes((OVMF / "CCEL_data_ovmf").read_bytes())
    sent = read_event_log(ccel)
    assert sent is not None and len(sent) == 2120 and sent[-1] != 0xFF
    assert parse_event_log(sent).replay() == parse_event_log(ccel.read_bytes()).replay()
    assert read_event_log(tmp_path / "absent") is None
