"""Every JSON document of every command validates against the schema the package ships, for
every outcome: the result, each refusal, and each kind of error the command meets.

:data:`RUNS` has one entry per command of the command table (``cli.main.COMMANDS``, walked
to its leaves): a command added to the table without runs here fails
:func:`test_every_command_of_the_table_has_its_documents_checked`, and a field added to a
document without its schema fails :func:`test_every_document_validates_against_its_schema`
(the schemas forbid fields they do not describe). The runs are real processes, in order, in
one directory: later runs use what earlier ones wrote.
"""

from __future__ import annotations

import datetime as dt
import json
import signal
import subprocess
import sys
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from gpucc.cli.exitcodes import TABLE, outcome_for_code
from gpucc.cli.schemas import load_schema, schema_names
from tests.e2e.test_cli_contract import leaves
from tests.support.cli import ENV, run_cli
from tests.support.netfixtures import RimService, free_port, serve
from tests.support.paths import ROOT

pytestmark = pytest.mark.slow

ERROR = "gpucc.error/v1"


@dataclass(frozen=True)
class Run:
    """One command line and the document it must print: ``schema`` (the command's result
    document, with exit ``code``) or, when ``schema`` is None, the error document."""

    outcome: str
    args: tuple[str, ...]
    code: int = 0
    schema: str | None = None


def ok(schema: str, line: str) -> Run:
    return Run("ok", tuple(line.split()), 0, schema)


def refused(what: str, schema: str, code: int, line: str) -> Run:
    return Run(f"refused: {what}", tuple(line.split()), code, schema)


def error(code: int, line: str) -> Run:
    return Run(outcome_for_code(code).kind, tuple(line.split()), code)


AT = "2024-01-01T00:00:00Z"
SIM = "--host-key host.key --simulate sim"
KEYS = "--dataset d.gcc --data-key k.key"
FETCH = "--rim-url http://127.0.0.1:9 --ocsp-url http://127.0.0.1:9 --no-cache --timeout 1"
SERVE = "--data-key k.key --holder-key h.key"
CCEL = ROOT / "tests" / "data" / "cloud-cvm" / "tdx-ccel" / "CCEL_data"
TDX_QUOTE_4 = CCEL.parent / "tdx_quote_4.dat"
AZURE_SNP = CCEL.parent.parent / "azure-snp-vtpm" / "evidence-v1.json"

