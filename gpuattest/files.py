"""The safe file helpers under their former name: :mod:`gpucc.core.files` (re-exported)."""

from __future__ import annotations

from gpucc.core.files import *  # noqa: F403 - the former public name of the same objects
from gpucc.core.files import __all__ as __all__
