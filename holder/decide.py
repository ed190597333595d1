"""The holder's release decision: which datasets an offer may have, under which policy.

:func:`answer_offer` verifies an offer through each release policy that governs a dataset
(its attestation policy's verifier, and the requester identity it names), wraps the keys
of the datasets whose policy it meets to the offer's session and signs the answer; the
others are withheld, each with its policy and unmet rule. :mod:`gpucc.holder.service`
serves it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from gpucc.assembly import PlatformResult, PlatformVerifier
from gpucc.assembly.record import TrustRecord, release_record
from gpucc.core.errors import GpuccError
from gpucc.keyrelease.protocol import DatasetKey, Offer, accept_offer, offer_devices
from gpucc.keyrelease.requester import RequesterSignatureError, requester_key_id
from gpucc.staging.errors import ProtocolError
from gpucc.travel.signing import sign_answer

from .state import PostgresState, SqliteState

__all__ = [
    "DatasetsRefused",
    "HolderConfig",
    "Released",
    "ReleasePolicy",
    "answer_offer",
    "failed_checks",
    "one_line",
    "whole_refusal",
]


@dataclass(frozen=True)
class ReleasePolicy:
    """A group of datasets and what their requester must meet (as a key broker's resource
    policy): ``verifier`` is built once from that group's attestation policy (None: the
    holder's own), and ``requesters``, when not empty, are the key ids of which one must have
    signed the offer (:mod:`gpucc.keyrelease.requester`)."""

    name: str
    datasets: tuple[str, ...]
    verifier: PlatformVerifier | None = field(default=None, repr=False)
    requesters: frozenset[str] = frozenset()


@dataclass(frozen=True)
class HolderConfig:
    """Everything the service needs.

    Attributes:
        datasets: the dataset keys this holder releases (never in a repr).
        signing_key: the long-term answer-signing key (never in a repr).
        verifier: the platform verifier (``gpucc.assembly``): GPU and CVM evidence, the
            holder's policy, its roots and collateral; GPU-only offers only under the
            policy's relaxation ``cvm.allow_gpu_only``.
        challenge_ttl: seconds a challenge stays valid.
        max_request_bytes: larger request bodies are refused before parsing.
        rate_per_s, burst: each client's token bucket.
        max_outstanding: challenges kept at most (oldest evicted first).
        max_challenges_per_client: outstanding challenges one client address may hold.
        body_timeout_s: a whole request must arrive within this many seconds.
        receipt_dir: where receipts of visits are kept as files (``None``: not as files).
        dataset_names: each dataset's name (the sealed file's stem), in ``datasets``' order.
        releases: per-dataset release policies: a dataset named in one is released only to
            offers that pass that policy's verifier; the others under ``verifier``.
        state: the durable state (:mod:`gpucc.holder.state`): answered and issued
            challenges, receipts and an audit record per decision (``None``: memory only).
        orchestrator_key: receipts are accepted only when signed by this key (``None``:
            by any key, a few per session).
    """

    datasets: tuple[DatasetKey, ...] = field(repr=False)
    signing_key: ec.EllipticCurvePrivateKey = field(repr=False)
    verifier: PlatformVerifier = field(repr=False)
    challenge_ttl: float = 120.0
    max_request_bytes: int = 256 * 1024
    rate_per_s: float = 20.0
    burst: int = 40
    max_outstanding: int = 10_000
    max_challenges_per_client: int = 64
    body_timeout_s: float = 30.0
    receipt_dir: Path | None = None
    orchestrator_key: ec.EllipticCurvePublicKey | None = None
    state: SqliteState | PostgresState | None = field(default=None, repr=False)
    dataset_names: tuple[str, ...] = ()
    releases: tuple[ReleasePolicy, ...] = ()


class DatasetsRefused(ProtocolError):  # noqa: N818 - an outcome: no dataset may be released
    """The offer met no dataset's release policy; ``reasons`` name each dataset and rule."""

    def __init__(
        self, message: str, reasons: list[dict[str, str]], requester: str | None = None
    ) -> None:
        super().__init__(message)
        self.reasons = reasons
        self.requester = requester


@dataclass(frozen=True)
class Released:
    """An answered offer: the signed answer, and what the decision was."""

    envelope: bytes
    transcript_hash: bytes
    record: TrustRecord
    released: list[tuple[str, str]]  # (dataset, policy)
    withheld: list[dict[str, str]]
    requester: str | None


def _groups(
    config: HolderConfig,
) -> list[tuple[str, PlatformVerifier, frozenset[str], list[int]]]:
    """(policy name, verifier, requester key ids, indexes into ``config.datasets``) for each
    release policy that governs at least one dataset; ``default`` for the datasets no policy
    names."""
    names = _names(config)
    claimed: set[str] = set()
    groups = []
    for policy in config.releases:
        chosen = [i for i, n in enumerate(names) if n in policy.datasets and n not in claimed]
        claimed.update(names[i] for i in chosen)
        if chosen:
            verifier = policy.verifier or config.verifier
            groups.append((policy.name, verifier, policy.requesters, chosen))
    rest = [i for i, n in enumerate(names) if n not in claimed]
    if rest:
        groups.insert(0, ("default", config.verifier, frozenset[str](), rest))
    return groups


