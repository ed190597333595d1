"""Collect a TDX quote or an SEV-SNP report inside a confidential VM, through configfs-tsm.

Linux (6.7 and later) gives TDX and SEV-SNP guests one interface for attestation evidence:
configfs-tsm, under ``/sys/kernel/config/tsm/report`` (the kernel documents it in
``Documentation/ABI/testing/configfs-tsm-report``, named ``configfs-tsm`` in earlier trees).
:func:`collect_tsm_report` makes one request, in this order:

1. ``mkdir`` a uniquely named entry under the root; the kernel fills it with attributes.
2. Read ``provider`` (``tdx_guest`` or ``sev_guest``); any other is refused before anything
   is written.
3. Read ``generation``: the kernel counts every write to the entry's attributes.
4. Write ``privlevel`` when one was asked for (SNP: the VMPL the report is made for), then
   the 64 bytes of report data to ``inblob``, each in one write.
5. Read ``outblob`` (the kernel asks the TEE for the evidence now), then ``auxblob`` when the
   entry has one (SNP: the host's certificate table, see :mod:`.snp_certs`).
6. Read ``generation`` again. It must equal the first value plus the writes made here;
   otherwise another writer changed the request between our write and our read, and the
   outblob may answer theirs. The evidence must also carry the report data written (SNP:
   REPORT_DATA; TDX: the TD report's REPORTDATA). Either failure is retried once in a fresh
   entry, then refused (:class:`TsmConflictError`).
7. ``rmdir`` the entry, whatever happened.

Every read is capped. Nothing here verifies the evidence: that is :mod:`.snp`'s job (or the
TDX verifier's), with the same report data.
"""

from __future__ import annotations

import errno
import hmac
import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from gpucc.core.errors import (
    EnvironmentProblemError,
    FileAccessError,
    MalformedEvidenceError,
    MalformedInputError,
    UsageError,
)

from .findings import CvmKind
from .snp_report import parse_snp_report

__all__ = [
    "AUXBLOB_MAX",
    "DEFAULT_TSM_ROOT",
    "OUTBLOB_MAX",
    "PROVIDERS",
    "REPORT_DATA_SIZE",
    "MalformedTsmOutputError",
    "TsmAccessError",
    "TsmConflictError",
    "TsmError",
    "TsmReport",
    "TsmRequestError",
    "TsmUnavailableError",
    "UnknownTsmProviderError",
    "collect_tsm_report",
]

DEFAULT_TSM_ROOT = Path("/sys/kernel/config/tsm/report")
REPORT_DATA_SIZE = 64
OUTBLOB_MAX = 64 * 1024
"""Largest outblob accepted (twice the kernel's own cap; TDX quotes are about 5 KiB)."""
AUXBLOB_MAX = 64 * 1024
"""Largest auxblob accepted (the SNP guest driver's certificate buffer is smaller)."""
PROVIDERS: Mapping[str, CvmKind] = MappingProxyType(
    {"tdx_guest": CvmKind.TDX, "sev_guest": CvmKind.SNP}
)
"""The configfs-tsm providers gpucc knows, and the kind of evidence each gives."""

_SMALL_MAX = 64  # provider, generation, privlevel_floor
_MAX_PRIVLEVEL = 3  # the kernel's TSM_PRIVLEVEL_MAX
_TDX_REPORT_DATA_AT = 520  # in the TD report body, 1.0 and 1.5 alike
_HINT = (
    "needs Linux >= 6.7 with configfs mounted at /sys/kernel/config and a TDX or SEV-SNP "
    "guest whose driver (tdx_guest, sev_guest) is loaded"
)


class TsmError(EnvironmentProblemError):
    """configfs-tsm could not give evidence (exit 5)."""


class TsmUnavailableError(TsmError):
    """There is no configfs-tsm report interface at the root given (exit 5)."""

    hint = _HINT


class UnknownTsmProviderError(TsmUnavailableError):
    """The entry names a provider gpucc does not know (neither TDX nor SEV-SNP)."""


class TsmRequestError(TsmError):
    """The kernel refused or failed the request (an error reading or writing an attribute)."""


class TsmConflictError(TsmError):
    """Another writer changed the request, or the evidence answers other report data."""


class TsmAccessError(FileAccessError):
    """configfs-tsm is there but this process may not use it (exit 8)."""

    hint = "configfs-tsm reports need root, or write access to the report directory"


class MalformedTsmOutputError(MalformedInputError):
    """The outblob is not the provider's evidence or is larger than accepted (exit 4)."""


