"""Every input that ever ended in an internal error (tests/data/crash-corpus), given to gpucc
as its users give it: the command line answers one line and exit 4 (malformed input), never
a traceback or exit 70; a configuration names its file and key, at start and on SIGHUP (which
keeps the running configuration)."""

from __future__ import annotations

import datetime as dt
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from gpucc.gpuattest.simulate import SimulatedGpu
from tests.e2e.test_travel_e2e import World, _holder_files
from tests.support.cli import run_cli
from tests.support.netfixtures import free_port
from tests.support.paths import DATA, SAMPLES

pytestmark = pytest.mark.slow

CORPUS = DATA / "crash-corpus"
SET_A = SAMPLES / "set-a-h100-545.00" / "attestation-report.hex"
SNP, TDX = DATA / "cpu-tee" / "snp", DATA / "cpu-tee" / "tdx"
CVM = [
    "--cvm-only", "--cvm-report-data", "00" * 64, "--offline", "--no-cache",
    "--at", "2025-06-19T11:16:03Z",
]  # fmt: skip
BUNDLE_ATTEST = ["--sample", "--offline", "--no-cache", "--at", "2024-01-01T00:00:00Z"]


def _commands(path: Path) -> list[list[str]]:
    """How the corpus README says each kind of file is given."""
    kind, f = path.name.split("--", 1)[0], str(path)
    return {
        "cert-chain": [["attest", "--evidence", str(SET_A), "--cert-chain", f, "--offline",
                        "--no-cache"]],
        "snp-vcek": [["attest", "--cvm-evidence", str(SNP / "report.bin"), "--cvm-collateral", f,
                      *CVM]],
        "tdx-quote": [["attest", "--cvm-evidence", f, "--cvm-collateral",
                       str(TDX / "collateral.json"), *CVM]],
        "tdx-quote-nocoll": [["attest", "--cvm-evidence", f, *CVM]],
        "tdx-collateral": [["attest", "--cvm-evidence", str(TDX / "quote.bin"),
                            "--cvm-collateral", f, *CVM]],
        "vtpm-json": [["attest", "--cvm-evidence", f, *CVM]],
        "bundle-json": [["collateral", "show", f], ["attest", *BUNDLE_ATTEST, "--collateral", f]],
        "holder-config": [["holder", "serve", "--config", f, "--listen", "127.0.0.1:0"]],
    }.get(kind, [])  # fmt: skip


COMMANDS = [
    pytest.param(args, id=f"{path.name}-{i}")
    for path in sorted(CORPUS.iterdir())
    for i, args in enumerate(_commands(path))
]


def test_the_corpus_covers_every_kind_it_documents() -> None:
    kinds = {p.name.split("--", 1)[0] for p in CORPUS.iterdir() if "--" in p.name}
    assert kinds - {"holder-http", "fuzz"} <= {
        "cert-chain", "snp-vcek", "tdx-quote", "tdx-quote-nocoll", "tdx-collateral",
        "vtpm-json", "bundle-json", "holder-config",
    }  # fmt: skip
    given = [p for p in CORPUS.iterdir() if p.name.split("--", 1)[0] not in {"holder-http", "fuzz"}]
    assert all(_commands(p) for p in given if p.suffix != ".md")


@pytest.mark.parametrize("args", COMMANDS)
def test_the_command_line_answers_malformed_input(args: list[str], tmp_path: Path) -> None:
    result = run_cli(*args, cwd=tmp_path, timeout=60)
    assert result.returncode == 4, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpucc: error: "), result.stderr
    if args[:2] == ["holder", "serve"]:
        path = Path(args[3])
        key = path.read_text().split(":", 1)[0]
        assert str(path) in lines[0] and (f": {key}: " in lines[0] or "Unicode" in lines[0])


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    tmp = tmp_path_factory.mktemp("corpus")
    w = World(tmp=tmp, gpu=SimulatedGpu.create(now=dt.datetime.now(dt.UTC)), roots=tmp / "roots")
    w.write_roots()
    return w


def _config(world: World, name: str, extra: str) -> Path:
    data, kek, key, _, _, _ = _holder_files(world.tmp, name, [1_000])
    conf = world.tmp / f"{name}.yaml"
    conf.write_text(
        f"datasets: {data}\ndata-key: {kek}\nholder-key: {key}\nsimulate: {world.roots}\n"
        f"state: memory\n{extra}"
    )
    return conf


@pytest.mark.parametrize(
    ("name", "extra", "key"),
    [
        ("nul-requester", 'releases:\n  - {name: r, datasets: [x], requesters: ["\\0"]}\n',
         "releases[0]"),
        ("long-simulation", f"simulate: {'s' * 300}\n", "simulate"),
        ("null-listen", "listen:\n", "listen"),
        ("huge-key", "holder-key: 10000000000\n", "holder-key"),
    ],
)  # fmt: skip
def test_configuration_values_of_the_wrong_type_name_the_file_and_key(
    world: World, name: str, extra: str, key: str
) -> None:
    conf = _config(world, name, "")
    lines = conf.read_text().splitlines()
    kept = [x for x in lines if x.split(":", 1)[0] not in extra.split(":", 1)[0]]
    conf.write_text("\n".join(kept) + "\n" + extra)
    result = run_cli("holder", "serve", "--config", conf, cwd=world.tmp, timeout=60)
    assert result.returncode == 4, result.stderr
    assert f"holder configuration {conf}: {key}" in result.stderr, result.stderr


def _events(log: Path, kind: str) -> list[dict[str, object]]:
    lines = log.read_text().splitlines()
    docs = [json.loads(x) for x in lines if x.startswith("{")]
    return [d for d in docs if d.get("event") == kind]


def test_a_reload_that_fails_keeps_the_running_configuration_and_says_why(world: World) -> None:
    port = free_port()
    conf = _config(world, "reloaded", f"listen: '127.0.0.1:{port}'\n")
    good = conf.read_text()
    log = world.tmp / "reloaded.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpucc.cli.holder", "serve", "--config", str(conf)],
        stdout=subprocess.DEVNULL, stderr=log.open("wb"),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                requests.get(url + "/healthz", timeout=1)
                break
            except requests.RequestException:
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline
                time.sleep(0.05)
        bad = sorted(CORPUS.glob("holder-config--*.yaml"))
        for n, path in enumerate(bad, start=1):
            conf.write_text(good + path.read_text())  # the bad key last: it wins over none
            if "listen" in path.name or "trusted-proxy" in path.read_text():
                conf.write_text(good.replace(f"listen: '127.0.0.1:{port}'\n", "")
                                + path.read_text())  # fmt: skip
            proc.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 20
            while len(_events(log, "reload-failed")) < n:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            failed = _events(log, "reload-failed")[-1]
            assert failed["error"] == "MalformedInputError", failed
            assert requests.get(url + "/healthz", timeout=5).status_code == 200
        assert not _events(log, "reloaded")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
