"""The output contract every command keeps, checked on real processes.

* One exit-code table: each file situation (a missing input, a directory where a file
  belongs, an existing output without ``--force``, an exposed key file) gives the code
  ``cli.exitcodes.FILE_SITUATIONS`` names, in every command that meets it.
* JSON that cannot mislead: a non-zero exit prints the error document, or a result whose
  verdict fields (``verified``, ``trusted``, ``complete``) are false, with the exit code.
* Every JSON document names a schema the package ships.
"""

from __future__ import annotations

import ast
import concurrent.futures
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from jsonschema import Draft202012Validator

from gpucc.cli.exitcodes import FILE_SITUATIONS
from gpucc.cli.schemas import load_schema, schema_names
from tests.support.cli import run_cli
from tests.support.paths import ROOT

AT = "2024-01-01T00:00:00Z"
C = "00" * 32
MISSING = "absent.file"
EXISTS = "exists.out"
KEY, EXPOSED = "k.key", "exposed.key"
PRIV, XPRIV, PUB = "priv.pem", "xpriv.pem", "pub.pem"
DIR = "adir"

#: For every command: the file situations it meets, as a command line run in the fixture
#: directory. A command that names no file says so (the empty mapping, with a reason).
CASES: dict[str, dict[str, tuple[str, ...]]] = {
    "attest": {
        "missing-input": ("attest", "--evidence", MISSING),
        "input-is-directory": ("attest", "--evidence", DIR),
        "exposed-key-file": (
            "attest",
            "--sample",
            "--offline",
            "--at",
            AT,
            "--sign-eat",
            XPRIV,
            "-o",
            "r.eat.json",
        ),
        "existing-output": (
            "attest",
            "--sample",
            "--offline",
            "--at",
            AT,
            "--sign-eat",
            PRIV,
            "-o",
            EXISTS,
        ),
    },  # fmt: skip
    "evidence collect": {"existing-output": ("evidence", "collect", "-o", EXISTS)},
    "collateral fetch": {
        "missing-input": ("collateral", "fetch", "--evidence", MISSING, "-o", "b.json"),
        "existing-output": ("collateral", "fetch", "--evidence", "d.bin", "-o", EXISTS),
    },
    "collateral serve": {
        "missing-input": ("collateral", "serve", "--config", MISSING),
        "input-is-directory": ("collateral", "serve", "--config", DIR),
    },
    "collateral export": {
        "existing-output": ("collateral", "export", "--store", DIR, "-o", EXISTS),
    },
    "collateral import": {
        "missing-input": ("collateral", "import", MISSING, "--store", "store"),
        "input-is-directory": ("collateral", "import", DIR, "--store", "store"),
    },
    "collateral check": {
        "missing-input": ("collateral", "check", "--evidence", MISSING),
        "input-is-directory": ("collateral", "check", "--cvm-evidence", DIR),
    },
    "collateral show": {
        "missing-input": ("collateral", "show", MISSING),
        "input-is-directory": ("collateral", "show", DIR),
    },
    "seal": {
        "missing-input": ("seal", MISSING, "-o", "x.gcc", "--data-key", KEY),
        "input-is-directory": ("seal", DIR, "-o", "x.gcc", "--data-key", KEY),
        "existing-output": ("seal", "d.bin", "-o", EXISTS, "--data-key", KEY),
        "exposed-key-file": ("seal", "d.bin", "-o", "x.gcc", "--data-key", EXPOSED),
    },
    "stage": {
        "missing-input": ("stage", MISSING, "--data-key", KEY),
        "exposed-key-file": ("stage", "d.gcc", "--data-key", EXPOSED),
    },
    "session challenge": {},
    "session offer": {
        "existing-output": (
            "session",
            "offer",
            "--challenge",
            C,
            "-o",
            EXISTS,
            "--host-key",
            "h.key",
            "--simulate",
            "sim",
        ),
    },  # fmt: skip
    "session answer": {
        "missing-input": (
            "session",
            "answer",
            MISSING,
            "--challenge",
            C,
            "--dataset",
            "d.gcc",
            "--data-key",
            KEY,
            "-o",
            "a.json",
        ),
        "existing-output": (
            "session",
            "answer",
            "d.bin",
            "--challenge",
            C,
            "--dataset",
            "d.gcc",
            "--data-key",
            KEY,
            "-o",
            EXISTS,
        ),
        "exposed-key-file": (
            "session",
            "answer",
            "d.bin",
            "--challenge",
            C,
            "--dataset",
            "d.gcc",
            "--data-key",
            EXPOSED,
            "-o",
            "a.json",
        ),
    },  # fmt: skip
    "session accept": {
        "missing-input": ("session", "accept", MISSING, "--host-key", KEY),
        "exposed-key-file": ("session", "accept", "d.bin", "--host-key", EXPOSED),
    },
    "session local": {
        "missing-input": (
            "session",
            "local",
            MISSING,
            "--data-key",
            KEY,
            "-o",
            "a.json",
            "--host-key",
            "h.key",
            "--simulate",
            "sim",
        ),
        "existing-output": (
            "session",
            "local",
            "d.gcc",
            "--data-key",
            KEY,
            "-o",
            EXISTS,
            "--host-key",
            "h.key",
            "--simulate",
            "sim",
        ),
        "exposed-key-file": (
            "session",
            "local",
            "d.gcc",
            "--data-key",
            EXPOSED,
            "-o",
            "a.json",
            "--host-key",
            "h.key",
            "--simulate",
            "sim",
        ),
    },  # fmt: skip
    "demo": {},
    "cvm reference-snp": {
        "missing-input": (
            "cvm",
            "reference-snp",
            "--ovmf",
            MISSING,
            "--vcpus",
            "2",
            "--vcpu-type",
            "EPYC-v4",
        ),
        "input-is-directory": (
            "cvm",
            "reference-snp",
            "--ovmf",
            DIR,
            "--vcpus",
            "2",
            "--vcpu-type",
            "EPYC-v4",
        ),
    },
    "cvm reference-tdx": {
        "missing-input": ("cvm", "reference-tdx", "--event-log", MISSING),
        "input-is-directory": ("cvm", "reference-tdx", "--event-log", DIR),
    },
    "cvm reference-vtpm": {
        "missing-input": ("cvm", "reference-vtpm", "--event-log", MISSING),
        "input-is-directory": ("cvm", "reference-vtpm", "--event-log", DIR),
    },
    "cvm pin": {
        "missing-input": ("cvm", "pin", MISSING),
        "input-is-directory": ("cvm", "pin", DIR),
    },
    "inspect": {
        "missing-input": ("inspect", MISSING),
        "input-is-directory": ("inspect", DIR),
        "exposed-key-file": ("inspect", EXPOSED),
    },
    "token verify": {
        "missing-input": ("token", "verify", MISSING, "--signer-pub", PUB, "--no-nonce"),
        "input-is-directory": ("token", "verify", DIR, "--signer-pub", PUB, "--no-nonce"),
    },
    "token verify-ear": {
        "missing-input": ("token", "verify-ear", MISSING, "--signer-pub", PUB, "--no-nonce"),
        "input-is-directory": ("token", "verify-ear", DIR, "--signer-pub", PUB, "--no-nonce"),
    },
    "model digest": {
        "missing-input": ("model", "digest", MISSING),
        "existing-output": ("model", "digest", "model", "-o", EXISTS),
    },
    "model verify": {
        "missing-input": ("model", "verify", "model", "--manifest", MISSING),
        "input-is-directory": ("model", "verify", "model", "--manifest", DIR),
    },
    "model sign": {
        "missing-input": ("model", "sign", MISSING, "--signer-key", PRIV, "--signature", "s"),
        "existing-output": ("model", "sign", "model", "--signer-key", PRIV, "--signature", EXISTS),
        "exposed-key-file": ("model", "sign", "model", "--signer-key", XPRIV, "--signature", "s"),
    },
    "holder serve": {
        "missing-input": (
            "holder",
            "serve",
            "--datasets",
            MISSING,
            "--data-key",
            KEY,
            "--holder-key",
            PRIV,
        ),
        "exposed-key-file": (
            "holder",
            "serve",
            "--datasets",
            DIR,
            "--data-key",
            EXPOSED,
            "--holder-key",
            PRIV,
        ),
    },  # fmt: skip
    "holder keygen": {
        "existing-output": ("holder", "keygen", "--holder-key", "n.key", "--holder-pub", EXISTS)
    },
    "holder datasets": {
        "missing-input": ("holder", "datasets", "--datasets", MISSING),
        "input-is-directory": ("holder", "datasets", "--datasets", "d.bin"),
    },
    "holder receipts": {
        "missing-input": ("holder", "receipts", "--receipt-dir", MISSING),
        "input-is-directory": ("holder", "receipts", "--state", DIR),
    },
    "holder prune": {
        "missing-input": ("holder", "prune", "--state", MISSING, "--before", "0"),
        "input-is-directory": ("holder", "prune", "--state", DIR, "--before", "0"),
    },
    "travel run": {"missing-input": ("travel", "run", MISSING)},
    "travel verify-log": {
        "missing-input": ("travel", "verify-log", MISSING, "--orchestrator-pub", PUB),
        "input-is-directory": ("travel", "verify-log", DIR, "--orchestrator-pub", PUB),
    },
    "travel keygen": {
        "existing-output": (
            "travel",
            "keygen",
            "--orchestrator-key",
            "n2.key",
            "--orchestrator-pub",
            EXISTS,
        )
    },
}
NO_FILES = {
    "session challenge": "prints a challenge; reads and writes no file",
    "demo": "works in its own temporary directory; takes no file option",
}


