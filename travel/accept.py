"""Moved to :mod:`gpucc.holder.accept`; this old path re-exports it
(docs/ARCHITECTURE.md, "What moved")."""

from gpucc.holder.accept import *  # noqa: F403
from gpucc.holder.accept import __all__ as __all__
