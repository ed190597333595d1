"""What a CPU TEE verifier found, before any policy: the common value object of both kinds.

Checks use the GPU verifier's :class:`~gpuattest.result.Check` so the composite result reads
the same for a CVM as for a GPU. Verifiers set each check's ``status`` (and ``reason``,
``collateral_missing``); decisions are the policy's.

Claim names (``claims``), shared by both kinds where they mean the same thing:

- ``kind``: ``"tdx"`` or ``"snp"``.
- ``report_data``: hex of the 64 bytes the guest asked to be signed.
- ``debug``: bool, the guest is debuggable (TD attribute DEBUG; SNP policy DEBUG bit).
- ``tcb_status``: the platform's TCB status in Intel's vocabulary (``UpToDate``,
  ``SWHardeningNeeded``, ``ConfigurationNeeded``, ``ConfigurationAndSWHardeningNeeded``,
  ``OutOfDate``, ``OutOfDateConfigurationNeeded``, ``Revoked``); SNP maps its reported-TCB
  vs VCEK comparison onto ``UpToDate`` / ``OutOfDate``.
- ``advisory_ids``: list of advisory IDs (Intel-SA-...), empty when none.
- TDX only: ``mrtd``, ``rtmr0`` .. ``rtmr3``, ``mrseam``, ``mrsignerseam``, ``mrconfigid``,
  ``mrowner``, ``mrownerconfig``, ``td_attributes``, ``xfam``, ``tee_tcb_svn``,
  ``quote_version``, ``td_report_version`` (all hex strings but the versions).
- SNP only: ``measurement``, ``host_data``, ``policy`` (hex of the 64-bit field), ``vmpl``,
  ``report_version``, ``product`` (``Milan``/``Genoa``/``Turin``), ``chip_id``,
  ``reported_tcb``, ``committed_tcb``, ``vcek_tcb`` (dicts of component SVNs).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from ..result import Check, CheckStatus

__all__ = ["CvmFindings", "CvmKind"]


class CvmKind(enum.StrEnum):
    """Which CPU TEE produced the evidence."""

    TDX = "tdx"
    SNP = "snp"


@dataclass(frozen=True)
class CvmFindings:
    """One CVM's evidence as verified, with no policy applied.

    Attributes:
        kind: TDX or SNP.
        checks: the evidence checks in order (parse, chain, signatures, collateral, TCB).
        claims: the reported values (see the module docstring for names).
        report_data: the 64 bytes of report data the evidence signs (for session binding).
        evidence_sha256: SHA-256 of the evidence exactly as given.
    """

    kind: CvmKind
    checks: tuple[Check, ...]
    claims: dict[str, Any] = field(repr=False)
    report_data: bytes
    evidence_sha256: bytes

    @property
    def evidence_ok(self) -> bool:
        """True when every evidence check passed (nothing failed, nothing unchecked)."""
        return all(c.status is CheckStatus.PASS for c in self.checks)
