"""Typed errors raised by the gpucc libraries.

Every error a caller can meet derives from :class:`GpuccError`. The families keep
apart what callers must be able to tell apart (the command line maps each family
to its own exit status, in ``gpucc.cli.exitcodes``):

* :class:`NotTrustedError`: evidence was evaluated and refused.
* :class:`UsageError`: the caller asked for something impossible.
* :class:`CollateralUnavailableError`: something needed to decide (a RIM, an OCSP
  answer) could not be obtained. Never a verdict on the GPU.
* :class:`MalformedInputError`: the evidence, a RIM, a policy or a dataset cannot be
  parsed or evaluated at all.
* :class:`EnvironmentProblemError`: no GPU, no NVML, CC mode off.
* :class:`IntegrityError`: authenticated data failed verification (a chunk tag, a
  wrapped key record, a sealed header).
* :class:`WrongKeyError`: the key offered is not the one the data was sealed for
  (told apart from tampering by the key id the wrap record names).
* :class:`FileAccessError`: a file could not be read or written.

Staging's errors (sealed datasets, key files, key release, GPU staging) live in
``staging.errors`` and derive from these families.

Messages never contain key material.

Errors keep their attributes across processes. Pickling (``multiprocessing``, a DataLoader
worker's queue) rebuilds an error from its arguments and attributes without calling its
constructor. PyTorch's DataLoader does not pickle a worker's exception: it re-raises
``type(error)(text)`` in the main process, ``text`` being the worker's formatted traceback.
An error class that lists attributes in :attr:`GpuccError.portable` therefore carries them
in a note (``gpucc error state <Class> <JSON>``, visible in tracebacks), and constructing
that class from a text that holds such a note restores them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

__all__ = [
    "CcModeError",
    "CollateralUnavailableError",
    "ConnectionFailedError",
    "EnvironmentProblemError",
    "ExposedKeyFileError",
    "FileAccessError",
    "GpuccError",
    "HttpStatusError",
    "IntegrityError",
    "KeyFileError",
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
    "SimulationRootsMissingError",
    "RimNotFoundError",
    "ServiceAccessDeniedError",
    "UnsupportedFormatError",
    "UsageError",
    "WrongKeyError",
]


_STATE = "gpucc error state "


def _encode(value: Any) -> Any:
    if isinstance(value, Path):
        return {"path": str(value)}
    if isinstance(value, tuple):
        return {"tuple": [_encode(v) for v in value]}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"{type(value).__name__} is not portable")


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if "path" in value:
            return Path(value["path"])
        return tuple(_decode(v) for v in value["tuple"])
    return value


def _state_note(error: GpuccError) -> str:
    state = {}
    for name in type(error).portable:
        try:
            state[name] = _encode(getattr(error, name))
        except (AttributeError, TypeError):
            continue
    return _STATE + type(error).__name__ + " " + json.dumps(state, separators=(",", ":"))


def _state_from(cls: type, text: str) -> dict[str, Any] | None:
    """The attributes the last state note for ``cls`` in ``text`` carries, if any."""
    head = f"{_STATE}{cls.__name__} "
    for line in reversed(text.splitlines()):
        if line.startswith(head):
            try:
                state = json.loads(line[len(head) :])
                return {str(k): _decode(v) for k, v in state.items()}
            except (ValueError, KeyError, TypeError, AttributeError):
                return None
    return None


def _restore(cls: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    """An error of ``cls`` with ``args`` and attributes ``state``, without its constructor."""
    error = cls.__new__(cls, *args)
    error.__dict__.update(state)
    return error


class _ErrorType(type):
    """Constructs gpucc errors: notes their portable state, restores it from such a note."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and isinstance(args[0], str):
            state = _state_from(cls, args[0]) if getattr(cls, "portable", ()) else None
            if state is not None:
                error = _restore(cls, args, state)  # type: ignore[arg-type]
                error.add_note(_state_note(error))
                return error
        error = super().__call__(*args, **kwargs)
        if getattr(cls, "portable", ()):
            error.add_note(_state_note(error))
        return error