#: command -> its runs; ``{RIMS}`` is a RIM service, ``{CHALLENGE}`` the challenge
#: printed by the session challenge run, ``{HEAD}`` the head printed by the travel run,
#: ``{RECEIPT}`` the receipt its holder kept.
# fmt: off
RUNS: dict[str, tuple[Run, ...]] = {
    "seal": (
        ok("gpucc.seal/v1", "seal d.bin -o d.gcc --data-key k.key"),
        ok("gpucc.seal/v1", "seal d.bin -o data/d.gcc --data-key k.key"),
        ok("gpucc.seal.shards/v1",
           "seal d.bin -o shards --data-key k.key --shards 2 --chunk-size 4KiB"),
        ok("gpucc.seal/v1", "seal d.bin -o other.gcc --data-key other.key"),
        error(2, "seal d.bin --no-such-option"),
        error(8, "seal d.bin -o d.gcc --data-key k.key"),
    ),
    "stage": (
        ok("gpucc.stage/v1", "stage d.gcc --data-key k.key"),
        refused("the data is not the manifest's", "gpucc.stage/v1", 6,
                "stage d.gcc --data-key k.key --manifest other.manifest.json"),
        error(7, "stage d.gcc --data-key other.key"),
        error(6, "stage tampered.gcc --data-key k.key"),
        error(4, "stage d.bin --data-key k.key"),
        error(8, "stage absent.gcc --data-key k.key"),
    ),
    "demo": (ok("gpucc.demo/v1", "demo --size-mib 1"), error(2, "demo --size-mib x")),
    "cvm reference-snp": (
        error(8, "cvm reference-snp --ovmf absent.fd --vcpus 2 --vcpu-type EPYC-v4"),
        error(2, "cvm reference-snp --ovmf d.bin --vcpus 2 --vcpu-type no-such-cpu"),
    ),
    "cvm pin": (
        error(8, "cvm pin absent.json"),
        error(4, "cvm pin d.bin"),
    ),
    "cvm reference-tdx": (
        ok("gpucc.cvm.reference/v1", f"cvm reference-tdx --event-log {CCEL}"),
        ok("gpucc.cvm.reference/v1", f"cvm reference-tdx --event-log {CCEL} -o ref.yaml"),
        error(1, f"cvm reference-tdx --event-log {CCEL} --quote {TDX_QUOTE_4}"),
        error(8, "cvm reference-tdx --event-log absent.bin"),
    ),
    "cvm reference-vtpm": (
        ok("gpucc.cvm.reference/v1", "cvm reference-vtpm --event-log tpm.log"),
        ok("gpucc.cvm.reference/v1", "cvm reference-vtpm --event-log tpm.log -o vtpm.yaml"),
        error(1, f"cvm reference-vtpm --event-log tpm.log --evidence {AZURE_SNP}"),
        error(4, f"cvm reference-vtpm --event-log {CCEL}"),
        error(8, "cvm reference-vtpm --event-log absent.bin"),
    ),
    "attest": (
        ok("gpucc.attest/v1", f"attest --sample --at {AT}"),
        ok("gpucc.attest/v1", f"attest --sample --at {AT} --sign-eat p.pem -o r.eat.json"),
        refused("another nonce", "gpucc.attest/v1", 1,
                f"attest --sample --at {AT} --nonce {'11' * 32}"),
        error(4, "attest --sample --policy nul.yaml"),
        error(5, "attest"),
        error(8, "attest --evidence absent.json"),
    ),
    "evidence collect": (error(5, "evidence collect -o evidence.json"),),
    "collateral fetch": (
        refused("the OCSP service is unreachable", "gpucc.collateral.fetch/v1", 3,
                "collateral fetch --evidence report.bin --cert-chain c.pem -o partial.json"
                " --rim-url {RIMS} --ocsp-url http://127.0.0.1:9 --no-cache --timeout 1"),
        error(3, f"collateral fetch --evidence report.bin --cert-chain c.pem -o f.json {FETCH}"),
        error(8, "collateral fetch --evidence absent.json -o b.json"),
    ),
    "collateral serve": (error(4, "collateral serve --config d.bin"),),
    "collateral export": (error(2, "collateral export -o e.json --store absent-store"),),
    "collateral import": (error(4, "collateral import d.bin --store imported"),),
    "collateral check": (
        refused("the driver's RIM is not published", "gpucc.collateral.check/v1", 3,
                "collateral check --driver 999.99 --rim-url {RIMS} --timeout 1"),
        error(2, "collateral check"),
    ),
    "collateral show": (
        ok("gpucc.collateral.show/v1", "collateral show bundle.json"),
        error(4, "collateral show d.bin"),
        error(8, "collateral show absent.json"),
    ),
    "session challenge": (
        ok("gpucc.session.challenge/v1", "session challenge"),
        error(2, "session challenge --no-such-option"),
    ),
    "session offer": (
        ok("gpucc.session.offer/v1",
           f"session offer --challenge {{CHALLENGE}} -o offer.json {SIM}"),
        error(2, f"session offer --challenge zz -o o2.json {SIM}"),
        error(8, f"session offer --challenge {{CHALLENGE}} -o offer.json {SIM}"),
    ),
    "session answer": (
        ok("gpucc.session.answer/v1",
           f"session answer offer.json --challenge {{CHALLENGE}} {KEYS} -o ans.json"
           " --simulate sim"),
        error(1, f"session answer offer.json --challenge {'22' * 32} {KEYS} -o a2.json"
                 " --simulate sim"),
        error(4, f"session answer d.bin --challenge {{CHALLENGE}} {KEYS} -o a3.json"),
    ),
    "session accept": (
        ok("gpucc.session.accept/v1",
           "session accept ans.json --host-key host.key --dataset d.gcc"),
        error(4, "session accept d.bin --host-key host.key"),
    ),
    "session local": (
        ok("gpucc.session.local/v1",
           "session local d.gcc --data-key k.key -o local.json --host-key h2.key --simulate sim2"),
        error(8, "session local d.gcc --data-key k.key -o local.json --host-key h2.key"
                 " --simulate sim2"),
    ),
    "token verify": (
        ok("gpucc.token.verify/v1", f"token verify r.eat.json --signer-pub p.pub --no-nonce --at {AT}"),
        error(1, f"token verify r.eat.json --signer-pub q.pub --no-nonce --at {AT}"),
        error(2, "token verify r.eat.json --signer-pub p.pub"),
        error(4, "token verify d.bin --signer-pub p.pub --no-nonce"),
    ),
    "token verify-ear": (
        ok("gpucc.token.verify-ear/v1", f"token verify-ear r.ear --signer-pub p.pub --no-nonce --at {AT}"),
        error(1, f"token verify-ear r.ear --signer-pub q.pub --no-nonce --at {AT}"),
        error(2, "token verify-ear r.ear --signer-pub p.pub"),
        error(4, "token verify-ear d.bin --signer-pub p.pub --no-nonce"),
    ),
    "model digest": (
        ok("gpucc.model.digest/v1", "model digest m"),
        ok("gpucc.model.digest/v1", "model digest m -o m.json"),
        error(8, "model digest absent"),
    ),
    "model sign": (
        ok("gpucc.model.sign/v1", "model sign m --signer-key p.pem --signature m.sig"),
        error(8, "model sign m --signer-key p.pem --signature m.sig"),
    ),
    "model verify": (
        ok("gpucc.model.verify/v1", "model verify m --manifest m.json"),
        refused("a changed file", "gpucc.model.verify/v1", 6, "model verify m2 --manifest m.json"),
        error(4, "model verify m --manifest d.bin"),
    ),
    "holder keygen": (
        ok("gpucc.keygen/v1", "holder keygen --holder-key h.key --holder-pub h.pub"),
        error(8, "holder keygen --holder-key h.key --holder-pub h.pub"),
    ),
    "holder datasets": (
        ok("gpucc.holder.datasets/v1", "holder datasets --datasets data"),
        error(8, "holder datasets --datasets absent"),
    ),
    "holder receipts": (
        ok("gpucc.holder.receipts/v1", "holder receipts --receipt-dir receipts"),
        ok("gpucc.holder.audit/v1", "holder receipts --state state.sqlite3"),
        ok("gpucc.holder.audit/v1",
           "holder receipts --state state.sqlite3 --decision released --dataset d"),
        error(8, "holder receipts --receipt-dir absent"),
        error(8, "holder receipts --state absent.sqlite3"),
        error(2, "holder receipts --state state.sqlite3 --since yesterday"),
    ),
    "holder prune": (
        ok("gpucc.holder.prune/v1", "holder prune --state state.sqlite3 --before 2024-01-01"),
        ok("gpucc.holder.prune/v1",
           "holder prune --state state.sqlite3 --before 1700000000 --dry-run"),
        error(8, "holder prune --state absent.sqlite3 --before 2024-01-01"),
        error(2, "holder prune --state state.sqlite3 --before 2999-01-01"),
        error(2, "holder prune --state state.sqlite3 --before yesterday"),
    ),
    "holder serve": (
        error(8, f"holder serve --datasets absent {SERVE}"),
        error(2, f"holder serve --datasets data {SERVE} --listen nowhere"),
    ),
    "travel keygen": (
        ok("gpucc.keygen/v1", "travel keygen --orchestrator-key o.key --orchestrator-pub o.pub.pem"),
        error(8, "travel keygen --orchestrator-key o.key --orchestrator-pub o.pub.pem"),
    ),
    "travel run": (
        ok("gpucc.travel.run/v2", "travel run plan.yaml --simulate sim"),
        error(8, "travel run plan.yaml --simulate sim"),
        Run("connection-failed", tuple("travel run gone.yaml --simulate sim".split()), 3),
        error(6, "travel run pinned-elsewhere.yaml --simulate sim"),
        error(4, "travel run nul.yaml --simulate sim"),
    ),
    "travel verify-log": (
        ok("gpucc.travel.verify-log/v1", "travel verify-log travel-log.jsonl --orchestrator-pub o.pub.pem"),
        ok("gpucc.travel.verify-log/v1",
           "travel verify-log travel-log.jsonl --orchestrator-pub o.pub.pem --expect-head {HEAD}"
           " --receipt {RECEIPT}"),
        ok("gpucc.travel.verify-log/v1", "travel verify-log gone-log.jsonl --orchestrator-pub o.pub.pem"),
        error(6, f"travel verify-log travel-log.jsonl --orchestrator-pub o.pub.pem --expect-head {'00' * 32}"),
        error(4, "travel verify-log d.bin --orchestrator-pub o.pub.pem"),
    ),
    "inspect": (
        ok("gpucc.inspect/v1", "inspect d.gcc"),
        ok("gpucc.inspect/v1", "inspect shards/d-00001-of-00002.gcc"),
        ok("gpucc.inspect/v1", "inspect k.key"),
        ok("gpucc.inspect/v1", "inspect m.json"),
        ok("gpucc.inspect/v1", "inspect bundle.json"),
        ok("gpucc.inspect/v1", "inspect offer.json"),
        error(4, "inspect d.bin"),
        error(8, "inspect absent.gcc"),
    ),
}
# fmt: on
#: commands that print no result document, and why (their errors are still checked)
NO_RESULT = {
    "evidence collect": "needs an NVIDIA GPU with its driver (exit 5 is checked here)",
    "collateral fetch": "a complete bundle needs an OCSP responder for NVIDIA's chains",
    "holder serve": "a service: runs until stopped, its access log is on stderr",
    "collateral serve": "a service: runs until stopped, its logs are on stderr",
    "collateral export": "writes the export file; tests/e2e/test_collateral_mirror.py reads it",
    "collateral import": "writes the store; tests/e2e/test_collateral_mirror.py serves it",
    "collateral check": "ready needs NVIDIA's OCSP responder for the RIM chains; the refusal "
    "prints the same document",
    "cvm pin": "needs a trusted result of attest with a CVM: tests/e2e/test_cli_cvm.py makes "
    "one and checks this document against its schema",
    "cvm reference-snp": "needs an OVMF image: tests/e2e/test_cli_cvm_reference.py builds one "
    "and checks this document against its schema",
}
#: the order the commands run in (later ones read what earlier ones wrote)
ORDER = (
    "seal", "stage", "demo", "cvm reference-snp", "cvm reference-tdx", "cvm pin", "cvm reference-vtpm",
    "attest", "evidence collect", "collateral fetch", "collateral serve", "collateral export",
    "collateral import", "collateral check", "collateral show", "session challenge", "session offer", "session answer",
    "session accept", "session local", "token verify", "token verify-ear", "model digest", "model sign",
    "model verify", "holder keygen", "holder datasets", "holder serve", "travel keygen",
    "travel run", "holder receipts", "holder prune", "travel verify-log", "inspect",
)  # fmt: skip


