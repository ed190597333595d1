"""gpucc: attestation and confidential data staging for NVIDIA H100 GPUs.

The public API, importable from ``gpucc`` directly (submodules load on first use, so
``import gpucc`` stays cheap)::

    import datetime as dt
    import gpucc

    sample = gpucc.nvidia_h100_sample()
    result = gpucc.verify(
        sample.evidence,
        expected_nonce=sample.nonce,
        roots=gpucc.TrustRoots.nvidia(),
        now=gpucc.SAMPLE_VALID_AT,
        rims=sample.rims,
        ocsp=gpucc.NoOcsp("no stored OCSP answers exist for the sample"),
        policy=gpucc.sample_policy(),
    )
    assert result.trusted

Attestation: :func:`verify` with evidence from files (:func:`load_evidence_file`,
:func:`load_raw_evidence`) or the local GPUs (:func:`collect_evidence`, needs the ``nvml``
extra), a :class:`Policy`, :class:`TrustRoots` and collateral (:class:`FileRimSource`,
:class:`DirectoryRimSource`, :func:`build_collateral` for the network, cache and bundles).
Sealing and staging: :func:`seal_file`, :func:`seal_bytes`, :func:`open_sealed`,
:func:`stage`, :func:`plan_stage`. Key release bound to attestation: :func:`new_challenge`,
:func:`create_offer`, :func:`accept_offer`, :func:`open_answer`, :func:`local_session`.
Errors: :class:`GpuccError` and its families.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from gpucc.core.errors import (
        CollateralUnavailableError,
        EnvironmentProblemError,
        FileAccessError,
        GpuccError,
        IntegrityError,
        MalformedInputError,
        NotTrustedError,
        UsageError,
        WrongKeyError,
    )
    from gpucc.gpuattest.collateral import DirectoryRimSource, FileRimSource, NoOcsp
    from gpucc.gpuattest.evidence import (
        EvidenceSet,
        load_evidence_file,
        load_raw_evidence,
        parse_nonce_hex,
    )
    from gpucc.gpuattest.netconfig import NetworkSettings, build_collateral
    from gpucc.gpuattest.nvml import collect_evidence
    from gpucc.gpuattest.policy import Policy, load_policy, parse_policy
    from gpucc.gpuattest.result import AttestationResult, Verdict
    from gpucc.gpuattest.samples import (
        SAMPLE_VALID_AT,
        Sample,
        nvidia_h100_sample,
        sample_policy,
    )
    from gpucc.gpuattest.simulate import SimulatedGpu
    from gpucc.gpuattest.trust import TrustRoots
    from gpucc.gpuattest.verifier import verify
    from gpucc.keyrelease.protocol import (
        DatasetKey,
        accept_offer,
        create_offer,
        local_session,
        new_challenge,
        open_answer,
    )
    from gpucc.staging import (
        SealedDataset,
        SealResult,
        StagePlan,
        open_sealed,
        plan_stage,
        read_key_file,
        seal_bytes,
        seal_file,
        stage,
        write_key_file,
    )

_HOME: dict[str, str] = {
    **dict.fromkeys(("DirectoryRimSource", "FileRimSource", "NoOcsp"), "gpuattest.collateral"),
    **dict.fromkeys(
        (
            "CollateralUnavailableError",
            "EnvironmentProblemError",
            "FileAccessError",
            "GpuccError",
            "IntegrityError",
            "MalformedInputError",
            "NotTrustedError",
            "UsageError",
            "WrongKeyError",
        ),
        "core.errors",
    ),
    **dict.fromkeys(
        ("EvidenceSet", "load_evidence_file", "load_raw_evidence", "parse_nonce_hex"),
        "gpuattest.evidence",
    ),
    **dict.fromkeys(("NetworkSettings", "build_collateral"), "gpuattest.netconfig"),
    "collect_evidence": "gpuattest.nvml",
    **dict.fromkeys(("Policy", "load_policy", "parse_policy"), "gpuattest.policy"),
    **dict.fromkeys(("AttestationResult", "Verdict"), "gpuattest.result"),
    **dict.fromkeys(
        ("SAMPLE_VALID_AT", "Sample", "nvidia_h100_sample", "sample_policy"), "gpuattest.samples"
    ),
    "SimulatedGpu": "gpuattest.simulate",
    "TrustRoots": "gpuattest.trust",
    "verify": "gpuattest.verifier",
    **dict.fromkeys(
        (
            "SealResult",
            "SealedDataset",
            "StagePlan",
            "open_sealed",
            "plan_stage",
            "read_key_file",
            "seal_bytes",
            "seal_file",
            "stage",
            "write_key_file",
        ),
        "staging",
    ),
    **dict.fromkeys(
        (
            "DatasetKey",
            "accept_offer",
            "create_offer",
            "local_session",
            "new_challenge",
            "open_answer",
        ),
        "keyrelease.protocol",
    ),
}

__all__ = [
    "__version__",
    "AttestationResult",
    "CollateralUnavailableError",
    "DatasetKey",
    "DirectoryRimSource",
    "EnvironmentProblemError",
    "EvidenceSet",
    "FileAccessError",
    "FileRimSource",
    "GpuccError",
    "IntegrityError",
    "MalformedInputError",
    "NetworkSettings",
    "NoOcsp",
    "NotTrustedError",
    "Policy",
    "SAMPLE_VALID_AT",
    "Sample",
    "SealResult",
    "SealedDataset",
    "SimulatedGpu",
    "StagePlan",
    "TrustRoots",
    "UsageError",
    "Verdict",
    "WrongKeyError",
    "accept_offer",
    "build_collateral",
    "collect_evidence",
    "create_offer",
    "load_evidence_file",
    "load_policy",
    "load_raw_evidence",
    "local_session",
    "new_challenge",
    "nvidia_h100_sample",
    "open_answer",
    "open_sealed",
    "parse_nonce_hex",
    "parse_policy",
    "plan_stage",
    "read_key_file",
    "sample_policy",
    "seal_bytes",
    "seal_file",
    "stage",
    "verify",
    "write_key_file",
]


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'gpucc' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"gpucc.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