class GpuccError(Exception, metaclass=_ErrorType):
    """Base of every error gpucc raises on purpose."""

    hint: str = ""
    #: What the failed step was for, where the code that knows says so ("cvm": the CVM's
    #: collateral; "remote": a remote verifier): front ends pick their remedy by it.
    subject: str = ""
    #: Attributes carried across a DataLoader worker boundary (see the module documentation).
    portable: ClassVar[tuple[str, ...]] = ()

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle the arguments and attributes; unpickling does not call the constructor."""
        return (_restore, (type(self), self.args, dict(self.__dict__)))

    def diagnostics(self) -> str:
        """One line for people: the message, then the hint when there is one."""
        msg = str(self) or self.__class__.__name__
        msg = " ".join(msg.split())
        return f"{msg} ({self.hint})" if self.hint else msg


class UsageError(GpuccError):
    """The request itself is inconsistent (conflicting or missing options)."""


class NotTrustedError(GpuccError):
    """Evidence was evaluated and did not satisfy the verification or policy."""


# --- malformed input ------------------------------------------------


class MalformedInputError(GpuccError):
    """Input cannot be parsed or evaluated."""


class MalformedReportError(MalformedInputError):
    """The SPDM attestation report violates its layout."""


class UnsupportedFormatError(MalformedReportError):
    """The input is in a format (or a version of one) gpucc does not read yet.

    Not a statement that the evidence is bad: genuine evidence from newer firmware lands
    here. It exits like malformed input (the verdict cannot be formed) but says
    "unsupported" and names the version.
    """


class MalformedEvidenceError(MalformedInputError):
    """An evidence file (JSON, hex, PEM) cannot be read."""


class MalformedCertificateError(MalformedInputError):
    """A certificate or certificate bundle cannot be parsed."""


class MalformedRimError(MalformedInputError):
    """A reference integrity manifest cannot be parsed."""


class KeyFileError(MalformedInputError):
    """A key file is malformed or has permissions that expose it."""


class MalformedPolicyError(MalformedInputError):
    """A policy file has unknown keys, wrong types or is not YAML."""


# --- collateral -----------------------------------------------------


class CollateralUnavailableError(GpuccError):
    """Collateral needed for a decision could not be obtained.

    This is never a statement about the GPU: the evidence may be perfectly good.
    """


class NetworkError(CollateralUnavailableError):
    """A collateral service could not be reached or answered badly."""


class ConnectionFailedError(NetworkError):
    """No connection to a service: refused, a name not known, or TLS failed; the message
    names the cause (the command line reports it under a kind of its own)."""


class HttpStatusError(NetworkError):
    """The service answered with an HTTP status the caller did not accept.

    Attributes:
        status: the HTTP status code.
    """

    portable = ("status",)

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


class ServiceAccessDeniedError(HttpStatusError):
    """The service refused access (HTTP 401/403)."""

    hint = "the deployment may need an NVIDIA attestation service key"


class SimulationRootsMissingError(CollateralUnavailableError):
    """A simulation directory holds no roots for the evidence at hand: the simulation that
    made the evidence is another one, or has not made such a part yet. Nothing is fetched, so
    connectivity is never the remedy."""


class OfflineError(CollateralUnavailableError):
    """Network use was needed while running with --offline."""


class RimNotFoundError(CollateralUnavailableError):
    """The RIM service has not published the reference manifest asked for."""

    hint = "NVIDIA has not published this RIM yet; try again later"
    portable = ("rim_id",)

    def __init__(self, rim_id: str, detail: str = "") -> None:
        self.rim_id = rim_id
        text = f"RIM {rim_id} is not available"
        super().__init__(f"{text}: {detail}" if detail else text)


# --- environment ----------------------------------------------------


class EnvironmentProblemError(GpuccError):
    """The local machine cannot do what was asked (no GPU, NVML, CuPy)."""


class NvmlUnavailableError(EnvironmentProblemError):
    """NVML (the NVIDIA driver library) or a GPU is not available."""


class CcModeError(EnvironmentProblemError):
    """Confidential computing is off (or in a mode gpucc refuses) on this host."""


# --- integrity ------------------------------------------------------


class IntegrityError(GpuccError):
    """Authenticated data failed verification; nothing unverified was released."""


class WrongKeyError(GpuccError):
    """The key offered is not the one the data was sealed or released for."""


# --- files ------------------------------------------------------------------


class FileAccessError(GpuccError):
    """A file could not be read or written (missing, permissions, exists, disk full)."""


class ExposedKeyFileError(KeyFileError, FileAccessError):
    """A key file someone else can read or replace (group/other access, another owner).

    A key file problem, and a file access problem: its permissions, not its contents, are
    wrong (the command line reports it like every other file access problem).
    """