def leaves() -> list[str]:
    from gpucc.cli.main import app

    def walk(command: Any, path: str) -> list[str]:
        subs = getattr(command, "commands", None)
        if subs:
            return [leaf for n, c in subs.items() for leaf in walk(c, f"{path} {n}".strip())]
        return [path]

    return walk(typer.main.get_command(app), "")


def _pem_key(path: Path, mode: int) -> ec.EllipticCurvePrivateKey:
    key = ec.generate_private_key(ec.SECP384R1())
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(mode)
    return key


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from gpucc.staging import seal_file, write_key_file

    work = tmp_path_factory.mktemp("contract")
    (work / "d.bin").write_bytes(os.urandom(10_000))
    kek = write_key_file(work / KEY)
    seal_file(work / "d.bin", work / "d.gcc", kek=kek, chunk_size=4096)
    write_key_file(work / EXPOSED)
    (work / EXPOSED).chmod(0o644)
    key = _pem_key(work / PRIV, 0o600)
    _pem_key(work / XPRIV, 0o644)
    (work / PUB).write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    (work / EXISTS).write_bytes(b"keep me")
    (work / DIR).mkdir()
    (work / "model").mkdir()
    (work / "model" / "w.bin").write_bytes(os.urandom(1000))
    return work


def test_every_command_is_covered() -> None:
    assert sorted(CASES) == sorted(leaves())
    for command, cases in CASES.items():
        assert set(cases) <= set(FILE_SITUATIONS), command
        assert cases or NO_FILES.get(command), f"{command}: no file situation and no reason"
    met = {situation for cases in CASES.values() for situation in cases}
    assert met == set(FILE_SITUATIONS)


