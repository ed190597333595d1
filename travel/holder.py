"""Moved to :mod:`gpucc.holder.service`; this old path re-exports it
(docs/ARCHITECTURE.md, "What moved")."""

from gpucc.holder.service import *  # noqa: F403
from gpucc.holder.service import __all__ as __all__
