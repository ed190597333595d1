"""Pre-flight: is the collateral a verification will need published, valid and current?

``gpucc collateral check`` asks before a rollout what ``gpucc attest`` would ask after it:
the driver and VBIOS RIMs (published by NVIDIA's RIM service, signed, chained to the pinned
RIM root, not revoked), OCSP for the device chain of given evidence, and for CVM evidence
whether its TCB collateral (Intel's PCS, AMD's KDS) can be had and is current. Each item gets
one status:

``ok``            published, verified and current;
``not-published`` the RIM service has no such RIM (yet): NVIDIA's usual lag after a release;
``unavailable``   could not be obtained now (network, service error, offline);
``stale``         obtained, but past its lifetime (nextUpdate, certificate validity);
``invalid``       obtained and refused (bad signature, broken chain, bad OCSP answer);
``revoked``       a certificate of the chain is revoked (or unknown to its responder).

:class:`PreflightReport` turns them into the pipeline's decision: ``refused`` (any invalid or
revoked item: exit 1), ``undecided`` (any item not published, unavailable or stale: exit 3),
or ``ready`` (exit 0).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography import x509

from gpucc.core.errors import (
    CollateralUnavailableError,
    MalformedInputError,
    RimNotFoundError,
)

from .collateral import ChainKind, OcspChecker, OcspStatus, RimSource, ocsp_targets
from .trust import TrustRoots

__all__ = [
    "PreflightItem",
    "PreflightReport",
    "check_device_chains",
    "check_rims",
    "driver_rim_id",
    "vbios_rim_id",
]

_REFUSED = frozenset({"invalid", "revoked"})
_UNDECIDED = frozenset({"not-published", "unavailable", "stale"})


@dataclass(frozen=True)
class PreflightItem:
    """One piece of collateral and what was found."""

    kind: str
    name: str
    status: str
    detail: str = ""

    def to_json(self) -> dict[str, str]:
        """The item as a JSON object."""
        return {"kind": self.kind, "name": self.name, "status": self.status, "detail": self.detail}


@dataclass(frozen=True)
class PreflightReport:
    """Every item checked, at ``checked_at``."""

    items: tuple[PreflightItem, ...]
    checked_at: dt.datetime

    @property
    def decision(self) -> str:
        """``refused``, ``undecided`` or ``ready`` (see the module docstring)."""
        statuses = {i.status for i in self.items}
        if statuses & _REFUSED:
            return "refused"
        if statuses & _UNDECIDED or not self.items:
            return "undecided"
        return "ready"

    def to_json(self) -> dict[str, Any]:
        """The report as a JSON document."""
        return {
            "schema": "gpucc.collateral.check/v1",
            "decision": self.decision,
            "complete": self.decision == "ready",
            "checked_at": self.checked_at.isoformat(),
            "items": [i.to_json() for i in self.items],
        }


def driver_rim_id(driver_version: str, gpu: str = "GH100") -> str:
    """The driver RIM ID NVIDIA's verifiers derive for ``driver_version`` on ``gpu``."""
    gpu = gpu.upper()
    if gpu == "GH100":
        return f"NV_GPU_DRIVER_GH100_{driver_version}"
    return f"NV_GPU_CC_DRIVER_{gpu}_{driver_version}"


def vbios_rim_id(vbios_version: str, board: str) -> str:
    """The VBIOS RIM ID for ``vbios_version`` (dotted) on ``board`` (PROJECT_SKU_CHIPSKU)."""
    return f"NV_GPU_VBIOS_{board.upper()}_{vbios_version.replace('.', '').upper()}"


def _ocsp_item(kind: str, name: str, checker: OcspChecker, target: Any) -> PreflightItem:
    outcome = checker.check(target)
    if outcome.status is OcspStatus.GOOD:
        until = f" until {outcome.next_update.isoformat()}" if outcome.next_update else ""
        return PreflightItem(kind, name, "ok", f"good{until}")
    if outcome.status is OcspStatus.NOT_CHECKED:
        status = "stale" if "stale" in outcome.reason else "unavailable"
        return PreflightItem(kind, name, status, outcome.reason)
    if outcome.response_valid is False:
        return PreflightItem(kind, name, "invalid", outcome.reason)
    detail = str(outcome.status)
    if outcome.revocation_reason:
        detail += f" ({outcome.revocation_reason})"
    return PreflightItem(kind, name, "revoked", detail)


