"""The ``cvm:`` policy's rules for vTPM evidence: pinned PCRs and the paravisor's console.

``cvm-pcrs``: every PCR the policy pins (``cvm.pcrs``, by index) must be in the quote with
that value. Events of the measured-boot log (``cvm.events.vtpm``, judged with the log) pin
the PCRs instead when ``cvm.pcrs`` is empty. Nothing pinned is shown as "not pinned" and
accepted, except for key release (``require_pins``), which refuses it unless
``cvm.allow_unpinned`` names the relaxation (the caller then passes ``require_pins=False``).

``cvm-console``: a VM whose paravisor reports ``console-enabled`` is refused when the policy
says ``allow_console: false``; otherwise accepted and shown.
"""

from __future__ import annotations

from typing import Any

from ..result import Check, CheckStatus, Decision
from .policy import CvmPolicy

__all__ = ["vtpm_policy_checks"]


def vtpm_policy_checks(vtpm: dict[str, Any], policy: CvmPolicy, require_pins: bool) -> list[Check]:
    """The two checks for the ``vtpm`` claims of one piece of evidence."""
    return [_pcr_check(vtpm, policy, require_pins), _console_check(vtpm, policy)]


def _pcr_check(vtpm: dict[str, Any], policy: CvmPolicy, require_pins: bool) -> Check:
    title = "PCRs"
    if not policy.pcrs and policy.event_pins("vtpm"):
        note = "pinned by events (cvm.events.vtpm); no PCR pinned"
        return Check("cvm-pcrs", title, CheckStatus.NOT_CHECKED, "", False, Decision.ACCEPT, note)
    if not policy.pcrs:
        if require_pins:
            reason = "not pinned: releasing keys to a vTPM CVM needs cvm.pcrs in the policy"
            return Check("cvm-pcrs", title, CheckStatus.NOT_CHECKED, reason, False, Decision.REFUSE)
        note = "not pinned: no cvm.pcrs in the policy; reported only"
        return Check("cvm-pcrs", title, CheckStatus.NOT_CHECKED, "", False, Decision.ACCEPT, note)
    quoted: dict[str, str] = vtpm.get("pcrs") or {}
    wrong = [
        f"PCR{i}" + ("" if str(i) in quoted else " (not quoted)")
        for i, value in sorted(policy.pcrs.items())
        if quoted.get(str(i)) != value
    ]
    note = "pinned: " + ", ".join(f"PCR{i}" for i in sorted(policy.pcrs))
    if wrong:
        reason = "differs from the policy: " + ", ".join(wrong)
        return Check("cvm-pcrs", title, CheckStatus.FAIL, reason, False, Decision.REFUSE, note)
    return Check("cvm-pcrs", title, CheckStatus.PASS, "", False, Decision.ACCEPT, note)


def _console_check(vtpm: dict[str, Any], policy: CvmPolicy) -> Check:
    title = "Serial console"
    enabled = bool(vtpm.get("console_enabled"))
    if not enabled:
        return Check("cvm-console", title, CheckStatus.PASS, "", False, Decision.ACCEPT)
    if policy.allow_console:
        note = "the paravisor reports the console enabled; accepted (cvm.allow_console)"
        return Check("cvm-console", title, CheckStatus.PASS, "", False, Decision.ACCEPT, note)
    reason = "the paravisor reports the console enabled (cvm.allow_console: false)"
    return Check("cvm-console", title, CheckStatus.FAIL, reason, False, Decision.REFUSE)
