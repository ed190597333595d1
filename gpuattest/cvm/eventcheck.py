"""The event log's two checks: does it replay to the quote's RTMRs (a vTPM's measured-boot
log: to its quoted PCRs, :mod:`.tpmlog`), and does it hold what the policy's ``cvm.events``
require (:mod:`.policy` for the rule)."""

from __future__ import annotations

from typing import Any

from ..result import Check, CheckStatus, Decision
from .eventlog import CcEventLog
from .policy import CvmPolicy, EventPin

__all__ = ["event_checks"]

_REGISTERS = ("rtmr0", "rtmr1", "rtmr2", "rtmr3")


def _check(cid: str, title: str, ok: bool, reason: str = "", note: str = "") -> Check:
    status = CheckStatus.PASS if ok else CheckStatus.FAIL
    decision = Decision.ACCEPT if ok else Decision.REFUSE
    return Check(cid, title, status, "" if ok else reason, False, decision, note)


def _pcr_replay_check(log: CcEventLog, claims: dict[str, Any]) -> tuple[Check, set[str]]:
    """Every PCR the log extends against the quoted value (``vtpm.pcrs``: index -> hex); a
    PCR the quote does not cover leaves its events unverified. Returns the check and the
    registers whose events the quote vouches for."""
    title = "Event log replays to the PCRs"
    quoted: dict[str, str] = (claims.get("vtpm") or {}).get("pcrs") or {}
    problems: list[str] = []
    verified: set[str] = set()
    for name, value in log.replay().items():
        index = name.removeprefix("pcr")
        if index not in quoted:
            continue
        if quoted[index] != value.hex():
            problems.append(f"PCR{index} replays to {value.hex()}, the quote has {quoted[index]}")
        else:
            verified.add(name)
    if problems:
        reason = "the measured-boot log does not match the quote: " + "; ".join(problems)
        return _check("cvm-event-log", title, False, reason), verified
    if not verified:
        reason = "the measured-boot log extends no PCR the quote covers"
        return _check("cvm-event-log", title, False, reason), verified
    pcrs = ", ".join(r.upper() for r in sorted(verified, key=lambda r: int(r[3:])))
    note = f"{len(log.events)} events; {pcrs} replayed"
    return _check("cvm-event-log", title, True, note=note), verified


def _replay_check(log: CcEventLog, claims: dict[str, Any]) -> Check:
    title = "Event log replays to the RTMRs"
    replayed = log.replay()
    wrong = [r for r in _REGISTERS if claims.get(r) != replayed[r].hex()]
    if not wrong:
        return _check("cvm-event-log", title, True, note=f"{len(log.events)} events")
    detail = "; ".join(
        f"{r.upper()} replays to {replayed[r].hex()}, the quote has {claims.get(r)}" for r in wrong
    )
    names = ", ".join(r.upper() for r in wrong)
    reason = f"the event log does not match the quote: {names} differ ({detail})"
    return _check("cvm-event-log", title, False, reason)


def _requirements(
    log: CcEventLog, pins: tuple[EventPin, ...], verified: set[str] | None = None
) -> list[str]:
    """What the log lacks or holds against the pins, as reasons. ``verified``: the registers
    whose events the evidence vouches for (None: all of them)."""
    problems = []
    for pin in pins:
        if verified is not None and pin.register not in verified:
            problems.append(
                f"{pin.label}: {pin.register.upper()} is not extended by the log and quoted"
            )
            continue
        found = any(
            e.register == pin.register
            and e.event_type == pin.event_type
            and e.digest is not None
            and e.digest.hex() == pin.digest
            for e in log.events
        )
        if not found:
            problems.append(
                f"{pin.label}: no {pin.register.upper()} event with digest {pin.digest}"
            )
    named = {(p.register, p.event_type) for p in pins}
    allowed = {(p.register, p.event_type, p.digest) for p in pins}
    for e in log.events:
        key = (e.register, e.event_type)
        digest = e.digest.hex() if e.digest is not None else ""
        if key in named and (e.register, e.event_type, digest) not in allowed:
            assert e.register is not None
            problems.append(
                f"event {e.seq} ({e.type_name} in {e.register.upper()}, digest {digest}) "
                "is not one the policy lists for that register and type"
            )
    return problems


def event_checks(
    log: CcEventLog | None, claims: dict[str, Any], policy: CvmPolicy, kind: str
) -> list[Check]:
    """``cvm-event-log`` (when a log was given) and ``cvm-events`` (when the policy lists
    events for ``kind``)."""
    checks: list[Check] = []
    pins = policy.event_pins(kind)
    verified: set[str] | None = None
    replay = None
    if log is not None and log.pcr_log:
        replay, verified = _pcr_replay_check(log, claims)
    elif log is not None:
        replay = _replay_check(log, claims)
    if replay is not None:
        checks.append(replay)
    if not pins:
        return checks
    title = "Events required by the policy"
    if log is None:
        reason = f"the policy lists events (cvm.events.{kind}) but no event log was given"
        return [*checks, _check("cvm-events", title, False, reason)]
    if replay is not None and replay.status is not CheckStatus.PASS:
        reason = "not evaluated: the event log does not match the quote"
        return [*checks, Check("cvm-events", title, CheckStatus.NOT_CHECKED, reason)]
    problems = _requirements(log, pins, verified)
    note = f"{len(pins)} events listed ({', '.join(p.label for p in pins)})"
    reason = "; ".join(problems)
    return [*checks, _check("cvm-events", title, not problems, reason, note)]
