"""``gpucc cvm``: reference values for a confidential VM's image, written as a ``cvm:`` policy."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from .command import App
from .options import FormatOption, OutputFormat
from .safety_options import ForceOption, force_hint

cvm_app = App(
    group="cvm",
    help="Reference values for a confidential VM's image: the policy that admits it.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)

OutputOption = Annotated[
    Path | None,
    typer.Option(
        "-o",
        "--output",
        dir_okay=False,
        help="Write the policy here (YAML) instead of printing it; an existing file is "
        "replaced only with --force.",
    ),
]
BaseOption = Annotated[
    Path | None,
    typer.Option(
        "--base",
        exists=True,
        dir_okay=False,
        help="A policy file to start from: its other settings are kept, the reference "
        "values replace its cvm pins for this kind.",
    ),
]


def _merged(base: Path | None, section: dict[str, Any]) -> dict[str, Any]:
    """The base policy document (or an empty one) with ``section``'s pins set in ``cvm``."""
    doc: dict[str, Any] = {}
    if base is not None:
        from gpucc.core.errors import MalformedPolicyError
        from gpucc.core.files import read_capped
        from gpucc.core.jsonio import load_yaml_untrusted
        from gpucc.gpuattest.policy import MAX_POLICY_BYTES, load_policy

        load_policy(base)  # a base that is no valid policy is refused as such
        data = read_capped(base, MAX_POLICY_BYTES, what="policy")
        loaded = load_yaml_untrusted(data, what=f"policy {base}", error=MalformedPolicyError)
        doc = dict(loaded) if isinstance(loaded, dict) else {}
    cvm = dict(doc.get("cvm") or {})
    for key, value in section.items():
        merged = dict(cvm.get(key) or {})
        merged.update(value)
        cvm[key] = merged
    doc["cvm"] = cvm
    return doc


def _emit(
    doc: dict[str, Any],
    output: Path | None,
    *,
    force: bool,
    header: str,
    kind: str,
    fmt: OutputFormat,
) -> None:
    """Check the document is a policy gpucc accepts, then write or print it (with
    ``--format json`` the policy is in the ``gpucc.cvm.reference/v1`` document)."""
    import yaml

    from gpucc.gpuattest.policy import parse_policy

    parse_policy(doc, source="reference")
    text = header + yaml.safe_dump(doc, sort_keys=False, width=200)
    if fmt is OutputFormat.JSON:
        from gpucc.gpuattest.cvm.reference import ReferencePolicy

        from .output import emit

        emit(ReferencePolicy(kind, doc, output).to_dict())
    if output is None:
        if fmt is not OutputFormat.JSON:
            from .output import out

            out(*text.rstrip("\n").split("\n"))
        return
    from gpucc.core.files import refuse_existing, write_atomic

    from .output import note

    with force_hint():
        refuse_existing(output, force=force)
        write_atomic(output, text.encode(), force=force, what="policy")
    note(f"wrote the policy to {output}")