def _check_json_failure(result: subprocess.CompletedProcess[str], code: int) -> dict[str, Any]:
    """The one document of a failed run: the error, or a result whose verdict is false."""
    assert result.returncode == code, (result.returncode, result.stderr)
    doc: dict[str, Any] = json.loads(result.stdout)
    Draft202012Validator(load_schema(doc["schema"])).validate(doc)
    if doc["schema"] == "gpucc.error/v1":
        assert doc["error"]["code"] == code
    else:
        assert doc["exit_code"] == code
        for verdict in ("verified", "trusted", "complete"):
            assert doc.get(verdict) in (None, False), (verdict, doc)
    errors = [line for line in result.stderr.splitlines() if line.startswith("gpucc: error: ")]
    assert len(errors) == (1 if "error" in doc else len(errors[:1])), result.stderr
    return doc


@pytest.mark.slow
def test_file_situations_give_the_code_of_the_table(files: Path) -> None:
    before = sorted(p.name for p in files.iterdir())
    runs = [
        (command, situation, args)
        for command, cases in CASES.items()
        for situation, args in cases.items()
    ]

    def one(item: tuple[str, str, tuple[str, ...]]) -> tuple[str, str, Any]:
        command, situation, args = item
        return command, situation, run_cli(*args, "-f", "json", cwd=files, timeout=60)

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(one, runs))
    failures = []
    for command, situation, result in results:
        want = FILE_SITUATIONS[situation].code
        if result.returncode != want:
            failures.append(f"{command} / {situation}: exit {result.returncode}: {result.stderr}")
            continue
        doc = _check_json_failure(result, want)
        kind = doc["error"]["kind"] if "error" in doc else doc["exit_kind"]
        assert kind == FILE_SITUATIONS[situation].kind
    assert not failures, "\n".join(failures)
    # Nothing was written, replaced or left behind (the simulator's directory aside).
    assert sorted(p.name for p in files.iterdir() if p.name != "sim") == before
    assert (files / EXISTS).read_bytes() == b"keep me"


