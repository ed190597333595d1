"""The suite's own check (tests/conftest.py): a broad ``pytest.raises`` passes only for an
error of gpucc's family; a crash it would have swallowed fails the test."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucc.core.errors import MalformedInputError
from gpucc.staging.cpu import open_plaintext

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"


def test_a_broad_expectation_passes_for_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(Exception) as info:
        open_plaintext(tmp_path, 4096)  # a directory: MalformedInputError
    assert isinstance(info.value, MalformedInputError)


def test_a_named_builtin_passes_as_named() -> None:
    with pytest.raises(ValueError):
        int("x")


def _crash() -> None:
    raise KeyError("not a gpucc error")


def test_a_broad_expectation_fails_on_a_crash() -> None:
    with pytest.raises(pytest.fail.Exception, match="outside gpucc's error family"):
        with pytest.raises(Exception):  # noqa: B017  (the check under test)
            _crash()
    with pytest.raises(pytest.fail.Exception, match="KeyError"):
        pytest.raises((MalformedInputError, BaseException), _crash)
