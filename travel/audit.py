"""Moved to :mod:`gpucc.holder.audit`; this old path re-exports it
(docs/ARCHITECTURE.md, "What moved")."""

from gpucc.holder.audit import *  # noqa: F403
from gpucc.holder.audit import __all__ as __all__
