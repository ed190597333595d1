"""Moved to :mod:`gpucc.holder.state_retention`; this old path re-exports it
(docs/ARCHITECTURE.md, "What moved")."""

from gpucc.holder.state_retention import *  # noqa: F403
from gpucc.holder.state_retention import __all__ as __all__
