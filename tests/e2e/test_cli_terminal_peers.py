"""What peers and services say reaches the terminal escaped, on real processes: a hostile
holder's refusals at the orchestrator (``travel run``), a log's fields (``travel verify-log``),
the holder's own commands (``holder serve``, ``datasets``, ``receipts``) with hostile file
names and requests, and a bundle's or a collateral service's text (``collateral show``,
``collateral fetch``)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime as dt
import json
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.serialization import Encoding

from tests.e2e.test_cli_terminal import HOSTILE, raw_controls
from tests.support.cli import ENV, GPUCC, run_cli
from tests.support.netfixtures import Reply, Seen, free_port, read_request_head, serve, serve_raw

pytestmark = pytest.mark.slow  # every test starts several gpucc processes (2-4 s each)

#: What a hostile peer says: erase the line, move up, hyperlink, overwrite, a C1 CSI and a
#: bidi override (HOSTILE, the name used for local files, adds a screen clear and a title).
MESSAGE = "ok\x1b[2K\x1b[1A\x1b]8;;http://evil\x1b\\verified\x1b]8;;\x1b\\\r\x9b2J\u202edone"

#: The same as an HTTP reason phrase (which is Latin-1: the bidi override arrives as bytes).
REASON = b"x\x1b[2K\x1b[1A\x1b]8;;\x9b2J\xe2\x80\xae"


def _error_body(message: str = MESSAGE) -> bytes:
    return json.dumps({"error": "refused", "message": message}).encode()


def _assert_clean(args: object, result: subprocess.CompletedProcess[str]) -> str:
    text = result.stdout + result.stderr
    assert not raw_controls(text), (args, raw_controls(text), text)
    return text


def _escaped(text: str) -> bool:
    """The hostile text is there, shown as escapes (text lines or JSON)."""
    return any(e in text for e in ("\\x1b[2K", "\\u001b[2K", "\\x1b[2J", "\\u001b[2J"))


def _hostile_holder(mode: str) -> Callable[[Seen], Reply]:
    """A holder that gives a fresh challenge (unless ``mode`` refuses that too) and then
    refuses the offer with a hostile message."""
    json_type = {"content-type": "application/json"}

    def handler(seen: Seen) -> Reply:
        if seen.path == "/v1/challenge":
            if mode == "challenge-503":
                return Reply(503, _error_body(), json_type)
            if mode == "challenge-429":
                return Reply(429, _error_body(), json_type)
            return Reply(200, json.dumps({"challenge": "5a" * 32}).encode(), json_type)
        if seen.path == "/v1/offer":
            if mode == "offer-envelope":  # a 200 that is no envelope, its fields hostile
                junk = {"schema": MESSAGE, "key_id": MESSAGE, MESSAGE: [MESSAGE]}
                return Reply(200, json.dumps(junk).encode(), json_type)
            status = {"offer-403": 403, "offer-503": 503, "offer-409": 409}[mode]
            return Reply(status, _error_body(), json_type)
        return Reply(404, _error_body(), json_type)

    return handler


def test_a_hostile_holders_refusals_reach_the_orchestrator_escaped(tmp_path: Path) -> None:
    from gpucc.staging import open_sealed, seal_file, write_key_file

    kek = write_key_file(tmp_path / "k.key")
    (tmp_path / "plain").write_bytes(b"p" * 3000)
    sealed = tmp_path / f"{HOSTILE}.gcc"
    seal_file(tmp_path / "plain", sealed, kek=kek, chunk_size=4096)
    digest = open_sealed(sealed).header_digest.hex()
    modes = ["challenge-503", "challenge-429", "offer-403", "offer-503", "offer-409"]
    modes += ["offer-envelope"]
    with contextlib.ExitStack() as stack:
        urls = {m: stack.enter_context(serve(_hostile_holder(m))).url for m in modes}
        runs = []
        for mode, url in urls.items():
            plan = tmp_path / f"{mode}.yaml"
            doc = {
                "version": 1,
                "timeout_s": 20,
                "holders": [
                    {
                        "id": "h",
                        "url": url,
                        "public_key": "sha256:" + "ab" * 32,
                        "datasets": [{"name": "d", "path": sealed.name, "header_digest": digest}],
                    }
                ],
            }
            plan.write_text(json.dumps(doc))
            extra = ("-f", "json") if mode == "offer-503" else ("-v",)
            runs.append((mode, ("travel", "run", plan.name, "--simulate", f"sim-{mode}", *extra)))

        def one(run: tuple[str, tuple[str, ...]]) -> subprocess.CompletedProcess[str]:
            if "-vv" in run[1]:  # the traceback of -vv, which quotes the message, on purpose
                command = [GPUCC, *run[1]]
                return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True,
                                      timeout=90, env=ENV, check=False)  # fmt: skip
            return run_cli(*run[1], cwd=tmp_path, timeout=90)

        refused = dict(runs)["offer-403"]
        runs.append(("offer-403", (*refused[: refused.index("-v")], "-vv")))

        with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
            results = list(pool.map(one, runs))
    assert "Traceback" in results[-1].stderr
    for (mode, args), result in zip(runs, results, strict=True):
        text = _assert_clean(args, result)
        assert result.returncode not in (0, 70), (mode, result.stderr)
        if mode in ("challenge-503", "offer-503"):
            assert result.returncode == 3, (mode, result.stderr)  # could not decide
        if mode == "offer-403":
            assert result.returncode == 1, result.stderr  # not trusted
        if mode != "offer-envelope":
            assert _escaped(text), (mode, text)  # the peer's message is shown, escaped
    document = json.loads(results[3].stdout)  # JSON carries the message as it came
    assert " ".join(MESSAGE.split()) in document["error"]["message"]


def _signed_log(tmp: Path) -> tuple[Path, Path, str]:
    """A log whose visit names a hostile holder and whose closing entry carries hostile
    text, correctly signed; the orchestrator's public key; the log's head."""
    from gpucc.travel.log import GENESIS, LOG_SCHEMA, closing_entry, entry_hash, sign_entry
    from gpucc.travel.signing import generate_signing_key, key_id, public_pem

    key = generate_signing_key()
    visit = {"schema": LOG_SCHEMA, "seq": 0, "prev": GENESIS, "holder_id": HOSTILE}
    first = sign_entry(key, {**visit, "note": MESSAGE})
    close = closing_entry(
        seq=1, prev=entry_hash(first), orchestrator_key_id=key_id(key), planned=1, done=1,
        finished=MESSAGE,
    )  # fmt: skip
    last = sign_entry(key, close)
    log = tmp / f"{HOSTILE}.jsonl"
    log.write_bytes(first + b"\n" + last + b"\n")
    # a second log: a hostile sequence number, signed, so that the refusal quotes it
    bad = sign_entry(key, {**visit, "seq": MESSAGE})
    (tmp / "bad-seq.jsonl").write_bytes(bad + b"\n")
    pub = tmp / "orchestrator.pub.pem"
    pub.write_bytes(public_pem(key))
    return log, pub, entry_hash(last)


def test_a_logs_fields_reach_the_terminal_escaped(tmp_path: Path) -> None:
    from gpucc.travel.receipt import make_receipt
    from gpucc.travel.signing import generate_signing_key

    log, pub, head = _signed_log(tmp_path)
    other = make_receipt(
        generate_signing_key(), holder_id="h", seq=0, entry_hash="00" * 32,
        transcript_hash="11" * 48,
    )  # fmt: skip
    (tmp_path / "other.json").write_bytes(other.to_json())
    runs = [
        ("travel", "verify-log", log.name, "--orchestrator-pub", pub.name, "--expect-head", head),
        ("travel", "verify-log", log.name, "--orchestrator-pub", pub.name, "-f", "json"),
        (
            "travel",
            "verify-log",
            log.name,
            "--orchestrator-pub",
            pub.name,
            "--expect-head",
            "ab" * 32,
        ),
        (
            "travel",
            "verify-log",
            log.name,
            "--orchestrator-pub",
            pub.name,
            "--receipt",
            "other.json",
        ),
        ("travel", "verify-log", "bad-seq.jsonl", "--orchestrator-pub", pub.name),
        ("travel", "verify-log", "bad-seq.jsonl", "--orchestrator-pub", pub.name, "-f", "json"),
        ("travel", "verify-log", log.name, "--orchestrator-pub", f"{HOSTILE}.pem"),
    ]
    results = _run_all(runs, tmp_path)
    for args, result in zip(runs, results, strict=True):
        _assert_clean(args, result)
    ok = results[0]
    assert ok.returncode == 0, ok.stderr
    assert "\\x1b[2J" in ok.stdout and "log verified: 1 of 1" in ok.stdout
    assert json.loads(results[1].stdout)["holders"] == [HOSTILE]
    assert results[2].returncode == 6 and results[3].returncode != 0
    assert results[4].returncode == 6 and _escaped(results[4].stderr), results[4].stderr
    assert _escaped(results[5].stdout) and results[6].returncode != 0


def _run_all(runs: list[tuple[str, ...]], cwd: Path) -> list[subprocess.CompletedProcess[str]]:
    def one(args: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, cwd=cwd, timeout=60)

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(one, runs))


def test_receipts_and_datasets_with_hostile_file_names(tmp_path: Path) -> None:
    from gpucc.staging import seal_file, write_key_file
    from gpucc.travel.receipt import make_receipt
    from gpucc.travel.signing import generate_signing_key

    receipt = make_receipt(
        generate_signing_key(), holder_id="h", seq=0, entry_hash="00" * 32,
        transcript_hash="11" * 48,
    )  # fmt: skip
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / f"receipt-{HOSTILE}.json").write_bytes(receipt.to_json())
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / f"receipt-{HOSTILE}.json").write_text(json.dumps({MESSAGE: MESSAGE}))
    data = tmp_path / "data"
    data.mkdir()
    kek = write_key_file(tmp_path / "k.key")
    (tmp_path / "plain").write_bytes(b"p" * 100)
    seal_file(tmp_path / "plain", data / f"{HOSTILE}.gcc", kek=kek, chunk_size=4096)
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / f"{HOSTILE}.gcc").write_bytes(MESSAGE.encode() * 20)
    from gpucc.holder.audit import audit_document
    from gpucc.holder.state import SqliteState

    state = SqliteState(tmp_path / "state.sqlite3")
    reason = {"dataset": HOSTILE, "policy": MESSAGE, "check": MESSAGE, "detail": MESSAGE}
    state.put_audit(
        audit_document(
            client=MESSAGE, requester=None, challenge=bytes(32), released=[], refused=[reason]
        )
    )
    state.close()
    runs = [
        ("holder", "receipts", "--state", "state.sqlite3"),
        ("holder", "receipts", "--state", "state.sqlite3", "-f", "json"),
        ("holder", "receipts", "--receipt-dir", "kept"),
        ("holder", "receipts", "--receipt-dir", "kept", "-f", "json"),
        ("holder", "receipts", "--receipt-dir", "broken"),
        ("holder", "datasets", "--datasets", "data"),
        ("holder", "datasets", "--datasets", "junk"),
        ("holder", "datasets", "--datasets", "junk", "-f", "json"),
        ("holder", "prune", "--state", f"{HOSTILE}.sqlite3", "--before", "0"),
        ("holder", "prune", "--state", "state.sqlite3", "--before", MESSAGE),
    ]
    results = _run_all(runs, tmp_path)
    for args, result in zip(runs, results, strict=True):
        _assert_clean(args, result)
    pruned = results[-2:]
    assert [r.returncode for r in pruned] == [8, 2], [r.stderr for r in pruned]
    assert all(_escaped(r.stderr) for r in pruned), [r.stderr for r in pruned]
    results = results[:-2]
    audit, audit_json = results[0], results[1]
    assert audit.returncode == 0 and _escaped(audit.stdout), audit.stderr
    assert json.loads(audit_json.stdout)["records"][0]["datasets"][0]["dataset"] == HOSTILE
    results = results[2:]
    assert results[0].returncode == 0 and _escaped(results[0].stdout), results[0].stderr
    assert json.loads(results[1].stdout)["receipts"][0]["file"].endswith(f"{HOSTILE}.json")
    assert results[2].returncode == 4, results[2].stderr
    assert results[3].returncode == 0 and _escaped(results[3].stdout)
    assert results[4].returncode not in (0, 70) and _escaped(results[4].stderr)


def test_a_bundles_and_a_services_text_reaches_the_terminal_escaped(tmp_path: Path) -> None:
    from cryptography.x509 import ocsp

    from gpucc.gpuattest.bundle import Bundle, BundleOcspEntry, write_bundle
    from gpucc.gpuattest.ocsp_response import CertId
    from gpucc.gpuattest.samples import nvidia_h100_sample

    unsuccessful = ocsp.OCSPResponseBuilder.build_unsuccessful(
        ocsp.OCSPResponseStatus.TRY_LATER
    ).public_bytes(Encoding.DER)
    entry = BundleOcspEntry(
        CertId("sha256", b"\x01" * 32, b"\x02" * 32, 7), unsuccessful, HOSTILE, MESSAGE
    )
    created = dt.datetime(2026, 1, 15, tzinfo=dt.UTC)
    write_bundle(Bundle(created=created, ocsp=(entry,)), tmp_path / f"{HOSTILE}.json")
    doc = json.loads((tmp_path / f"{HOSTILE}.json").read_text())
    doc["rims"] = {MESSAGE: ""}  # a RIM id no service would give: refused, and quoted
    (tmp_path / "bad-rim.json").write_text(json.dumps(doc))
    sample = nvidia_h100_sample()
    evidence = ("--evidence", str(sample.report_path), "--cert-chain", str(sample.cert_chain_path))

    def refusing(conn: socket.socket) -> None:  # a refusal with a hostile reason phrase
        read_request_head(conn)
        conn.sendall(b"HTTP/1.1 404 " + REASON + b"\r\nContent-Length: 0\r\n\r\n")

    def redirecting(conn: socket.socket) -> None:  # to a hostile location
        read_request_head(conn)
        conn.sendall(
            b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:1/" + REASON
            + b"\r\nContent-Length: 0\r\n\r\n"
        )  # fmt: skip

    def junk(seen: Seen) -> Reply:  # every request: 200 with hostile bytes for a body
        return Reply(200, MESSAGE.encode() * 3, {"Content-Type": "application/xml"})

    with serve_raw(refusing) as down, serve_raw(redirecting) as away, serve(junk) as liar:
        runs: list[tuple[str, ...]] = [("collateral", "show", f"{HOSTILE}.json")]
        runs.append(("collateral", "show", f"{HOSTILE}.json", "-f", "json"))
        runs.append(("collateral", "show", "bad-rim.json"))
        for name, url in (("down", down), ("away", away), ("liar", liar.url)):
            fetch = ("collateral", "fetch", *evidence, "-o", f"{name}.json", "--rim-url", url,
                     "--ocsp-url", url, "--no-cache", "--timeout", "5", "--deadline", "20")  # fmt: skip
            runs += [(*fetch, "-v"), (*fetch, "-f", "json", "--force")]
        for url in (down, away, liar.url):  # the pre-flight check meets the same services
            runs.append(("collateral", "check", "--driver", "550.90.07", "--vbios",
                         "96.00.5E.00.01", "--board", "1010_0200_882", "--rim-url", url,
                         "--timeout", "5", "--deadline", "20", "-v"))  # fmt: skip
        results = _run_all(runs, tmp_path)
    for args, result in zip(runs, results, strict=True):
        _assert_clean(args, result)
    shown = results[0]
    assert shown.returncode == 0 and "\\x1b[2J" in shown.stdout, shown.stderr
    assert json.loads(results[1].stdout)["ocsp"][0]["subject"] == HOSTILE
    assert results[2].returncode == 4 and _escaped(results[2].stderr), results[2].stderr
    assert all(r.returncode == 3 for r in results[3:]), [r.stderr for r in results[3:]]
    assert "\\x1b[1A\\x1b]8;;\\x9b2J" in results[3].stderr  # the reason, shown escaped
    checked = results[-3]  # collateral check against the refusing service: not published
    assert "not-published" in checked.stdout, checked.stdout


#: Requests as a hostile client sends them: raw control bytes in the target, the headers
#: (among them the forwarded-for address the service may log), the body and the request line.
HOSTILE_REQUESTS = [
    b"GET /\x1b[2J\x9b\xe2\x80\xae HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /%1b[2J%c2%9b%e2%80%ae?q=%1b]0;owned%07 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /healthz?q=\x1b]0;owned\x07 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: \x1b[2J\r\nX-Forwarded-For: \x1b[2J\x9b1m\r\n"
    b"User-Agent: \x1b[1A\xe2\x80\xae\r\nConnection: close\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 10.0.0.1, \xe2\x80\xae1.2.3.4\xc2\x9b\r\n"
    b"Connection: close\r\n\r\n",
    b"POST /v1/offer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(_error_body()), _error_body()),
    b"POST /v1/receipt HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\nConnection: close\r\n\r\n"
    b"\x1b[2J\x9b\r\n\r\n",
    b"\x1b[2J\x1b[1A\x9b2J\r\n\r\n",
]


def _exchange(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(request)
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
        return data


def test_the_holder_service_shows_hostile_names_and_requests_escaped(tmp_path: Path) -> None:
    from gpucc.gpuattest.simulate import SimulatedGpu
    from gpucc.staging import seal_file, write_key_file
    from gpucc.travel.signing import generate_signing_key, write_signing_key
    from tests.e2e.test_travel_e2e import World

    World(
        tmp=tmp_path, gpu=SimulatedGpu.create(now=dt.datetime.now(dt.UTC)), roots=tmp_path / "roots"
    ).write_roots()
    data = tmp_path / "data"
    data.mkdir()
    kek = write_key_file(tmp_path / "k.key")
    (tmp_path / "plain").write_bytes(b"p" * 100)
    seal_file(tmp_path / "plain", data / f"{HOSTILE}.gcc", kek=kek, chunk_size=4096)
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / f"{HOSTILE}.gcc").write_bytes(MESSAGE.encode() * 20)
    write_signing_key(tmp_path / "holder.key", generate_signing_key())
    port = free_port()
    common = ("--data-key", "k.key", "--holder-key", "holder.key", "--simulate", "roots")
    serve_args = ("holder", "serve", "--datasets", "data", *common, "--listen", f"127.0.0.1:{port}",
                  "--idle-timeout-s", "2", "--drain-s", "2", "--trusted-proxy", "127.0.0.1", "-v")  # fmt: skip
    out, err = (tmp_path / "serve.out").open("w+"), (tmp_path / "serve.err").open("w+")
    with out, err:
        proc = subprocess.Popen([GPUCC, *serve_args], cwd=tmp_path, stdout=out, stderr=err, env=ENV)
        try:
            deadline = time.monotonic() + 30
            while b"HTTP/1.1 200" not in _try_health(port):
                assert proc.poll() is None and time.monotonic() < deadline, err.read()
                time.sleep(0.05)
            answers = [_exchange(port, request) for request in HOSTILE_REQUESTS]
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        out.seek(0), err.seek(0)
        service = subprocess.CompletedProcess(serve_args, proc.returncode, out.read(), err.read())
    assert all(a.startswith(b"HTTP/1.1 ") for a in answers), answers
    text = _assert_clean(serve_args, service)
    assert "Traceback" not in text
    accesses = [json.loads(line) for line in service.stderr.splitlines() if '"access"' in line]
    assert len(accesses) >= len(HOSTILE_REQUESTS), service.stderr
    refused = run_cli("holder", "serve", "--datasets", "junk", *common, "--listen",
                      "127.0.0.1:1", cwd=tmp_path, timeout=60)  # fmt: skip
    _assert_clean("serve junk", refused)
    assert refused.returncode == 4 and _escaped(refused.stderr), refused.stderr


def _try_health(port: int) -> bytes:
    try:
        return _exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    except OSError:
        return b""


def test_a_hostile_offer_and_answer_reach_the_terminal_escaped(tmp_path: Path) -> None:
    """``session answer`` reads the host's offer and ``session accept`` the holder's answer:
    both are the other side's documents."""
    from gpucc.staging import seal_file, write_key_file

    kek = write_key_file(tmp_path / "k.key")
    (tmp_path / "plain").write_bytes(b"p" * 100)
    seal_file(tmp_path / "plain", tmp_path / f"{HOSTILE}.gcc", kek=kek, chunk_size=4096)
    challenge = "c3" * 32
    made = run_cli("session", "offer", "--challenge", challenge, "-o", "offer.json",
                   "--host-key", "host.key", "--simulate", "sim", cwd=tmp_path)  # fmt: skip
    assert made.returncode == 0, made.stderr
    offer = json.loads((tmp_path / "offer.json").read_text())
    fields = {**offer, "evidence": [
        {**e, "uuid": MESSAGE, "driver_version": MESSAGE, "vbios_version": MESSAGE}
        for e in offer["evidence"]
    ]}  # fmt: skip
    arch = {**offer, "evidence": [{**e, "arch": MESSAGE} for e in offer["evidence"]]}
    for name, doc in (("fields", fields), ("arch", arch), ("junk", {MESSAGE: MESSAGE})):
        (tmp_path / f"{name}.offer").write_text(json.dumps(doc))
    (tmp_path / f"{HOSTILE}.answer").write_text(json.dumps({"schema": MESSAGE, MESSAGE: 1}))
    answer = ("session", "answer", "--challenge", challenge, "--dataset", f"{HOSTILE}.gcc",
              "--data-key", "k.key", "--simulate", "sim", "--state-dir", "state")  # fmt: skip
    runs: list[tuple[str, ...]] = [
        (*answer, "fields.offer", "-o", "a1.json", "-v"),
        (*answer, "fields.offer", "-o", "a2.json", "-f", "json"),
        (*answer, "arch.offer", "-o", "a3.json"),
        (*answer, "junk.offer", "-o", "a4.json"),
        ("session", "accept", f"{HOSTILE}.answer", "--host-key", "host.key"),
        ("session", "local", f"{HOSTILE}.gcc", "--data-key", "k.key", "-o", "l.json",
         "--host-key", "l.key", "--simulate", "sim-local", "-v"),
        ("session", "challenge"),
    ]  # fmt: skip
    results = _run_all(runs, tmp_path)
    for args, result in zip(runs, results, strict=True):
        _assert_clean(args, result)
    assert all(r.returncode not in (0, 70) for r in results[:5]), [r.stderr for r in results]
    assert all(_escaped(results[n].stderr) for n in (0, 1, 4)), [r.stderr for r in results]
    assert results[5].returncode == 0, results[5].stderr


