"""Moved to :mod:`gpucc.core.httpserver`; this old path re-exports it
(docs/ARCHITECTURE.md, "What moved")."""

from gpucc.core.httpserver import *  # noqa: F403
from gpucc.core.httpserver import __all__ as __all__
