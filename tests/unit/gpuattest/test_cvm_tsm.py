"""configfs-tsm collection against a directory standing in for the kernel's interface."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucc.gpuattest.cvm.tsm import collect_tsm_report
from gpucc.gpuattest.errors import EnvironmentProblemError, MalformedEvidenceError

RD = bytes(range(64))


def fake_entry(
    root: Path, name: str, *, provider: str = "tdx_guest", outblob: bytes = b"quote"
) -> Path:
    """What the kernel shows after ``mkdir``: the entry with its attributes."""
    entry = root / name
    entry.mkdir(parents=True)
    (entry / "provider").write_text(provider + "\n")
    (entry / "generation").write_text("1\n")
    (entry / "outblob").write_bytes(outblob)
    return entry


def test_collects_evidence_and_writes_the_report_data(tmp_path: Path) -> None:
    entry = fake_entry(tmp_path, "e")
    report = collect_tsm_report(RD, root=tmp_path, name="e")
    assert (report.kind, report.provider, report.evidence) == ("tdx", "tdx_guest", b"quote")
    assert (entry / "inblob").read_bytes() == RD
    assert report.auxblob is None


def test_snp_with_an_auxblob(tmp_path: Path) -> None:
    entry = fake_entry(tmp_path, "e", provider="sev_guest")
    (entry / "auxblob").write_bytes(b"certs")
    report = collect_tsm_report(RD, root=tmp_path, name="e")
    assert report.kind == "snp" and report.auxblob == b"certs"


def test_no_interface_is_an_environment_problem(tmp_path: Path) -> None:
    with pytest.raises(EnvironmentProblemError, match="not a TDX or SEV-SNP guest"):
        collect_tsm_report(RD, root=tmp_path / "missing")


@pytest.mark.parametrize(
    ("provider", "outblob", "error", "words"),
    [
        ("other_guest", b"x", EnvironmentProblemError, "not TDX or SEV-SNP"),
        ("tdx_guest", b"", MalformedEvidenceError, "empty"),
        ("tdx_guest", b"x" * 70_000, MalformedEvidenceError, "larger than"),
    ],
)
def test_bad_answers_from_the_interface(
    tmp_path: Path, provider: str, outblob: bytes, error: type[Exception], words: str
) -> None:
    fake_entry(tmp_path, "e", provider=provider, outblob=outblob)
    with pytest.raises(error, match=words):
        collect_tsm_report(RD, root=tmp_path, name="e")


def test_a_fresh_entry_without_a_kernel_behind_it_fails_cleanly(tmp_path: Path) -> None:
    """A plain directory does not answer: the error names what could not be read."""
    with pytest.raises(EnvironmentProblemError, match="cannot read generation"):
        collect_tsm_report(RD, root=tmp_path)


def test_report_data_must_be_64_bytes(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="64 bytes"):
        collect_tsm_report(b"short", root=tmp_path)


def test_the_session_collector_names_the_gpu_only_way_out(tmp_path: Path) -> None:
    from gpucc.cli.session_cvm import cvm_collector

    collect = cvm_collector(simulate=None, collateral=None, gpu_only=False, tsm_root=tmp_path / "x")
    assert collect is not None
    with pytest.raises(EnvironmentProblemError) as info:
        collect(RD)
    assert "--gpu-only" in info.value.diagnostics()
    assert cvm_collector(simulate=None, collateral=None, gpu_only=True) is None
