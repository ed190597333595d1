"""Attested group setup: challenge, offers, mutual verification, verdicts, keys.

Four exchanges over the process group, each an ``all_gather`` of length-bounded byte
strings (raw bytes in tensors; nothing is unpickled):

1. 32 random bytes per rank -> the group challenge (:func:`messages.group_challenge`).
2. Every rank's session offer (:func:`gpucc.keyrelease.protocol.create_offer` with the group
   challenge and a fresh ephemeral P-384 key).
3. Every rank verifies every peer's offer with :func:`gpucc.keyrelease.protocol.accept_offer`
   under the caller's ``attest`` and sends its verdicts and its transcript hash.
4. (No message) every rank derives ``ECDH(own, peer)`` per peer, and the edge keys.

A refusal anywhere raises :class:`PeerNotTrustedError` on every rank.
"""

from __future__ import annotations

import datetime as dt
import hmac
import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives.asymmetric import ec

from gpucc.core.errors import GpuccError, MalformedInputError
from gpucc.core.jsonio import loads_untrusted
from gpucc.keyrelease.messages import CURVE, MAX_OFFER_BYTES, decode_public_key
from gpucc.keyrelease.protocol import (
    Attester,
    CollectedCvmEvidence,
    CollectedEvidence,
    CvmAttester,
    EvidenceLoader,
    Offer,
    accept_offer,
    create_offer,
)

from .errors import GroupSetupError, PeerNotTrustedError
from .messages import (
    CONTRIBUTION_SIZE,
    encode_group_transcript,
    group_challenge,
    group_transcript_hash,
)

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["MAX_VERDICT_BYTES", "GroupSecrets", "establish_group", "exchange_bytes"]

MAX_VERDICT_BYTES = 64 * 1024
_REASON_CHARS = 400


@dataclass(frozen=True)
class GroupSecrets:
    """What attested setup established for this rank: a secret shared with each peer and
    the transcript hash every rank agreed on (the group's keys are derived from them)."""

    rank: int
    world_size: int
    shared_secrets: dict[int, bytes] = field(repr=False)
    transcript_hash: bytes
    gpu_only_peers: tuple[int, ...] = ()


def exchange_bytes(data: bytes, *, limit: int, group: ProcessGroup | None) -> list[bytes]:
    """All ranks' ``data`` in rank order; any entry over ``limit`` bytes is refused.

    Lengths go first, so nothing oversized is allocated or received.

    Raises:
        GroupSetupError: some rank's data is larger than ``limit``.
    """
    import torch
    import torch.distributed as dist

    size = dist.get_world_size(group)
    mine = torch.tensor([len(data)], dtype=torch.int64)
    lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(size)]
    dist.all_gather(lengths, mine, group=group)
    sizes = [int(t.item()) for t in lengths]
    too_big = [r for r, n in enumerate(sizes) if not 0 <= n <= limit]
    if too_big:
        raise GroupSetupError(f"rank(s) {too_big} sent more than {limit} bytes during setup")
    width = max(sizes + [1])
    buf = torch.zeros(width, dtype=torch.uint8)
    if data:
        buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    out = [torch.empty(width, dtype=torch.uint8) for _ in range(size)]
    dist.all_gather(out, buf, group=group)
    return [bytes(t[:n].numpy().tobytes()) for t, n in zip(out, sizes, strict=True)]


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 3] + "..."


def _verify_peer(
    raw: bytes,
    *,
    challenge: bytes,
    attest: Attester,
    load_evidence: EvidenceLoader | None,
    private_key: ec.EllipticCurvePrivateKey,
    attest_cvm: CvmAttester | None,
    allow_gpu_only: bool,
) -> str | None:
    """None when the peer's offer is trusted, else the reason (never key material)."""
    if not raw:
        return "the rank made no offer (its evidence collection failed)"
    try:
        offer = Offer.from_json(raw)
        accept_offer(
            offer,
            challenge=challenge,
            attest=attest,
            load_evidence=load_evidence,
            private_key=private_key,
            attest_cvm=attest_cvm,
            allow_gpu_only=allow_gpu_only,
        )
    except GpuccError as exc:
        return _short(exc.diagnostics())
    except Exception as exc:  # a verifier bug must refuse, not pass
        return _short(f"verification failed: {type(exc).__name__}")
    return None


