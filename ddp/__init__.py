"""Encrypted, authenticated gradient exchange for PyTorch DistributedDataParallel.

Needs the ``torch`` extra (``pip install 'gpucc[torch]'``). ``docs/DDP.md`` describes the
protocol, its threat model and its known-answer vectors.
"""

from __future__ import annotations

from gpucc.core.extras import require

require("torch", "gpucc.ddp (encrypted gradient exchange)")

from .errors import (  # noqa: E402
    GradientAuthenticationError,
    GroupSetupError,
    KeyUsageExceededError,
    PeerAuthenticationError,
    PeerNotTrustedError,
)
from .hook import EncryptedAllReduce, HookStats, choose_algorithm, encrypted_allreduce_hook  # noqa: E402
from .keys import GroupKeys, KeyUsage, UsageLimits  # noqa: E402
from .messages import MessageId, Phase  # noqa: E402

__all__ = [
    "EncryptedAllReduce",
    "GradientAuthenticationError",
    "GroupKeys",
    "GroupSetupError",
    "HookStats",
    "KeyUsage",
    "KeyUsageExceededError",
    "MessageId",
    "PeerAuthenticationError",
    "PeerNotTrustedError",
    "Phase",
    "UsageLimits",
    "choose_algorithm",
    "encrypted_allreduce_hook",
]
