"""``gpucc attest`` and ``gpucc evidence collect``."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from .options import (
    AtOption,
    CacheDirOption,
    CollateralOption,
    FormatOption,
    NoCacheOption,
    NoOcspNonceOption,
    OcspUrlOption,
    OfflineOption,
    OutputFormat,
    PolicyOption,
    RimDirOption,
    RimUrlOption,
    ServiceKeyOption,
    TimeoutOption,
    parse_time,
)

if TYPE_CHECKING:
    from gpucc.gpuattest.collateral import OcspChecker, RimSource
    from gpucc.gpuattest.evidence import EvidenceSet
    from gpucc.gpuattest.netconfig import NetworkSettings

evidence_app = typer.Typer(
    help="Collect GPU evidence.", no_args_is_help=True, pretty_exceptions_show_locals=False
)

# The bundled sample (NVIDIA's set A, driver 545.00) and its nonce.
SAMPLE_NONCE = "4cff7f5380ead8fad8ec2c531c110aca4302a88f603792801a8ca29ee151af2e"

ExistingFile = Annotated[
    Path | None, typer.Option(exists=True, dir_okay=False, readable=True, resolve_path=False)
]


def _sample_paths() -> tuple[Path, Path, Path, Path]:
    from importlib import resources

    base = resources.files("gpucc.gpuattest._samples")
    names = (
        "attestation-report.hex",
        "cert-chain.pem",
        "driver-rim-545.00.swidtag",
        "vbios-rim-1010_0200_882_96005E0001-test.swidtag",
    )
    paths = tuple(Path(str(base.joinpath(n))) for n in names)
    return paths[0], paths[1], paths[2], paths[3]


def load_evidence(evidence: Path, cert_chain: Path | None) -> EvidenceSet:
    """Evidence JSON, or a raw report with its chain; says which option a raw report needs.

    Raises:
        MalformedEvidenceError: unreadable or malformed input.
    """
    from gpucc.gpuattest.errors import MalformedEvidenceError
    from gpucc.gpuattest.evidence import NotEvidenceJsonError, load_evidence_file

    try:
        return load_evidence_file(evidence, cert_chain)
    except NotEvidenceJsonError as exc:
        raise MalformedEvidenceError(
            f"{exc}; for a raw report also pass --cert-chain FILE"
        ) from None


def _rim_source(
    rim_dir: Path | None, driver_rim: Path | None, vbios_rim: Path | None
) -> list[RimSource]:
    from gpucc.gpuattest.collateral import DirectoryRimSource, FileRimSource

    sources: list[RimSource] = []
    if driver_rim or vbios_rim:
        sources.append(FileRimSource(driver=driver_rim, vbios=vbios_rim))
    if rim_dir:
        sources.append(DirectoryRimSource(rim_dir))
    return sources


def _collateral(
    file_sources: list[RimSource], settings: NetworkSettings
) -> tuple[RimSource, OcspChecker]:
    """Local files first, then the network/cache/bundle layer."""
    from gpucc.gpuattest.collateral import CompositeRimSource
    from gpucc.gpuattest.netconfig import build_collateral

    net_rims, ocsp = build_collateral(settings)
    return CompositeRimSource([*file_sources, net_rims]), ocsp


def attest(
    evidence: Annotated[
        Path | None,
        typer.Option(
            "--evidence",
            envvar="GPUCC_EVIDENCE",
            exists=True,
            dir_okay=False,
            help="Evidence JSON (nvattest format), or a raw report with --cert-chain. "
            "Without it, evidence is collected from the local GPUs.",
        ),
    ] = None,
    cert_chain: Annotated[
        Path | None,
        typer.Option(
            "--cert-chain",
            envvar="GPUCC_CERT_CHAIN",
            exists=True,
            dir_okay=False,
            help="PEM chain for a raw report given with --evidence.",
        ),
    ] = None,
    nonce: Annotated[
        str | None,
        typer.Option(
            "--nonce",
            envvar="GPUCC_NONCE",
            help="Expected nonce (64 hex). Required by the default policy for file evidence.",
        ),
    ] = None,
    rim_dir: RimDirOption = None,
    driver_rim: Annotated[
        Path | None,
        typer.Option("--driver-rim", envvar="GPUCC_DRIVER_RIM", exists=True, dir_okay=False),
    ] = None,
    vbios_rim: Annotated[
        Path | None,
        typer.Option("--vbios-rim", envvar="GPUCC_VBIOS_RIM", exists=True, dir_okay=False),
    ] = None,
    policy: PolicyOption = None,
    at: AtOption = None,
    output: FormatOption = OutputFormat.TEXT,
    sample: Annotated[
        bool,
        typer.Option(
            "--sample",
            help="Verify the bundled NVIDIA H100 sample (set A, driver 545.00) with its RIMs "
            "and nonce.",
        ),
    ] = False,
    rim_url: RimUrlOption = None,
    ocsp_url: OcspUrlOption = None,
    service_key: ServiceKeyOption = None,
    no_ocsp_nonce: NoOcspNonceOption = False,
    cache_dir: CacheDirOption = None,
    no_cache: NoCacheOption = False,
    collateral: CollateralOption = None,
    offline: OfflineOption = False,
    timeout: TimeoutOption = 10.0,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Verify GPU attestation evidence and print a verdict.

    Exit codes: 0 trusted, 1 not trusted, 2 usage, 3 collateral missing,
    4 malformed input, 5 environment (no GPU/NVML, CC off).
    """
    from rich.console import Console

    from gpucc.gpuattest.errors import UsageError
    from gpucc.gpuattest.evidence import load_raw_evidence, parse_nonce_hex
    from gpucc.gpuattest.policy import Policy, load_policy, parse_policy
    from gpucc.gpuattest.trust import TrustRoots
    from gpucc.gpuattest.verifier import verify

    from .render import render_json, render_text, verdict_exit_code

    now = parse_time(at)
    pol: Policy = load_policy(policy) if policy else Policy()
    ev: EvidenceSet
    if sample:
        if evidence or cert_chain:
            raise UsageError("--sample cannot be combined with --evidence/--cert-chain")
        report, chain, d_rim, v_rim = _sample_paths()
        ev = load_raw_evidence(report, chain)
        driver_rim = driver_rim or d_rim
        vbios_rim = vbios_rim or v_rim
        nonce = nonce or SAMPLE_NONCE
        if policy is None:
            pol = parse_policy(
                {"ocsp": {"require": False}},
                source="sample default: OCSP not required (NVIDIA publishes no stored "
                "responses for the sample)",
            )
    elif evidence is not None:
        ev = load_evidence(evidence, cert_chain)
    else:
        if cert_chain is not None:
            raise UsageError("--cert-chain needs --evidence REPORT")
        from gpucc.gpuattest.nvml import collect_evidence

        fresh = parse_nonce_hex(nonce) if nonce else os.urandom(32)
        ev = collect_evidence(fresh)
        nonce = fresh.hex()
    expected = parse_nonce_hex(nonce) if nonce else None
    roots = TrustRoots.nvidia()
    from gpucc.gpuattest.netconfig import NetworkSettings

    settings = NetworkSettings(
        rim_url=rim_url,
        ocsp_url=ocsp_url,
        service_key=service_key,
        ocsp_nonce=not no_ocsp_nonce,
        cache_dir=cache_dir,
        use_cache=not no_cache,
        bundle=collateral,
        offline=offline,
        timeout=timeout,
    )
    rims, ocsp = _collateral(_rim_source(rim_dir, driver_rim, vbios_rim), settings)
    result = verify(
        ev, expected_nonce=expected, roots=roots, now=now, rims=rims, ocsp=ocsp, policy=pol
    )
    if output is OutputFormat.JSON:
        sys.stdout.write(render_json(result) + "\n")
    else:
        render_text(result, Console(), verbose=verbose)
    raise typer.Exit(verdict_exit_code(result.verdict))


