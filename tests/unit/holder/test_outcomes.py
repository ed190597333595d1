"""The one outcome table: the command line's exit statuses and the holder's HTTP refusals."""

from __future__ import annotations

import ast

import pytest

from gpucc.cli.exitcodes import OUTCOMES, outcome_for
from gpucc.core import errors, outcomes
from gpucc.holder import refusals
from gpucc.holder.decide import DatasetsRefused
from gpucc.holder.state import StateUnavailableError
from gpucc.keyrelease.requester import RequesterSignatureError
from gpucc.staging.errors import ProtocolError
from tests.support.paths import ROOT


@pytest.mark.parametrize(
    ("error", "code", "status", "name"),
    [
        (errors.MalformedEvidenceError("x"), 4, 400, "malformed"),
        (errors.OfflineError("x"), 3, 503, "collateral-unavailable"),
        (StateUnavailableError("x"), 5, 503, "state-unavailable"),
        (errors.NvmlUnavailableError("x"), 5, 403, "refused"),
        (ProtocolError("x"), 1, 403, "not-trusted"),
        (DatasetsRefused("x", []), 1, 403, "not-trusted"),
        (RequesterSignatureError("x"), 1, 403, "not-trusted"),
        (errors.NotTrustedError("x"), 1, 403, "refused"),
        (errors.IntegrityError("x"), 6, 403, "refused"),
        (errors.WrongKeyError("x"), 7, 403, "refused"),
        (errors.FileAccessError("x"), 8, 403, "refused"),
        (errors.UsageError("x"), 2, 403, "refused"),
        (errors.GpuccError("x"), 1, 403, "refused"),
        (RuntimeError("x"), 70, 500, "internal"),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_an_error_has_one_exit_status_and_one_http_answer(
    error: BaseException, code: int, status: int, name: str
) -> None:
    assert outcome_for(error).code == code
    assert refusals.HOLDER_OUTCOMES.outcome_for(error).code == code
    assert refusals.HOLDER_OUTCOMES.http_for(error) == outcomes.HttpAnswer(status, name)


def test_the_holders_rows_keep_their_familys_exit_outcome() -> None:
    """The holder's rows only say how to answer over HTTP: the exit status of an error is
    the command line's whether or not the holder's table is asked."""
    added = refusals.HOLDER_OUTCOMES.rows[: -len(outcomes.FAMILIES)]
    assert added and refusals.HOLDER_OUTCOMES.rows[len(added) :] == OUTCOMES.rows
    for row in added:
        assert row.outcome == OUTCOMES.outcome_for(row.family.__new__(row.family))


def test_a_more_specific_row_comes_first() -> None:
    rows = outcomes.FAMILIES
    for i, row in enumerate(rows):
        for later in rows[i + 1 :]:
            assert not issubclass(later.family, row.family), (row.family, later.family)


def test_the_holder_service_names_every_refusal() -> None:
    """No HTTP status is written out where requests are answered: each comes from
    refusals.py's names or the outcome table."""
    tree = ast.parse((ROOT / "holder" / "service.py").read_text(encoding="utf-8"))
    answering = {"build_app", "RequestHandlers", "_refuse", "_refuse_for"}
    found = {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name in answering
    }
    assert found == answering
    statuses = [
        f"{top.name}, line {node.lineno}: {node.value}"
        for top in tree.body
        if isinstance(top, ast.FunctionDef | ast.ClassDef) and top.name in answering
        for node in ast.walk(top)
        if isinstance(node, ast.Constant) and type(node.value) is int and 400 <= node.value < 600
    ]
    assert statuses == []
