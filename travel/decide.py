"""Moved to :mod:`gpucc.holder.decide`; this old path re-exports it
(docs/ARCHITECTURE.md, "What moved")."""

from gpucc.holder.decide import *  # noqa: F403
from gpucc.holder.decide import __all__ as __all__
