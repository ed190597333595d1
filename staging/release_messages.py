"""Moved to :mod:`gpucc.keyrelease.messages`; this old path re-exports it
(docs/ARCHITECTURE.md, "What moved")."""

from gpucc.keyrelease.messages import *  # noqa: F403
from gpucc.keyrelease.messages import __all__ as __all__
