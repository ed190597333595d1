"""Before the journey: does this CVM run the image each holder's policy describes?

A plan may name, per holder, the image policy that holder enforces (``cvm_policy``: a gpucc
policy file whose ``cvm:`` section pins launch measurements or boot events, as
``gpucc cvm reference-snp`` and ``reference-tdx`` write it). Before any holder is contacted,
the orchestrator collects its own CVM evidence over fresh report data and verifies it under
each named policy as a key release would (measurements must be pinned unless the policy
names ``cvm.allow_unpinned``). A journey whose CVM one holder would refuse never starts, so
no holder's data is staged on a journey that could not finish. The holder still decides for
itself: this check predicts its verdict, it does not replace it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from gpucc.assembly import PlatformEvidence, PlatformVerifier
from gpucc.core.errors import MalformedPolicyError, UsageError
from gpucc.core.files import read_capped
from gpucc.core.jsonio import load_yaml_untrusted
from gpucc.gpuattest.policy import MAX_POLICY_BYTES, Policy, parse_policy
from gpucc.keyrelease.protocol import CollectedCvmEvidence

from .errors import CvmPolicyMismatchError, CvmPolicyUndecidedError
from .plan import HolderSpec

__all__ = ["VerifierFor", "check_cvm_policies"]

#: builds the verifier for one policy (the caller's roots, collateral and clock)
VerifierFor = Callable[[Policy], PlatformVerifier]


def check_cvm_policies(
    holders: Sequence[HolderSpec],
    *,
    collect_cvm: Callable[[bytes], CollectedCvmEvidence] | None,
    verifier_for: VerifierFor | None,
) -> dict[str, str]:
    """Check this CVM against every holder's ``cvm_policy``; each distinct policy file once.

    Returns:
        holder id -> SHA-256 (hex) of the policy file it was checked against.

    Raises:
        UsageError: a policy is named but no CVM evidence or no verifier is available.
        FileAccessError, MalformedPolicyError: a policy file cannot be read or parsed.
        CvmPolicyMismatchError: this CVM does not satisfy a holder's policy.
        CvmPolicyUndecidedError: the check could not be decided (collateral unavailable).
        MalformedEvidenceError: this CVM's own evidence is malformed.
    """
    named = [h for h in holders if h.cvm_policy is not None]
    if not named:
        return {}
    if collect_cvm is None or verifier_for is None:
        raise UsageError(
            f"the plan names an image policy for {named[0].id}, but this run offers no CVM "
            "evidence to check against it"
        )
    satisfied: set[str] = set()  # digests of the policy files this CVM satisfies
    checked: dict[str, str] = {}
    for holder in named:
        assert holder.cvm_policy is not None
        digest, policy = _read_policy(holder.cvm_policy, holder.id)
        if digest not in satisfied:
            _check_one(holder, policy, collect_cvm, verifier_for)
            satisfied.add(digest)
        checked[holder.id] = digest
    return checked


def _read_policy(path: Path, holder_id: str) -> tuple[str, Policy]:
    """The policy file's SHA-256 and the policy parsed from those same bytes."""
    data = read_capped(path, MAX_POLICY_BYTES, what=f"CVM policy of {holder_id}")
    if len(data) > MAX_POLICY_BYTES:
        raise MalformedPolicyError(f"policy {path} is larger than {MAX_POLICY_BYTES} bytes")
    doc = load_yaml_untrusted(data, what=f"policy {path}", error=MalformedPolicyError)
    return hashlib.sha256(data).hexdigest(), parse_policy(doc, source=str(path))


def _check_one(
    holder: HolderSpec,
    policy: Policy,
    collect_cvm: Callable[[bytes], CollectedCvmEvidence],
    verifier_for: VerifierFor,
) -> None:
    report_data = os.urandom(64)
    found = collect_cvm(report_data)
    result = verifier_for(policy).verify(
        PlatformEvidence(
            cvm=found.evidence,
            cvm_collateral=found.collateral,
            cvm_event_log=found.event_log,
            source="self",
        ),
        cvm_report_data=report_data,
        release=True,
    )
    if result.trusted:
        return
    why = "; ".join(result.reasons) or "no reason given"
    if result.undecided:
        raise CvmPolicyUndecidedError(
            f"cannot decide whether this CVM satisfies {holder.id}'s image policy: {why}"
        )
    raise CvmPolicyMismatchError(f"this CVM does not satisfy {holder.id}'s image policy: {why}")