def test_a_text_run_gives_the_same_code(files: Path) -> None:
    for args in (CASES["seal"]["missing-input"], CASES["model digest"]["existing-output"]):
        result = run_cli(*args, cwd=files)
        assert result.returncode == 8 and result.stdout == ""
        assert result.stderr.startswith("gpucc: error: ") and result.stderr.count("\n") == 1
        assert "Usage:" not in result.stderr and "╭" not in result.stderr  # not a usage box


def test_failed_verdicts_never_read_true(files: Path, tmp_path: Path) -> None:
    """A ``jq .verified`` / ``.trusted`` gate can never pass a non-zero exit."""
    from gpucc.staging.model import digest_model, make_serialization

    model = tmp_path / "model"
    model.mkdir()
    (model / "a.bin").write_bytes(b"a" * 100)
    (tmp_path / "m.json").write_bytes(digest_model(model, make_serialization(model)).to_bytes())
    (model / "a.bin").write_bytes(b"b" * 100)
    verify = run_cli("model", "verify", model, "--manifest", tmp_path / "m.json", "-f", "json")
    doc = _check_json_failure(verify, 6)
    assert doc["schema"] == "gpucc.model.verify/v1" and doc["problems"][0]["problem"] == "mismatch"

    (tmp_path / "w.bin").write_bytes(b"w" * 5000)
    (tmp_path / "w.json").write_bytes(
        digest_model(tmp_path / "w.bin", make_serialization(tmp_path / "w.bin")).to_bytes()
    )
    (tmp_path / "w.bin").write_bytes(b"x" * 5000)
    sealed = run_cli(
        "seal", tmp_path / "w.bin", "-o", tmp_path / "w.gcc", "--data-key", tmp_path / "w.key"
    )
    assert sealed.returncode == 0, sealed.stderr
    staged = run_cli(
        "stage", tmp_path / "w.gcc", "--data-key", tmp_path / "w.key",
        "--manifest", tmp_path / "w.json", "-f", "json",
    )  # fmt: skip
    doc = _check_json_failure(staged, 6)
    assert doc["schema"] == "gpucc.stage/v1" and doc["exit_kind"] == "authentication-failed"
    assert doc["model"]["verified"] is False

    attest = run_cli("attest", "--sample", "--at", AT, "--nonce", "11" * 32, "-f", "json")
    doc = _check_json_failure(attest, 1)
    assert doc["verdict"] == "not-trusted" and doc["exit_kind"] == "not-trusted"

    signed = run_cli(
        "attest", "--sample", "--offline", "--at", AT, "--sign-eat", files / PRIV,
        "-o", files / EXISTS, "-f", "json",
    )  # fmt: skip
    doc = _check_json_failure(signed, 8)  # verified, but the signed result was not written
    assert doc["schema"] == "gpucc.attest/v1" and doc["exit_kind"] == "file-access"


