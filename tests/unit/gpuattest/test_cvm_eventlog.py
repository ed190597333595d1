"""The CC event log: the real td-shim log replays to its independently computed RTMRs, every
malformed log is one clear error, and descriptions cannot drive a terminal."""

from __future__ import annotations

import hashlib
import json
import struct

import pytest

from gpucc.core.errors import MalformedEvidenceError
from gpucc.gpuattest.cvm.eventlog import MAX_EVENT_LOG_BYTES, parse_event_log
from gpucc.gpuattest.cvm.eventlog_build import (
    LogEvent,
    boot_events,
    build_event_log,
    efi_variable_data,
)
from gpucc.gpuattest.cvm.eventlog_decode import escape
from tests.support.paths import DATA

CCEL = DATA / "cloud-cvm" / "tdx-ccel"


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
        "does not start with a Spec ID": _patched(ccel, 4, struct.pack("<I", 1)),
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
