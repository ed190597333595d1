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
    state = "TRUSTED" if verdict.trusted else "NOT TRUSTED"
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

    lines.append(f"{state}: {counted(len(verdict.gpus), 'GPU', 'GPUs')} verified remotely")
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
