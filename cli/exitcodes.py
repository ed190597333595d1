"""Exit statuses: the library's one outcome table (:mod:`gpucc.core.outcomes`), read here.

The libraries raise typed errors and return verdicts; only the command line turns them
into process exit statuses, a machine-readable ``kind`` and a hint that names the options
of the command that failed. The rows (``OK`` ... ``BROKEN_PIPE``, :data:`TABLE`) are the
library's, re-exported under their old names; README's exit-code table is checked against
:data:`TABLE`.
"""

from __future__ import annotations

import os

from gpucc.core.errors import SimulationRootsMissingError
from gpucc.core.outcomes import (
    AUTHENTICATION,
    BROKEN_PIPE,
    COLLATERAL,
    CONNECTION,
    ENVIRONMENT,
    FILE_ACCESS,
    INTERNAL,
    INTERRUPTED,
    MALFORMED,
    NOT_TRUSTED,
    OK,
    TABLE,
    USAGE,
    WRONG_KEY,
    Outcome,
    OutcomeTable,
)
from gpucc.gpuattest import errors
from gpucc.gpuattest.result import Verdict
from gpucc.staging.errors import GpuKernelError, GpuStagingUnavailableError

__all__ = [
    "AUTHENTICATION",
    "BROKEN_PIPE",
    "COLLATERAL",
    "CONNECTION",
    "ENVIRONMENT",
    "FILE_ACCESS",
    "FILE_SITUATIONS",
    "INTERNAL",
    "INTERRUPTED",
    "MALFORMED",
    "NOT_TRUSTED",
    "OK",
    "OUTCOMES",
    "SIGNAL_CODES",
    "TABLE",
    "USAGE",
    "WRONG_KEY",
    "Outcome",
    "cli_hint",
    "describe",
    "exit_codes_line",
    "exit_code_for",
    "outcome_for",
    "outcome_for_code",
    "signal_outcome",
    "verdict_outcome",
]


#: Exit statuses of the signals that stop a command (SIGINT, SIGTERM, SIGHUP): 128 + the
#: signal's number, the same in the JSON error document as in the process status.
SIGNAL_CODES: dict[str, int] = {"SIGINT": 130, "SIGTERM": 143, "SIGHUP": 129}

#: The file situations every command meets the same way, and their outcome: README's
#: "8: missing, exists, special, permissions", checked for every command by the tests.
FILE_SITUATIONS: dict[str, Outcome] = {
    "missing-input": FILE_ACCESS,  # an input file or directory that does not exist
    "input-is-directory": FILE_ACCESS,  # a directory where a file belongs, or the reverse
    "existing-output": FILE_ACCESS,  # an output that exists, without --force
    "exposed-key-file": FILE_ACCESS,  # a key file group or others can access, or not ours
}

_VERDICTS = {
    Verdict.TRUSTED: OK,
    Verdict.NOT_TRUSTED: NOT_TRUSTED,
    Verdict.UNDECIDED: COLLATERAL,
}

# Hints that name command-line options, by error family (most specific first) and by the
# commands that have those options (None: every command). The libraries' own hints never
# name options; these are appended by the CLI, and only for a command that accepts them.
_ATTESTING = frozenset({"attest", "session answer", "session local"})
_WITH_DEVICE = frozenset({"stage", "model digest", "model verify", "model sign"})
_NVML_HINT = "run on a host with an NVIDIA driver and the nvml extra (pip install 'gpucc[nvml]')"
_CVM = frozenset(f"{c} (cvm)" for c in _ATTESTING)
_REMOTE = frozenset({"attest (remote)"})
#: The commands that take --simulate DIR (and their CVM's and remote subjects).
_SIMULATING = frozenset(
    {"attest", "cvm pin", "holder serve", "session answer", "session local", "session offer"}
    | {"travel run", "attest (cvm)", "session offer (cvm)", "session local (cvm)"}
)
_HINTS: tuple[tuple[type[errors.GpuccError], frozenset[str] | None, str], ...] = (
    # Nothing is fetched for a simulation: connectivity is never its remedy.
    (
        SimulationRootsMissingError,
        _SIMULATING,
        "a simulation's roots are written by the side whose simulated GPU or CVM made the "
        "evidence: give every party the directory that side used (--simulate DIR)",
    ),
    # The CVM's collateral (Intel's for TDX, AMD's VCEK for SEV-SNP) is never in a bundle.
    (
        errors.OfflineError,
        _CVM,
        "a CVM's collateral is not in collateral bundles: give it with --cvm-collateral FILE, "
        "or run once online so the cache holds it",
    ),
    (
        errors.CollateralUnavailableError,
        frozenset({"attest (cvm)"}),
        "check connectivity to Intel's PCS, your PCCS (--cvm-pccs-url) or AMD's KDS, or give "
        "the CVM's collateral with --cvm-collateral FILE",
    ),
    (
        errors.CollateralUnavailableError,
        _CVM,
        "check connectivity to Intel's PCS or AMD's KDS, or give the CVM's collateral with "
        "--cvm-collateral FILE",
    ),
    # NRAS judges: a bundle does not replace it, and it cannot run offline.
    (
        errors.ServiceAccessDeniedError,
        _REMOTE,
        "pass --service-key or set NV_ATTESTATION_SERVICE_KEY",
    ),
    (
        errors.OfflineError,
        _REMOTE,
        "--verifier remote asks NVIDIA's attestation service: drop --offline, or verify "
        "locally with --verifier local, which takes --collateral bundle.json",
    ),
    (
        errors.CollateralUnavailableError,
        _REMOTE,
        "check connectivity to NVIDIA's attestation service, --nras-url and HTTPS_PROXY, "
        "or verify locally with --verifier local",
    ),
    (
        errors.ServiceAccessDeniedError,
        frozenset({"attest", "collateral fetch"}),
        "pass --service-key or set NV_ATTESTATION_SERVICE_KEY",
    ),
    (errors.NvmlUnavailableError, frozenset({"attest"}), _NVML_HINT + ", or pass --evidence FILE"),
    (
        errors.NvmlUnavailableError,
        frozenset({"session offer", "session local"}),
        _NVML_HINT + ", or try the protocol with --simulate DIR (a simulated GPU, never trusted)",
    ),
    (errors.NvmlUnavailableError, None, _NVML_HINT),
    (
        errors.OfflineError,
        _ATTESTING,
        "on a connected machine run 'gpucc collateral fetch --evidence FILE -o bundle.json', "
        "then pass --collateral bundle.json",
    ),
    (errors.RimNotFoundError, _ATTESTING, "or supply the RIM with --rim-dir DIR"),
    (
        errors.CollateralUnavailableError,
        _ATTESTING,
        "check connectivity, or use --collateral BUNDLE --offline",
    ),
    (
        errors.CollateralUnavailableError,
        frozenset({"collateral fetch"}),
        "check connectivity, HTTPS_PROXY, --rim-url and --ocsp-url, then run it again",
    ),
    (
        GpuKernelError,
        _WITH_DEVICE,
        "the GPU is present but its kernels failed to build or verify: check the CUDA "
        "driver and CuPy/NVRTC versions, or use --backend cpu",
    ),
    (
        GpuStagingUnavailableError,
        _WITH_DEVICE,
        "pip install 'gpucc[gpu]' on a host with a CUDA GPU, or use --backend cpu",
    ),
)


