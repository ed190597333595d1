"""Moved to :mod:`gpucc.holder.state`; this old path re-exports it
(docs/ARCHITECTURE.md, "What moved")."""

from gpucc.holder.state import *  # noqa: F403
from gpucc.holder.state import __all__ as __all__