@dataclass(frozen=True)
class TsmReport:
    """Evidence as configfs-tsm gave it.

    Attributes:
        provider: the kernel's provider name (``tdx_guest`` or ``sev_guest``).
        kind: the evidence kind that provider gives.
        outblob: the TDX quote or SEV-SNP report, exactly as read.
        auxblob: the auxiliary data (SNP: the host's certificate table), or None when the
            entry has none or it is empty.
        generation: the entry's write count when the outblob was read.
        privlevel: the privilege level written (SNP VMPL), or None when none was.
    """

    provider: str
    kind: CvmKind
    outblob: bytes = field(repr=False)
    auxblob: bytes | None = field(repr=False)
    generation: int
    privlevel: int | None = None


class _Retry(Exception):
    """One attempt failed in a way a fresh entry may not repeat; carries the public error."""

    def __init__(self, error: TsmError) -> None:
        super().__init__(str(error))
        self.error = error


def _make_entry(path: Path) -> None:
    """Make an entry (configfs fills it with attributes; the tests' fake kernel does too)."""
    os.mkdir(path, 0o700)


def _remove_entry(path: Path) -> None:
    """Remove an entry with its attributes (configfs allows it; a plain directory would not)."""
    os.rmdir(path)


def _os_error(exc: OSError, what: str) -> TsmError | TsmAccessError:
    reason = exc.strerror or type(exc).__name__
    if isinstance(exc, PermissionError):
        return TsmAccessError(f"cannot {what}: {reason}")
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return TsmUnavailableError(f"cannot {what}: {reason}")
    return TsmRequestError(f"cannot {what}: {reason}")


def _read(path: Path, cap: int, what: str) -> bytes:
    """All of attribute ``path``, refusing more than ``cap`` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            chunks: list[bytes] = []
            total = 0
            while total <= cap:
                chunk = os.read(fd, cap + 1 - total)
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
        finally:
            os.close(fd)
    except OSError as exc:
        raise _os_error(exc, f"read configfs-tsm {what} ({path})") from None
    if total > cap:
        raise MalformedTsmOutputError(f"configfs-tsm {what} is larger than {cap} bytes")
    return b"".join(chunks)


def _write(path: Path, data: bytes, what: str) -> None:
    """Write ``data`` to attribute ``path`` in one write (the kernel takes it at close)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            written = os.write(fd, data)
        finally:
            os.close(fd)
    except OSError as exc:
        raise _os_error(exc, f"write configfs-tsm {what} ({path})") from None
    if written != len(data):
        raise TsmRequestError(f"configfs-tsm {what} took {written} of {len(data)} bytes ({path})")


def _read_text(path: Path, what: str) -> str:
    raw = _read(path, _SMALL_MAX, what)
    try:
        return raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise TsmRequestError(f"configfs-tsm {what} is not text ({path})") from None


def _read_int(path: Path, what: str) -> int:
    text = _read_text(path, what)
    if not text.isdigit() or not text.isascii():
        raise TsmRequestError(f"configfs-tsm {what} is not a number: {text[:20]!r} ({path})")
    return int(text)


def _tdx_report_data(quote: bytes) -> bytes:
    from .tdx import td_report_span

    try:
        _version, _td_version, body, _size = td_report_span(quote)
    except MalformedEvidenceError as exc:
        raise MalformedTsmOutputError(f"TDX outblob: {exc}") from None
    start = body + _TDX_REPORT_DATA_AT
    if len(quote) < start + REPORT_DATA_SIZE:
        raise MalformedTsmOutputError(f"TDX outblob is {len(quote)} bytes, too short for a quote")
    return quote[start : start + REPORT_DATA_SIZE]


def _report_data_of(kind: CvmKind, outblob: bytes) -> bytes:
    if kind is CvmKind.SNP:
        return parse_snp_report(outblob).report_data
    return _tdx_report_data(outblob)


