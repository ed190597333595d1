"""``gpucc attest`` and ``gpucc evidence collect``."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpucc.core.errors import CollateralUnavailableError

from .attest_cvm import (
    CvmCollateralOption,
    CvmEventLogOption,
    CvmEvidenceOption,
    CvmKdsOption,
    CvmOnlyOption,
    CvmPccsOption,
    CvmReportDataOption,
    CvmSampleOption,
    bundled_cvm,
    cvm_report_data_value,
    read_cvm_event_log,
    read_cvm_evidence,
)
from .command import App, VerdictExit
from .options import (
    AtOption,
    CacheDirOption,
    CollateralOption,
    DeadlineOption,
    EvidenceFileFormat,
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
    parse_nonce,
    parse_time,
)
from .render import counted
from .safety_options import ForceOption, force_hint

if TYPE_CHECKING:
    from gpucc.assembly import PlatformResult
    from gpucc.gpuattest.evidence import EvidenceSet
    from gpucc.gpuattest.netconfig import NetworkSettings
    from gpucc.gpuattest.policy import Policy

evidence_app = App(
    group="evidence",
    help="Collect GPU evidence.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


ExistingFile = Annotated[
    Path | None, typer.Option(exists=True, dir_okay=False, readable=True, resolve_path=False)
]


class Device(enum.StrEnum):
    """--device values (nvattest's)."""

    GPU = "gpu"
    NVSWITCH = "nvswitch"


class Verifier(enum.StrEnum):
    """--verifier values."""

    LOCAL = "local"
    REMOTE = "remote"


def load_evidence(evidence: Path, cert_chain: Path | None, arch: str | None = None) -> EvidenceSet:
    """Evidence JSON, or a raw report with its chain (``arch``: the raw report's device;
    None: read from its leaf certificate); says which option a raw report needs.

    Raises:
        MalformedEvidenceError: unreadable or malformed input.
    """
    from gpucc.core.errors import MalformedEvidenceError
    from gpucc.gpuattest.evidence import NotEvidenceJsonError, load_evidence_file

    try:
        return load_evidence_file(evidence, cert_chain, arch=arch)
    except NotEvidenceJsonError as exc:
        raise MalformedEvidenceError(
            f"{exc}; for a raw report also pass --cert-chain FILE"
        ) from None


def attest(
    evidence: Annotated[
        Path | None,
        typer.Option(
            "--evidence",
            "--gpu-evidence-file",
            rich_help_panel="Evidence",
            envvar="GPUCC_EVIDENCE",
            exists=True,
            dir_okay=False,
            help="Evidence JSON (nvattest format), or a raw report with --cert-chain. "
            "Without it, evidence is collected from the local GPUs. "
            "--gpu-evidence-file is nvattest's name for it.",
        ),
    ] = None,
    cert_chain: Annotated[
        Path | None,
        typer.Option(
            "--cert-chain",
            rich_help_panel="Evidence",
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
            rich_help_panel="Evidence",
            envvar="GPUCC_NONCE",
            help="Expected nonce (64 hex). Required by the default policy for file evidence.",
        ),
    ] = None,
    rim_dir: RimDirOption = None,
    driver_rim: Annotated[
        Path | None,
        typer.Option(
            "--driver-rim",
            rich_help_panel="Collateral",
            help="The driver RIM (SWID XML, or a CoRIM: read by its content) to use instead "
            "of fetching it.",
            envvar="GPUCC_DRIVER_RIM",
            exists=True,
            dir_okay=False,
        ),
    ] = None,
    vbios_rim: Annotated[
        Path | None,
        typer.Option(
            "--vbios-rim",
            rich_help_panel="Collateral",
            help="The VBIOS RIM (SWID XML, or a CoRIM: read by its content) to use instead "
            "of fetching it.",
            envvar="GPUCC_VBIOS_RIM",
            exists=True,
            dir_okay=False,
        ),
    ] = None,
    policy: PolicyOption = None,
    at: AtOption = None,
    output: FormatOption = OutputFormat.TEXT,
    sample: Annotated[
        bool,
        typer.Option(
            "--sample",
            rich_help_panel="Evidence",
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
    deadline: DeadlineOption = 60.0,
    verifier: Annotated[
        Verifier,
        typer.Option(
            "--verifier",
            envvar="GPUCC_VERIFIER",
            help="local: gpucc checks everything itself; remote: NVIDIA's attestation "
            "service (NRAS) judges and gpucc checks its signed answer.",
            rich_help_panel="Remote verification and signed results",
        ),
    ] = Verifier.LOCAL,
    nras_url: Annotated[
        str | None,
        typer.Option(
            "--nras-url",
            help="NRAS base URL (default NVIDIA's; env NVAT_NRAS_BASE_URL).",
            rich_help_panel="Remote verification and signed results",
        ),
    ] = None,
    nras_allow_origin: Annotated[
        list[str] | None,
        typer.Option(
            "--nras-allow-origin",
            metavar="ORIGIN",
            envvar="GPUCC_NRAS_ALLOW_ORIGIN",
            help="Let NRAS or its key set redirect to this origin (https://host[:port]); "
            "repeatable. Otherwise only the NRAS URL's own origin may answer.",
            rich_help_panel="Remote verification and signed results",
        ),
    ] = None,
    sign_eat: Annotated[
        Path | None,
        typer.Option(
            "--sign-eat",
            exists=True,
            dir_okay=False,
            help="Sign the verified result as an EAT (ES384) with this P-384 key (PEM, 0600).",
            rich_help_panel="Remote verification and signed results",
        ),
    ] = None,
    token_output: Annotated[
        Path | None,
        typer.Option(
            "-o",
            "--output",
            dir_okay=False,
            help="Where --sign-eat writes the signed result (detached EAT JSON).",
            rich_help_panel="Remote verification and signed results",
        ),
    ] = None,
    ear_out: Annotated[
        Path | None,
        typer.Option(
            "--ear-out",
            dir_okay=False,
            help="Also write the verdict as a signed EAR (IETF RATS attestation result, "
            "ES384 JWT) to FILE: one submodule per GPU, NVSwitch and the CVM. Needs --ear-key.",
            rich_help_panel="Remote verification and signed results",
        ),
    ] = None,
    ear_key: Annotated[
        Path | None,
        typer.Option(
            "--ear-key",
            exists=True,
            dir_okay=False,
            help="The P-384 private key (PEM, 0600) that signs --ear-out.",
            rich_help_panel="Remote verification and signed results",
        ),
    ] = None,
    force: ForceOption = False,
    cvm_evidence: CvmEvidenceOption = None,
    cvm_collateral: CvmCollateralOption = None,
    cvm_report_data: CvmReportDataOption = None,
    cvm_only_: CvmOnlyOption = False,
    cvm_pccs_url: CvmPccsOption = None,
    cvm_kds_url: CvmKdsOption = None,
    cvm_sample: CvmSampleOption = None,
    device: Annotated[
        Device,
        typer.Option(
            "--device",
            "-d",
            rich_help_panel="Evidence",
            help="Which device the evidence is from (nvattest's flag): gpu, or nvswitch "
            "(NVSwitch LS10 evidence). A raw report's device is read from its chain's leaf.",
        ),
    ] = Device.GPU,
    switch_evidence: Annotated[
        Path | None,
        typer.Option(
            "--nvswitch-evidence-file",
            "--switch-evidence",
            rich_help_panel="Evidence",
            exists=True,
            dir_okay=False,
            help="NVSwitch evidence JSON to verify beside the GPUs' (for --ppcie); switch "
            "entries (arch LS10) inside --evidence are read too.",
        ),
    ] = None,
    ppcie: Annotated[
        bool,
        typer.Option(
            "--ppcie",
            rich_help_panel="Evidence",
            help="Protected PCIe: the GPUs and NVSwitches are one machine, trusted only if "
            "every device is and the topology holds (the policy's topology: section gives "
            "the board's counts; 8 GPUs and 4 switches by default).",
        ),
    ] = False,
    simulate: Annotated[
        Path | None,
        typer.Option(
            "--simulate",
            file_okay=False,
            exists=True,
            metavar="DIR",
            rich_help_panel="Simulation (no GPU; never for production)",
            help="Trust a SIMULATION's self-made roots and RIMs from DIR instead of NVIDIA's. "
            "It attests nothing real; never use it in production.",
        ),
    ] = None,
    cvm_event_log: CvmEventLogOption = None,
    record_gpus: Annotated[
        bool,
        typer.Option(
            "--record-gpus",
            rich_help_panel="Confidential VM",
            help="Inside a TDX guest: when the GPUs are trusted, record them (their leaf "
            "certificate serials and the evidence's SHA-256) as events in RTMR3 and in the "
            "TD's runtime event log, so that later quotes commit to them; a policy's "
            "cvm.events can require it. Under a paravisor (Azure): extend vTPM PCR 23 with "
            "the serials, which cvm.pcrs can pin (docs/CVM.md, GPUs bound to this CVM).",
        ),
    ] = False,
    record_tcti: Annotated[
        str | None,
        typer.Option(
            "--record-tpm-tcti",
            rich_help_panel="Confidential VM",
            help="Under a paravisor (Azure): the vTPM's TCTI --record-gpus extends PCR 23 "
            "through (default device:/dev/tpmrm0).",
        ),
    ] = None,
    tdx_measurements: Annotated[
        Path | None, typer.Option("--tdx-measurements", hidden=True, file_okay=False)
    ] = None,
    runtime_log: Annotated[
        Path | None, typer.Option("--runtime-log", hidden=True, dir_okay=False)
    ] = None,
) -> None:
    """Verify GPU attestation evidence (and a confidential VM's) and print a verdict.

    Exit codes: 0 trusted (verdict line TRUSTED), 1 not trusted (REFUSED), 2 usage,
    3 collateral missing (UNDECIDED) or a service unreachable, 4 malformed input,
    5 environment (no GPU/NVML, CC off), 8 a file cannot be read or written.
    """
    from gpucc.assembly import PlatformEvidence, PlatformVerifier, Settings, select_policy
    from gpucc.core.errors import UsageError

    from .invocation import current
    from .render import verdict_exit_code

    verbose = current().verbosity >= 1  # -v (every command's option): values in full
    at_origin = "--at or GPUCC_AT" if at else ""
    cvm_bundle = None
    if cvm_sample is not None:
        others = {
            "--cvm-evidence": cvm_evidence,
            "--cvm-collateral": cvm_collateral,
            "--cvm-report-data": cvm_report_data,
            "--cvm-pccs-url": cvm_pccs_url,
            "--cvm-event-log": cvm_event_log,
        }
        given = [name for name, value in others.items() if value is not None]
        cvm_bundle = bundled_cvm(cvm_sample, given=given, gpu_sample=sample)
        cvm_only_ = cvm_only_ or not (sample or evidence)
        if at is None:
            at, at_origin = cvm_bundle.at, f"the bundled CVM sample's time ({cvm_sample.value})"
    if sample and at is None:
        from gpucc.gpuattest.samples import SAMPLE_VALID_AT

        at = SAMPLE_VALID_AT.isoformat().replace("+00:00", "Z")
        at_origin = "the bundled sample's time"
        from .output import note

        note(
            f"--sample: verifying as of {at}, when the sample's RIM signers were valid "
            "(give --at to choose another time)"
        )
    now = parse_time(at)
    sample_pol: Policy | None = None  # NVIDIA's sample is verified under its own policy
    ev: EvidenceSet | None = None
    if (sign_eat is None) != (token_output is None):
        raise UsageError("--sign-eat KEY and -o FILE go together")
    if (ear_out is None) != (ear_key is None):
        raise UsageError("--ear-out FILE and --ear-key KEY go together")
    if ear_out is not None and verifier is Verifier.REMOTE:
        raise UsageError("--ear-out signs a local verification: drop --verifier remote")
    if sign_eat is not None and verifier is Verifier.REMOTE:
        raise UsageError("--sign-eat signs a local verification; NRAS's tokens are already signed")
    has_cvm = cvm_evidence is not None or cvm_bundle is not None
    if has_cvm and (sign_eat is not None or verifier is Verifier.REMOTE):
        raise UsageError(
            "CVM evidence (--cvm-evidence, --cvm-sample) is verified locally only: drop "
            "--sign-eat/--verifier"
        )
    if cvm_only_ and (evidence or cert_chain or sample):
        raise UsageError("--cvm-only verifies --cvm-evidence alone: drop the GPU evidence")
    if not has_cvm and (
        cvm_only_ or cvm_collateral or cvm_report_data or cvm_pccs_url or cvm_event_log
    ):
        raise UsageError(
            "--cvm-only, --cvm-collateral, --cvm-report-data, --cvm-pccs-url, --cvm-event-log "
            "need --cvm-evidence"
        )
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
        deadline=deadline,
        kds_url=cvm_kds_url,
    )
    cvm = read_cvm_evidence(cvm_evidence, cvm_collateral) if cvm_evidence is not None else None
    if cvm_bundle is not None:
        cvm = (cvm_bundle.evidence, cvm_bundle.collateral)
    if sample:
        if evidence or cert_chain:
            raise UsageError("--sample cannot be combined with --evidence/--cert-chain")
        from gpucc.gpuattest.samples import nvidia_h100_sample, sample_policy

        bundled = nvidia_h100_sample()
        ev = bundled.evidence
        driver_rim = driver_rim or bundled.driver_rim_path
        vbios_rim = vbios_rim or bundled.vbios_rim_path
        nonce = nonce or bundled.nonce.hex()
        sample_pol = sample_policy()
    elif evidence is not None:
        ev = load_evidence(evidence, cert_chain)
    elif device is Device.NVSWITCH or ppcie:
        from gpucc.core.errors import EnvironmentProblemError

        raise EnvironmentProblemError(
            "collecting NVSwitch evidence here needs NVIDIA's NSCQ library, which gpucc does "
            "not drive; collect it with nvattest and give --evidence FILE"
        )
    elif not cvm_only_:
        if cert_chain is not None:
            raise UsageError("--cert-chain needs --evidence REPORT")
        from gpucc.assembly import sources

        fresh = parse_nonce(nonce) if nonce else os.urandom(32)
        ev = sources.open_source().gpu_evidence(fresh)
        nonce = fresh.hex()
    expected = parse_nonce(nonce) if nonce and not cvm_only_ else None
    ev, switches = _devices(ev, switch_evidence, device=device, ppcie=ppcie)
    pol = select_policy(policy, simulation=simulate is not None, default=sample_pol)
    if ppcie:
        from gpucc.gpuattest.topology import TopologyPolicy

        topo = pol.topology
        pol = dataclasses.replace(pol, topology=TopologyPolicy(True, topo.gpus, topo.switches))
    if switches is not None and (verifier is Verifier.REMOTE or sign_eat is not None):
        raise UsageError("NVSwitch evidence is verified locally only: drop --sign-eat/--verifier")
    if verifier is Verifier.REMOTE and ev is not None:
        _attest_remote(
            ev,
            expected,
            settings,
            nras_url=nras_url,
            origins=nras_allow_origin or [],
            now=now,
            output=output,
        )
    platform = PlatformVerifier(
        Settings(
            policy=pol,
            network=settings,
            rim_dir=rim_dir,
            driver_rim=driver_rim,
            vbios_rim=vbios_rim,
            cvm_collateral=cvm[1] if cvm is not None else None,
            pccs_url=cvm_pccs_url,
            at=now if at else None,
            at_origin=at_origin,
            simulation=simulate,
        )
    )
    try:
        result = platform.verify(
            PlatformEvidence(
                gpus=ev,
                cvm=cvm[0] if cvm is not None else None,
                cvm_event_log=read_cvm_event_log(cvm_event_log),
                switches=switches,
            ),
            nonce=expected,
            cvm_report_data=cvm_bundle.report_data
            if cvm_bundle is not None
            else cvm_report_data_value(cvm_report_data, cvm[0] if cvm else None),
        )
    except CollateralUnavailableError as exc:
        if cvm is not None and cvm[1] is None and not exc.subject:
            exc.subject = "cvm"  # the CVM's evidence is judged with the GPUs'
        raise
    if record_gpus:
        _record_gpus(
            result, ev, measurements=tdx_measurements, runtime_log=runtime_log, tcti=record_tcti
        )
    _print(result, output=output, verbose=verbose)
    if cvm is not None and cvm[1] is None and result.cvm is not None and result.cvm.undecided:
        from gpucc.core.errors import OfflineError

        from .exitcodes import cli_hint
        from .output import note

        # The remedy for this machine's case, from the one table of hints (never a bundle).
        missing: CollateralUnavailableError = (
            OfflineError("offline") if offline else CollateralUnavailableError("unreachable")
        )
        missing.subject = "cvm"
        note(f"the CVM's collateral is missing: {cli_hint(missing, 'attest')}")
    if output is not OutputFormat.JSON:  # JSON carries it as trusted_with and reasons
        _explain(result)
    if sign_eat is not None and token_output is not None and result.gpu is not None:
        from .attest_remote import sign_result

        kid, path = sign_result(result.gpu, sign_eat, token_output, force=force)
        from .output import note

        note(f"signed result (key {kid}) written to {path}")
    if ear_out is not None and ear_key is not None:
        from .attest_remote import sign_ear_result
        from .output import note

        kid, path = sign_ear_result(result, ear_key, ear_out, force=force)
        note(f"EAR (key {kid}) written to {path}")
    raise VerdictExit(verdict_exit_code(result.verdict))


def _explain(result: PlatformResult) -> None:
    """The verdict's account on stderr (nothing with ``-q``): what a trusted verdict was
    trusted with, or every reason that refused it or left it undecided. Simulated roots
    are said even with ``-q``: such a verdict attests nothing real."""
    from .output import note, warn

    record = result.record
    if record.simulated:
        warn("SIMULATED roots: this verdict attests nothing real")
    if result.trusted:
        note(f"trusted with: {record.summary()}")
        return
    what = "refused by" if str(result.verdict) == "not-trusted" else "undecided because of"
    for reason in result.reasons:
        note(f"{what}: {reason}")


def _record_gpus(
    result: PlatformResult,
    ev: EvidenceSet | None,
    *,
    measurements: Path | None,
    runtime_log: Path | None,
    tcti: str | None,
) -> None:
    """``--record-gpus``: the trusted GPUs' identities and the evidence's digest into RTMR3
    (:mod:`gpucc.gpuattest.cvm.gpu_event`); nothing is recorded for any other verdict.

    Raises:
        UsageError: no GPU evidence was verified.
        EnvironmentProblemError: not a TD that can extend RTMR3, or the log cannot be written.
    """
    import hashlib

    from gpucc.assembly.sources import RUNTIME_LOG_PATH
    from gpucc.core.errors import UsageError
    from gpucc.gpuattest.cvm.gpu_event import TDX_MEASUREMENTS, record_gpu_verdict
    from gpucc.gpuattest.evidence import dump_evidence_json

    from .output import note

    if ev is None or result.gpu is None:
        raise UsageError("--record-gpus records verified GPUs: give GPU evidence")
    if not result.trusted:
        note("the GPUs are not trusted: nothing recorded in RTMR3")
        return
    devices = [str(g.claims.get("ueid")) for g in result.gpu.gpus]
    digest = hashlib.sha256(dump_evidence_json(ev)).digest()
    registers = measurements or TDX_MEASUREMENTS
    if not (registers / "rtmr3:sha384").exists():
        from gpucc.gpuattest.cvm.gpu_event import GPU_PCR, record_gpu_verdict_vtpm
        from gpucc.gpuattest.cvm.vtpm_collect import DEFAULT_TCTI, paravisor_present

        if paravisor_present(tcti or DEFAULT_TCTI):
            record_gpu_verdict_vtpm(devices, tcti=tcti or DEFAULT_TCTI)
            note(f"recorded in vTPM PCR {GPU_PCR}: GPUs {', '.join(devices)}")
            return
    log = runtime_log or RUNTIME_LOG_PATH
    record_gpu_verdict(devices, digest, runtime_log=log, measurements=registers)
    note(f"recorded in RTMR3 and {log}: GPUs {', '.join(devices)}, evidence sha256 {digest.hex()}")


def _devices(
    ev: EvidenceSet | None, switch_file: Path | None, *, device: Device, ppcie: bool
) -> tuple[EvidenceSet | None, EvidenceSet | None]:
    """The GPUs' and the switches' evidence; evidence of the wrong device is a usage error.

    Raises:
        UsageError: switch evidence without --device nvswitch or --ppcie, or GPU evidence
            with --device nvswitch.
    """
    from gpucc.assembly.parts import split_devices
    from gpucc.core.errors import UsageError

    extra = None
    if switch_file is not None:
        more, extra = split_devices(load_evidence(switch_file, None), None)
        if more is not None:
            raise UsageError(f"{switch_file} holds GPU evidence, not NVSwitch evidence")
    gpus, switches = split_devices(ev, extra)
    if ppcie:
        return gpus, switches
    if device is Device.NVSWITCH:
        if gpus is not None:
            arch = gpus.gpus[0].arch
            raise UsageError(
                f"--device nvswitch, but the evidence is a GPU's (arch {arch}); "
                "drop --device nvswitch, or pass --ppcie for GPUs and switches together"
            )
        return None, switches
    if switches is not None:
        raise UsageError(
            "the evidence is an NVSwitch's (arch LS10): pass --device nvswitch, or --ppcie "
            "for GPUs and switches together"
        )
    return gpus, None


def _print(result: PlatformResult, *, output: OutputFormat, verbose: bool) -> None:
    """Print a result: its JSON document, or the text report (Rich's console only for a
    terminal or a composite result: it costs more to import than verifying)."""
    from .output import console, emit
    from .plain import is_terminal, render_plain
    from .render import attest_document, render_text

    if output is OutputFormat.JSON:
        emit(attest_document(result))
    elif (
        is_terminal(sys.stdout)
        or any(p.kind.name != "gpu" for p in result.parts)  # the plain writer: GPUs only
        or not render_plain(result, verbose=verbose)
    ):
        render_text(result, console(), verbose=verbose)


def _attest_remote(
    ev: EvidenceSet,
    expected: bytes | None,
    settings: NetworkSettings,
    *,
    nras_url: str | None,
    origins: list[str],
    now: dt.datetime,
    output: OutputFormat,
) -> None:
    """NRAS judges; gpucc checks its answer; the same document and exit codes."""
    from gpucc.core.errors import GpuccError, UsageError

    from .attest_remote import remote_text, verify_remote
    from .output import emit, out

    if expected is None:
        raise UsageError("remote verification needs the nonce the evidence carries (--nonce)")
    try:
        verdict = verify_remote(ev, expected, settings, nras_url=nras_url, origins=origins, now=now)
    except GpuccError as exc:
        exc.subject = exc.subject or "remote"  # its remedies are NRAS's, not collateral's
        raise
    document = verdict.attest_document(ev)
    if output is OutputFormat.JSON:
        emit(document)
    else:
        out(*remote_text(verdict))
    raise VerdictExit(document["exit_code"])


@evidence_app.command("collect")
def collect(
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="Evidence JSON to write.")
    ] = None,
    nonce: Annotated[
        str | None,
        typer.Option(
            "--nonce",
            rich_help_panel="Evidence",
            help="32-byte nonce as 64 hex, chosen by the verifier (e.g. from 'gpucc session "
            "challenge'); random if omitted. 'gpucc attest' needs the same value as --nonce.",
        ),
    ] = None,
    force: ForceOption = False,
    fmt: FormatOption = OutputFormat.TEXT,
    cvm: Annotated[
        Path | None,
        typer.Option(
            "--cvm",
            dir_okay=False,
            rich_help_panel="Confidential VM",
            help="Also write this CVM's TDX quote or SEV-SNP report (configfs-tsm) to FILE, "
            "over report data SHA-512('gpucc/attest/v1/cvm-report-data' || nonce), which binds "
            "it to the GPU evidence; 'gpucc attest --cvm-evidence FILE' expects the same. "
            "Under a paravisor (Azure: no configfs-tsm, the HCL report in the vTPM) FILE is "
            "vTPM evidence JSON whose TPM quote carries the report data's first 32 bytes.",
        ),
    ] = None,
    cvm_only: Annotated[
        bool,
        typer.Option(
            "--cvm-only",
            rich_help_panel="Confidential VM",
            help="Collect the CVM's evidence (--cvm FILE) alone: no GPU evidence, no -o.",
        ),
    ] = False,
    cvm_collateral: Annotated[
        Path | None,
        typer.Option(
            "--cvm-collateral",
            dir_okay=False,
            exists=True,
            rich_help_panel="Confidential VM",
            help="Under an SEV-SNP paravisor: the VCEK (DER or PEM) to put in the evidence "
            "(not used under a TDX paravisor).",
        ),
    ] = None,
    tpm_tcti: Annotated[
        str | None,
        typer.Option(
            "--tpm-tcti",
            rich_help_panel="Confidential VM",
            help="The vTPM's TCTI for tpm2-tools (default device:/dev/tpmrm0).",
        ),
    ] = None,
    td_quote_url: Annotated[
        str | None,
        typer.Option(
            "--td-quote-url",
            envvar="GPUCC_TD_QUOTE_URL",
            rich_help_panel="Confidential VM",
            help="Under a TDX paravisor: the endpoint that turns the HCL report's TDREPORT "
            "into a TD quote (default Azure's, http://169.254.169.254/acc/tdquote).",
        ),
    ] = None,
    tsm_root: Annotated[
        Path | None, typer.Option("--tsm-root", hidden=True, file_okay=False)
    ] = None,
    device: Annotated[
        Device,
        typer.Option(
            "--device",
            "-d",
            rich_help_panel="Evidence",
            help="gpu (NVML), or nvswitch: every NVSwitch (LS10) through NVIDIA's NSCQ library, "
            "as nvattest collects it.",
        ),
    ] = Device.GPU,
    nscq_library: Annotated[
        str | None,
        typer.Option(
            "--nscq-library",
            envvar="GPUCC_NSCQ_LIBRARY",
            rich_help_panel="Evidence",
            help="The NSCQ library to load for --device nvswitch (default: libnvidia-nscq as "
            "the system's loader finds it).",
        ),
    ] = None,
    evidence_format: Annotated[
        EvidenceFileFormat,
        typer.Option(
            "--evidence-format",
            case_sensitive=False,
            rich_help_panel="Evidence",
            help="nvat: nvattest's evidence JSON; cmw: NVIDIA's CMW verifier-input file "
            "(report, chain and nonce per device). gpucc reads both.",
        ),
    ] = EvidenceFileFormat.NVAT,
) -> None:
    """Collect evidence from the local GPUs (NVML), or NVSwitches (NSCQ), into an
    nvattest-format JSON file (or a CMW file with --evidence-format cmw).

    An existing file is replaced only with --force.
    """
    from gpucc.assembly import sources
    from gpucc.core.errors import UsageError
    from gpucc.core.files import read_capped, refuse_existing, write_atomic
    from gpucc.gpuattest.cvm.appraise import attest_report_data
    from gpucc.gpuattest.evidence import dump_cmw, dump_evidence_json

    from .output import emit, note

    value = parse_nonce(nonce) if nonce else os.urandom(32)

    if cvm_only and (cvm is None or output is not None):
        raise UsageError("--cvm-only writes --cvm FILE alone: give --cvm and drop -o")
    if not cvm_only and output is None:
        raise UsageError("-o FILE is required (or --cvm FILE --cvm-only)")
    if cvm is not None and (cvm == output or device is Device.NVSWITCH):
        raise UsageError(
            "--cvm goes with GPU evidence, in a file of its own (not with --device nvswitch)"
            if device is Device.NVSWITCH
            else "--cvm and -o must name different files"
        )
    vcek = read_capped(cvm_collateral, 64 * 1024, what="VCEK") if cvm_collateral else None
    report_data = attest_report_data(value)
    with force_hint():
        for path in (output, cvm):
            if path is not None:
                refuse_existing(path, force=force)
        source = sources.open_source(
            tsm_root=tsm_root,
            cvm_collateral=vcek,
            tpm_tcti=tpm_tcti,
            nscq_library=nscq_library,
            td_quote_url=td_quote_url,
        )
        if cvm_only:
            ev = None
        elif device is Device.NVSWITCH:
            ev = sources.switch_evidence(source, value)
        else:
            ev = source.gpu_evidence(value)
        found = source.cvm_evidence(report_data) if cvm is not None else None
        quote = found.evidence if found is not None else None
        if output is not None and ev is not None:
            data = dump_cmw(ev) if evidence_format is EvidenceFileFormat.CMW else None
            data = data or dump_evidence_json(ev)
            write_atomic(output, data, force=force, what="evidence file")
        if cvm is not None and quote is not None:
            write_atomic(cvm, quote, force=force, what="CVM evidence file")
            note(f"wrote the CVM's evidence to {cvm}")
    if quote is not None:  # what this kind of evidence carries for the report data
        from gpucc.assembly.parts import default_parts

        report_data = default_parts().classify_cvm(quote).bind_report_data(report_data)
    switches = len(ev.gpus) if ev is not None and device is Device.NVSWITCH else 0
    if ev is not None:
        what = (
            counted(switches, "NVSwitch", "NVSwitches")
            if switches
            else counted(len(ev.gpus), "GPU", "GPUs")
        )
        note(f"wrote evidence for {what} to {output}; nonce {value.hex()}")
    if quote is not None:
        note(f"the CVM's evidence commits to report data {report_data.hex()}")
    if fmt is OutputFormat.JSON:
        from gpucc.assembly.reports import EvidenceWritten

        written = EvidenceWritten(
            output=output,
            gpus=len(ev.gpus) - switches if ev is not None else 0,
            switches=switches,
            nonce=value,
            cvm_report_data=report_data if quote is not None else None,
        )
        emit(written.to_dict())
