"""Moved to :mod:`gpucc.keyrelease.protocol`; this old path re-exports it
(docs/ARCHITECTURE.md, "What moved")."""

from gpucc.keyrelease.protocol import *  # noqa: F403
from gpucc.keyrelease.protocol import __all__ as __all__