def test_every_command_of_the_table_has_its_documents_checked() -> None:
    assert sorted(RUNS) == sorted(leaves()) == sorted(ORDER)
    for command, runs in RUNS.items():
        outcomes = {run.outcome for run in runs}
        assert "ok" in outcomes or NO_RESULT.get(command), f"{command}: no result document"
        assert any(run.schema is None for run in runs), f"{command}: no error document"
        for run in runs:
            assert " ".join(run.args).startswith(command), (command, run.args)
    # every document that ships a schema is printed by some run, and every error kind
    # a command meets in this table is a row of the exit-code table
    printed = {run.schema for runs in RUNS.values() for run in runs} - {None}
    assert printed | {ERROR, "gpucc.evidence/v1"} == set(schema_names())
    kinds = {run.outcome for runs in RUNS.values() for run in runs if run.schema is None}
    assert kinds <= {o.kind for o in TABLE}


def _pem_key(path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
    pub = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    path.with_suffix(".pub").write_bytes(pub)


def _plan(work: Path, name: str, url: str, pin: str, log: str) -> None:
    from gpucc.staging import open_sealed

    digest = open_sealed(work / "data" / "d.gcc").header_digest.hex()
    doc = {
        "version": 1,
        "orchestrator": {"key": "o.key", "log": log},
        "timeout_s": 20,
        "holders": [
            {
                "id": "alice",
                "url": url,
                "public_key": pin,
                "datasets": [{"name": "d", "path": "data/d.gcc", "header_digest": digest}],
            }
        ],
    }
    (work / name).write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from gpucc.gpuattest.bundle import Bundle, write_bundle
    from gpucc.gpuattest.samples import nvidia_h100_sample
    from gpucc.staging.model import digest_model, make_serialization

    work = tmp_path_factory.mktemp("schemas")
    (work / "d.bin").write_bytes(bytes(range(256)) * 80 + b"x" * 123)
    (work / "data").mkdir()
    (work / "receipts").mkdir()
    (work / "nul.yaml").write_bytes(b"version: 1\x00\n")
    from gpucc.gpuattest.cvm.eventlog_build import LogEvent, build_tpm_log

    (work / "tpm.log").write_bytes(
        build_tpm_log([LogEvent("pcr4", 0x80000003, b"kernel"), LogEvent("pcr7", 0x04, bytes(4))])
    )
    _pem_key(work / "p.pem")
    _pem_key(work / "q.pem")
    from gpucc.gpuattest.ear import EarSubmodule, Outcome, sign_ear
    from gpucc.gpuattest.eat import load_private_key_pem

    at = dt.datetime.fromisoformat(AT.replace("Z", "+00:00"))
    ear = sign_ear(
        [EarSubmodule("GPU-0", Outcome.TRUSTED)],
        private_key=load_private_key_pem(work / "p.pem"),
        nonce=bytes(32),
        now=at,
    )
    (work / "r.ear").write_text(ear + "\n")
    sample = nvidia_h100_sample()
    (work / "report.bin").write_bytes(sample.report_path.read_bytes())
    (work / "c.pem").write_bytes(sample.cert_chain_path.read_bytes())
    rims = {
        "NV_GPU_DRIVER_GH100_545.00": sample.driver_rim_path.read_bytes(),
        "NV_GPU_VBIOS_1010_0200_882_96005E0001": sample.vbios_rim_path.read_bytes(),
    }
    created = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    write_bundle(Bundle(created=created, rims=rims), work / "bundle.json")
    for name, content in (("m", b"a" * 100), ("m2", b"b" * 100)):
        (work / name).mkdir()
        (work / name / "a.bin").write_bytes(content)
    other = work / "other.bin"
    other.write_bytes(b"o" * 5000)
    manifest = digest_model(other, make_serialization(other)).to_bytes()
    (work / "other.manifest.json").write_bytes(manifest)
    return work


def _substitute(args: tuple[str, ...], values: dict[str, str]) -> list[str]:
    out = []
    for arg in args:
        for key, value in values.items():
            arg = arg.replace("{" + key + "}", value)
        out.append(arg)
    return out


def _prepare(command: str, work: Path, values: dict[str, str], stack: ExitStack) -> None:
    """What a command's runs need from earlier ones, made just before they run; the
    services they need stop when ``stack`` closes."""
    if command in ("collateral fetch", "collateral check"):
        values["RIMS"] = stack.enter_context(serve(RimService.with_samples())).url
    if command == "stage":
        sealed = (work / "d.gcc").read_bytes()
        (work / "tampered.gcc").write_bytes(
            sealed[:-100] + bytes([sealed[-100] ^ 1]) + sealed[-99:]
        )
    if command == "travel run":
        from gpucc.travel.signing import key_id, load_public_key

        pin = "sha256:" + "ab" * 32  # a key no holder has
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpucc", "holder", "serve", "--datasets", "data",
             "--data-key", "k.key", "--holder-key", "h.key", "--listen", f"127.0.0.1:{port}",
             "--simulate", "sim", "--receipt-dir", "receipts", "--state", "state.sqlite3"],
            cwd=work, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        stack.callback(_stop, proc)
        url = f"http://127.0.0.1:{port}"
        _wait(url, proc)
        hkey = load_public_key((work / "h.pub").read_bytes(), "h.pub")
        _plan(work, "plan.yaml", url, "sha256:" + key_id(hkey), "travel-log.jsonl")
        _plan(work, "gone.yaml", f"http://127.0.0.1:{free_port()}", "sha256:" + key_id(hkey),
              "gone-log.jsonl")  # fmt: skip
        _plan(work, "pinned-elsewhere.yaml", url, pin, "elsewhere-log.jsonl")
    if command == "holder receipts" and "HEAD" in values:
        kept = sorted((work / "receipts").iterdir())
        assert kept, "the holder kept no receipt"
        values["RECEIPT"] = str(kept[-1])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)


