"""Azure vTPM evidence with its measured-boot log: the TPM 2.0 crypto-agile log parsed,
replayed into the SHA-256 PCR bank, compared with the quoted PCRs, and judged by
``cvm.events.vtpm``. The real Azure samples carry no log, so logs are built here: against the
real SEV-SNP sample's PCRs a built log cannot match (the mismatch path); the matching path uses
the sample with its quote re-signed over the replayed PCRs by a swapped AK, which the
hardware report no longer vouches for (``vtpm-binding`` alone refused, as in
test_cvm_vtpm.py)."""

from __future__ import annotations

import base64
import hashlib
import json
import struct
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from gpucc.core.errors import MalformedEvidenceError, MalformedPolicyError
from gpucc.gpuattest.cvm.appraise import CvmResult, verify_cvm_evidence
from gpucc.gpuattest.cvm.eventcheck import event_checks
from gpucc.gpuattest.cvm.eventlog import EV_NO_ACTION, MAX_EVENT_LOG_BYTES, parse_event_log
from gpucc.gpuattest.cvm.eventlog_build import (
    EV_EFI_ACTION,
    EV_EFI_BOOT_SERVICES_APPLICATION,
    EV_EFI_VARIABLE_DRIVER_CONFIG,
    EV_SEPARATOR,
    LogEvent,
    build_event_log,
    build_tpm_log,
    efi_variable_data,
    image_load_data,
)
from gpucc.gpuattest.cvm.policy import parse_cvm_policy
from gpucc.gpuattest.result import CheckStatus, Verdict
from tests.unit.gpuattest.test_cvm_vtpm import NONCE, NOW, SNP, edit_claims, hcl, load

KERNEL = hashlib.sha256(b"kernel 6.8 PE image").digest()
NEW_KERNEL = hashlib.sha256(b"kernel 6.9 PE image").digest()
SECURE_BOOT = efi_variable_data(bytes(16), "SecureBoot", b"\x01")
LOCALITY = b"StartupLocality\0\x03"


def boot(kernel: bytes = KERNEL, *, locality: bool = True) -> list[LogEvent]:
    events = [LogEvent("pcr0", EV_NO_ACTION, LOCALITY)] if locality else []
    return [
        *events,
        LogEvent("pcr0", 0x08, b"S-CRTM"),  # EV_S_CRTM_VERSION
        LogEvent("pcr7", EV_EFI_VARIABLE_DRIVER_CONFIG, SECURE_BOOT),
        LogEvent("pcr0", EV_SEPARATOR, bytes(4)),
        LogEvent("pcr7", EV_SEPARATOR, bytes(4)),
        LogEvent("pcr4", EV_EFI_BOOT_SERVICES_APPLICATION, image_load_data("\\vmlinuz", 0), kernel),
        LogEvent("pcr5", EV_EFI_ACTION, b"Exit Boot Services Invocation"),
    ]


def by_hand(events: list[LogEvent]) -> dict[str, bytes]:
    """The replay written out: PCR0 from locality 3, the others from zero."""
    pcrs: dict[str, bytes] = {}
    for e in events:
        if e.event_type == EV_NO_ACTION:
            continue
        start = bytes(31) + b"\x03" if e.register == "pcr0" else bytes(32)
        digest = e.digest if e.digest is not None else hashlib.sha256(e.data).digest()
        pcrs[e.register] = hashlib.sha256(pcrs.get(e.register, start) + digest).digest()
    return pcrs


# --- the log ------------------------------------------------------------------------------


def test_the_log_replays_into_the_sha256_bank() -> None:
    events = boot()
    log = parse_event_log(build_tpm_log(events, with_sha1=True), pcrs=True)
    assert log.pcr_log and sorted(log.algorithms) == ["sha1", "sha256"]
    assert [e.register for e in log.events] == [
        None,
        "pcr0",
        "pcr7",
        "pcr0",
        "pcr7",
        "pcr4",
        "pcr5",
    ]
    assert log.replay() == by_hand(events)
    assert list(log.replay()) == ["pcr0", "pcr4", "pcr5", "pcr7"]
    shown = log.to_dict()
    assert shown["events"][5]["register"] == "pcr4"
    assert shown["events"][5]["digest"] == KERNEL.hex()
    assert shown["replay"]["pcr4"] == by_hand(events)["pcr4"].hex()


def test_pcr0_starts_at_zero_without_a_startup_locality_and_17_to_22_at_ones() -> None:
    events = [LogEvent("pcr0", 0x08, b"x"), LogEvent("pcr17", 0x08, b"y")]
    replayed = parse_event_log(build_tpm_log(events), pcrs=True).replay()
    assert replayed["pcr0"] == hashlib.sha256(bytes(32) + hashlib.sha256(b"x").digest()).digest()
    ones = hashlib.sha256(b"\xff" * 32 + hashlib.sha256(b"y").digest()).digest()
    assert replayed["pcr17"] == ones