#: Where each command's terminal output meets hostile text: this file, the test of local
#: names next door, or why there is none to meet.
WALKED = {
    "attest": "test_cli_terminal: a hostile evidence file name",
    "collateral fetch": "a service's reason phrase, redirect and junk answers",
    "collateral check": "the same services' reason phrase, redirect and junk answers",
    "collateral serve": "none to a terminal: its log is JSON lines (json.dumps escapes control "
    "characters) and it stores upstream bytes without printing them",
    "collateral export": "none: it prints a count and the path it was given",
    "collateral import": "test_collateral_mirror: a malformed export is refused in one line",
    "collateral show": "a bundle's OCSP subject, issuer and RIM id",
    "demo": "none: it makes and names its own data in its own directory",
    "cvm reference-snp": "a hostile image file name (test_cvm_reference_with_hostile_names)",
    "cvm reference-tdx": "hostile event-log and quote file names (the same test)",
    "cvm reference-vtpm": "a hostile measured-boot log file name (the same test)",
    "cvm pin": "a hostile result file name (the same test)",
    "inspect": "a hostile file name (test_cvm_reference_with_hostile_names)",
    "evidence collect": "none here: its strings come from the local GPU driver (NVML)",
    "holder datasets": "hostile sealed-file names, valid and not",
    "holder keygen": "none: it prints the pin it computed and the paths it was given",
    "holder receipts": "a hostile receipt file name, valid and not; audit records with a "
    "hostile dataset name, client and refusal detail",
    "holder prune": "a hostile state file name and --before value",
    "holder serve": "hostile dataset names and hostile requests",
    "model digest": "test_cli_terminal: hostile resource names",
    "model sign": "test_cli_terminal: a hostile key file name",
    "model verify": "test_cli_terminal: hostile resource names",
    "seal": "test_cli_terminal: hostile input and output names",
    "session accept": "a hostile answer and its file name",
    "session answer": "a hostile offer's fields",
    "session challenge": "none: it prints the challenge it made",
    "session local": "a hostile dataset file name",
    "session offer": "test_cli_terminal: hostile output and key names",
    "stage": "test_cli_terminal: hostile dataset and resource names",
    "token verify": "test_cli_terminal: a signed token's hostile kid",
    "token verify-ear": "test_cli_ear: a signed EAR's hostile kid and part names",
    "travel keygen": "none: as holder keygen",
    "travel run": "a hostile holder's refusals and a hostile dataset path",
    "travel verify-log": "a log's hostile holder ids, fields and sequence number",
}


