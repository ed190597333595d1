"""Protocol version 2's confidential-VM parts: what the host collects and how the holder
checks it (``docs/PROTOCOL.md``, "Version 2: the confidential VM").

The CVM verifier is injected (``attest_cvm``), as the GPU verifier is, so this module depends
on no verifier and knows no kind of CVM evidence: in production it is the platform verifier's
``cvm_attester`` (``gpucc.assembly``) with the holder's ``cvm:`` policy, which binds the
report data as the evidence's kind does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from gpucc.core.errors import CollateralUnavailableError
from gpucc.staging.errors import ProtocolError

from .messages import GPU_ONLY_VERSION, Offer, cvm_report_data

__all__ = ["CollectedCvmEvidence", "CvmAttester", "CvmOutcome", "check_cvm"]


class CvmOutcome(Protocol):
    """The verdict on a CVM's evidence (``gpuattest.cvm.appraise.CvmResult`` fits)."""

    @property
    def trusted(self) -> bool:
        """The evidence verified and the policy accepts it, report data included."""
        ...

    @property
    def reasons(self) -> tuple[str, ...]:
        """Why not, when not trusted."""
        ...


#: ``attest_cvm(evidence, collateral, expected_report_data, event_log) -> outcome``. It must
#: require the evidence to commit to ``expected_report_data`` (64 bytes) as its kind binds
#: report data (a TDX quote or an SEV-SNP report signs them as they are; a paravisor's vTPM
#: quote carries their first 32 bytes as its qualifying data: the platform verifier's
#: ``cvm_attester`` knows each kind's rule); ``event_log`` (TDX: the CC event log, or None)
#: must replay to the evidence's registers.
CvmAttester = Callable[[bytes, bytes | None, bytes, bytes | None], CvmOutcome]


@dataclass(frozen=True)
class CollectedCvmEvidence:
    """What the host's CVM collector returns for report data: the quote or report,
    collateral for it when the host has some (optional; the holder may fetch its own), and
    the CC event log when the CVM has one (TDX: the ACPI CCEL table's)."""

    evidence: bytes = field(repr=False)
    collateral: bytes | None = field(default=None, repr=False)
    event_log: bytes | None = field(default=None, repr=False)


def check_cvm(offer: Offer, nonce: bytes, attest_cvm: CvmAttester | None) -> bytes | None:
    """Step 3b: the CVM evidence of a version-2 offer; its digest for the transcript."""
    if offer.version == GPU_ONLY_VERSION or offer.cvm_evidence is None:
        return None
    if attest_cvm is None:
        raise ProtocolError("the offer carries CVM evidence but no CVM verifier is configured")
    expected = cvm_report_data(nonce, offer.host_public_key)
    outcome = attest_cvm(offer.cvm_evidence, offer.cvm_collateral, expected, offer.cvm_event_log)
    if not outcome.trusted:
        reasons = "; ".join(outcome.reasons) or "no reason given"
        if getattr(outcome, "undecided", False):
            # Nothing was refused; the collateral could not be used (expired, not yet valid).
            raise CollateralUnavailableError(f"the offer's CVM attestation is undecided: {reasons}")
        raise ProtocolError(f"the offer's CVM attestation is not trusted: {reasons}")
    return hashlib.sha256(offer.cvm_evidence).digest()