#: The library's packages: where every document a command prints is built.
LIBRARY = ("core", "gpuattest", "staging", "keyrelease", "assembly", "travel", "ddp", "holder")


def _library_documents() -> set[str]:
    """The schemas of the library's document values: each class's ``SCHEMA``-named class
    variable, and a dict literal's ``"schema"`` (the attestation result's)."""
    named: set[str] = set()
    for package in LIBRARY:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (
                    isinstance(node, ast.AnnAssign)
                    and isinstance(node.target, ast.Name)
                    and node.target.id.endswith("SCHEMA")
                    and isinstance(node.value, ast.Constant)
                ):
                    named.add(str(node.value.value))
                if isinstance(node, ast.Dict):
                    for key, value in zip(node.keys, node.values, strict=True):
                        if isinstance(key, ast.Constant) and key.value == "schema":
                            if isinstance(value, ast.Constant):
                                named.add(str(value.value))
    return named


def test_every_document_a_command_prints_has_a_shipped_schema() -> None:
    shipped = set(schema_names())
    named = _library_documents()
    assert named == shipped, (named - shipped, shipped - named)
    for name in shipped:
        assert load_schema(name)["properties"]["schema"] == {"const": name}


def test_every_document_comes_from_a_library_object() -> None:
    """The command line only renders: no command module builds a schema-tagged document
    (a dict literal with a ``"schema"`` key), so a Python caller gets from the library
    object what ``-f json`` prints."""
    built = []
    for path in sorted((ROOT / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Dict) and any(
                isinstance(k, ast.Constant) and k.value == "schema" for k in node.keys
            ):
                built.append(f"{path.name}:{node.lineno}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "dict":
                if any(k.arg == "schema" for k in node.keywords):
                    built.append(f"{path.name}:{node.lineno}")
    assert built == []


def test_stdout_and_terminal_text_have_one_path_each() -> None:
    """Commands write results through cli.output (escaped text, every byte or exit 141) and
    draw with cli.terminal.console (escaped, 141 on a closed pipe), never around them."""
    allowed = {"output.py", "terminal.py", "boundary.py", "main.py"}
    forbidden = re.compile(
        r"sys\.stdout\.write|sys\.stderr\.write|typer\.echo|(?<![.\w])print\(|\bConsole\("
    )
    offenders = []
    for path in sorted((ROOT / "cli").glob("*.py")):
        if path.name in allowed:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            if forbidden.search(code):
                offenders.append(f"{path.name}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


# --- no empty passes ----------------------------------------------------------------------


def test_stage_takes_a_shard_set_and_refuses_a_part_of_one(tmp_path: Path) -> None:
    (tmp_path / "d.bin").write_bytes(os.urandom(50_000))
    (tmp_path / "shards").mkdir()
    sealed = run_cli(
        "seal", "d.bin", "-o", "shards", "--data-key", "k.key", "--shards", "4",
        "--chunk-size", "4KiB", cwd=tmp_path,
    )  # fmt: skip
    assert sealed.returncode == 0, sealed.stderr
    shards = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "shards").iterdir())
    assert len(shards) == 4
    lone = run_cli("stage", shards[2], "--data-key", "k.key", "-f", "json", cwd=tmp_path)
    doc = _check_json_failure(lone, 6)
    assert "one of 4 shards" in doc["error"]["message"]
    for given in (["shards"], shards):
        whole = run_cli("stage", *given, "--data-key", "k.key", "-f", "json", cwd=tmp_path)
        assert whole.returncode == 0, whole.stderr
        doc = json.loads(whole.stdout)
        Draft202012Validator(load_schema("gpucc.stage/v1")).validate(doc)
        assert doc["shards"] == 4 and doc["bytes"] == 50_000 and doc["verified"] is True
    swapped = [shards[1], shards[0], *shards[2:]]
    assert run_cli("stage", *swapped, "--data-key", "k.key", cwd=tmp_path).returncode == 6
    assert run_cli("stage", *shards[:3], "--data-key", "k.key", cwd=tmp_path).returncode == 6


def test_stage_refuses_to_stage_a_key_file(tmp_path: Path) -> None:
    from gpucc.staging import write_key_file

    write_key_file(tmp_path / "data.key")
    result = run_cli("stage", "data.key", "-f", "json", cwd=tmp_path)
    doc = _check_json_failure(result, 2)
    assert "key file" in doc["error"]["message"]
    assert "staged" not in result.stderr


def test_a_model_of_nothing_is_refused(tmp_path: Path) -> None:
    import hashlib

    (tmp_path / "empty").mkdir()
    assert run_cli("model", "digest", "empty", cwd=tmp_path).returncode == 4
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "a.bin").write_bytes(b"a")
    made = run_cli("model", "digest", "m", "-o", "m.json", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    statement = json.loads((tmp_path / "m.json").read_text())
    statement["predicate"]["serialization"]["ignore_paths"] = ["."]
    (tmp_path / "dot.json").write_text(json.dumps(statement))
    statement["predicate"]["serialization"].pop("ignore_paths")
    statement["predicate"]["resources"] = []
    statement["subject"][0]["digest"]["sha256"] = hashlib.sha256(b"").hexdigest()
    (tmp_path / "none.json").write_text(json.dumps(statement))
    for manifest in ("dot.json", "none.json"):
        result = run_cli("model", "verify", "empty", "--manifest", manifest, cwd=tmp_path)
        assert result.returncode == 4, (manifest, result.stderr)
        assert "cover nothing" in result.stderr or "covers nothing" in result.stderr


def test_ignore_paths_are_relative_to_the_model(tmp_path: Path) -> None:
    model = tmp_path / "m"
    (model / "logs").mkdir(parents=True)
    (model / "w.bin").write_bytes(b"w")
    (model / "logs" / "run.txt").write_bytes(b"log")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = run_cli("model", "digest", model, "--ignore", "logs", "-f", "json", cwd=elsewhere)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert (
        doc["resources"] == 1
        and "logs" in doc["statement"]["predicate"]["serialization"]["ignore_paths"]
    )
    for outside in ("../x", str(tmp_path), "."):
        bad = run_cli("model", "digest", model, "--ignore", outside, cwd=elsewhere)
        assert bad.returncode == 2, (outside, bad.stderr)
        assert "--ignore" in bad.stderr


def test_quiet_means_only_errors(tmp_path: Path) -> None:
    (tmp_path / "d.bin").write_bytes(b"d" * 5000)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "a").write_bytes(b"a")
    runs = [
        ("seal", "d.bin", "-o", "d.gcc", "--data-key", "k.key", "-q"),
        ("stage", "d.gcc", "--data-key", "k.key", "-q"),
        ("model", "digest", "m", "-o", "m.json", "-q"),
        ("model", "sign", "m", "--signer-key", "p.pem", "--signature", "s.sig", "-q"),
        ("session", "offer", "--challenge", C, "-o", "o.json", "--host-key", "h.key",
         "--simulate", "sim", "-q"),
        ("demo", "--size-mib", "0", "-f", "json", "-q"),
    ]  # fmt: skip
    _pem_key(tmp_path / "p.pem", 0o600)
    for args in runs:
        result = run_cli(*args, cwd=tmp_path)
        assert result.returncode == 0, (args, result.stderr)
        # The one line -q keeps: a simulated GPU is never to be trusted.
        lines = [line for line in result.stderr.splitlines() if "SIMULATED GPU" not in line]
        assert lines == [], (args, result.stderr)


