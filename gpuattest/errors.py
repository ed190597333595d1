"""Typed errors raised by the gpucc libraries.

Every error a caller can meet derives from :class:`GpuccError` and carries the
process exit code the CLI uses for it, so the mapping lives in one place.
The families keep apart what users must be able to tell apart:

* :class:`MalformedInputError` (exit 4): the evidence, a RIM, a policy or a
  dataset cannot be parsed or evaluated at all.
* :class:`CollateralUnavailableError` (exit 3): something needed to decide
  (a RIM, an OCSP answer) could not be obtained. Never a verdict on the GPU.
* :class:`EnvironmentProblemError` (exit 5): no GPU, no NVML, CC mode off.
* :class:`IntegrityError` (exit 6): authenticated data failed verification
  (a chunk tag, a wrapped key, a sealed header).
* :class:`NotTrustedError` (exit 1): evidence was evaluated and refused.
* :class:`UsageError` (exit 2): the caller asked for something impossible.

Staging's errors (sealed datasets, key files, key release, GPU staging) live in
``staging.errors`` and derive from these families.

Messages never contain key material.
"""

from __future__ import annotations

__all__ = [
    "EXIT_COLLATERAL",
    "EXIT_ENVIRONMENT",
    "EXIT_INTEGRITY",
    "EXIT_MALFORMED",
    "EXIT_NOT_TRUSTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "CcModeError",
    "CollateralUnavailableError",
    "EnvironmentProblemError",
    "FileAccessError",
    "GpuccError",
    "IntegrityError",
    "MalformedCertificateError",
    "MalformedEvidenceError",
    "MalformedInputError",
    "MalformedPolicyError",
    "MalformedReportError",
    "MalformedRimError",
    "NetworkError",
    "NotTrustedError",
    "NvmlUnavailableError",
    "OfflineError",
    "RimNotFoundError",
    "UsageError",
]

EXIT_OK = 0
EXIT_NOT_TRUSTED = 1
EXIT_USAGE = 2
EXIT_COLLATERAL = 3
EXIT_MALFORMED = 4
EXIT_ENVIRONMENT = 5
EXIT_INTEGRITY = 6


class GpuccError(Exception):
    """Base of every error gpucc raises on purpose."""

    exit_code: int = EXIT_NOT_TRUSTED
    hint: str = ""

    def diagnostics(self) -> str:
        """One line for people: the message, then the hint when there is one."""
        msg = str(self) or self.__class__.__name__
        msg = " ".join(msg.split())
        return f"{msg} ({self.hint})" if self.hint else msg


class UsageError(GpuccError):
    """The request itself is inconsistent (conflicting or missing options)."""

    exit_code = EXIT_USAGE


class NotTrustedError(GpuccError):
    """Evidence was evaluated and did not satisfy the verification or policy."""

    exit_code = EXIT_NOT_TRUSTED


# --- exit 4: malformed input ------------------------------------------------


class MalformedInputError(GpuccError):
    """Input cannot be parsed or evaluated."""

    exit_code = EXIT_MALFORMED


class MalformedReportError(MalformedInputError):
    """The SPDM attestation report violates its layout."""


class MalformedEvidenceError(MalformedInputError):
    """An evidence file (JSON, hex, PEM) cannot be read."""


class MalformedCertificateError(MalformedInputError):
    """A certificate or certificate bundle cannot be parsed."""


class MalformedRimError(MalformedInputError):
    """A reference integrity manifest cannot be parsed."""


class MalformedPolicyError(MalformedInputError):
    """A policy file has unknown keys, wrong types or is not YAML."""


# --- exit 3: collateral -----------------------------------------------------


class CollateralUnavailableError(GpuccError):
    """Collateral needed for a decision could not be obtained.

    This is never a statement about the GPU: the evidence may be perfectly good.
    """

    exit_code = EXIT_COLLATERAL
    hint = "check connectivity, or use --collateral BUNDLE --offline"


class NetworkError(CollateralUnavailableError):
    """A collateral service could not be reached or answered badly."""


class OfflineError(CollateralUnavailableError):
    """Network use was needed while running with --offline."""

    hint = "fetch a bundle with 'gpucc collateral fetch' on a connected machine"


class RimNotFoundError(CollateralUnavailableError):
    """The RIM service has not published the reference manifest asked for."""

    hint = "NVIDIA has not published this RIM yet; try again later or supply it with --rim-dir"

    def __init__(self, rim_id: str, detail: str = "") -> None:
        self.rim_id = rim_id
        text = f"RIM {rim_id} is not available"
        super().__init__(f"{text}: {detail}" if detail else text)


# --- exit 5: environment ----------------------------------------------------


class EnvironmentProblemError(GpuccError):
    """The local machine cannot do what was asked (no GPU, NVML, CuPy)."""

    exit_code = EXIT_ENVIRONMENT


class NvmlUnavailableError(EnvironmentProblemError):
    """NVML (the NVIDIA driver library) or a GPU is not available."""

    hint = "run on a host with an NVIDIA driver, or pass --evidence FILE"


class FileAccessError(EnvironmentProblemError):
    """A file could not be read or written (missing, permissions, disk full)."""


class CcModeError(EnvironmentProblemError):
    """Confidential computing is off (or in a mode gpucc refuses) on this host."""


# --- exit 6: integrity ------------------------------------------------------


class IntegrityError(GpuccError):
    """Authenticated data failed verification; nothing unverified was released."""

    exit_code = EXIT_INTEGRITY