def exit_codes_line() -> str:
    """``Exit codes: 0 ok, 1 not-trusted, ...``: every status and its kind, for the ``--help``
    of a command whose own text lists none."""
    kinds: dict[int, list[str]] = {}
    for outcome in TABLE:
        kinds.setdefault(outcome.code, []).append(outcome.kind)
    listed = ", ".join(f"{code} {' or '.join(names)}" for code, names in kinds.items())
    return f"Exit codes: {listed} (README.md, Exit codes)."


def signal_outcome(signum: int) -> Outcome:
    """The row for a command stopped by signal ``signum``: kind ``interrupted``, status
    128 + ``signum`` (130 SIGINT, 143 SIGTERM, 129 SIGHUP)."""
    return Outcome(128 + signum, INTERRUPTED.kind, INTERRUPTED.meaning)


def outcome_for_code(code: int) -> Outcome:
    """The row of an exit status (signals map to ``interrupted``)."""
    for outcome in TABLE:
        if outcome.code == code:
            return outcome
    if code in SIGNAL_CODES.values():
        return signal_outcome(code - 128)
    return INTERNAL


#: The library's table, read by the holder service too.
OUTCOMES = OutcomeTable()


def outcome_for(exc: BaseException) -> Outcome:
    """The exit-status row for an error raised by the libraries (INTERNAL for anything else)."""
    return OUTCOMES.outcome_for(exc)


def exit_code_for(exc: BaseException) -> int:
    """The process exit status for ``exc``."""
    return outcome_for(exc).code


def verdict_outcome(verdict: Verdict) -> Outcome:
    """The exit-status row for an attestation verdict."""
    return _VERDICTS[verdict]


def cli_hint(exc: BaseException, command: str = "") -> str:
    """The option-naming hint for ``exc`` raised by ``command`` (e.g. ``session offer``).

    Only hints whose options ``command`` has; with no command, the first for the family.
    """
    if isinstance(exc, GpuKernelError) and getattr(exc, "stage", "") == "launch":
        if not command or command in _WITH_DEVICE:
            return _LAUNCH_FAULT
    subject = getattr(exc, "subject", "")
    if command and subject:  # a remedy for what failed, or none (never a wrong one)
        command = f"{command} ({subject})"
    matching = [
        (family, hint)
        for family, commands, hint in _HINTS
        if isinstance(exc, family) and (not command or commands is None or command in commands)
    ]
    # Without a command, a hint for a subject (the CVM's, NRAS's) is not a guess to make: the
    # first hint for the error's own class wins, then the first for a class it belongs to.
    if not command:
        unqualified = [(f, h) for f, c, h in _HINTS if c is None or not any("(" in x for x in c)]
        matching = [m for m in matching if m in unqualified] or matching
    exact = [hint for family, hint in matching if type(exc) is family]
    return exact[0] if exact else (matching[0][1] if matching else "")


#: A kernel that built and passed its known answers faulted on real work (its output is
#: zeroed): the device or the driver, not the build.
_LAUNCH_FAULT = (
    "a GPU kernel faulted on the data (its output was zeroed): check the GPU's health "
    "(nvidia-smi, Xid errors in the kernel log) and run again, or use --backend cpu"
)


def describe(exc: errors.GpuccError, command: str = "") -> tuple[str, str]:
    """(message, hint) for one line on stderr or the JSON error document."""
    message = " ".join((str(exc) or type(exc).__name__).split())
    path = getattr(exc, "path", None)  # the file an error about a file is about
    if isinstance(path, (str, os.PathLike)) and os.path.basename(str(path)) not in message:
        message = f"{'standard input' if str(path) == '-' else path}: {message}"
    hints = [h for h in (exc.hint, cli_hint(exc, command)) if h]
    return message, "; ".join(hints)