def _wait(url: str, proc: subprocess.Popen[bytes]) -> None:
    import time

    import requests

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the holder exited"
        try:
            if requests.get(url + "/healthz", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise AssertionError("the holder did not become healthy")


def _check(command: str, run: Run, result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    where = f"{command} / {run.outcome} {run.args}"
    assert result.returncode == run.code, (where, result.returncode, result.stderr)
    doc: dict[str, Any] = json.loads(result.stdout)  # one document, nothing after it
    schema = run.schema or ERROR
    assert doc.get("schema") == schema, (where, result.stdout[:300])
    failures = sorted(
        Draft202012Validator(load_schema(schema)).iter_errors(doc), key=lambda e: e.json_path
    )
    assert not failures, (where, [f"{e.json_path}: {e.message}" for e in failures])
    if run.schema is None:
        assert doc["error"]["code"] == run.code and doc["error"]["kind"] == run.outcome, where
    elif run.code:
        assert doc["exit_code"] == run.code, where
    return doc


def test_every_document_validates_against_its_schema(work: Path) -> None:
    values: dict[str, str] = {}
    failures: list[str] = []
    with ExitStack() as stack:
        for command in ORDER:
            _prepare(command, work, values, stack)
            for run in RUNS[command]:
                args = _substitute(run.args, values)
                result = run_cli(*args, "-f", "json", cwd=work, timeout=180)
                try:
                    doc = _check(command, run, result)
                except AssertionError as exc:
                    failures.append(str(exc)[:2000])
                    continue
                if command == "session challenge" and run.outcome == "ok":
                    values["CHALLENGE"] = doc["challenge"]
                if command == "travel run" and run.outcome == "ok":
                    values["HEAD"] = doc["head"]
    assert not failures, "\n".join(failures)
