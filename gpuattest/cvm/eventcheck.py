"""The event log's two checks: does it replay to the quote's RTMRs, and does it hold what the
policy's ``cvm.events`` require (:mod:`.policy` for the rule)."""

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


def _requirements(log: CcEventLog, pins: tuple[EventPin, ...]) -> list[str]:
    """What the log lacks or holds against the pins, as reasons."""
    problems = []
    for pin in pins:
        found = any(
            e.register == pin.register
            and e.event_type == pin.event_type
            and e.sha384 is not None
            and e.sha384.hex() == pin.digest
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
        digest = e.sha384.hex() if e.sha384 is not None else ""
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
    replay = _replay_check(log, claims) if log is not None else None
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
    problems = _requirements(log, pins)
    note = f"{len(pins)} events listed ({', '.join(p.label for p in pins)})"
    reason = "; ".join(problems)
    return [*checks, _check("cvm-events", title, not problems, reason, note)]