def _chain_items(
    kind: ChainKind,
    chain: Sequence[x509.Certificate],
    roots: TrustRoots,
    ocsp: OcspChecker,
    now: dt.datetime,
    label: str,
) -> list[PreflightItem]:
    anchor = roots.device_root if kind is ChainKind.DEVICE else roots.rim_root
    items = []
    for target in ocsp_targets(chain, kind=kind, anchor=anchor, now=now):
        name = f"{label}: {target.cert.subject.rfc4514_string()[:120]}"
        items.append(_ocsp_item("ocsp", name, ocsp, target))
    return items


def check_rims(
    rim_ids: Iterable[str],
    *,
    rims: RimSource,
    ocsp: OcspChecker,
    roots: TrustRoots,
    now: dt.datetime,
) -> list[PreflightItem]:
    """Each RIM: published, schema-valid, signed, chained to the pin at ``now``; then OCSP
    for its signing chain. Never raises for collateral problems."""
    from .bundle import rim_kind
    from .rim import verify_document
    from .x509chain import ChainStatus

    items: list[PreflightItem] = []
    for rim_id in dict.fromkeys(rim_ids):
        try:
            data = rims.get_rim(rim_id)
        except RimNotFoundError as exc:
            items.append(PreflightItem("rim", rim_id, "not-published", str(exc)))
            continue
        except CollateralUnavailableError as exc:
            items.append(PreflightItem("rim", rim_id, "unavailable", str(exc)))
            continue
        try:
            manifest, schema, sig = verify_document(data, anchor=roots.rim_root, now=now)
        except MalformedInputError as exc:
            items.append(PreflightItem("rim", rim_id, "invalid", str(exc)))
            continue
        if not schema.valid:
            items.append(PreflightItem("rim", rim_id, "invalid", f"schema: {schema.reason}"))
            continue
        if not sig.signature_valid:
            items.append(PreflightItem("rim", rim_id, "invalid", sig.signature_reason))
            continue
        if sig.chain.status is ChainStatus.EXPIRED:
            items.append(PreflightItem("rim", rim_id, "stale", sig.chain.reason))
            continue
        if sig.chain.status is not ChainStatus.VALID:
            items.append(PreflightItem("rim", rim_id, "invalid", f"chain: {sig.chain.reason}"))
            continue
        until = min(c.not_valid_after_utc for c in manifest.certificates)
        items.append(
            PreflightItem(
                "rim",
                rim_id,
                "ok",
                f"version {manifest.colloquial_version}, signer valid until {until.isoformat()}",
            )
        )
        items += _chain_items(rim_kind(rim_id), manifest.certificates, roots, ocsp, now, rim_id)
    return items


def check_device_chains(
    chains: Sequence[Sequence[x509.Certificate]],
    *,
    ocsp: OcspChecker,
    roots: TrustRoots,
    now: dt.datetime,
) -> list[PreflightItem]:
    """OCSP for certificates 1..n-2 of every device chain (each certificate asked once)."""
    items: list[PreflightItem] = []
    seen: set[str] = set()
    for n, chain in enumerate(chains):
        for item in _chain_items(ChainKind.DEVICE, chain, roots, ocsp, now, f"GPU {n} device"):
            key = item.name.split(": ", 1)[-1]
            if key not in seen:
                seen.add(key)
                items.append(item)
    return items


def check_cvm_collateral(collateral: bytes | None, kind: str, now: dt.datetime) -> PreflightItem:
    """Whether fetched CVM collateral (TDX: PCCS JSON; SNP: the VCEK) is current at ``now``."""
    if collateral is None:
        return PreflightItem("cvm", kind, "ok", "the evidence carries its own certificates")
    try:
        if kind == "tdx":
            from .cvm.pcs import next_update
            from .cvm.tdx import TdxCollateral

            until = next_update(TdxCollateral.from_json(collateral))
            name = "TDX TCB info, QE identity and CRLs"
        else:
            from .cvm.snp_roots import load_vcek

            until = load_vcek(collateral).not_valid_after_utc
            name = "SEV-SNP VCEK"
    except (MalformedInputError, ValueError) as exc:
        return PreflightItem("cvm", kind, "invalid", str(exc))
    if now >= until:
        return PreflightItem("cvm", name, "stale", f"past its next update {until.isoformat()}")
    return PreflightItem("cvm", name, "ok", f"current until {until.isoformat()}")
