"""Moved to :mod:`gpucc.keyrelease.cvm`; this old path re-exports it
(docs/ARCHITECTURE.md, "What moved")."""

from gpucc.keyrelease.cvm import *  # noqa: F403
from gpucc.keyrelease.cvm import __all__ as __all__
