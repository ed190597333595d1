"""Encrypted, authenticated gradient exchange for PyTorch DistributedDataParallel.

Needs the ``torch`` extra (``pip install 'gpucc[torch]'``). ``docs/DDP.md`` describes the
protocol, its threat model and its known-answer vectors.
"""

from __future__ import annotations

from .errors import (
    GradientAuthenticationError,
    GroupSetupError,
    KeyUsageExceededError,
    PeerAuthenticationError,
    PeerNotTrustedError,
)
from .hook import EncryptedAllReduce, HookStats, choose_algorithm, encrypted_allreduce_hook
from .keys import GroupKeys, KeyUsage, UsageLimits
from .messages import MessageId, Phase

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
