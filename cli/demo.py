"""``gpucc demo``: the whole job on bundled data, with no GPU and no network."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from .options import FormatOption, OutputFormat
from .output import emit

DEMO_AT = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


def demo(
    size_mib: Annotated[
        int, typer.Option("--size-mib", min=0, max=4096, help="Size of the generated dataset.")
    ] = 64,
    fmt: FormatOption = OutputFormat.TEXT,
) -> None:
    """Attest NVIDIA's bundled H100 sample, run the key protocol, seal and stage a dataset.

    Steps: (1) verify NVIDIA's real H100 sample as of 2024-01-01; (2) run the
    attestation-bound session protocol in one process against a simulated GPU (there
    is no GPU here); (3) seal a generated dataset; (4) stage it on the CPU, verifying
    every chunk; (5) show that a tampered chunk is caught and named. With --format json
    the steps are one document on stdout and the narration goes to stderr.
    """
    from gpucc.assembly.reports import DemoRun
    from gpucc.core.errors import NotTrustedError
    from gpucc.gpuattest.collateral import NoOcsp, rim_sources_from_mapping
    from gpucc.gpuattest.policy import parse_policy
    from gpucc.gpuattest.samples import nvidia_h100_sample
    from gpucc.gpuattest.simulate import SimulatedGpu
    from gpucc.gpuattest.trust import TrustRoots
    from gpucc.gpuattest.verifier import verify
    from gpucc.keyrelease.protocol import CollectedEvidence, DatasetKey, local_session
    from gpucc.staging import open_sealed, seal_file, stage
    from gpucc.staging.errors import ChunkAuthenticationError

    from .output import console

    out = console(stderr=fmt is OutputFormat.JSON)
    run = DemoRun()
    step = run.step

    no_ocsp = parse_policy({"ocsp": {"require": False}}, source="demo")

    # (1) the real NVIDIA sample, verified against NVIDIA's pinned roots
    sample = nvidia_h100_sample()
    result = verify(
        sample.evidence,
        expected_nonce=sample.nonce,
        roots=TrustRoots.nvidia(),
        now=DEMO_AT,
        rims=sample.rims,
        ocsp=NoOcsp("NVIDIA publishes no stored OCSP answers for this sample"),
        policy=no_ocsp,
    )
    gpu = result.gpus[0]
    passed = sum(1 for c in gpu.checks if c.status == "pass")
    out.print(
        "[bold]1. attest[/bold]  NVIDIA H100 sample (driver "
        f"{gpu.claims['x-nvidia-gpu-driver-version']}, VBIOS "
        f"{gpu.claims['x-nvidia-gpu-vbios-version']}) as of 2024-01-01: "
        f"{str(result.verdict).upper()} ({passed} checks passed, measres "
        f"{gpu.claims['measres']}, OCSP not checked: no stored answers exist for the sample)",
        highlight=False,
        soft_wrap=not out.is_terminal,
    )
    if not result.trusted:
        raise NotTrustedError("the bundled sample did not verify: " + "; ".join(result.reasons))
    step(
        "attest",
        True,
        verdict=str(result.verdict),
        checks_passed=passed,
        driver=gpu.claims["x-nvidia-gpu-driver-version"],
        vbios=gpu.claims["x-nvidia-gpu-vbios-version"],
        verified_at=DEMO_AT.isoformat(),
    )

    # (2) session protocol against a simulated GPU under its own test PKI
    now = dt.datetime.now(dt.UTC)
    sim = SimulatedGpu.create(now=now)
    sim_rims = rim_sources_from_mapping(sim.rims)

    def collect(nonce: bytes) -> CollectedEvidence:
        return CollectedEvidence.from_evidence_set(sim.evidence(nonce))

    def attest(evidence: Any, nonce: bytes) -> Any:
        return verify(
            evidence,
            expected_nonce=nonce,
            roots=sim.roots,
            now=now,
            rims=sim_rims,
            ocsp=NoOcsp("simulated GPU"),
            policy=no_ocsp,
        )

    with tempfile.TemporaryDirectory(prefix="gpucc-demo-") as tmp:
        work = Path(tmp)
        plain = work / "dataset.bin"
        sealed = work / "dataset.gcc"
        data = os.urandom(size_mib * 1024 * 1024 + 12345)
        plain.write_bytes(data)
        want = hashlib.sha256(data).hexdigest()
        dataset_key = os.urandom(32)
        t0 = time.perf_counter()
        sealed_result = seal_file(plain, sealed, dataset_key=dataset_key, chunk_size=1 << 20)
        seal_s = time.perf_counter() - t0
        header = open_sealed(sealed).header
        grant = DatasetKey(header.dataset_id, header.digest, dataset_key)
        collect_cvm, attest_cvm = _simulated_cvm(now)
        session = local_session(
            collect=collect,
            attest=attest,
            datasets=[grant],
            collect_cvm=collect_cvm,
            attest_cvm=attest_cvm,
        )
        out.print(
            "[bold]2. session[/bold] a simulated H100 in a simulated TDX CVM (their own test PKIs, "
            "not NVIDIA- or Intel-rooted: no GPU here) attested with a nonce and CVM report data "
            "bound to the host's ephemeral key; transcript "
            f"{session.answer.transcript_hash.hex()[:16]}...; dataset key released, wrapped for "
            "this session only",
            highlight=False,
            soft_wrap=not out.is_terminal,
        )
        step(
            "session",
            True,
            simulated_gpu=True,
            transcript_hash=session.answer.transcript_hash.hex(),
        )
        del sealed_result
        out.print(
            f"[bold]3. seal[/bold]    {len(data) / 1e6:.1f} MB in {header.chunk_count} chunks "
            f"of 1 MiB, {len(data) / seal_s / 1e9:.2f} GB/s",
            highlight=False,
            soft_wrap=not out.is_terminal,
        )
        step(
            "seal",
            True,
            bytes=len(data),
            chunks=header.chunk_count,
            chunk_size=header.chunk_size,
            gb_per_s=round(len(data) / seal_s / 1e9, 3) if seal_s > 0 else None,
        )
        key = session.session.dataset_key(header.digest)
        t0 = time.perf_counter()
        with stage(sealed, key=key, device="cpu") as buf:
            stage_s = time.perf_counter() - t0
            ok = hashlib.sha256(memoryview(buf)).hexdigest() == want
        out.print(
            "[bold]4. stage[/bold]   CPU, every tag verified, "
            f"{len(data) / stage_s / 1e9:.2f} GB/s, bytes identical: {ok}",
            highlight=False,
            soft_wrap=not out.is_terminal,
        )
        if not ok:
            raise NotTrustedError("staged bytes differ from the original")
        step(
            "stage",
            True,
            device="cpu",
            bytes_identical=True,
            gb_per_s=round(len(data) / stage_s / 1e9, 3) if stage_s > 0 else None,
        )
        tampered = work / "tampered.gcc"
        raw = bytearray(sealed.read_bytes())
        raw[header.chunk_offset(header.chunk_count - 1) + 1] ^= 0x01  # a bit in the last chunk
        tampered.write_bytes(raw)
        try:
            with stage(tampered, key=key, device="cpu"):
                caught = "NOT caught"
        except ChunkAuthenticationError as exc:
            caught = f"caught: {exc}"
        out.print(
            f"[bold]5. tamper[/bold]  one flipped bit: {caught}",
            highlight=False,
            soft_wrap=not out.is_terminal,
        )
        if caught.startswith("NOT"):
            raise NotTrustedError("a flipped bit in a sealed chunk was not caught")
        step("tamper", True, detail=caught)
    out.print(
        "[bold green]demo complete: attestation verified, data staged and verified[/bold green]"
    )
    if fmt is OutputFormat.JSON:
        emit(run.to_dict())


def _simulated_cvm(now: dt.datetime) -> tuple[Any, Any]:
    """A simulated TDX platform's collector and the holder's check of it (image pinned)."""
    from gpucc.gpuattest.cvm.appraise import verify_tdx
    from gpucc.gpuattest.cvm.policy import parse_cvm_policy
    from gpucc.gpuattest.cvm.tdx_sim import SIMULATED_MRTD, simulated_tdx
    from gpucc.keyrelease.protocol import CollectedCvmEvidence

    tdx = simulated_tdx(now)
    collateral = tdx.collateral(issued=now - dt.timedelta(minutes=5)).to_json()
    policy = parse_cvm_policy({"measurements": {"tdx": {"mrtd": SIMULATED_MRTD.hex()}}})

    def collect_cvm(report_data: bytes) -> CollectedCvmEvidence:
        return CollectedCvmEvidence(tdx.quote(report_data), collateral)

    def attest_cvm(
        evidence: bytes, offered: bytes | None, expected: bytes, event_log: bytes | None
    ) -> Any:
        return verify_tdx(  # the simulated platform's quotes: TDX, nothing else
            evidence,
            offered,
            now=now,
            policy=policy,
            expected_report_data=expected,
            root=tdx.root,
            require_pins=True,
            event_log=event_log,
        )

    return collect_cvm, attest_cvm
