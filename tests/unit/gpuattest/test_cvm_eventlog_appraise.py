"""Event logs judged with the quote: the real pair is refused for its mismatch even without
Intel's collateral; a simulated TD whose RTMRs come from its log is trusted, and refused when
an event's digest, the order or a register changes; event policies survive a kernel update
with one changed line."""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import replace

import pytest

from gpucc.core.errors import (
    MalformedPolicyError,
    UsageError,
)
from gpucc.gpuattest.cvm.appraise import CvmResult, verify_cvm_evidence
from gpucc.gpuattest.cvm.eventlog_build import LogEvent, boot_events, build_event_log
from gpucc.gpuattest.cvm.policy import CvmPolicy, parse_cvm_policy
from gpucc.gpuattest.cvm.tdx_sim import SimulatedTdx, simulated_tdx
from gpucc.gpuattest.result import Verdict
from tests.support.paths import DATA

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
RD = bytes(range(64))
CCEL = DATA / "cloud-cvm" / "tdx-ccel"
KERNEL_A = hashlib.sha384(b"vmlinuz 6.8.0-1").digest()
KERNEL_B = hashlib.sha384(b"vmlinuz 6.8.0-2").digest()
INITRD = b"initrd image"
CMDLINE = "console=ttyS0 root=/dev/vda1"


@pytest.fixture(scope="module")
def sim() -> SimulatedTdx:
    return simulated_tdx(NOW)


def events(kernel: bytes = KERNEL_A) -> list[LogEvent]:
    return boot_events(kernel_digest=kernel, initrd=INITRD, cmdline=CMDLINE)


def judge(
    sim: SimulatedTdx,
    quote: bytes,
    log: bytes | None,
    policy: CvmPolicy | None = None,
    *,
    release: bool = False,
) -> CvmResult:
    collateral = sim.collateral(issued=NOW - dt.timedelta(hours=1)).to_json()
    return verify_cvm_evidence(
        quote,
        collateral,
        now=NOW,
        policy=policy or CvmPolicy(),
        expected_report_data=RD,
        tdx_root=sim.root,
        event_log=log,
        require_pins=release,
    )


def refusals(result: CvmResult) -> dict[str, str]:
    return {c.id: c.reason for c in result.checks if str(c.decision) == "refuse"}


def event_policy(kernel: bytes = KERNEL_A, **extra: object) -> CvmPolicy:
    """What 'gpucc cvm reference' writes for this boot: the kernel, command line, initrd."""
    pins = [
        {"name": "kernel", "register": "rtmr1", "type": "EV_EFI_BOOT_SERVICES_APPLICATION",
         "digest": kernel.hex()},
        {"name": "cmdline", "register": "rtmr2", "type": "EV_EVENT_TAG",
         "digest": events()[4].sha384.hex()},
        {"name": "initrd", "register": "rtmr2", "type": "EV_EVENT_TAG",
         "digest": hashlib.sha384(INITRD).hexdigest()},
    ]  # fmt: skip
    return parse_cvm_policy({"events": {"tdx": pins}, **extra})


def test_the_real_pair_is_refused_for_its_mismatch_without_collateral() -> None:
    quote = (CCEL / "tdx_quote_4.dat").read_bytes()
    log = (CCEL / "CCEL_data").read_bytes()
    lenient = parse_cvm_policy({"allow_debug": True, "require_report_data": False})
    for policy in (CvmPolicy(), lenient):
        result = verify_cvm_evidence(
            quote, None, now=NOW, policy=policy, expected_report_data=None, event_log=log
        )
        assert result.verdict is Verdict.NOT_TRUSTED
        assert result.reasons[0].startswith(
            "Event log replays to the RTMRs: the event log does not match the quote: "
            "RTMR0, RTMR1 differ (RTMR0 replays to 2dc71230"
        )
        assert "the quote has e940da7c" in result.reasons[0]
    assert set(refusals(result)) == {"cvm-event-log"}  # the lenient policy: only the mismatch
    assert result.event_log is not None and len(result.event_log["events"]) == 5
    default = verify_cvm_evidence(
        quote, None, now=NOW, policy=CvmPolicy(), expected_report_data=None, event_log=log
    )
    assert "cvm-debug" in refusals(default)  # a debug TD, refused by the default policy


def test_a_simulated_td_whose_log_matches_is_trusted(sim: SimulatedTdx) -> None:
    log = build_event_log(events())
    result = judge(sim, sim.quote(RD, event_log=log), log)
    assert result.verdict is Verdict.TRUSTED, result.reasons
    check = next(c for c in result.checks if c.id == "cvm-event-log")
    assert check.note == "6 events"