def test_a_cc_event_log_still_refuses_pcr_indices() -> None:
    data = build_tpm_log([LogEvent("pcr0", 0x08, b"x")])
    with pytest.raises(MalformedEvidenceError, match="SHA-384"):
        parse_event_log(data)
    cc = build_event_log([LogEvent("rtmr0", 0x08, b"x")], with_sha256=True)
    bad = cc[: len(cc) - 4096]
    spec = len(bad) - (12 + 2 + 48 + 2 + 32 + 4 + 1)
    bad = bad[:spec] + struct.pack("<I", 0) + bad[spec + 4 :]  # index 0: MRTD, not extended
    with pytest.raises(MalformedEvidenceError, match="1..4"):
        parse_event_log(bad)


def _spec_and_events(events: list[LogEvent]) -> bytes:
    return build_tpm_log(events)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (build_event_log([LogEvent("rtmr0", 0x08, b"x")]), "no SHA-256"),
        (build_tpm_log([LogEvent("pcr24", 0x08, b"x")]), "PCRs 0..23"),
        (build_tpm_log([LogEvent("pcr0", EV_NO_ACTION, b"StartupLocality\0")]), "17 bytes"),
        (build_tpm_log([LogEvent("pcr0", EV_NO_ACTION, LOCALITY + b"x")]), "17 bytes"),
        (build_tpm_log([LogEvent("pcr0", EV_NO_ACTION, b"StartupLocality\0\x02")]), "locality 2"),
        (build_tpm_log([LogEvent("pcr0", EV_NO_ACTION, LOCALITY)] * 2), "repeats"),
        (
            build_tpm_log([LogEvent("pcr0", 0x08, b"x"), LogEvent("pcr0", EV_NO_ACTION, LOCALITY)]),
            "after PCR0",
        ),
        (build_tpm_log(boot()) + b"\x01", "data after its end|truncated"),
        (b"\0" * 64, "empty"),
        (b"", "empty"),
        (b"\0" * (MAX_EVENT_LOG_BYTES + 1), "larger"),
    ],
)
def test_malformed_measured_boot_logs(data: bytes, match: str) -> None:
    with pytest.raises(MalformedEvidenceError, match=match):
        parse_event_log(data, pcrs=True)


def test_every_truncation_is_refused_or_ends_at_an_event() -> None:
    data = build_tpm_log(boot())
    log = parse_event_log(data, pcrs=True)
    ends = {e.offset for e in log.events} | {len(data)}
    for cut in range(1, len(data)):
        if cut in ends:
            continue
        with pytest.raises(MalformedEvidenceError):
            parse_event_log(data[:cut], pcrs=True)


# --- the policy ---------------------------------------------------------------------------


def pins(kernel: bytes = KERNEL) -> dict[str, Any]:
    return {
        "events": {
            "vtpm": [
                {
                    "name": "kernel",
                    "register": "pcr4",
                    "type": "EV_EFI_BOOT_SERVICES_APPLICATION",
                    "digest": kernel.hex(),
                },
                {
                    "name": "secure-boot",
                    "register": "pcr7",
                    "type": "EV_EFI_VARIABLE_DRIVER_CONFIG",
                    "digest": hashlib.sha256(SECURE_BOOT).hexdigest(),
                },
            ]
        }
    }


@pytest.mark.parametrize(
    ("event", "match"),
    [
        ({"register": "rtmr1"}, "pcr0..pcr23"),
        ({"register": "pcr24"}, "pcr0..pcr23"),
        ({"digest": "ab" * 48}, "64 hex digits"),
        ({"digest": "zz" * 32}, "64 hex digits"),
        ({"type": "EV_NO_ACTION"}, "EV_NO_ACTION"),
    ],
)
def test_bad_vtpm_event_pins_are_malformed_policy(event: dict[str, str], match: str) -> None:
    doc = pins()
    doc["events"]["vtpm"][0].update(event)
    with pytest.raises(MalformedPolicyError, match=match):
        parse_cvm_policy(doc)
    tdx = {"events": {"tdx": [{**pins()["events"]["vtpm"][0], "digest": "ab" * 48}]}}
    with pytest.raises(MalformedPolicyError, match="rtmr0..rtmr3"):
        parse_cvm_policy(tdx)


def _claims(events: list[LogEvent], **change: str) -> dict[str, Any]:
    pcrs = {str(i): "00" * 32 for i in range(24)}
    pcrs.update({k[3:]: v.hex() for k, v in by_hand(events).items()})
    pcrs.update(change)
    return {"vtpm": {"pcrs": pcrs}}


