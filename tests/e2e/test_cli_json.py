"""``--format json`` on every command: one document on stdout, valid against its shipped schema.

Every document checked here comes from a real ``python -m gpucc`` process; the schemas are
the ones the package ships (``gpucc.cli.schemas``), validated as draft 2020-12.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from gpucc.cli.exitcodes import SIGNAL_CODES, TABLE
from gpucc.cli.schemas import load_schema, schema_names

SAMPLE_AT = "2024-01-01T00:00:00Z"
CS = 4096


def gpucc(
    *args: str | Path, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GPUCC_", "NVAT_"))}
    base["COLUMNS"] = "200"
    result = subprocess.run(
        [sys.executable, "-m", "gpucc", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=base | (env or {}),
        check=False,
    )
    assert "Traceback" not in result.stderr + result.stdout
    return result


def document(result: subprocess.CompletedProcess[str], schema: str) -> dict[str, Any]:
    """The one JSON document on stdout, validated against the shipped schema it names."""
    doc = json.loads(result.stdout)  # exactly one document: json.loads refuses trailing data
    assert isinstance(doc, dict) and doc["schema"] == schema, result.stdout[:200]
    Draft202012Validator(load_schema(schema)).validate(doc)
    if schema == "gpucc.error/v1":
        assert doc["error"]["code"] == result.returncode
        assert result.stderr.count("gpucc: error: ") == 1
    else:
        assert result.returncode == 0, result.stderr
    return doc


@pytest.fixture
def work(tmp_path: Path) -> Path:
    data = bytes(range(256)) * (5 * CS // 256) + b"x" * 123
    (tmp_path / "d.bin").write_bytes(data)
    (tmp_path / "small.txt").write_bytes(b"hello\n")
    return tmp_path


def _seal(work: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return gpucc(
        "seal", "d.bin", "-o", "d.gcc", "--data-key", "k.key", "--chunk-size", "4KiB",
        *extra, cwd=work,
    )  # fmt: skip


def test_every_shipped_schema_is_a_valid_draft_2020_12_schema() -> None:
    names = schema_names()
    assert "gpucc.error/v1" in names and len(names) >= 13
    for name in names:
        schema = load_schema(name)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        Draft202012Validator.check_schema(schema)
        assert schema["properties"]["schema"] == {"const": name}


def test_every_command_takes_format_and_its_aliases() -> None:
    import typer

    from gpucc.cli.main import app

    def leaves(command: Any, path: str) -> list[tuple[str, Any]]:
        subs = getattr(command, "commands", None)
        if subs:
            return [leaf for n, c in subs.items() for leaf in leaves(c, f"{path} {n}".strip())]
        return [(path, command)]

    commands = leaves(typer.main.get_command(app), "")
    assert len(commands) >= 11
    for path, command in commands:
        formats = [p for p in command.params if "--format" in p.opts]
        assert len(formats) == 1, path
        assert "-f" in formats[0].opts and formats[0].envvar == ["GPUCC_FORMAT", "NVAT_FORMAT"]


def test_error_schema_kinds_are_the_exit_table() -> None:
    error = load_schema("gpucc.error/v1")["properties"]["error"]["properties"]
    failing = [o for o in TABLE if o.code != 0]
    codes = {o.code for o in failing} | set(SIGNAL_CODES.values())  # 129, 143 beside 130
    assert sorted(error["code"]["enum"]) == sorted(codes)
    assert sorted(error["kind"]["enum"]) == sorted(o.kind for o in failing)


def test_attest_sample_json_and_its_aliases(tmp_path: Path) -> None:
    for args, env in (
        (("--format", "json"), {}),
        (("-f", "json"), {}),
        ((), {"GPUCC_FORMAT": "json"}),
        ((), {"NVAT_FORMAT": "json"}),
    ):
        result = gpucc("attest", "--sample", "--at", SAMPLE_AT, *args, cwd=tmp_path, env=env)
        doc = document(result, "gpucc.attest/v1")
        assert doc["verdict"] == "trusted" and doc["exit_code"] == 0


def test_attest_without_gpu_prints_the_error_document(tmp_path: Path) -> None:
    result = gpucc("attest", "-f", "json", cwd=tmp_path)
    if result.returncode == 0:
        pytest.skip("this machine has a usable GPU and NVML")
    doc = document(result, "gpucc.error/v1")
    assert doc["error"]["kind"] == "environment" and result.returncode == 5
    assert "pip install 'gpucc[nvml]'" in doc["error"]["hint"]
    assert "--evidence FILE" in doc["error"]["hint"]  # attest has --evidence


@pytest.mark.parametrize(
    "args",
    [
        ("evidence", "collect", "-o", "evidence.json"),
        ("session", "offer", "--challenge", "00" * 32, "-o", "offer.json", "--host-key", "h.key"),
    ],
)
def test_commands_without_evidence_option_do_not_suggest_it(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    result = gpucc(*args, "-f", "json", cwd=tmp_path)
    if result.returncode == 0:
        pytest.skip("this machine has a usable GPU and NVML")
    doc = document(result, "gpucc.error/v1")
    assert result.returncode == 5
    assert "--evidence" not in doc["error"]["hint"] and "--evidence" not in result.stderr
    assert "pip install 'gpucc[nvml]'" in doc["error"]["hint"]
    assert "pip download" not in result.stderr
    assert not (tmp_path / "evidence.json").exists() and not (tmp_path / "offer.json").exists()


def test_usage_error_in_json_mode(tmp_path: Path) -> None:
    result = gpucc("seal", "-f", "json", "--no-such-option", cwd=tmp_path)
    assert result.returncode == 2
    doc = json.loads(result.stdout)
    Draft202012Validator(load_schema("gpucc.error/v1")).validate(doc)
    assert doc["error"]["kind"] == "usage"


def test_seal_and_stage_json(work: Path) -> None:
    sealed = _seal(work, "-f", "json")
    doc = document(sealed, "gpucc.seal/v1")
    assert doc["output"] == "d.gcc" and doc["bytes"] == 5 * CS + 123 and doc["chunks"] == 6
    assert doc["chunk_size"] == CS and doc["sealed_bytes"] == (work / "d.gcc").stat().st_size
    assert sealed.stderr.startswith("gpucc: ") and "sealed " in sealed.stderr
    staged = gpucc("stage", "d.gcc", "--data-key", "k.key", "-f", "json", cwd=work)
    doc = document(staged, "gpucc.stage/v1")
    assert doc["verified"] is True and doc["bytes"] == 5 * CS + 123
    assert staged.stderr.startswith("gpucc: staged ")


def test_small_file_is_one_chunk_in_words(work: Path) -> None:
    result = gpucc("seal", "small.txt", "-o", "s.gcc", "--data-key", "k.key", cwd=work)
    assert result.returncode == 0 and result.stdout == ""
    assert "1 chunk (6 bytes; chunk size 4 MiB)" in result.stderr
    assert "chunk(s)" not in result.stderr and "MiB/s" not in result.stderr
    staged = gpucc("stage", "s.gcc", "--data-key", "k.key", cwd=work)
    assert staged.returncode == 0 and staged.stdout == ""
    assert "1 chunk (6 bytes; chunk size 4 MiB) verified" in staged.stderr


def test_stage_failures_print_the_error_document(work: Path) -> None:
    _seal(work)
    raw = bytearray((work / "d.gcc").read_bytes())
    raw[-40] ^= 1
    (work / "t.gcc").write_bytes(bytes(raw))
    result = gpucc("stage", "t.gcc", "--data-key", "k.key", "-f", "json", cwd=work)
    doc = document(result, "gpucc.error/v1")
    assert result.returncode == 6 and "chunk 5" in doc["error"]["message"]
    gpucc("seal", "small.txt", "-o", "o.gcc", "--data-key", "other.key", cwd=work)
    wrong = gpucc("stage", "d.gcc", "--data-key", "other.key", "-f", "json", cwd=work)
    assert document(wrong, "gpucc.error/v1")["error"]["kind"] == "wrong-key"


def test_session_commands_json_on_the_simulator(work: Path) -> None:
    _seal(work)
    challenge = document(
        gpucc("session", "challenge", "-f", "json", cwd=work), "gpucc.session.challenge/v1"
    )["challenge"]
    offer = gpucc(
        "session", "offer", "--challenge", challenge, "-o", "offer.json",
        "--host-key", "host.key", "--simulate", "sim", "-f", "json", cwd=work,
    )  # fmt: skip
    doc = document(offer, "gpucc.session.offer/v1")
    assert doc["simulated"] is True and "SIMULATED GPU" in offer.stderr
    answer = gpucc(
        "session", "answer", "offer.json", "--challenge", challenge, "--dataset", "d.gcc",
        "--data-key", "k.key", "-o", "answer.json", "--simulate", "sim", "-f", "json", cwd=work,
    )  # fmt: skip
    doc = document(answer, "gpucc.session.answer/v1")
    assert len(doc["dataset_ids"]) == 1
    accept = gpucc(
        "session", "accept", "answer.json", "--host-key", "host.key", "--dataset", "d.gcc",
        "-f", "json", cwd=work,
    )  # fmt: skip
    from gpucc.staging import open_sealed

    accepted = document(accept, "gpucc.session.accept/v1")
    # What the wrap authenticates (the header digest), not the answer's unauthenticated ids.
    assert accepted["header_digests"] == [open_sealed(work / "d.gcc").header.digest.hex()]
    local = gpucc(
        "session", "local", "d.gcc", "--data-key", "k.key", "-o", "a2.json",
        "--host-key", "h2.key", "--simulate", "sim2", "-f", "json", cwd=work,
    )  # fmt: skip
    assert document(local, "gpucc.session.local/v1")["simulated"] is True


def test_refused_answer_is_short_and_lists_every_reason_in_json(work: Path) -> None:
    _seal(work)
    challenge = "11" * 32
    offer = gpucc(
        "session", "offer", "--challenge", challenge, "-o", "offer.json",
        "--host-key", "host.key", "--simulate", "sim", cwd=work,
    )  # fmt: skip
    assert offer.returncode == 0, offer.stderr
    # The holder trusts another simulated GPU's anchors: every chain check fails.
    other = gpucc(
        "session", "offer", "--challenge", challenge, "-o", "o2.json",
        "--host-key", "h2.key", "--simulate", "other", cwd=work,
    )  # fmt: skip
    assert other.returncode == 0
    args = (
        "session", "answer", "offer.json", "--challenge", challenge, "--dataset", "d.gcc",
        "--data-key", "k.key", "-o", "answer.json", "--simulate", "other",
    )  # fmt: skip
    text = gpucc(*args, cwd=work)
    assert text.returncode == 1 and not (work / "answer.json").exists()
    errors = [line for line in text.stderr.splitlines() if line.startswith("gpucc: error:")]
    assert len(errors) == 1 and len(errors[0]) < 600, errors
    assert "reasons)" in errors[0] and "more (all with -v or --format json)" in errors[0]
    doc = document(gpucc(*args, "-f", "json", cwd=work), "gpucc.error/v1")
    reasons = doc["error"]["reasons"]  # every failed check, as data
    assert len(reasons) >= 2 and reasons[0]["detail"][:60] in doc["error"]["message"]
    assert all(r["part"] == "GPU 0" and r["check"] and r["title"] for r in reasons)
    verbose = gpucc(*args, "-v", cwd=work)
    assert all(
        f"refused: {r['part']}: {r['title']}: {r['detail']}" in verbose.stderr for r in reasons
    )


def _sample_bundle(path: Path) -> None:
    from gpucc.gpuattest.samples import nvidia_h100_sample

    sample = nvidia_h100_sample()
    from gpucc.gpuattest.bundle import Bundle, write_bundle

    d_rim, v_rim = sample.driver_rim_path, sample.vbios_rim_path
    rims = {
        "NV_GPU_DRIVER_GH100_545.00": d_rim.read_bytes(),
        "NV_GPU_VBIOS_1010_0200_882_96005E0001": v_rim.read_bytes(),
    }
    write_bundle(Bundle(created=dt.datetime(2024, 1, 1, tzinfo=dt.UTC), rims=rims), path)


def test_collateral_show_json(tmp_path: Path) -> None:
    _sample_bundle(tmp_path / "bundle.json")
    doc = document(
        gpucc("collateral", "show", "bundle.json", "-f", "json", cwd=tmp_path),
        "gpucc.collateral.show/v1",
    )
    assert len(doc["rims"]) == 2 and doc["ocsp"] == []


def test_collateral_fetch_without_network_fails_with_3_and_writes_nothing(
    tmp_path: Path,
) -> None:
    from gpucc.gpuattest.samples import nvidia_h100_sample

    sample = nvidia_h100_sample()

    report, chain = sample.report_path, sample.cert_chain_path
    closed = "http://127.0.0.1:9"  # the discard port: nothing listens there
    result = gpucc(
        "collateral", "fetch", "--evidence", report, "--cert-chain", chain, "-o", "bundle.json",
        "--rim-url", closed, "--ocsp-url", closed, "--no-cache", "--timeout", "1", "-f", "json",
        cwd=tmp_path,
    )  # fmt: skip
    doc = document(result, "gpucc.error/v1")
    assert result.returncode == 3 and doc["error"]["kind"] == "collateral-unavailable"
    assert "no bundle written" in doc["error"]["message"]
    assert "bundle.json" not in doc["error"]["message"] + doc["error"]["hint"]
    assert "--collateral" not in doc["error"]["hint"]
    assert not (tmp_path / "bundle.json").exists()
    assert "not tried" in result.stderr  # the second RIM is not waited for
    assert "[1/2] RIM" not in result.stderr  # progress: only on a terminal or with -v
    verbose = gpucc(
        "collateral", "fetch", "--evidence", report, "--cert-chain", chain, "-o", "bundle.json",
        "--rim-url", closed, "--ocsp-url", closed, "--no-cache", "--timeout", "1", "-v",
        cwd=tmp_path,
    )  # fmt: skip
    assert verbose.returncode == 3 and verbose.stdout == ""
    assert "gpucc: [1/2] RIM NV_GPU_DRIVER_GH100_545.00" in verbose.stderr
    assert "gpucc: OCSP device" in verbose.stderr
    assert not (tmp_path / "bundle.json").exists()


def test_collateral_fetch_partial_is_a_result_with_exit_3(tmp_path: Path) -> None:
    from gpucc.gpuattest.samples import nvidia_h100_sample

    sample = nvidia_h100_sample()
    from tests.support.netfixtures import RimService, serve

    report, chain = sample.report_path, sample.cert_chain_path
    with serve(RimService.with_samples()) as rims:
        result = gpucc(
            "collateral", "fetch", "--evidence", report, "--cert-chain", chain,
            "-o", "bundle.json", "--rim-url", rims.url, "--ocsp-url", "http://127.0.0.1:9",
            "--no-cache", "--timeout", "1", "-f", "json", cwd=tmp_path,
        )  # fmt: skip
    assert result.returncode == 3, result.stderr
    doc = json.loads(result.stdout)  # one document: the result, not also an error
    Draft202012Validator(load_schema("gpucc.collateral.fetch/v1")).validate(doc)
    assert doc["complete"] is False and len(doc["rims"]) == 2 and doc["missing"]
    assert all(o["status"] == "not-checked" for o in doc["ocsp"])
    assert (tmp_path / "bundle.json").exists()
    assert "gpucc: error: collateral incomplete" in result.stderr
    text = gpucc(
        "collateral", "show", "bundle.json", "-f", "json", cwd=tmp_path,
    )  # fmt: skip
    assert len(document(text, "gpucc.collateral.show/v1")["rims"]) == 2


def test_demo_json(tmp_path: Path) -> None:
    result = gpucc("demo", "--size-mib", "1", "-f", "json", cwd=tmp_path)
    doc = document(result, "gpucc.demo/v1")
    assert [s["name"] for s in doc["steps"]] == ["attest", "session", "seal", "stage", "tamper"]
    assert "demo complete" in result.stderr


def test_holder_audit_records_json_and_their_errors(tmp_path: Path) -> None:
    from gpucc.holder.audit import audit_document
    from gpucc.holder.state import SqliteState

    state = SqliteState(tmp_path / "state.sqlite3")
    state.put_audit(
        audit_document(
            client="192.0.2.1",
            requester="ab" * 32,
            challenge=bytes(32),
            released=[("a", "default")],
            refused=[{"dataset": "b", "policy": "k1", "check": "requester identity",
                      "detail": "not signed by a requester this policy names"}],
            trusted_with={"relaxations": [{"item": "ocsp.require: false"}], "simulated": False},
            transcript_hash="cd" * 48,
        )
    )  # fmt: skip
    state.close()
    doc = document(gpucc("holder", "receipts", "--state", "state.sqlite3", "-f", "json",
                         cwd=tmp_path), "gpucc.holder.audit/v1")  # fmt: skip
    (record,) = doc["records"]
    assert record["relaxations"] == ["ocsp.require: false"]
    assert [d["decision"] for d in record["datasets"]] == ["released", "refused"]
    refused = document(
        gpucc("holder", "receipts", "--state", "state.sqlite3", "--decision", "refused",
              "--requester", "abababab", "-f", "json", cwd=tmp_path),
        "gpucc.holder.audit/v1",
    )  # fmt: skip
    assert [d["dataset"] for d in refused["records"][0]["datasets"]] == ["b"]
    for args, code in (
        (("--state", "state.sqlite3", "--receipt-dir", "."), 2),  # one of them
        (("--dataset", "a", "--receipt-dir", "."), 2),  # a filter needs --state
        (("--state", "state.sqlite3", "--until", "soon"), 2),
        (("--state", "memory"), 2),
        (("--state", "absent.sqlite3"), 8),
    ):
        result = gpucc("holder", "receipts", *args, "-f", "json", cwd=tmp_path)
        assert document(result, "gpucc.error/v1")["error"]["code"] == code, (args, result.stderr)


def test_holder_prune_json_and_its_errors(tmp_path: Path) -> None:
    from gpucc.holder.state import SqliteState

    old = dt.datetime(2025, 1, 1, tzinfo=dt.UTC).timestamp()
    state = SqliteState(tmp_path / "state.sqlite3", clock=lambda: old)
    state.put_audit({"decision": "refused", "client": "192.0.2.1", "datasets": []})
    state.put_record("receipt", "ab:cd:1", {"seq": 1})
    state.close()
    args = ("holder", "prune", "--state", "state.sqlite3", "-f", "json")
    counted = document(gpucc(*args, "--before", "2025-06-01", "--dry-run", cwd=tmp_path),
                       "gpucc.holder.prune/v1")  # fmt: skip
    assert counted == {"schema": "gpucc.holder.prune/v1", "before": "2025-06-01T00:00:00Z",
                       "audit_records": 1, "receipts": 1, "dry_run": True}  # fmt: skip
    done = document(gpucc(*args, "--before", str(int(old) + 1), cwd=tmp_path),
                    "gpucc.holder.prune/v1")  # fmt: skip
    assert (done["audit_records"], done["receipts"], done["dry_run"]) == (1, 1, False)
    soon = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).isoformat()
    for extra, code in (
        (("--before", "2999-01-01"), 2),  # the future, even with --force
        (("--before", "2999-01-01", "--force"), 2),
        (("--before", soon), 2),  # the last day: only with --force
        (("--before", "soon"), 2),
        (("--before", ""), 2),
    ):
        result = gpucc(*args, *extra, cwd=tmp_path)
        assert document(result, "gpucc.error/v1")["error"]["code"] == code, (extra, result.stderr)
    forced = document(gpucc(*args, "--before", soon, "--force", cwd=tmp_path),
                      "gpucc.holder.prune/v1")  # fmt: skip
    assert forced["audit_records"] == 0 and forced["dry_run"] is False
    for state_arg, code in (("memory", 2), ("absent.sqlite3", 8), (".", 8)):
        result = gpucc("holder", "prune", "--state", state_arg, "--before", "0", "-f", "json",
                       cwd=tmp_path)  # fmt: skip
        assert document(result, "gpucc.error/v1")["error"]["code"] == code, result.stderr
    assert not (tmp_path / "absent.sqlite3").exists()
