"""Azure's paravisor quote endpoint, played by a loopback stand-in serving the real Azure TDX
sample's bytes: the TDREPORT of the sample's HCL report goes out as Azure's endpoint reads
it, the sample's TD quote comes back, and the document assembled from it is judged by
`gpucc attest` exactly as the sample file is. A broken endpoint is an environment problem
naming it, never evidence."""

from __future__ import annotations

import base64
import datetime as dt
import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpucc.core.errors import EnvironmentProblemError
from gpucc.gpuattest.cvm.azure_tdquote import AZURE_TD_QUOTE_URL, fetch_td_quote
from gpucc.gpuattest.cvm.tdx_sim import simulated_tdx
from gpucc.gpuattest.cvm.vtpm_evidence import encode_vtpm_evidence, parse_vtpm_evidence
from tests.support.azure_tdquote import TdQuoteService, td_quote_service
from tests.support.cli import run_cli
from tests.support.paths import DATA

SAMPLE = DATA / "cloud-cvm" / "azure-tdx-vtpm" / "evidence-v1.json"
EV = parse_vtpm_evidence(SAMPLE.read_bytes())
TDREPORT = EV.hcl.hardware_report


@pytest.fixture
def azure() -> Iterator[TdQuoteService]:
    """The stand-in knows one TD: the sample's; any other TDREPORT is refused."""
    with td_quote_service(lambda report: EV.td_quote if report == TDREPORT else None) as svc:
        yield svc


def test_the_default_endpoint_is_azures() -> None:
    assert AZURE_TD_QUOTE_URL == "http://169.254.169.254/acc/tdquote"


def test_the_sample_tdreport_goes_out_and_its_quote_comes_back(azure: TdQuoteService) -> None:
    assert EV.td_quote is not None and len(TDREPORT) == 1024
    quote = fetch_td_quote(TDREPORT, url=azure.url)
    assert quote == EV.td_quote  # the 70 zero bytes after the signature data included
    (sent,) = azure.requests
    doc = json.loads(sent)
    assert list(doc) == ["report"] and "=" not in doc["report"]
    assert base64.urlsafe_b64decode(doc["report"] + "=" * (-len(doc["report"]) % 4)) == TDREPORT
    azure.padded = True  # an answer with base64 padding reads the same
    assert fetch_td_quote(TDREPORT, url=azure.url) == EV.td_quote


def _attest(path: Path) -> tuple[int, dict[str, Any]]:
    proc: subprocess.CompletedProcess[str] = run_cli(
        "attest", "--cvm-only", "--cvm-evidence", path, "--cvm-report-data",
        b"challenge".hex(), "--offline", "--no-cache", "--at", "2026-01-01T00:00:00Z",
        "-f", "json",
    )  # fmt: skip
    return proc.returncode, json.loads(proc.stdout)


def test_the_collected_document_is_judged_as_the_sample_is(
    azure: TdQuoteService, tmp_path: Path
) -> None:
    quote = fetch_td_quote(TDREPORT, url=azure.url)
    raw_hcl = base64.urlsafe_b64decode(json.loads(SAMPLE.read_bytes())["hcl_report"])
    doc = encode_vtpm_evidence(
        hcl_report=raw_hcl, quote=EV.quote, signature=EV.signature, pcrs=list(EV.pcrs),
        td_quote=quote, user_data=False,
    )  # fmt: skip
    collected = tmp_path / "cvm.json"
    collected.write_text(json.dumps(doc))
    code, ours = _attest(collected)
    sample_code, theirs = _attest(SAMPLE)
    assert code == sample_code == 3  # no Intel collateral for FMSPC 00806F050000 offline
    checks = [(c["id"], c["status"]) for c in ours["cvm"]["checks"]]
    assert checks == [(c["id"], c["status"]) for c in theirs["cvm"]["checks"]]
    passed = {cid for cid, status in checks if status == "pass"}
    assert {"tdx-quote-signature", "vtpm-binding", "vtpm-quote-signature"} <= passed


def test_another_tdreport_gets_no_quote(azure: TdQuoteService) -> None:
    other = bytearray(TDREPORT)
    other[200] ^= 1
    with pytest.raises(EnvironmentProblemError, match="could not be used: .*400"):
        fetch_td_quote(bytes(other), url=azure.url)
    with pytest.raises(ValueError, match="1024 bytes of type 0x81"):
        fetch_td_quote(TDREPORT[:512], url=azure.url)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_an_endpoint_that_is_not_there_is_an_environment_problem() -> None:
    url = f"http://127.0.0.1:{_closed_port()}/acc/tdquote"
    with pytest.raises(EnvironmentProblemError, match=f"endpoint {url} could not be used"):
        fetch_td_quote(TDREPORT, url=url)


def test_a_proxy_in_the_environment_is_not_used(
    azure: TdQuoteService, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = f"http://127.0.0.1:{_closed_port()}"
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, dead)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert fetch_td_quote(TDREPORT, url=azure.url) == EV.td_quote


def test_bad_answers_are_environment_problems_naming_the_endpoint(
    azure: TdQuoteService,
) -> None:
    sim = simulated_tdx(dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    foreign = base64.urlsafe_b64encode(sim.quote(bytes(64))).decode()
    sgx = bytearray(EV.td_quote or b"")
    sgx[4:8] = bytes(4)  # TEE type SGX
    cases = {
        "did not answer with JSON": b"<html>quota</html>",
        "without a base64url 'quote'": b'{"quote": 5}',
        "without a base64url 'quote'.": b'{"quote": "not base64!"}',
        "answered with no TDX quote: an SGX quote": json.dumps(
            {"quote": base64.urlsafe_b64encode(bytes(sgx)).decode()}
        ).encode(),
        "other report data than the TDREPORT's": json.dumps({"quote": foreign}).encode(),
    }
    for words, answer in cases.items():
        azure.raw = (200, answer)
        with pytest.raises(EnvironmentProblemError, match=words.rstrip(".")) as caught:
            fetch_td_quote(TDREPORT, url=azure.url)
        assert azure.url in str(caught.value)
    azure.raw = (500, b"{}")
    with pytest.raises(EnvironmentProblemError, match="could not be used: .*500"):
        fetch_td_quote(TDREPORT, url=azure.url)