def test_help_shows_verbose_as_a_flag() -> None:
    result = run_cli("seal", "--help")
    line = next(line for line in result.stdout.splitlines() if "--verbose" in line)
    assert "INTEGER" not in line and "<int>" not in line


@pytest.mark.parametrize(("signame", "code"), [("SIGTERM", 143), ("SIGHUP", 129)])
def test_a_signal_has_one_code_in_the_status_and_the_document(
    tmp_path: Path, signame: str, code: int
) -> None:
    """A command stopped while it waits on a service that never answers."""
    import signal
    import socket
    import time

    from gpucc.cli.exitcodes import SIGNAL_CODES
    from gpucc.gpuattest.samples import nvidia_h100_sample
    from tests.support.cli import ENV, GPUCC

    assert SIGNAL_CODES[signame] == code
    sample = nvidia_h100_sample()
    with socket.socket() as silent:  # accepts connections (backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        proc = subprocess.Popen(
            [GPUCC, "collateral", "fetch", "--evidence", str(sample.report_path),
             "--cert-chain", str(sample.cert_chain_path), "-o", "b.json", "--rim-url", url,
             "--ocsp-url", url, "--no-cache", "--timeout", "60", "-f", "json"],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
        )  # fmt: skip
        silent.settimeout(60)
        connection, _ = silent.accept()  # the command is waiting on its first request
        with connection:
            time.sleep(0.2)
            proc.send_signal(getattr(signal, signame))
            stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == code, stderr
    doc = json.loads(stdout)
    Draft202012Validator(load_schema("gpucc.error/v1")).validate(doc)
    assert doc["error"]["code"] == code and doc["error"]["kind"] == "interrupted"
    assert not (tmp_path / "b.json").exists() and "Traceback" not in stderr


