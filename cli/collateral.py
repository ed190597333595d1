"""``gpucc collateral fetch`` and ``gpucc collateral show``: bundles for offline verification."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated

import typer

from .options import (
    CacheDirOption,
    NoCacheOption,
    NoOcspNonceOption,
    OcspUrlOption,
    RimUrlOption,
    ServiceKeyOption,
    TimeoutOption,
)
from .safety_options import ForceOption, check_output, force_hint
from .terminal import safe_text

collateral_app = typer.Typer(
    help="Gather RIMs and OCSP responses into a bundle for verification without network.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


@collateral_app.command("fetch")
def fetch(
    evidence: Annotated[
        Path,
        typer.Option(
            "--evidence",
            envvar="GPUCC_EVIDENCE",
            exists=True,
            dir_okay=False,
            help="Evidence JSON (nvattest format), or a raw report with --cert-chain.",
        ),
    ],
    output: Annotated[
        Path, typer.Option("-o", "--output", dir_okay=False, help="Bundle file to write.")
    ],
    cert_chain: Annotated[
        Path | None,
        typer.Option(
            "--cert-chain", exists=True, dir_okay=False, help="PEM chain for a raw report."
        ),
    ] = None,
    rim_url: RimUrlOption = None,
    ocsp_url: OcspUrlOption = None,
    service_key: ServiceKeyOption = None,
    no_ocsp_nonce: NoOcspNonceOption = False,
    cache_dir: CacheDirOption = None,
    no_cache: NoCacheOption = False,
    timeout: TimeoutOption = 10.0,
    force: ForceOption = False,
) -> None:
    """Fetch every RIM and OCSP response the evidence needs and write them to one bundle.

    The bundle is written even when something is missing; the command then exits 3
    and lists what could not be obtained. An existing file is replaced only with --force.
    """
    from rich.console import Console

    from gpucc.gpuattest.bundle import collect_collateral, write_bundle
    from gpucc.gpuattest.chain import load_pem_chain
    from gpucc.gpuattest.collateral import OcspStatus
    from gpucc.gpuattest.errors import CollateralUnavailableError
    from gpucc.gpuattest.files import refuse_existing
    from gpucc.gpuattest.netconfig import NetworkSettings, build_fetcher, network_sources
    from gpucc.gpuattest.report import Architecture, AttestationReport
    from gpucc.gpuattest.trust import TrustRoots

    from .attest import load_evidence

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    check_output(output, evidence, cert_chain)
    with force_hint():
        refuse_existing(output, force=force)
    ev = load_evidence(evidence, cert_chain)
    chains = [load_pem_chain(gpu.cert_chain_pem) for gpu in ev.gpus]
    rim_ids: list[str] = []
    for gpu in ev.gpus:
        report = AttestationReport.parse(gpu.report)
        rim_ids += [report.driver_rim_id(Architecture.parse(gpu.arch)), report.vbios_rim_id()]

    settings = NetworkSettings(
        rim_url=rim_url,
        ocsp_url=ocsp_url,
        service_key=service_key,
        ocsp_nonce=not no_ocsp_nonce,
        cache_dir=cache_dir,
        use_cache=not no_cache,
        timeout=timeout,
    )
    fetcher = build_fetcher(settings)
    rims, ocsp = network_sources(settings, fetcher)
    with fetcher:
        result = collect_collateral(
            device_chains=chains,
            rim_ids=rim_ids,
            rim_source=rims,
            ocsp=ocsp,
            roots=TrustRoots.nvidia(),
            now=dt.datetime.now(dt.UTC),
        )
    with force_hint():
        write_bundle(result.bundle, output, force=force)

    bundle = result.bundle
    err.print(
        f"wrote {output}: {len(bundle.rims)} RIM(s), {len(bundle.ocsp)} OCSP response(s) "
        f"for {len(ev.gpus)} GPU(s)"
    )
    for rim_id in bundle.rims:
        err.print(f"  RIM  {safe_text(rim_id)}")
    for name, kind, outcome in result.outcomes:
        status = str(outcome.status)
        if outcome.status is OcspStatus.REVOKED and outcome.revocation_reason:
            status += f" ({outcome.revocation_reason})"
        err.print(f"  OCSP {kind:<10} {safe_text(name)}: {safe_text(status)}")
    for problem in result.problems:
        err.print(f"  missing: {safe_text(problem)}")
    if result.problems:
        raise CollateralUnavailableError(
            f"collateral incomplete: {len(result.problems)} item(s) could not be obtained; "
            f"{output} holds the rest"
        )


@collateral_app.command("show")
def show(
    bundle_path: Annotated[
        Path, typer.Argument(exists=True, dir_okay=False, help="Bundle file to describe.")
    ],
) -> None:
    """Describe a bundle: when it was made, which RIMs and OCSP responses it holds."""
    from cryptography.x509 import ocsp as x509_ocsp

    from gpucc.gpuattest.bundle import load_bundle

    bundle = load_bundle(bundle_path)
    typer.echo(f"created {bundle.created.isoformat()}")
    for rim_id, data in bundle.rims.items():
        typer.echo(f"RIM  {safe_text(rim_id)} ({len(data)} bytes)")
    for entry in bundle.ocsp:
        resp = x509_ocsp.load_der_ocsp_response(entry.response)
        window = ""
        if resp.response_status is x509_ocsp.OCSPResponseStatus.SUCCESSFUL:
            nxt = resp.next_update_utc
            window = f" thisUpdate {resp.this_update_utc.isoformat()}" + (
                f" nextUpdate {nxt.isoformat()}" if nxt else " (no nextUpdate)"
            )
        typer.echo(f"OCSP {safe_text(entry.subject)}{window}")
