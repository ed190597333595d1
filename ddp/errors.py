"""Typed errors of :mod:`gpucc.ddp`, in the families of :mod:`gpucc.core.errors`.

Messages name ranks, steps, buckets and phases; they never contain key material.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpucc.core.errors import IntegrityError, NotTrustedError, UsageError

__all__ = [
    "GradientAuthenticationError",
    "GroupSetupError",
    "KeyUsageExceededError",
    "PeerAuthenticationError",
    "PeerNotTrustedError",
]


class GradientAuthenticationError(IntegrityError):
    """A sealed gradient piece did not open on the receiving rank.

    Raised on the receiving rank before any unverified value reaches a gradient. Causes:
    a flipped bit, a replayed, reordered, swapped, dropped or misdirected message, or a
    sender using another key.

    Attributes:
        sender: the rank the piece should have come from.
        receiver: this rank.
        epoch: the key epoch.
        step: the step counter of the epoch.
        bucket: the DDP bucket index.
        phase: the phase name (``a2a-scatter``, ``a2a-gather``, ``ring-scatter``,
            ``ring-gather``).
        hop: the hop within the phase.
    """

    def __init__(
        self,
        *,
        sender: int,
        receiver: int,
        epoch: int,
        step: int,
        bucket: int,
        phase: str,
        hop: int,
    ) -> None:
        super().__init__(
            f"gradient message from rank {sender} to rank {receiver} failed authentication "
            f"(epoch {epoch}, step {step}, bucket {bucket}, phase {phase}, hop {hop}): "
            "tampered, replayed, reordered, dropped, from another sender, or sealed under "
            "another key; nothing from it was applied"
        )
        self.sender = sender
        self.receiver = receiver
        self.epoch = epoch
        self.step = step
        self.bucket = bucket
        self.phase = phase
        self.hop = hop


class PeerAuthenticationError(IntegrityError):
    """Another rank rejected a gradient message in this step; this rank stops too.

    Attributes:
        ranks: the ranks that rejected a message.
        epoch: the key epoch.
        step: the step counter of the epoch.
    """

    def __init__(self, *, ranks: tuple[int, ...], epoch: int, step: int) -> None:
        names = ", ".join(str(r) for r in ranks)
        super().__init__(
            f"rank(s) {names} rejected a gradient message in epoch {epoch}, step {step}; "
            "the step is abandoned on every rank and nothing was applied"
        )
        self.ranks = ranks
        self.epoch = epoch
        self.step = step


class PeerNotTrustedError(NotTrustedError):
    """Group setup refused one or more ranks: their evidence is not trusted.

    Raised on every rank of the group, so no rank goes on alone.

    Attributes:
        ranks: the refused ranks.
        reasons: per refused rank, the reasons given by the ranks that refused it.
    """

    def __init__(self, reasons: Mapping[int, tuple[str, ...]]) -> None:
        ranks = tuple(sorted(reasons))
        detail = "; ".join(f"rank {r}: {' / '.join(reasons[r])}" for r in ranks)
        super().__init__(f"the group refused rank(s) {', '.join(map(str, ranks))}: {detail}")
        self.ranks = ranks
        self.reasons = dict(reasons)


class GroupSetupError(NotTrustedError):
    """Group setup cannot agree (different transcripts, malformed or oversized offers)."""


class KeyUsageExceededError(UsageError):
    """A key reached its usage limit without a rekey (the limits are checked per message)."""
