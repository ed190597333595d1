"""Moved to :mod:`gpucc.holder.metrics`; this old path re-exports it
(docs/ARCHITECTURE.md, "What moved")."""

from gpucc.holder.metrics import *  # noqa: F403
from gpucc.holder.metrics import __all__ as __all__