def test_a_changed_digest_order_or_register_is_refused(sim: SimulatedTdx) -> None:
    good = events()
    quote = sim.quote(RD, event_log=build_event_log(good))
    digest = [*good]
    digest[2] = replace(good[2], digest=KERNEL_B)
    order = [*good]
    order[4], order[5] = good[5], good[4]
    for changed in (digest, order):
        result = judge(sim, quote, build_event_log(changed))
        assert result.verdict is Verdict.NOT_TRUSTED
        assert "does not match the quote" in refusals(result)["cvm-event-log"]
    log = build_event_log(good)
    rtmrs = (bytes(48), bytes(48), bytes(48), b"\x01" * 48)
    moved = sim.quote(RD, rtmrs=rtmrs)
    assert "RTMR0, RTMR1, RTMR2, RTMR3 differ" in refusals(judge(sim, moved, log))["cvm-event-log"]


def test_an_event_policy_takes_a_kernel_update_as_one_changed_line(sim: SimulatedTdx) -> None:
    old_log = build_event_log(events(KERNEL_A))
    new_log = build_event_log(events(KERNEL_B))
    old_quote = sim.quote(RD, event_log=old_log)
    new_quote = sim.quote(RD, event_log=new_log)
    old_policy, new_policy = event_policy(KERNEL_A), event_policy(KERNEL_B)
    assert judge(sim, old_quote, old_log, old_policy, release=True).trusted
    refused = refusals(judge(sim, new_quote, new_log, old_policy, release=True))
    assert refused["cvm-events"].startswith(f"kernel: no RTMR1 event with digest {KERNEL_A.hex()}")
    assert judge(sim, new_quote, new_log, new_policy, release=True).trusted
    diff = [
        (a, b)
        for a, b in zip(old_policy.event_pins("tdx"), new_policy.event_pins("tdx"), strict=True)
        if a != b
    ]
    assert [a.name for a, _ in diff] == ["kernel"]


def test_a_second_kernel_or_a_missing_log_is_refused(sim: SimulatedTdx) -> None:
    extra = [*events(), LogEvent("rtmr1", 0x80000003, b"other", KERNEL_B)]
    log = build_event_log(extra)
    refused = refusals(judge(sim, sim.quote(RD, event_log=log), log, event_policy()))
    assert "is not one the policy lists for that register and type" in refused["cvm-events"]
    log = build_event_log(events())
    refused = refusals(judge(sim, sim.quote(RD, event_log=log), None, event_policy()))
    assert refused["cvm-events"] == (
        "the policy lists events (cvm.events.tdx) but no event log was given"
    )


def test_release_needs_pins_and_events_count_as_pins(sim: SimulatedTdx) -> None:
    log = build_event_log(events())
    quote = sim.quote(RD, event_log=log)
    assert "cvm-measurements" in refusals(judge(sim, quote, log, release=True))
    assert judge(sim, quote, log, event_policy(), release=True).trusted
    rtmr_pins = {"measurements": {"tdx": {"rtmr1": quote[48 + 376 : 48 + 424].hex()}}}
    assert judge(sim, quote, None, parse_cvm_policy(rtmr_pins), release=True).trusted


def test_an_event_log_with_snp_evidence_is_a_usage_error() -> None:
    report = (DATA / "cpu-tee" / "snp" / "report.bin").read_bytes()
    with pytest.raises(UsageError, match="SEV-SNP evidence has none"):
        verify_cvm_evidence(
            report, None, now=NOW, policy=CvmPolicy(), expected_report_data=None, event_log=b"x"
        )


@pytest.mark.parametrize(
    ("events_doc", "message"),
    [
        ({"snp": []}, "event logs are replayed for tdx"),
        ({"tdx": {}}, "must be a list"),
        ({"tdx": [{"register": "rtmr4", "type": "EV_IPL", "digest": "00" * 48}]}, "rtmr0..rtmr3"),
        ({"tdx": [{"register": "rtmr1", "type": "EV_NOPE", "digest": "00" * 48}]}, "event type"),
        ({"tdx": [{"register": "rtmr1", "type": "EV_NO_ACTION", "digest": "00" * 48}]}, "type"),
        ({"tdx": [{"register": "rtmr1", "type": "EV_IPL", "digest": "00" * 32}]}, "96 hex"),
        ({"tdx": [{"register": "rtmr1", "type": "EV_IPL", "digest": "zz" * 48}]}, "96 hex"),
        ({"tdx": [{"register": "rtmr1", "type": "EV_IPL", "digest": "00" * 48, "x": 1}]}, "x'"),
    ],
)
def test_malformed_event_policies_are_refused(events_doc: object, message: str) -> None:
    with pytest.raises(MalformedPolicyError, match=message):
        parse_cvm_policy({"events": events_doc})