def test_documents_of_model_holder_keygen_and_shards_match_their_schemas(tmp_path: Path) -> None:
    from gpucc.staging import seal_file, write_key_file

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "a.bin").write_bytes(b"a" * 100)
    _pem_key(tmp_path / "p.pem", 0o600)
    kek = write_key_file(tmp_path / "k.key")
    (tmp_path / "data").mkdir()
    (tmp_path / "d.bin").write_bytes(b"d" * 9000)
    seal_file(tmp_path / "d.bin", tmp_path / "data" / "d.gcc", kek=kek, chunk_size=4096)
    (tmp_path / "shards").mkdir()
    from gpucc.holder.state import SqliteState

    SqliteState(tmp_path / "state.sqlite3").close()  # a holder's state, no decision yet
    runs = {
        "gpucc.model.digest/v1": ("model", "digest", "m"),
        "gpucc.model.sign/v1": ("model", "sign", "m", "--signer-key", "p.pem",
                                "--signature", "m.sig"),
        "gpucc.holder.datasets/v1": ("holder", "datasets", "--datasets", "data"),
        "gpucc.keygen/v1": ("holder", "keygen", "--holder-key", "h.key", "--holder-pub", "h.pub"),
        "gpucc.holder.receipts/v1": ("holder", "receipts", "--receipt-dir", "data"),
        "gpucc.holder.audit/v1": ("holder", "receipts", "--state", "state.sqlite3"),
        "gpucc.holder.prune/v1": ("holder", "prune", "--state", "state.sqlite3",
                                  "--before", "2024-01-01"),
        "gpucc.seal.shards/v1": ("seal", "d.bin", "-o", "shards", "--data-key", "k.key",
                                 "--shards", "2", "--chunk-size", "4KiB"),
    }  # fmt: skip
    for schema, args in runs.items():
        result = run_cli(*args, "-f", "json", cwd=tmp_path)
        assert result.returncode == 0, (args, result.stderr)
        doc = json.loads(result.stdout)
        assert doc["schema"] == schema
        Draft202012Validator(load_schema(schema)).validate(doc)
