"""The error families under their former name: :mod:`gpucc.core.errors` (re-exported)."""

from __future__ import annotations

from gpucc.core.errors import *  # noqa: F403 - the former public name of the same objects
from gpucc.core.errors import __all__ as __all__
