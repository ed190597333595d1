"""CVM evidence from inside the guest through Linux's configfs-tsm interface (Linux >= 6.7).

One interface for TDX and SEV-SNP guests (Documentation/ABI/testing/configfs-tsm-report):
make a directory under ``/sys/kernel/config/tsm/report``, write the report data (64 bytes) to
its ``inblob``, read ``outblob`` (a TDX quote or an SNP report), ``provider`` (``tdx_guest``,
``sev_guest``) and, for SNP, ``auxblob`` (the certificate table with the VCEK when the host
supplies it). ``generation`` is read before and after: if another writer used the same entry
in between, the outblob may answer other report data, and the evidence is refused.

The root is an argument so tests can stand in for the kernel with a directory of files.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import EnvironmentProblemError, MalformedEvidenceError

__all__ = ["TSM_REPORT_ROOT", "TsmReport", "collect_tsm_report"]

TSM_REPORT_ROOT = Path("/sys/kernel/config/tsm/report")
MAX_BLOB_BYTES = 64 * 1024
_PROVIDERS = {"tdx_guest": "tdx", "sev_guest": "snp"}


@dataclass(frozen=True)
class TsmReport:
    """What configfs-tsm returned for one report request."""

    kind: str  # "tdx" or "snp"
    provider: str
    evidence: bytes = field(repr=False)
    auxblob: bytes | None = field(default=None, repr=False)


def _read(path: Path, what: str) -> bytes:
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_BLOB_BYTES + 1)
    except OSError as exc:
        raise EnvironmentProblemError(
            f"configfs-tsm: cannot read {what}: {exc.strerror or exc}"
        ) from None
    if len(data) > MAX_BLOB_BYTES:
        raise MalformedEvidenceError(f"configfs-tsm {what} is larger than {MAX_BLOB_BYTES} bytes")
    return data


def collect_tsm_report(
    report_data: bytes, *, root: Path = TSM_REPORT_ROOT, name: str | None = None
) -> TsmReport:
    """Ask the CPU TEE for evidence over ``report_data`` (exactly 64 bytes).

    Args:
        report_data: what the evidence must sign (gpucc's session binding).
        root: the configfs-tsm report directory.
        name: the entry to create (a fresh random name by default).

    Raises:
        EnvironmentProblemError: no configfs-tsm (not a TDX/SNP guest, or an older kernel),
            an unknown provider, or a concurrent writer changed the entry.
        MalformedEvidenceError: the outblob is empty or oversized.
    """
    if len(report_data) != 64:
        raise ValueError("configfs-tsm report data is 64 bytes")
    if not root.is_dir():
        raise EnvironmentProblemError(
            f"configfs-tsm is not available at {root}: this is not a TDX or SEV-SNP guest, or "
            "its kernel is older than 6.7"
        )
    entry = root / (name or f"gpucc-{os.getpid()}-{secrets.token_hex(8)}")
    try:
        entry.mkdir(mode=0o700)
    except FileExistsError:
        if name is None:
            raise EnvironmentProblemError(f"configfs-tsm entry {entry} exists") from None
    except OSError as exc:
        raise EnvironmentProblemError(
            f"configfs-tsm: cannot create {entry}: {exc.strerror or exc}"
        ) from None
    try:
        try:
            (entry / "inblob").write_bytes(report_data)
        except OSError as exc:
            raise EnvironmentProblemError(
                f"configfs-tsm: cannot write the report data: {exc.strerror or exc}"
            ) from None
        before = _read(entry / "generation", "generation").strip()
        evidence = _read(entry / "outblob", "outblob")
        provider = _read(entry / "provider", "provider").decode("ascii", "replace").strip()
        aux_path = entry / "auxblob"
        aux = _read(aux_path, "auxblob") if aux_path.exists() else None
        after = _read(entry / "generation", "generation").strip()
    finally:
        if name is None:
            with contextlib.suppress(OSError):
                entry.rmdir()
    if before != after:
        raise EnvironmentProblemError(
            "configfs-tsm: another writer used the report entry meanwhile; try again"
        )
    if provider not in _PROVIDERS:
        raise EnvironmentProblemError(f"configfs-tsm provider {provider!r} is not TDX or SEV-SNP")
    if not evidence:
        raise MalformedEvidenceError("configfs-tsm returned empty evidence")
    return TsmReport(_PROVIDERS[provider], provider, evidence, aux or None)
