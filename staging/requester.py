"""Moved to :mod:`gpucc.keyrelease.requester`; this old path re-exports it
(docs/ARCHITECTURE.md, "What moved")."""

from gpucc.keyrelease.requester import *  # noqa: F403
from gpucc.keyrelease.requester import __all__ as __all__