def _by_id(checks: list[Any]) -> dict[str, Any]:
    return {c.id: c for c in checks}


def test_events_are_judged_once_the_log_replays_to_the_quoted_pcrs() -> None:
    events = boot()
    log = parse_event_log(build_tpm_log(events), pcrs=True)
    policy = parse_cvm_policy(pins())
    checks = _by_id(event_checks(log, _claims(events), policy, "vtpm"))
    assert checks["cvm-event-log"].status is CheckStatus.PASS
    assert "PCR0, PCR4, PCR5, PCR7 replayed" in checks["cvm-event-log"].note
    assert checks["cvm-events"].status is CheckStatus.PASS

    # a kernel update: the log and the PCRs change, the old policy refuses, one line admits it
    updated = boot(NEW_KERNEL)
    new_log = parse_event_log(build_tpm_log(updated), pcrs=True)
    checks = _by_id(event_checks(new_log, _claims(updated), policy, "vtpm"))
    assert checks["cvm-event-log"].status is CheckStatus.PASS
    assert checks["cvm-events"].status is CheckStatus.FAIL
    assert "kernel: no PCR4 event" in checks["cvm-events"].reason
    checks = _by_id(
        event_checks(new_log, _claims(updated), parse_cvm_policy(pins(NEW_KERNEL)), "vtpm")
    )
    assert checks["cvm-events"].status is CheckStatus.PASS


def test_a_log_that_does_not_replay_to_the_quote_is_refused_and_events_not_judged() -> None:
    events = boot()
    log = parse_event_log(build_tpm_log(events), pcrs=True)
    policy = parse_cvm_policy(pins())
    # one PCR changed in the quote
    checks = _by_id(event_checks(log, _claims(events, **{"4": "11" * 32}), policy, "vtpm"))
    assert checks["cvm-event-log"].status is CheckStatus.FAIL
    assert "PCR4 replays to" in checks["cvm-event-log"].reason
    assert "PCR7" not in checks["cvm-event-log"].reason
    assert checks["cvm-events"].status is CheckStatus.NOT_CHECKED
    # one event's digest changed, or two events of a PCR swapped, in the log
    for tampered in (
        [
            *events[:5],
            LogEvent("pcr4", EV_EFI_BOOT_SERVICES_APPLICATION, b"k", NEW_KERNEL),
            events[6],
        ],
        [*events[:2], events[4], events[3], events[2], *events[5:]],  # PCR7's two swapped,
    ):
        bad = parse_event_log(build_tpm_log(tampered), pcrs=True)
        checks = _by_id(event_checks(bad, _claims(events), policy, "vtpm"))
        assert checks["cvm-event-log"].status is CheckStatus.FAIL, tampered
        assert checks["cvm-events"].status is CheckStatus.NOT_CHECKED
    # PCR0 replayed from locality 0 instead of 3
    no_locality = parse_event_log(build_tpm_log(boot(locality=False)), pcrs=True)
    checks = _by_id(event_checks(no_locality, _claims(events), policy, "vtpm"))
    assert "PCR0 replays to" in checks["cvm-event-log"].reason


def test_events_in_a_pcr_the_quote_does_not_cover_do_not_count() -> None:
    events = boot()
    log = parse_event_log(build_tpm_log(events), pcrs=True)
    claims = _claims(events)
    del claims["vtpm"]["pcrs"]["4"]
    checks = _by_id(event_checks(log, claims, parse_cvm_policy(pins()), "vtpm"))
    assert checks["cvm-event-log"].status is CheckStatus.PASS
    assert "PCR4" not in checks["cvm-event-log"].note
    assert checks["cvm-events"].status is CheckStatus.FAIL
    assert "kernel: PCR4 is not extended by the log and quoted" in checks["cvm-events"].reason
    only_unquoted = parse_event_log(build_tpm_log([events[5]]), pcrs=True)
    checks = _by_id(event_checks(only_unquoted, claims, parse_cvm_policy(None), "vtpm"))
    assert "extends no PCR the quote covers" in checks["cvm-event-log"].reason


def test_a_second_kernel_in_the_pinned_pcr_is_refused() -> None:
    events = [*boot(), LogEvent("pcr4", EV_EFI_BOOT_SERVICES_APPLICATION, b"k2", NEW_KERNEL)]
    log = parse_event_log(build_tpm_log(events), pcrs=True)
    checks = _by_id(event_checks(log, _claims(events), parse_cvm_policy(pins()), "vtpm"))
    assert checks["cvm-event-log"].status is CheckStatus.PASS
    assert "is not one the policy lists" in checks["cvm-events"].reason


