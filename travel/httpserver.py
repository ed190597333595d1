"""Moved to :mod:`gpucc.holder.httpserver`; this old path re-exports it
(docs/ARCHITECTURE.md, "What moved")."""

from gpucc.holder.httpserver import *  # noqa: F403
from gpucc.holder.httpserver import __all__ as __all__
