"""Moved to :mod:`gpucc.holder.state_schema`; this old path re-exports it
(docs/ARCHITECTURE.md, "What moved")."""

from gpucc.holder.state_schema import *  # noqa: F403
from gpucc.holder.state_schema import __all__ as __all__