def _request(entry: Path, report_data: bytes, privlevel: int | None) -> TsmReport:
    provider = _read_text(entry / "provider", "provider")
    kind = PROVIDERS.get(provider)
    if kind is None:
        raise UnknownTsmProviderError(
            f"configfs-tsm provider {provider[:40]!r} is neither tdx_guest nor sev_guest"
        )
    if privlevel is not None:
        floor_path = entry / "privlevel_floor"
        if not floor_path.exists():
            raise UsageError(f"configfs-tsm provider {provider} has no privilege levels")
        floor = _read_int(floor_path, "privlevel_floor")
        if privlevel < floor:
            raise UsageError(f"privilege level {privlevel} is below {provider}'s floor {floor}")
    before = _read_int(entry / "generation", "generation")
    writes = 0
    if privlevel is not None:
        _write(entry / "privlevel", f"{privlevel}\n".encode("ascii"), "privlevel")
        writes += 1
    _write(entry / "inblob", report_data, "inblob")
    writes += 1
    outblob = _read(entry / "outblob", OUTBLOB_MAX, "outblob")
    auxblob_path = entry / "auxblob"
    auxblob = _read(auxblob_path, AUXBLOB_MAX, "auxblob") if auxblob_path.exists() else None
    after = _read_int(entry / "generation", "generation")
    if after != before + writes:
        raise _Retry(
            TsmConflictError(
                f"configfs-tsm generation went from {before} to {after} over our {writes} "
                f"write(s): another writer changed the request"
            )
        )
    if not outblob:
        raise TsmRequestError(f"configfs-tsm gave an empty outblob ({entry})")
    if not hmac.compare_digest(_report_data_of(kind, outblob), report_data):
        raise _Retry(
            TsmConflictError("configfs-tsm evidence carries other report data than written")
        )
    return TsmReport(provider, kind, outblob, auxblob or None, after, privlevel)


def _remove(entry: Path, failing: BaseException | None) -> None:
    try:
        _remove_entry(entry)
    except OSError as exc:
        note = f"configfs-tsm entry {entry} could not be removed: {exc.strerror or exc}"
        if failing is None:
            raise TsmRequestError(note) from None
        (failing.error if isinstance(failing, _Retry) else failing).add_note(note)


def _attempt(root: Path, report_data: bytes, privlevel: int | None) -> TsmReport:
    entry = root / f"gpucc-{os.getpid()}-{secrets.token_hex(8)}"
    try:
        _make_entry(entry)
    except OSError as exc:
        if isinstance(exc, PermissionError):
            raise TsmAccessError(f"cannot create an entry in {root}: permission denied") from None
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise TsmUnavailableError(f"no configfs-tsm report directory at {root}") from None
        reason = exc.strerror or type(exc).__name__
        raise TsmUnavailableError(f"cannot create an entry in {root}: {reason}") from None
    try:
        report = _request(entry, report_data, privlevel)
    except BaseException as exc:
        _remove(entry, exc)
        raise
    _remove(entry, None)
    return report


def collect_tsm_report(
    report_data: bytes,
    *,
    root: Path = DEFAULT_TSM_ROOT,
    privlevel: int | None = None,
    attempts: int = 2,
    retry_delay: float = 0.1,
) -> TsmReport:
    """Ask this CVM's TEE for evidence signing ``report_data`` (steps in the module docstring).

    Args:
        report_data: exactly 64 bytes for the evidence to carry (gpucc's binding).
        root: the configfs-tsm report directory.
        privlevel: the privilege level to request (SNP: VMPL 0..3), or None for the kernel's.
        attempts: how many fresh entries to try when a request is raced (at least 1).
        retry_delay: seconds to wait before another attempt.

    Returns:
        The evidence and what came with it; the entry is removed.

    Raises:
        UsageError: ``report_data`` is not 64 bytes, ``privlevel`` is out of range or the
            provider has none, or ``attempts`` is below 1 (exit 2).
        TsmUnavailableError: no configfs-tsm at ``root`` (exit 5).
        UnknownTsmProviderError: the provider is neither ``tdx_guest`` nor ``sev_guest`` (5).
        TsmAccessError: permission denied (exit 8).
        TsmRequestError: the kernel failed the request (exit 5).
        TsmConflictError: every attempt was raced by another writer (exit 5).
        MalformedTsmOutputError, MalformedSnpReportError: the outblob is not the provider's
            evidence, or an attribute is larger than accepted (exit 4).
    """
    if len(report_data) != REPORT_DATA_SIZE:
        raise UsageError(f"report data must be {REPORT_DATA_SIZE} bytes, not {len(report_data)}")
    if privlevel is not None and not 0 <= privlevel <= _MAX_PRIVLEVEL:
        raise UsageError(f"privilege level must be 0 to {_MAX_PRIVLEVEL}, not {privlevel}")
    if attempts < 1:
        raise UsageError(f"attempts must be at least 1, not {attempts}")
    data = bytes(report_data)
    error: TsmError | None = None
    for attempt in range(attempts):
        if attempt:
            time.sleep(retry_delay)
        try:
            return _attempt(root, data, privlevel)
        except _Retry as retry:
            error = retry.error
    assert error is not None  # noqa: S101 - the loop ran at least once and did not return
    raise error
