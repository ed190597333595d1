"""``gpucc attest --verifier remote`` and ``--sign-eat``: NRAS verdicts and signed results.

Remote verification posts the evidence to NVIDIA's Remote Attestation Service and accepts
its answer only after gpucc has checked every token (gpuattest/nras.py); the result is
reported in the same ``gpucc.attest/v1`` document as a local verification, with
``verifier: remote``. A service that cannot answer is "collateral unavailable" (exit 3),
never a verdict.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpucc.assembly import PlatformResult
    from gpucc.gpuattest.evidence import EvidenceSet
    from gpucc.gpuattest.netconfig import NetworkSettings
    from gpucc.gpuattest.nras import RemoteVerdict
    from gpucc.gpuattest.result import AttestationResult


def verify_remote(
    evidence: EvidenceSet,
    nonce: bytes,
    settings: NetworkSettings,
    *,
    nras_url: str | None,
    origins: list[str],
    now: dt.datetime,
) -> RemoteVerdict:
    """Ask NRAS and check its answer (every token, the key set, the nonce, the digests).

    Redirects may lead only to the NRAS URL's origin and to ``origins``.
    """
    from gpucc.gpuattest.nras import build_nras_client

    client = build_nras_client(
        settings, roots=[], nras_url=nras_url, environ=os.environ, allowed_origins=origins
    )
    return client.attest(evidence, nonce, now=now)


def remote_text(verdict: RemoteVerdict) -> list[str]:
    """Human lines for a remote verdict (stdout)."""
    from .render import VERDICT_TOKENS

    state = VERDICT_TOKENS["trusted" if verdict.trusted else "not-trusted"]
    anchor = (
        "key set chained to a pinned root"
        if verdict.key_anchor == "x5c-chain"
        else f"key set trusted for its TLS origin {verdict.key_origin} (no pinned NRAS root)"
    )
    lines = [
        f"remote verifier {verdict.url} (issuer {verdict.issuer}, key {verdict.kid}; {anchor})",
        "every token checked: ES384 signature, issuer, times, nonce, per-GPU digests",
    ]
    for gpu in verdict.gpus:
        measres = gpu.claims.get("measres", "absent")
        lines.append(f"  {gpu.name}: measres {measres}")
    from .render import counted

    gpus = counted(len(verdict.gpus), "GPU", "GPUs")
    lines.append(f"{state}: {gpus} {'verified' if verdict.trusted else 'not trusted'} remotely")
    return lines


def sign_result(
    result: AttestationResult, key_path: Path, output: Path, *, force: bool
) -> tuple[str, Path]:
    """Write ``result`` as a signed EAT (ES384, NVIDIA's detached shape) to ``output``.

    Returns the key id and the path written.
    """
    from gpucc.core.files import refuse_inputs_as_output, write_atomic
    from gpucc.gpuattest.eat import load_private_key_pem, sign_attestation_result

    refuse_inputs_as_output(output, [key_path])
    key = load_private_key_pem(key_path)
    signed = sign_attestation_result(result, private_key=key)
    write_atomic(output, signed.to_json().encode(), mode=0o644, force=force, what="signed result")
    return signed.kid, output


def sign_ear_result(
    result: PlatformResult, key_path: Path, output: Path, *, force: bool
) -> tuple[str, Path]:
    """Write ``result`` as a signed EAR (ES384 JWT) to ``output``: one submodule per GPU
    (``GPU-<n>``), per NVSwitch (``NVSWITCH-<n>``) and the CVM's (``CVM``), each with its
    outcome, claims, reasons and the relaxations its checks were accepted under.

    Returns the key id and the path written.

    Raises:
        UsageError: the result has no part to put in an EAR.
    """
    from gpucc import __version__
    from gpucc.core.errors import UsageError
    from gpucc.core.files import refuse_inputs_as_output, write_atomic
    from gpucc.gpuattest.ear import EarSubmodule, part_of, sign_ear
    from gpucc.gpuattest.eat import key_id, load_private_key_pem

    refuse_inputs_as_output(output, [key_path])
    key = load_private_key_pem(key_path)
    parts: list[EarSubmodule] = []
    if result.gpu is not None:
        parts += [part_of(f"GPU-{g.index}", g) for g in result.gpu.gpus]
    if result.switch is not None:
        parts += [part_of(f"NVSWITCH-{s.index}", s) for s in result.switch.switches]
    if result.cvm is not None:
        parts.append(part_of("CVM", result.cvm))
    if not parts:
        raise UsageError("--ear-out needs a verified device or CVM")
    token = sign_ear(
        parts,
        private_key=key,
        nonce=result.expected_nonce or b"",
        now=result.verified_at,
        version=__version__,
    )
    write_atomic(output, (token + "\n").encode(), mode=0o644, force=force, what="EAR")
    return key_id(key.public_key()), output