# --- real vTPM evidence -----------------------------------------------------------------------


def verify(doc: dict[str, Any], log: bytes | None, policy: Any = None, **kw: Any) -> CvmResult:
    return verify_cvm_evidence(
        json.dumps(doc).encode(),
        None,
        now=NOW,
        policy=parse_cvm_policy(policy),
        expected_report_data=NONCE,
        event_log=log,
        **kw,
    )


def checks_of(result: CvmResult) -> dict[str, Any]:
    return {c.id: c for c in result.checks}


def test_the_azure_sample_with_a_log_that_is_not_its_own_is_refused() -> None:
    """The real SEV-SNP sample carries no log; one built here cannot replay to its PCRs."""
    result = verify(load(SNP), build_tpm_log(boot()), pins())
    checks = checks_of(result)
    assert result.verdict is Verdict.NOT_TRUSTED
    assert checks["cvm-event-log"].status is CheckStatus.FAIL
    for pcr in ("PCR0", "PCR4", "PCR5", "PCR7"):
        assert pcr in checks["cvm-event-log"].reason
    assert checks["cvm-events"].status is CheckStatus.NOT_CHECKED
    refused = [c.id for c in result.checks if c.decision.value == "refuse"]
    assert refused == ["cvm-event-log", "cvm-events"]
    assert result.event_log is not None and result.event_log["replay"]["pcr4"]


def test_event_pins_without_a_log_are_refused() -> None:
    result = verify(load(SNP), None, pins())
    assert checks_of(result)["cvm-events"].status is CheckStatus.FAIL
    assert "no event log was given" in checks_of(result)["cvm-events"].reason


def resigned_for(events: list[LogEvent]) -> dict[str, Any]:
    """The SNP sample whose quoted PCRs are what ``events`` replay to, signed by a new AK
    swapped into the runtime claims (the hardware report no longer commits to them)."""
    doc = load(SNP)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    n = base64.urlsafe_b64encode(key.public_key().public_numbers().n.to_bytes(256, "big"))
    old = hcl(doc)[0x4D4:].split(b'"n":"')[1].split(b'"')[0]
    doc = edit_claims(doc, lambda b: b.replace(old, n.decode().rstrip("=").encode(), 1))
    pcrs = list(doc["tpm_quote"]["pcrs"])
    for name, value in by_hand(events).items():
        pcrs[int(name[3:])] = value.hex()
    digest = hashlib.sha256(b"".join(bytes.fromhex(p) for p in pcrs)).digest()
    message = bytes.fromhex(doc["tpm_quote"]["message"])[:-32] + digest
    doc["tpm_quote"] = {
        "pcrs": pcrs,
        "message": message.hex(),
        "signature": key.sign(message, padding.PKCS1v15(), hashes.SHA256()).hex(),
    }
    return doc


def test_a_quote_over_the_replayed_pcrs_passes_every_log_check() -> None:
    events = boot()
    doc = resigned_for(events)
    result = verify(doc, build_tpm_log(events), pins(), require_pins=True)
    checks = checks_of(result)
    assert checks["vtpm-quote-signature"].status is CheckStatus.PASS
    assert checks["vtpm-pcrs"].status is CheckStatus.PASS
    assert checks["cvm-event-log"].status is CheckStatus.PASS
    assert checks["cvm-events"].status is CheckStatus.PASS
    # events stand in for cvm.pcrs as key release's pins
    assert checks["cvm-pcrs"].decision.value == "accept"
    assert "pinned by events" in checks["cvm-pcrs"].note
    refused = [c.id for c in result.checks if c.decision.value == "refuse"]
    assert refused == ["vtpm-binding", "cvm-measurements"]  # swapped AK; paravisor unpinned
    # the same quote with another boot's log, or a policy for another kernel
    other = verify(doc, build_tpm_log(boot(NEW_KERNEL)), pins())
    assert checks_of(other)["cvm-event-log"].status is CheckStatus.FAIL
    assert "PCR4" in checks_of(other)["cvm-event-log"].reason
    moved = verify(doc, build_tpm_log(events), pins(NEW_KERNEL))
    assert checks_of(moved)["cvm-events"].status is CheckStatus.FAIL


def test_bare_snp_evidence_still_refuses_an_event_log() -> None:
    from gpucc.core.errors import UsageError
    from tests.support.paths import DATA

    report = (DATA / "cpu-tee" / "snp" / "report.bin").read_bytes()
    with pytest.raises(UsageError, match="SEV-SNP"):
        verify_cvm_evidence(
            report,
            None,
            now=NOW,
            policy=parse_cvm_policy(None),
            expected_report_data=None,
            event_log=build_tpm_log(boot()),
        )
