"""Where RIMs and OCSP answers come from: the seams the verifier is given.

The verifier never fetches anything itself. It asks a :class:`RimSource` for a
RIM by ID and an :class:`OcspChecker` for the revocation status of one
certificate. Files, directories, the network, caches and offline bundles are
implementations of these two protocols; tests inject their own.
"""

from __future__ import annotations

import datetime as dt
import enum
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cryptography import x509

from gpucc.core.errors import MalformedRimError, RimNotFoundError

_log = logging.getLogger(__name__)

__all__ = [
    "MAX_RIM_BYTES",
    "ChainKind",
    "CompositeRimSource",
    "DirectoryRimSource",
    "FileRimSource",
    "NoOcsp",
    "NoRimSource",
    "OcspChecker",
    "OcspOutcome",
    "OcspStatus",
    "OcspTarget",
    "RimSource",
    "ocsp_targets",
    "rim_sources_from_mapping",
]

# Real RIMs are about 20 KiB; anything above this is not a RIM.
MAX_RIM_BYTES = 4 * 1024 * 1024
_RIM_ID_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,200}$")


class ChainKind(enum.StrEnum):
    """Which chain a certificate belongs to (policies may treat them differently)."""

    DEVICE = "device"
    DRIVER_RIM = "driver-rim"
    VBIOS_RIM = "vbios-rim"


class RimSource(Protocol):
    """Gives the RIM XML for a RIM ID."""

    def get_rim(self, rim_id: str) -> bytes:
        """Return the raw RIM document.

        Raises:
            RimNotFoundError: the source has no such RIM.
            CollateralUnavailableError: the source could not be consulted.
        """
        ...


class OcspStatus(enum.StrEnum):
    """Revocation status of one certificate, in NVIDIA's claim vocabulary."""

    GOOD = "good"
    REVOKED = "revoked"
    UNKNOWN = "unknown"
    NOT_CHECKED = "not-checked"


@dataclass(frozen=True)
class OcspOutcome:
    """What an OCSP check found for one certificate.

    Attributes:
        status: good, revoked, unknown, or not-checked (with ``reason``).
        revocation_reason: cryptography ``ReasonFlags`` name (e.g. ``key_compromise``) when revoked.
        nonce_match: True/False when a nonce was sent, None when none was sent.
        response_valid: whether the response's signature, responder and CertID checked out;
            None when no response was evaluated.
        reason: human text for anything other than a clean ``good``.
        collateral_missing: True when not checked because the answer could not be obtained
            (network, offline, stale bundle); False when not checked by configuration.
        this_update / next_update: the response's validity window, when there was a response.
    """

    status: OcspStatus
    revocation_reason: str | None = None
    nonce_match: bool | None = None
    response_valid: bool | None = None
    reason: str = ""
    collateral_missing: bool = False
    this_update: dt.datetime | None = None
    next_update: dt.datetime | None = None


@dataclass(frozen=True)
class OcspTarget:
    """One OCSP question: is ``cert`` (issued by ``issuer``) revoked, judged at ``now``?

    Attributes:
        cert: the certificate asked about.
        issuer: the next certificate in the chain (the CA that answers for it).
        issuer_chain: the certificates above ``issuer``, ending in ``anchor``, so a
            responder's chain can be validated to the pin.
        kind: the chain it belongs to.
        anchor: the pinned root of that chain.
        now: the verification time (timezone-aware).
    """

    cert: x509.Certificate
    issuer: x509.Certificate
    issuer_chain: tuple[x509.Certificate, ...]
    kind: ChainKind
    anchor: x509.Certificate
    now: dt.datetime


def ocsp_targets(
    chain: Sequence[x509.Certificate],
    *,
    kind: ChainKind,
    anchor: x509.Certificate,
    now: dt.datetime,
) -> tuple[OcspTarget, ...]:
    """The certificates of a leaf-first chain that get OCSP, as NVIDIA's verifiers choose them.

    Device chains: indices 1 .. n-2 (not the per-boot leaf, not the root). RIM
    chains: indices 0 .. n-2. The chain's own last certificate is untrusted input
    and is replaced by ``anchor``, so the issuer of certificate n-2 is the pin. This
    is the only place that rule lives: the verifier and bundle collection both use it.
    """
    certs = list(chain)
    if len(certs) < 2:
        return ()
    path = [*certs[:-1], anchor]
    first = 1 if kind is ChainKind.DEVICE else 0
    return tuple(
        OcspTarget(path[i], path[i + 1], tuple(path[i + 2 :]), kind, anchor, now)
        for i in range(first, len(path) - 1)
    )


class OcspChecker(Protocol):
    """Checks the revocation status of one certificate."""

    def check(self, target: OcspTarget) -> OcspOutcome:
        """Return the outcome; never raises for network or response problems."""
        ...


