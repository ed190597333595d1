"""Optional extras: which module comes with which, and the error that names the one missing.

gpucc's base install runs every command that needs no optional package; the rest need an
extra (``pip install 'gpucc[EXTRA]'``). A path that needs one imports it with
:func:`require`, or turns the ``ModuleNotFoundError`` it met into :class:`MissingExtraError`
with :func:`missing_extra`, so that a missing extra is said, with the command that installs
it, never reported as a crash. The command line maps any such error that escaped a path the
same way.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import EnvironmentProblemError

__all__ = ["EXTRAS", "MissingExtraError", "missing_extra", "require"]

#: Top-level module -> (the extra that brings it, its distribution's name).
EXTRAS: dict[str, tuple[str, str]] = {
    "boto3": ("s3", "boto3"),
    "botocore": ("s3", "boto3"),
    "starlette": ("holder", "starlette"),
    "h11": ("holder", "h11"),
    "torch": ("torch", "torch"),
    "cupy": ("gpu", "CuPy"),
    "pynvml": ("nvml", "nvidia-ml-py"),
    "blake3": ("model", "blake3"),
    "prometheus_client": ("metrics", "prometheus-client"),
    "psycopg": ("state-postgres", "psycopg"),
    "sevsnpmeasure": ("cvm-reference", "sev-snp-measure"),
}


class MissingExtraError(EnvironmentProblemError, ModuleNotFoundError):
    """An optional extra that this path needs is not installed.

    Also a ``ModuleNotFoundError`` (``name`` is the module), so code that catches
    ``ImportError`` around an optional import sees it as before.

    Attributes:
        extra: the extra to install (``s3``, ``torch`` ...).
        module: the top-level module that was not found.
    """

    def __init__(self, message: str, *, extra: str = "", module: str = "") -> None:
        super().__init__(message, name=module or None)
        self.extra = extra
        self.module = module


def _error(module: str, purpose: str) -> MissingExtraError:
    extra, package = EXTRAS[module]
    return MissingExtraError(
        f"{purpose} needs {package}: pip install 'gpucc[{extra}]'", extra=extra, module=module
    )


def missing_extra(exc: BaseException, purpose: str = "") -> MissingExtraError | None:
    """The :class:`MissingExtraError` that ``exc`` means, or None.

    ``exc`` means one when it is a ``ModuleNotFoundError`` for a module of an extra (or one
    of its submodules); ``purpose`` says what needed it (default: the extra, as
    ``the s3 extra``).
    """
    if isinstance(exc, MissingExtraError):
        return exc
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    top = exc.name.partition(".")[0]
    if top not in EXTRAS:
        return None
    return _error(top, purpose or f"this command (the {EXTRAS[top][0]} extra)")


def require(module: str, purpose: str) -> ModuleType:
    """Import ``module`` (of an extra's package) for ``purpose``.

    Raises:
        MissingExtraError: the extra is not installed (``purpose`` needs PACKAGE: pip
            install 'gpucc[EXTRA]').
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        error = missing_extra(exc, purpose)
        if error is None:
            raise
        raise error from None