def test_every_command_is_walked_or_has_a_reason() -> None:
    from tests.e2e.test_cli_contract import leaves

    assert sorted(WALKED) == sorted(leaves())


def test_cvm_reference_with_hostile_names(tmp_path: Path) -> None:
    from tests.support.paths import ROOT

    ccel = ROOT / "tests" / "data" / "cloud-cvm" / "tdx-ccel"
    log = tmp_path / f"{HOSTILE}.ccel"
    quote = tmp_path / f"{HOSTILE}.quote"
    log.write_bytes((ccel / "CCEL_data").read_bytes())
    quote.write_bytes((ccel / "tdx_quote_4.dat").read_bytes())
    runs = [
        ("cvm", "reference-tdx", "--event-log", log.name, "--quote", quote.name),
        ("cvm", "reference-tdx", "--event-log", log.name, "-o", f"{HOSTILE}.yaml", "-v"),
        ("cvm", "reference-snp", "--ovmf", log.name, "--vcpus", "1", "--vcpu-type", "EPYC-v4"),
        ("cvm", "reference-vtpm", "--event-log", quote.name),
        ("cvm", "pin", quote.name),
        ("inspect", quote.name),
    ]
    results = _run_all(runs, tmp_path)
    for args, result in zip(runs, results, strict=True):
        _assert_clean(args, result)
    assert results[0].returncode == 1  # the pair does not replay: the refusal names it
    assert results[1].returncode == 0 and _escaped(results[1].stderr)  # "wrote the policy to"
    assert results[2].returncode == 4 and _escaped(results[2].stderr)  # not an OVMF image
    assert results[3].returncode == 4  # not a TPM event log (the message names no file)
    assert results[4].returncode == 4 and _escaped(results[4].stderr)  # not a result
    assert results[5].returncode == 4 and _escaped(results[5].stderr)  # nothing gpucc knows