def establish_group(
    group: ProcessGroup | None,
    *,
    collect: Callable[[bytes], CollectedEvidence],
    attest: Attester,
    epoch: int,
    timeout: dt.timedelta,
    load_evidence: EvidenceLoader | None,
    collect_cvm: Callable[[bytes], CollectedCvmEvidence] | None = None,
    attest_cvm: CvmAttester | None = None,
    allow_gpu_only: bool | None = None,
) -> GroupSecrets:
    """See :meth:`gpucc.ddp.keys.GroupKeys.establish`.

    ``allow_gpu_only`` None: GPU-only peers are accepted exactly when no CVM verifier is
    given (the group then binds to GPU evidence only, version 1)."""
    gpu_only_ok = attest_cvm is None if allow_gpu_only is None else allow_gpu_only
    import torch.distributed as dist

    rank = dist.get_rank(group)
    size = dist.get_world_size(group)
    if size < 2:
        raise GroupSetupError("encrypted all-reduce needs at least two ranks")
    if dist.get_backend(group) == "gloo":
        # Names the rank that does not arrive instead of waiting without end.
        dist.monitored_barrier(group, timeout=timeout)
    # (1) the group challenge
    contributions = exchange_bytes(
        secrets.token_bytes(CONTRIBUTION_SIZE), limit=CONTRIBUTION_SIZE, group=group
    )
    if any(len(c) != CONTRIBUTION_SIZE for c in contributions):
        raise GroupSetupError("a rank sent a malformed challenge contribution")
    challenge = group_challenge(contributions, epoch=epoch)
    # (2) offers; a rank whose collection fails still takes part, with an empty offer
    private = ec.generate_private_key(CURVE)
    own_error: BaseException | None = None
    try:
        offer, _ = create_offer(challenge, collect, private_key=private, collect_cvm=collect_cvm)
        own = offer.to_json()
    except Exception as exc:
        own_error, own = exc, b""
    offers = exchange_bytes(own, limit=MAX_OFFER_BYTES, group=group)
    if not hmac.compare_digest(offers[rank], own):
        raise GroupSetupError("the group returned another offer for this rank")
    # (3) verify every peer, then share verdicts and the transcript hash
    refused: dict[int, str] = {}
    for peer in range(size):
        if peer != rank:
            reason = _verify_peer(
                offers[peer],
                challenge=challenge,
                attest=attest,
                load_evidence=load_evidence,
                private_key=private,
                attest_cvm=attest_cvm,
                allow_gpu_only=gpu_only_ok,
            )
            if reason is not None:
                refused[peer] = reason
    if own_error is not None:
        refused[rank] = _short(f"evidence collection failed: {type(own_error).__name__}")
    th = group_transcript_hash(encode_group_transcript(offers, challenge=challenge, epoch=epoch))
    verdict = json.dumps(
        {"refused": {str(k): v for k, v in refused.items()}, "transcript": th.hex()}
    ).encode()
    verdicts = exchange_bytes(verdict[:MAX_VERDICT_BYTES], limit=MAX_VERDICT_BYTES, group=group)
    reasons: dict[int, list[str]] = {}
    hashes: set[str] = set()
    for judge, raw in enumerate(verdicts):
        doc = _parse_verdict(raw, judge)
        hashes.add(str(doc.get("transcript")))
        for who, why in doc["refused"].items():
            reasons.setdefault(int(who), []).append(f"by rank {judge}: {why}")
    if reasons:
        raise PeerNotTrustedError({r: tuple(v) for r, v in reasons.items()})
    if hashes != {th.hex()}:
        raise GroupSetupError("the ranks saw different offers (transcript hashes differ)")
    # (4) pairwise secrets; the keys are derived per epoch from them
    shared = {
        peer: private.exchange(ec.ECDH(), decode_public_key(_public_key(offers[peer]), "peer"))
        for peer in range(size)
        if peer != rank
    }
    gpu_only = tuple(peer for peer in range(size) if peer != rank and _is_gpu_only(offers[peer]))
    return GroupSecrets(
        rank=rank,
        world_size=size,
        shared_secrets=shared,
        transcript_hash=th,
        gpu_only_peers=gpu_only,
    )


def _is_gpu_only(raw: bytes) -> bool:
    from gpucc.keyrelease.messages import GPU_ONLY_VERSION

    return Offer.from_json(raw).version == GPU_ONLY_VERSION


def _public_key(raw: bytes) -> bytes:
    return Offer.from_json(raw).host_public_key


def _parse_verdict(raw: bytes, judge: int) -> dict[str, Any]:
    try:
        doc = loads_untrusted(raw, what="verdict", error=MalformedInputError)
        refused = doc["refused"]
        if not isinstance(refused, dict) or not all(
            isinstance(v, str) and k.isdigit() for k, v in refused.items()
        ):
            raise ValueError
    except (MalformedInputError, ValueError, KeyError, TypeError):
        raise GroupSetupError(f"rank {judge} sent a malformed verdict") from None
    return dict(doc)
