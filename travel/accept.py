"""Moved to :mod:`gpucc.core.accept`; this old path re-exports it
(docs/ARCHITECTURE.md, "What moved")."""

from gpucc.core.accept import *  # noqa: F403
from gpucc.core.accept import __all__ as __all__
