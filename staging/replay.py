"""Moved to :mod:`gpucc.keyrelease.replay`; this old path re-exports it
(docs/ARCHITECTURE.md, "What moved")."""

from gpucc.keyrelease.replay import *  # noqa: F403
from gpucc.keyrelease.replay import __all__ as __all__