@cvm_app.command("reference-snp")
def reference_snp(
    ovmf: Annotated[
        Path, typer.Option("--ovmf", exists=True, dir_okay=False, help="The OVMF firmware.")
    ],
    vcpus: Annotated[int, typer.Option("--vcpus", help="The guest's vCPU count.")],
    vcpu_type: Annotated[
        str, typer.Option("--vcpu-type", help="QEMU's vCPU type (EPYC-v4, EPYC-Milan, ...).")
    ],
    kernel: Annotated[
        Path | None,
        typer.Option("--kernel", exists=True, dir_okay=False, help="The direct-boot kernel."),
    ] = None,
    initrd: Annotated[
        Path | None,
        typer.Option("--initrd", exists=True, dir_okay=False, help="The initrd (with --kernel)."),
    ] = None,
    append: Annotated[
        str | None, typer.Option("--append", help="The kernel command line (with --kernel).")
    ] = None,
    guest_features: Annotated[
        str, typer.Option("--guest-features", help="The guest's SEV features (hex).")
    ] = "0x1",
    vmm: Annotated[str, typer.Option("--vmm", help="QEMU, ec2 or gce.")] = "QEMU",
    base: BaseOption = None,
    output: OutputOption = None,
    force: ForceOption = False,
    fmt: FormatOption = OutputFormat.TEXT,
) -> None:
    """The SEV-SNP launch measurement of an image (sev-snp-measure), as a cvm: policy.

    Exit codes: 0 written, 2 usage, 4 malformed image or base policy, 5 sev-snp-measure
    missing, 8 a file cannot be read or written.
    """
    from gpucc.core.errors import UsageError
    from gpucc.gpuattest.cvm.reference import (
        SnpImage,
        snp_launch_measurement,
        snp_reference_policy,
    )

    try:
        features = int(guest_features, 0)
    except ValueError:
        raise UsageError("--guest-features must be a number (0x1)") from None
    image = SnpImage(ovmf, vcpus, vcpu_type, kernel, initrd, append, features, vmm)
    measurement = snp_launch_measurement(image)
    parts = [f"ovmf {ovmf.name}", f"{vcpus} x {vcpu_type}"]
    if kernel is not None:
        parts.append(f"kernel {kernel.name}")
    if initrd is not None:
        parts.append(f"initrd {initrd.name}")
    header = f"# SEV-SNP reference values (sev-snp-measure): {', '.join(parts)}\n"
    if append is not None:
        import json

        header += f"# command line {json.dumps(append)}\n"
    section = snp_reference_policy(measurement)
    _emit(_merged(base, section), output, force=force, header=header, kind="snp", fmt=fmt)


@cvm_app.command("reference-tdx")
def reference_tdx(
    event_log: Annotated[
        Path,
        typer.Option(
            "--event-log",
            exists=True,
            dir_okay=False,
            help="The CC event log of a boot of the image (/sys/firmware/acpi/tables/data/CCEL).",
        ),
    ],
    quote: Annotated[
        Path | None,
        typer.Option(
            "--quote",
            exists=True,
            dir_okay=False,
            help="That boot's TDX quote: its MRTD is pinned, and the log must replay to its RTMRs.",
        ),
    ] = None,
    base: BaseOption = None,
    output: OutputOption = None,
    force: ForceOption = False,
    fmt: FormatOption = OutputFormat.TEXT,
) -> None:
    """A TDX image's reference values from a recorded boot: its events as cvm.events.tdx.

    The events pinned are the EFI variables, boot applications (the kernel), the Linux
    stub's command line and initrd, and grub's commands; a kernel update then changes one
    line. Exit codes: 0 written, 1 the log does not replay to the quote, 2 usage,
    4 malformed input, 8 a file cannot be read or written.
    """
    from gpucc.core.files import read_capped
    from gpucc.gpuattest.cvm.eventlog import MAX_EVENT_LOG_BYTES, parse_event_log
    from gpucc.gpuattest.cvm.reference import tdx_reference_policy

    log = parse_event_log(read_capped(event_log, MAX_EVENT_LOG_BYTES, what="CVM event log"))
    mrtd = None
    if quote is not None:
        mrtd = _checked_mrtd(quote, log)
    section = tdx_reference_policy(log, mrtd=mrtd)
    count = len(section["events"]["tdx"])
    header = f"# TDX reference values from a recorded boot: {count} events"
    header += f", MRTD of {quote.name}\n" if quote is not None else "\n"
    _emit(_merged(base, section), output, force=force, header=header, kind="tdx", fmt=fmt)