def _names(config: HolderConfig) -> tuple[str, ...]:
    return config.dataset_names or tuple(d.dataset_id.hex() for d in config.datasets)


def _identity_unmet(requesters: frozenset[str], requester: str | None) -> str | None:
    """Why the offer's requester does not meet a policy that names ``requesters``."""
    if not requesters or requester in requesters:
        return None
    if requester is None:
        return "the offer is not signed by a requester this policy names"
    return f"the offer is signed by requester {requester[:16]}…, not one this policy names"


def answer_offer(config: HolderConfig, offer: Offer, results: list[PlatformResult]) -> Released:
    """Verify ``offer`` through each release policy's platform verifier (every result
    appended to ``results``), wrap the keys of the datasets whose policy it meets (its
    attestation policy, and its requester identity when it names requesters) to its
    session, and sign the answer with the release's trust record.

    Raises:
        DatasetsRefused: no dataset's policy was met, or the offer's requester signature
            does not verify.
        ProtocolError: the one policy of a holder without release policies was not met.
    """
    names = _names(config)
    groups = _groups(config)
    try:
        requester = requester_key_id(offer)
    except RequesterSignatureError as exc:
        reasons = [
            {"dataset": names[i], "policy": policy, "check": "requester identity",
             "detail": one_line(exc)}
            for policy, _, _, chosen in groups for i in chosen
        ]  # fmt: skip
        raise DatasetsRefused(str(exc), reasons) from None
    released: list[tuple[int, str]] = []
    withheld: list[dict[str, str]] = []
    holder = None
    records: list[Any] = []
    for policy, verifier, requesters, chosen in groups:
        unmet_identity = _identity_unmet(requesters, requester)
        if unmet_identity is not None:
            for i in chosen:
                withheld.append(
                    {"dataset": names[i], "policy": policy, "check": "requester identity",
                     "detail": unmet_identity}
                )  # fmt: skip
            continue
        mine: list[PlatformResult] = []
        try:
            session = accept_offer(
                offer,
                challenge=offer.challenge,
                attest=verifier.gpu_attester(mine.append),
                attest_cvm=verifier.cvm_attester(mine.append),
                allow_gpu_only=verifier.allow_gpu_only,
            )
        except ProtocolError as exc:
            results.extend(mine)
            if len(groups) == 1 and not config.releases:  # one policy: its refusal as it is
                raise
            unmet = failed_checks(mine) or [{"check": "offer", "detail": one_line(exc)}]
            for i in chosen:
                for rule in unmet:
                    withheld.append({"dataset": names[i], "policy": policy, **rule})
            continue
        results.extend(mine)
        holder = holder or session
        records += [r.record for r in mine]
        released += [(i, policy) for i in chosen]
    if holder is None:
        raise DatasetsRefused("the offer meets no dataset's release policy", withheld, requester)
    record = release_record(records, gpu_only=holder.version == 1)
    released.sort()
    keys = [config.datasets[i] for i, _ in released]
    answer = holder.answer([holder.wrap(d) for d in keys]).to_json()
    envelope = sign_answer(
        config.signing_key, answer, holder.transcript_hash, record.to_dict()
    ).to_json()
    return Released(
        envelope,
        holder.transcript_hash,
        record,
        [(names[i], policy) for i, policy in released],
        withheld,
        requester,
    )


def whole_refusal(
    config: HolderConfig, exc: BaseException, reasons: list[dict[str, str]]
) -> list[dict[str, str]]:
    """A refusal of the whole offer (the one policy of a holder without release policies)
    as a refusal of each dataset, for the audit record."""
    unmet = reasons or [{"check": "offer", "detail": one_line(exc)}]
    return [
        {"dataset": name, "policy": "default", **{k: v for k, v in rule.items() if k != "dataset"}}
        for name in _names(config)
        for rule in unmet
    ]


def failed_checks(results: list[PlatformResult]) -> list[dict[str, str]]:
    refused = [r for r in results if not r.trusted]
    return refused[-1].failed_checks() if refused else []


def one_line(exc: BaseException) -> str:
    if isinstance(exc, GpuccError):
        return exc.diagnostics()[:500]
    return " ".join(str(exc).split())[:500]


def released_devices(results: list[PlatformResult]) -> list[str]:
    """The identities of the devices (GPUs, then NVSwitches) whose reports the offer
    carried, from the first verdict over them (every release policy judged the same
    reports): see :func:`~gpucc.keyrelease.protocol.offer_devices`."""
    for result in results:
        if result.gpu is not None:
            switches = result.switch.switches if result.switch is not None else ()
            return offer_devices([*result.gpu.gpus, *switches])
    return []