@evidence_app.command("collect")
def collect(
    output: Annotated[Path, typer.Option("-o", "--output", help="Evidence JSON to write.")],
    nonce: Annotated[
        str | None,
        typer.Option(
            "--nonce",
            help="32-byte nonce as 64 hex, chosen by the verifier (e.g. from 'gpucc session "
            "challenge'); random if omitted. 'gpucc attest' needs the same value as --nonce.",
        ),
    ] = None,
    fmt: FormatOption = OutputFormat.TEXT,
) -> None:
    """Collect evidence from the local GPUs (NVML) into an nvattest-format JSON file."""
    from rich.console import Console

    from gpucc.gpuattest.evidence import dump_evidence_json, parse_nonce_hex
    from gpucc.gpuattest.files import write_atomic
    from gpucc.gpuattest.nvml import collect_evidence

    from .output import emit

    value = parse_nonce_hex(nonce) if nonce else os.urandom(32)
    ev = collect_evidence(value)
    write_atomic(output, dump_evidence_json(ev))
    Console(stderr=True).print(
        f"gpucc: wrote evidence for {len(ev.gpus)} GPU(s) to {output}; nonce {value.hex()}",
        highlight=False,
    )
    if fmt is OutputFormat.JSON:
        emit(
            {
                "schema": "gpucc.evidence/v1",
                "output": str(output),
                "gpus": len(ev.gpus),
                "nonce": value.hex(),
            }
        )