@cvm_app.command("reference-vtpm")
def reference_vtpm(
    event_log: Annotated[
        Path,
        typer.Option(
            "--event-log",
            exists=True,
            dir_okay=False,
            help="The TPM measured-boot log of a boot of the image "
            "(/sys/kernel/security/tpm0/binary_bios_measurements).",
        ),
    ],
    evidence: Annotated[
        Path | None,
        typer.Option(
            "--evidence",
            exists=True,
            dir_okay=False,
            help="That boot's vTPM evidence (JSON): the paravisor's launch measurement is "
            "pinned, and the log must replay to its quoted PCRs.",
        ),
    ] = None,
    base: BaseOption = None,
    output: OutputOption = None,
    force: ForceOption = False,
    fmt: FormatOption = OutputFormat.TEXT,
) -> None:
    """An Azure vTPM image's reference values from a recorded boot: cvm.events.vtpm.

    The events pinned are the EFI variables, boot applications (the kernel), the Linux
    stub's command line and initrd, and grub's commands, in their PCRs with SHA-256 digests.
    Exit codes: 0 written, 1 the log does not replay to the evidence's PCRs, 2 usage,
    4 malformed input, 8 a file cannot be read or written.
    """
    from gpucc.core.files import read_capped
    from gpucc.gpuattest.cvm.eventlog import MAX_EVENT_LOG_BYTES, parse_event_log
    from gpucc.gpuattest.cvm.reference import vtpm_reference_policy

    data = read_capped(event_log, MAX_EVENT_LOG_BYTES, what="measured-boot log")
    log = parse_event_log(data, pcrs=True)
    launch = _checked_launch(evidence, log) if evidence is not None else None
    section = vtpm_reference_policy(log, launch=launch)
    count = len(section["events"]["vtpm"])
    header = f"# vTPM reference values from a recorded boot: {count} events"
    header += f", the paravisor's launch measurement of {evidence.name}\n" if evidence else "\n"
    _emit(_merged(base, section), output, force=force, header=header, kind="vtpm", fmt=fmt)


def _checked_launch(evidence: Path, log: Any) -> tuple[str, bytes]:
    """The paravisor's launch measurement in ``evidence``, once the log is known to replay
    to the PCRs it quotes (the evidence's signatures are not verified here: it is the
    reference boot's own)."""
    from gpucc.assembly.parts import VtpmPart
    from gpucc.core.errors import MalformedEvidenceError, NotTrustedError
    from gpucc.core.files import read_capped
    from gpucc.gpuattest.cvm.appraise import MAX_EVIDENCE_BYTES
    from gpucc.gpuattest.cvm.tpm_quote import parse_tpm_quote
    from gpucc.gpuattest.cvm.vtpm_evidence import parse_vtpm_evidence

    data = read_capped(evidence, MAX_EVIDENCE_BYTES, what="vTPM evidence")
    if len(data) > MAX_EVIDENCE_BYTES:
        raise MalformedEvidenceError(f"{evidence} is larger than {MAX_EVIDENCE_BYTES} bytes")
    if not VtpmPart().recognises(data):
        raise MalformedEvidenceError(f"{evidence} is not vTPM evidence (a JSON document)")
    parsed = parse_vtpm_evidence(data)
    quoted = dict(zip(parse_tpm_quote(parsed.quote).pcr_indices, parsed.pcrs, strict=False))
    replayed = log.replay()
    wrong = [
        name.upper()
        for name, value in replayed.items()
        if int(name[3:]) in quoted and quoted[int(name[3:])] != value
    ]
    if wrong or not any(int(name[3:]) in quoted for name in replayed):
        differ = f"{', '.join(wrong)} differ" if wrong else "it extends no quoted PCR"
        raise NotTrustedError(
            f"the measured-boot log does not replay to {evidence}'s PCRs ({differ}): "
            "they are not of one boot"
        )
    report = parsed.hcl.hardware_report
    if parsed.hcl.tee == "snp":
        from gpucc.gpuattest.cvm.snp_report import parse_snp_report

        return "snp", parse_snp_report(report).measurement
    return "tdx", bytes(report[528 : 528 + 48])


def _checked_mrtd(quote: Path, log: Any) -> bytes:
    """The quote's MRTD, once the log is known to replay to its RTMRs."""
    from gpucc.core.errors import MalformedEvidenceError, NotTrustedError
    from gpucc.core.files import read_capped
    from gpucc.gpuattest.cvm.tdx import td_report_span

    data = read_capped(quote, 64 * 1024, what="TDX quote")
    _, _, offset, size = td_report_span(data)
    if len(data) < offset + size:
        raise MalformedEvidenceError(f"the TDX quote {quote} is truncated")
    body = data[offset : offset + size]
    rtmrs = [body[328 + 48 * n : 376 + 48 * n] for n in range(4)]
    replayed = log.replay()
    wrong = [f"RTMR{n}" for n in range(4) if replayed[f"rtmr{n}"] != rtmrs[n]]
    if wrong:
        raise NotTrustedError(
            f"the event log does not replay to {quote}'s RTMRs ({', '.join(wrong)} differ): "
            "they are not of one boot"
        )
    return bytes(body[136:184])


