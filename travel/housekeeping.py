"""Moved to :mod:`gpucc.holder.housekeeping`; this old path re-exports it
(docs/ARCHITECTURE.md, "What moved")."""

from gpucc.holder.housekeeping import *  # noqa: F403
from gpucc.holder.housekeeping import __all__ as __all__
