"""The documents commands print are library values: built in Python, each is what its
command's ``-f json`` prints, and valid under the schema the package ships."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from gpucc.assembly.reports import DemoRun, EvidenceWritten
from gpucc.cli.boundary import VERDICT_FIELDS
from gpucc.cli.schemas import load_schema
from gpucc.core.outcomes import COLLATERAL, Failure
from gpucc.holder.audit import AuditRecords
from gpucc.keyrelease.reports import AnswerAccepted, ChallengeIssued, OfferWritten
from gpucc.staging.report import StageReport
from gpucc.travel.orchestrator import TravelResult
from gpucc.travel.signing import write_key_pair


def _valid(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` as a successful command prints it (a verdict-bearing document gains the exit
    status the process ends with), checked against its schema."""
    printed = dict(doc)
    if any(k in doc for k in VERDICT_FIELDS):
        printed.update(exit_code=0, exit_kind="ok")
    Draft202012Validator(load_schema(doc["schema"])).validate(printed)
    return doc


def _stage(**changes: Any) -> StageReport:
    report = StageReport(
        dataset="d.gcc", device="cpu", gpus=0, input="sealed", key_source="key-file",
        dataset_id="00" * 16, nbytes=4096, chunks=1, chunk_size=4096, threads=2,
        verified=True, scrubbed=True, held_bytes=4096, seconds=0.5,
    )  # fmt: skip
    return dataclasses.replace(report, **changes)


def test_a_stage_report_is_the_stage_document() -> None:
    doc = _valid(_stage().to_dict())
    assert list(doc)[:7] == [
        "schema", "dataset", "device", "gpus", "input", "key_source", "dataset_id",
    ]  # fmt: skip
    assert doc["bytes_per_second"] == 8192 and doc["gb_per_s"] == 0.0
    shards = _valid(_stage(shards=3).to_dict())
    assert list(shards)[:3] == ["schema", "dataset", "shards"]
    assert _stage(seconds=0.0).to_dict()["gb_per_s"] is None


@pytest.mark.parametrize(
    "value",
    [
        ChallengeIssued(b"\x01" * 32),
        OfferWritten("offer.json", "host.key", 1, b"\x02" * 32, True, 2, None),
        AnswerAccepted("answer.json", [b"\x03" * 32], ["d.gcc"]),
        EvidenceWritten(Path("ev.json"), 1, 0, b"\x04" * 32, None),
        DemoRun(
            [
                {"step": n, "name": name, "ok": True}
                for n, name in enumerate(("attest", "session", "seal", "stage", "tamper"), 1)
            ]
        ),
        Failure(COLLATERAL, "no RIM", "use --collateral"),
        AuditRecords(()),
        TravelResult((), None, "ab" * 32),
    ],
    ids=lambda v: type(v).__name__,
)
def test_a_value_makes_a_valid_document(value: Any) -> None:
    doc = _valid(value.to_dict())
    assert doc["schema"] == type(value).SCHEMA


def test_a_key_pair_written_by_the_library_is_the_keygen_document(tmp_path: Path) -> None:
    written = write_key_pair(tmp_path / "h.key", tmp_path / "h.pub")
    doc = _valid(written.to_dict())
    assert doc["pin"].startswith("sha256:") and (tmp_path / "h.pub").is_file()