@cvm_app.command("pin")
def pin(
    result: Annotated[
        Path | None,
        typer.Argument(
            metavar="RESULT",
            exists=True,
            dir_okay=False,
            help="A trusted result of gpucc attest -f json that verified a CVM.",
        ),
    ] = None,
    simulate: Annotated[
        Path | None,
        typer.Option(
            "--simulate",
            file_okay=False,
            metavar="DIR",
            help="Instead of RESULT: pin the simulated CVM that 'gpucc travel run' and "
            "'gpucc session offer' run with --simulate DIR (the simulated TD image's MRTD "
            "and boot events), so that a simulated holder with your own policy admits it. "
            "For simulations only: it attests nothing real.",
        ),
    ] = None,
    base: BaseOption = None,
    output: OutputOption = None,
    force: ForceOption = False,
    fmt: FormatOption = OutputFormat.TEXT,
) -> None:
    """Pin the measurements a verified CVM reported: the policy that admits exactly it.

    Every measurement the result's CVM reported and a policy can pin (TDX: MRTD, the RTMRs,
    MRSEAM, MRCONFIGID, MROWNER, MROWNERCONFIG; SEV-SNP: MEASUREMENT, HOST_DATA) becomes
    cvm.measurements. Only a trusted result is pinned. With --simulate DIR instead of
    RESULT, the simulation's CVM is pinned. Exit codes: 0 written, 1 the result is not
    trusted, 2 usage, 4 not a result with a CVM, 8 a file problem.
    """
    from gpucc.core.errors import MalformedInputError, NotTrustedError, UsageError
    from gpucc.core.files import read_capped
    from gpucc.core.jsonio import loads_untrusted
    from gpucc.gpuattest.cvm.policy import PINNABLE

    if (result is None) == (simulate is None):
        raise UsageError(
            "give RESULT (a trusted result of gpucc attest -f json) or --simulate DIR (the "
            "simulation's CVM), one of them"
        )
    if result is None:
        from gpucc.assembly.settings import simulation_cvm_section

        from .output import warn

        warn("SIMULATED CVM: for tests and demos only, this pins nothing real")
        section = simulation_cvm_section()
        header = f"# the simulated TD image run with --simulate {simulate}: for simulations only\n"
        _emit(_merged(base, section), output, force=force, header=header, kind="tdx", fmt=fmt)
        return

    doc = loads_untrusted(
        read_capped(result, 64 * 1024 * 1024, what="result"),
        what=f"result {result}",
        error=MalformedInputError,
    )
    cvm = doc.get("cvm") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or doc.get("schema") != "gpucc.attest/v1":
        raise MalformedInputError(f"{result} is not a result of gpucc attest -f json")
    if not isinstance(cvm, dict) or cvm.get("kind") not in PINNABLE:
        raise MalformedInputError(f"{result} verified no CVM: nothing to pin")
    if doc.get("trusted") is not True or cvm.get("verdict") != "trusted":
        raise NotTrustedError(f"{result} is not a trusted result: its measurements are not pinned")
    kind = str(cvm["kind"])
    found = cvm.get("claims")
    claims: dict[str, Any] = found if isinstance(found, dict) else {}
    pins = {n: claims[n] for n in PINNABLE[kind] if isinstance(claims.get(n), str)}
    if not pins:
        raise MalformedInputError(f"{result} carries none of the CVM's measurements")
    header = f"# {kind} measurements of the CVM verified in {result.name}\n"
    section = {"measurements": {kind: pins}}
    _emit(_merged(base, section), output, force=force, header=header, kind=kind, fmt=fmt)