class NoOcsp:
    """An OCSP checker that checks nothing and says so."""

    def __init__(
        self,
        reason: str = "no OCSP responder or collateral bundle is available",
        *,
        collateral_missing: bool = True,
    ) -> None:
        self.reason = reason
        self.collateral_missing = collateral_missing

    def check(self, target: OcspTarget) -> OcspOutcome:
        """Report "not checked" with the configured reason."""
        del target  # nothing is asked
        return OcspOutcome(
            OcspStatus.NOT_CHECKED, reason=self.reason, collateral_missing=self.collateral_missing
        )


def _read_capped(path: Path) -> bytes:
    from gpucc.core.files import read_capped

    data = read_capped(path, MAX_RIM_BYTES, what="RIM file")
    if len(data) > MAX_RIM_BYTES:
        raise MalformedRimError(f"RIM file {path} is larger than {MAX_RIM_BYTES} bytes")
    return data


class NoRimSource:
    """A source that has no RIMs: every lookup is "not available"."""

    def __init__(self, detail: str = "no RIM source is configured") -> None:
        self.detail = detail

    def get_rim(self, rim_id: str) -> bytes:
        """Always raises RimNotFoundError."""
        raise RimNotFoundError(rim_id, self.detail)


class FileRimSource:
    """Explicit files given for the driver and VBIOS RIMs.

    ``files`` maps a role ("driver" or "vbios") to a path; the verifier asks by
    RIM ID, and this source answers the ID whose kind matches the role.
    """

    def __init__(self, driver: Path | None = None, vbios: Path | None = None) -> None:
        self.driver = driver
        self.vbios = vbios

    def get_rim(self, rim_id: str) -> bytes:
        """Return the file for the RIM's role.

        Raises:
            RimNotFoundError: no file was given for this role.
            MalformedRimError: the file cannot be read or is oversized.
        """
        is_driver = "DRIVER" in rim_id.upper()
        path = self.driver if is_driver else self.vbios
        if path is None:
            raise RimNotFoundError(rim_id, "no file given for it")
        return _read_capped(path)


#: The names a RIM is looked for under in a directory, in order: nvattest's XML store, then
#: CoRIMs (a file's reader is chosen by its content, never by its name).
RIM_FILE_NAMES = ("{}.xml", "{}.cbor", "{}.corim", "{}")


class DirectoryRimSource:
    """nvattest's directory store: ``DIR/<RIM_ID>.xml``; CoRIMs as ``DIR/<RIM_ID>.cbor``,
    ``.corim`` or the bare ID."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def get_rim(self, rim_id: str) -> bytes:
        """Return the first of ``DIR/<RIM_ID>.xml``, ``.cbor``, ``.corim``, ``<RIM_ID>``.

        Raises:
            RimNotFoundError: no such file.
            MalformedRimError: unreadable or oversized.
        """
        if not _RIM_ID_RE.match(rim_id):
            raise RimNotFoundError(rim_id, "not a valid RIM ID for a file name")
        for pattern in RIM_FILE_NAMES:
            path = self.directory / pattern.format(rim_id)
            if path.is_file():
                return _read_capped(path)
        raise RimNotFoundError(
            rim_id, f"{rim_id}.xml is not in {self.directory} (nor a .cbor or .corim CoRIM)"
        )


class CompositeRimSource:
    """Tries sources in order; the first that has the RIM wins.

    A :class:`RimNotFoundError` moves on to the next source; any other error
    (including collateral errors) is raised at once.
    """

    def __init__(self, sources: Sequence[RimSource]) -> None:
        self.sources = tuple(sources)

    def get_rim(self, rim_id: str) -> bytes:
        """Return the RIM from the first source that has it.

        Raises:
            RimNotFoundError: no source has it.
        """
        details: list[str] = []
        for source in self.sources:
            try:
                data = source.get_rim(rim_id)
            except RimNotFoundError as exc:
                _log.debug("RIM %s: not from %s: %s", rim_id, _source_name(source), exc)
                details.append(str(exc))
                continue
            _log.debug("RIM %s: from %s (%d bytes)", rim_id, _source_name(source), len(data))
            return data
        raise RimNotFoundError(rim_id, "; ".join(details) if details else "no source")


def _source_name(source: object) -> str:
    """A RIM source, for a debug record: its kind, and its directory or files."""
    if isinstance(source, DirectoryRimSource):
        return f"the directory {source.directory}"
    if isinstance(source, FileRimSource):
        return "the files given"
    return repr(source) if type(source).__repr__ is not object.__repr__ else type(source).__name__


def rim_sources_from_mapping(mapping: Mapping[str, bytes]) -> RimSource:
    """A source over an in-memory mapping of RIM ID to bytes (bundles, tests)."""

    class _Mapped:
        def get_rim(self, rim_id: str) -> bytes:
            try:
                return mapping[rim_id]
            except KeyError:
                raise RimNotFoundError(rim_id, "not in the supplied collateral") from None

    return _Mapped()
