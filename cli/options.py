"""Option parsing shared by commands: times, nonces, output formats."""

from __future__ import annotations

import datetime as dt
import enum
from pathlib import Path
from typing import Annotated

import typer

from gpucc.core.errors import UsageError


class OutputFormat(enum.StrEnum):
    """--format values."""

    TEXT = "text"
    JSON = "json"


class EvidenceFileFormat(enum.StrEnum):
    """--evidence-format values: what ``gpucc evidence collect`` writes."""

    NVAT = "nvat"
    CMW = "cmw"


FormatOption = Annotated[
    OutputFormat,
    typer.Option(
        "--format",
        "-f",
        envvar=["GPUCC_FORMAT", "NVAT_FORMAT"],
        case_sensitive=False,
        help="text, or json: one JSON document on stdout (the result, or the error); "
        "human text on stderr.",
        rich_help_panel="Output",
    ),
]


def parse_time(text: str | None) -> dt.datetime:
    """``--at``: ISO 8601 (``Z`` or offset; naive means UTC) or Unix seconds; None is now.

    Raises:
        UsageError: unparseable.
    """
    if text is None or text == "":
        return dt.datetime.now(dt.UTC)
    value = text.strip()
    if value.isdigit():
        return dt.datetime.fromtimestamp(int(value), dt.UTC)
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"--at {text!r} is not an ISO 8601 time or Unix seconds") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.astimezone(dt.UTC)


def parse_nonce(text: str) -> bytes:
    """``--nonce``: 64 hex characters. A bad value is a usage error (exit 2), as a bad
    ``--at`` is: the value of an option, not a malformed input file.

    Raises:
        UsageError: not 64 hex characters.
    """
    from gpucc.core.errors import MalformedEvidenceError
    from gpucc.gpuattest.evidence import parse_nonce_hex

    try:
        return parse_nonce_hex(text)
    except MalformedEvidenceError as exc:
        raise UsageError(f"--nonce: {exc}") from None


# --- network options shared by `attest` and `collateral fetch` ------------------------


RimUrlOption = Annotated[
    str | None,
    typer.Option(
        "--rim-url",
        rich_help_panel="Network",
        envvar=["GPUCC_RIM_URL", "NVAT_RIM_SERVICE_BASE_URL"],
        help="RIM service base URL (default NVIDIA's).",
    ),
]
OcspUrlOption = Annotated[
    str | None,
    typer.Option(
        "--ocsp-url",
        rich_help_panel="Network",
        envvar=["GPUCC_OCSP_URL", "NVAT_OCSP_BASE_URL"],
        help="OCSP responder URL (default NVIDIA's).",
    ),
]
ServiceKeyOption = Annotated[
    str | None,
    typer.Option(
        "--service-key",
        rich_help_panel="Network",
        envvar=["NV_ATTESTATION_SERVICE_KEY", "NVIDIA_ATTESTATION_SERVICE_KEY"],
        help="NVIDIA service key (prefer the environment variable: argv is visible).",
        show_default=False,
        show_envvar=False,
    ),
]
NoOcspNonceOption = Annotated[
    bool,
    typer.Option(
        "--no-ocsp-nonce",
        rich_help_panel="Network",
        help="Do not send OCSP nonces (caching proxies).",
    ),
]
CacheDirOption = Annotated[
    Path | None,
    typer.Option(
        "--cache-dir",
        rich_help_panel="Collateral",
        help="Collateral cache (default: the user cache directory).",
        envvar="GPUCC_CACHE_DIR",
        file_okay=False,
    ),
]
NoCacheOption = Annotated[
    bool,
    typer.Option(
        "--no-cache", rich_help_panel="Collateral", help="Neither read nor write the cache."
    ),
]
TimeoutOption = Annotated[
    float,
    typer.Option(
        "--timeout",
        rich_help_panel="Network",
        min=0.1,
        help="Network timeout per request, in seconds.",
    ),
]
DeadlineOption = Annotated[
    float,
    typer.Option(
        "--deadline",
        rich_help_panel="Network",
        min=0.1,
        envvar="GPUCC_DEADLINE",
        help="Longest one network request may take, from connecting to the last byte of the "
        "answer, retries and redirects included; seconds.",
    ),
]


# --- attestation options shared by `attest` and the session commands ------------------

RimDirOption = Annotated[
    Path | None,
    typer.Option(
        "--rim-dir",
        rich_help_panel="Collateral",
        envvar="GPUCC_RIM_DIR",
        exists=True,
        file_okay=False,
        help="Directory of <RIM_ID>.xml files (XML RIMs), and CoRIMs as <RIM_ID>.cbor, "
        ".corim or <RIM_ID>; each is read by its content.",
    ),
]
PolicyOption = Annotated[
    Path | None,
    typer.Option(
        "--policy",
        rich_help_panel="Policy and time",
        help="Appraisal policy (YAML); the strict default when omitted.",
        envvar="GPUCC_POLICY",
        exists=True,
        dir_okay=False,
    ),
]
CollateralOption = Annotated[
    Path | None,
    typer.Option(
        "--collateral",
        rich_help_panel="Collateral",
        envvar="GPUCC_COLLATERAL",
        exists=True,
        dir_okay=False,
        help="Collateral bundle from 'gpucc collateral fetch'.",
    ),
]
OfflineOption = Annotated[
    bool,
    typer.Option(
        "--offline",
        rich_help_panel="Collateral",
        envvar="GPUCC_OFFLINE",
        help="Never use the network.",
    ),
]
AtOption = Annotated[
    str | None,
    typer.Option(
        "--at",
        rich_help_panel="Policy and time",
        envvar="GPUCC_AT",
        help="Verify as of this time (ISO 8601 or Unix seconds).",
    ),
]
