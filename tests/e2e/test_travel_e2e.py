"""GPU Travelling end to end: real holder service processes on 127.0.0.1, an orchestrator
with a simulated GPU for evidence and CPU staging, and hostile holders on the path."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, load_pem_public_key

from gpucc.assembly import PlatformVerifier, Settings
from gpucc.core.errors import FileAccessError, MalformedPolicyError, UsageError
from gpucc.gpuattest.cvm.eventlog import parse_event_log
from gpucc.gpuattest.cvm.reference import tdx_reference_policy
from gpucc.gpuattest.cvm.tdx_sim import (
    SIMULATED_MRTD,
    SimulatedTdx,
    simulated_boot_log,
    simulated_tdx,
)
from gpucc.gpuattest.simulate import SimulatedGpu
from gpucc.keyrelease.protocol import CollectedCvmEvidence, CollectedEvidence, create_offer
from gpucc.staging import open_sealed, seal_file
from gpucc.staging.errors import ProtocolError
from gpucc.staging.format import write_key_file
from gpucc.travel.client import HolderClient
from gpucc.travel.errors import (
    CvmPolicyMismatchError,
    CvmPolicyUndecidedError,
    DatasetDigestMismatchError,
    HolderAuthenticationError,
    HolderConnectionError,
    HolderRefusedError,
    HolderUnreachableError,
    ModelDigestMismatchError,
)
from gpucc.travel.log import verify_log
from gpucc.travel.orchestrator import run_plan
from gpucc.travel.plan import Plan, parse_plan
from gpucc.travel.signing import (
    Envelope,
    generate_signing_key,
    key_id,
    public_pem,
    sign_answer,
    write_signing_key,
)
from tests.support.netfixtures import Reply, Seen, free_port, serve

pytestmark = pytest.mark.slow


@dataclass
class Holder:
    name: str
    url: str
    key: ec.EllipticCurvePrivateKey
    datasets: list[tuple[str, Path, bytes, bytes]]  # name, path, header digest, plaintext
    dataset_keys: list[bytes]
    log: Path
    proc: subprocess.Popen[bytes]


@dataclass
class World:
    tmp: Path
    gpu: SimulatedGpu
    roots: Path
    holders: dict[str, Holder] = field(default_factory=dict)
    tdx: SimulatedTdx = field(default_factory=lambda: simulated_tdx(dt.datetime.now(dt.UTC)))

    def collect(self, nonce: bytes) -> CollectedEvidence:
        return CollectedEvidence.from_evidence_set(self.gpu.evidence(nonce))

    def collect_cvm(self, report_data: bytes) -> CollectedCvmEvidence:
        # The simulated TD's boot: the simulation's policy pins its MRTD and its events.
        issued = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
        log = simulated_boot_log()
        return CollectedCvmEvidence(
            self.tdx.quote(report_data, event_log=log),
            self.tdx.collateral(issued=issued).to_json(),
            log,
        )

    def write_roots(self) -> None:
        (self.roots / "rims").mkdir(parents=True, exist_ok=True)
        for rim_id, rim in self.gpu.rims.items():
            (self.roots / "rims" / f"{rim_id}.xml").write_bytes(rim)
        (self.roots / "rim_root.pem").write_bytes(
            self.gpu.roots.rim_root.public_bytes(Encoding.PEM)
        )
        (self.roots / "device_root.pem").write_bytes(
            self.gpu.roots.device_root.public_bytes(Encoding.PEM)
        )
        (self.roots / "tdx_root.pem").write_bytes(self.tdx.root.public_bytes(Encoding.PEM))


def _holder_files(
    tmp: Path, name: str, sizes: list[int]
) -> tuple[Path, Path, Path, list[Any], list[bytes], ec.EllipticCurvePrivateKey]:
    data = tmp / name / "data"
    data.mkdir(parents=True)
    kek_path = tmp / name / "data.key"
    kek = write_key_file(kek_path)
    datasets = []
    keys = []
    for i, size in enumerate(sizes):
        plain = os.urandom(size)
        src = tmp / name / f"plain{i}"
        src.write_bytes(plain)
        sealed = data / f"{name}-{i}.gcc"
        seal_file(src, sealed, kek=kek, chunk_size=16384)
        opened = open_sealed(sealed)
        datasets.append((f"{name}-{i}", sealed, opened.header_digest, plain))
        keys.append(opened.unwrap(kek))
    key = generate_signing_key()
    key_path = tmp / name / "holder.key"
    write_signing_key(key_path, key)
    return data, kek_path, key_path, datasets, keys, key


def _start(
    world: World, name: str, sizes: list[int], *extra: str, prefix: tuple[str, ...] = ()
) -> Holder:
    data, kek_path, key_path, datasets, keys, key = _holder_files(world.tmp, name, sizes)
    taken = {int(h.url.rsplit(":", 1)[1]) for h in world.holders.values()}
    port = free_port()
    while port in taken:  # a port handed out again before its holder bound it
        port = free_port()
    log = world.tmp / name / "service.log"
    receipts = world.tmp / name / "receipts"
    receipts.mkdir()
    proc = subprocess.Popen(
        [
            *prefix,
            sys.executable,
            "-m",
            "gpucc.cli.holder",
            "serve",
            "--datasets",
            str(data),
            "--data-key",
            str(kek_path),
            "--holder-key",
            str(key_path),
            "--listen",
            f"127.0.0.1:{port}",
            "--simulate",
            str(world.roots),
            "--rate",
            "500",
            "--burst",
            "500",
            "--receipt-dir",
            str(receipts),
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )
    return Holder(name, f"http://127.0.0.1:{port}", key, datasets, keys, log, proc)


def _wait_healthy(holder: Holder, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if holder.proc.poll() is not None:
            raise AssertionError(f"{holder.name} exited: {holder.log.read_text()}")
        try:
            if requests.get(holder.url + "/healthz", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{holder.name} did not become healthy")


def _stop(holder: Holder) -> int:
    if holder.proc.poll() is None:
        holder.proc.send_signal(signal.SIGTERM)
    try:
        return holder.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        holder.proc.kill()
        return holder.proc.wait()


def _image_policy(path: Path, kernel: str | None = None, mrtd: bytes = SIMULATED_MRTD) -> Path:
    """The simulated TD image's policy (``gpucc cvm reference-tdx``'s section); ``kernel``
    replaces the boot application's digest (another kernel)."""
    section = tdx_reference_policy(parse_event_log(simulated_boot_log()), mrtd=mrtd)
    if kernel is not None:
        for event in section["events"]["tdx"]:
            if event["name"] == "boot-application":
                event["digest"] = kernel
    path.write_text(
        json.dumps({"version": 1, "ocsp": {"require": False}, "cvm": section}, indent=1)
    )
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("travel")
    w = World(tmp=tmp, gpu=SimulatedGpu.create(now=dt.datetime.now(dt.UTC)), roots=tmp / "roots")
    w.write_roots()
    policy = tmp / "refuse.yaml"
    policy.write_text(
        "version: 1\nocsp:\n  require: false\nversions:\n  allowed_drivers: ['999.99.99']\n"
    )
    relaxed = tmp / "gpu-only.yaml"  # a holder that names the GPU-only relaxation
    relaxed.write_text(
        "version: 1\nocsp:\n  require: false\ncvm:\n  allow_gpu_only: true\n"
        f"  measurements:\n    tdx:\n      mrtd: '{SIMULATED_MRTD.hex()}'\n"
    )
    image = tmp / "image.yaml"  # the holder's image policy, as reference-tdx writes it
    _image_policy(image)
    specs: list[tuple[str, list[int], tuple[str, ...]]] = [
        ("a", [70_001, 20_000], ()),
        ("b", [50_000], ()),
        ("c", [33_333], ()),
        ("refuser", [5_000], ("--policy", str(policy), "--body-timeout-s", "1")),
        ("limited", [5_000], ("--rate", "0.1", "--burst", "3", "--max-request-kib", "64")),
        ("relaxed", [5_000], ("--policy", str(relaxed))),
        ("imaged", [5_000], ("--policy", str(image))),
    ]
    for name, sizes, extra in specs:
        w.holders[name] = _start(w, name, sizes, *extra)
    try:
        for holder in w.holders.values():
            _wait_healthy(holder)
        yield w
    finally:
        for holder in w.holders.values():
            _stop(holder)


def _plan(
    world: World,
    names: list[str],
    *,
    url: dict[str, str] | None = None,
    pin: dict[str, str] | None = None,
    digest: dict[str, str] | None = None,
    timeout: float = 20.0,
    log: Path | None = None,
    cvm_policy: dict[str, str] | None = None,
) -> Plan:
    holders = []
    for name in names:
        h = world.holders[name]
        policies = cvm_policy or {}
        extra = {"cvm_policy": policies[name]} if name in policies else {}
        holders.append(
            {
                **extra,
                "id": name,
                "url": (url or {}).get(name, h.url),
                "public_key": (pin or {}).get(name, public_pem(h.key).decode()),
                "datasets": [
                    {"name": n, "path": str(p), "header_digest": (digest or {}).get(n, d.hex())}
                    for n, p, d, _ in h.datasets
                ],
            }
        )
    doc: dict[str, Any] = {"version": 1, "holders": holders, "timeout_s": timeout}
    if log is not None:
        doc["orchestrator"] = {"log": str(log)}
    return parse_plan(doc)


class Staged:
    """Keeps every staged buffer to check it after the run."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, np.ndarray[Any, Any]]] = []

    def __call__(self, holder: str, name: str, buf: Any) -> None:
        self.seen.append((holder, name, buf))

    def all_zero(self) -> bool:
        return all(not np.count_nonzero(b) for _, _, b in self.seen)


# --- the journey -------------------------------------------------------------------


def test_three_holders_each_staged_once_scrubbed_and_logged(world: World, tmp_path: Path) -> None:
    staged = Staged()
    okey = generate_signing_key()
    model: dict[str, Any] = {"w": np.zeros(16, dtype=np.float32)}
    plain = {n: p for h in world.holders.values() for n, _, _, p in h.datasets}

    def step(buffers: Any, state: Any, holder: str) -> None:
        # this holder's data is here, verified; every earlier holder's buffer is already zero
        for name, buf in buffers.items():
            assert bytes(buf) == plain[name]
        assert all(not np.count_nonzero(b) for h, _, b in staged.seen if h != holder)
        state["w"] += 1.0

    log = tmp_path / "travel-log.jsonl"
    result = run_plan(
        _plan(world, ["a", "b", "c"]),
        collect=world.collect,
        collect_cvm=world.collect_cvm,
        training_step=step,
        model=model,
        signing_key=okey,
        log_path=log,
        on_staged=staged,
    )
    assert [(h, n) for h, n, _ in staged.seen] == [
        ("a", "a-0"),
        ("a", "a-1"),
        ("b", "b-0"),
        ("c", "c-0"),
    ]
    assert staged.all_zero()
    assert [v.holder_id for v in result.visits] == ["a", "b", "c"]
    assert [v.bytes_staged for v in result.visits] == [90_001, 50_000, 33_333]
    assert all(r.nonzero == 0 for v in result.visits for r in v.receipts)
    assert len({v.transcript_hash for v in result.visits}) == 3  # a session per holder
    assert len({v.evidence_digest for v in result.visits}) == 3  # a fresh nonce per holder
    for before, after in zip(result.visits, result.visits[1:], strict=False):
        assert after.model_digest_in == before.model_digest_out
    assert float(model["w"][0]) == 3.0

    summary = verify_log(log, okey.public_key())
    assert summary.holders == ("a", "b", "c")
    entries = [json.loads(line) for line in log.read_bytes().splitlines()]
    assert entries[1]["prev"] == hashlib.sha256(log.read_bytes().splitlines()[0]).hexdigest()
    assert entries[0]["holder_key_id"] == key_id(world.holders["a"].key)
    assert entries[0]["scrub"] == [
        {"name": "a-0", "device": "cpu", "bytes": 70_001, "nonzero": 0},
        {"name": "a-1", "device": "cpu", "bytes": 20_000, "nonzero": 0},
    ]

    # the holders' access logs: one JSON object per line, no key material
    for name in ("a", "b", "c"):
        holder = world.holders[name]
        text = holder.log.read_text()
        for k in holder.dataset_keys:
            assert k.hex() not in text and base64.b64encode(k).decode() not in text
        lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        offers = [e for e in lines if e.get("path") == "/v1/offer"]
        assert offers and all(
            set(e)
            <= {
                "event", "time", "client", "method", "path", "status", "outcome", "bytes_out",
                "ms", "simulated",
            }
            and e["simulated"] is True  # these holders trust a simulation's roots
            for e in offers
        )  # fmt: skip
        # each release is logged with what it trusted, as signed into the journey log
        releases = [e for e in lines if e.get("event") == "release"]
        assert len(releases) == 1 and releases[0]["trusted_with"]["roots"] == "simulated"
        entry = entries[("a", "b", "c").index(name)]
        assert entry["holder_trusted_with"] == releases[0]["trusted_with"]


def test_cli_run_and_verify_log(world: World, tmp_path: Path) -> None:
    okey_path = tmp_path / "orch.key"
    pub = tmp_path / "orch.pub.pem"
    cli = [sys.executable, "-m", "gpucc.cli.travel"]
    made = subprocess.run(
        [*cli, "keygen", "--orchestrator-key", str(okey_path), "--orchestrator-pub", str(pub)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    assert oct(okey_path.stat().st_mode & 0o777) == "0o600"
    pem_key = load_pem_public_key(pub.read_bytes())
    assert isinstance(pem_key, ec.EllipticCurvePublicKey)
    assert made.stdout.strip() == "sha256:" + key_id(pem_key)
    plan_doc = {
        "version": 1,
        "orchestrator": {"key": str(okey_path), "log": "travel-log.jsonl"},
        "holders": [
            {
                "id": n,
                "url": world.holders[n].url,
                "public_key": "sha256:" + key_id(world.holders[n].key),
                "datasets": [
                    {"name": d, "path": str(p), "header_digest": h.hex()}
                    for d, p, h, _ in world.holders[n].datasets
                ],
            }
            for n in ("b", "c")
        ],
    }
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(json.dumps(plan_doc))
    try:
        run = subprocess.run(
            [*cli, "run", str(plan_file), "--simulate", str(world.roots), "-q"],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
    finally:
        world.write_roots()  # the CLI made its own simulated GPU; restore ours
    assert run.returncode == 0, run.stderr
    assert "visited 2 holder(s)" in run.stdout
    # -q keeps what the journey trusted: the simulation, and each holder's signed record
    assert "SIMULATED GPU" in run.stderr
    for holder_id in ("b", "c"):
        assert f"{holder_id} released keys trusting:" in run.stderr
    assert "SIMULATED roots" in run.stderr
    log = tmp_path / "travel-log.jsonl"
    ok = subprocess.run(
        [*cli, "verify-log", str(log), "--orchestrator-pub", str(pub)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    assert "2 of 2 planned visits (complete: b, c)" in ok.stdout
    head = ok.stdout.split("head ")[-1].strip()
    assert f"head {head}" in run.stdout  # the run printed the head to keep

    # each holder kept its receipt and shows it
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpucc.cli.holder",
            "receipts",
            "--receipt-dir",
            str(world.tmp / "c" / "receipts"),
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    kept = json.loads(shown.stdout)["receipts"]
    mine = [r for r in kept if r["holder_id"] == "c" and r["seq"] == 1]
    assert (
        mine
        and mine[-1]["entry_hash"] == hashlib.sha256(log.read_bytes().splitlines()[1]).hexdigest()
    )
    receipt_file = mine[-1]["file"]
    # the receipt the holder keeps carries its own signed record of the release, as logged
    entry = json.loads(log.read_bytes().splitlines()[1])
    assert mine[-1]["holder_trusted_with"] == entry["holder_trusted_with"]
    assert mine[-1]["holder_trusted_with"]["roots"] == "simulated"

    def verify(path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*cli, "verify-log", str(path), "--orchestrator-pub", str(pub), *extra],
            capture_output=True,
            text=True,
            check=False,
        )

    assert verify(log, "--expect-head", head, "--receipt", receipt_file).returncode == 0
    # `head -n 1`: cut at its end, no closing entry
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(log.read_bytes().splitlines(keepends=True)[0])
    refused = verify(cut)
    assert refused.returncode == 6 and "closing entry" in refused.stderr
    # cut back and re-closed with the orchestrator's own key: only the head or c's receipt
    # can tell
    from gpucc.travel.log import closing_entry, entry_hash, sign_entry
    from gpucc.travel.signing import load_signing_key

    okey = load_signing_key(okey_path)
    first = log.read_bytes().splitlines()[0]
    reclosed = sign_entry(
        okey,
        closing_entry(
            seq=1,
            prev=entry_hash(first),
            orchestrator_key_id=key_id(okey),
            planned=1,
            done=1,
            finished="2026-01-01T00:00:00.000+00:00",
        ),
    )
    cut.write_bytes(first + b"\n" + reclosed + b"\n")
    assert verify(cut).returncode == 0
    for extra in (("--expect-head", head), ("--receipt", receipt_file)):
        caught = verify(cut, *extra)
        assert caught.returncode == 6, caught.stderr
        assert len(caught.stderr.strip().splitlines()) == 1

    again = subprocess.run(
        [*cli, "run", str(plan_file), "--simulate", str(tmp_path / "sim2")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert again.returncode == 8 and "exists" in again.stderr  # never replaced without --force
    assert len(again.stderr.strip().splitlines()) <= 2

    lines = log.read_bytes().splitlines()
    entry = json.loads(lines[1])
    entry["bytes_staged"] += 1
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_bytes(
        lines[0] + b"\n" + json.dumps(entry, sort_keys=True, separators=(",", ":")).encode() + b"\n"
    )
    bad = subprocess.run(
        [*cli, "verify-log", str(tampered), "--orchestrator-pub", str(pub)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 6 and "signature" in bad.stderr and "Traceback" not in bad.stderr
    dropped = tmp_path / "dropped.jsonl"
    dropped.write_bytes(lines[1] + b"\n")
    gap = subprocess.run(
        [*cli, "verify-log", str(dropped), "--orchestrator-pub", str(pub)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert gap.returncode == 6
    junk = tmp_path / "junk.jsonl"
    junk.write_bytes(b"not json\n")
    mal = subprocess.run(
        [*cli, "verify-log", str(junk), "--orchestrator-pub", str(pub)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert mal.returncode == 4 and "Traceback" not in mal.stderr


# --- hostile holders and paths --------------------------------------------------------


def _proxy(target: str, offer_reply: Any) -> Any:
    """A holder on the path: forwards challenges to ``target``, answers offers its own way."""

    def handle(seen: Seen) -> Reply:
        if seen.path == "/v1/challenge":
            r = requests.post(target + "/v1/challenge", data=seen.body, timeout=10)
            return Reply(r.status_code, r.content, {"content-type": "application/json"})
        if seen.path == "/v1/offer":
            result: Reply = offer_reply(seen)
            return result
        return Reply(404, b"{}")

    return handle


def _forward(target: str, seen: Seen) -> bytes:
    return requests.post(target + "/v1/offer", data=seen.body, timeout=20).content


def _envelope_for_another_session(world: World, holder: Holder) -> bytes:
    client = HolderClient(holder.url)
    offer, _ = create_offer(client.challenge(), world.collect, collect_cvm=world.collect_cvm)
    return client.offer(offer).to_json()


def _expect_nothing_staged(
    world: World, plan: Plan, exc: type[BaseException], match: str = ""
) -> BaseException:
    staged = Staged()
    with pytest.raises(exc, match=match) as info:
        run_plan(plan, collect=world.collect, collect_cvm=world.collect_cvm, on_staged=staged)
    assert staged.seen == []
    return info.value


def test_answer_made_for_another_session_is_refused(world: World) -> None:
    a = world.holders["a"]
    other = _envelope_for_another_session(world, a)  # genuine, signed by a, another session
    with serve(_proxy(a.url, lambda s: Reply(200, other))) as proxy:
        _expect_nothing_staged(
            world, _plan(world, ["a"], url={"a": proxy.url}), ProtocolError, "transcript mismatch"
        )


def test_replayed_answer_is_refused(world: World) -> None:
    a = world.holders["a"]
    recorded: list[bytes] = []

    def record_or_replay(seen: Seen) -> Reply:
        if not recorded:
            recorded.append(_forward(a.url, seen))
        return Reply(200, recorded[0])

    with serve(_proxy(a.url, record_or_replay)) as proxy:
        plan = _plan(world, ["a"], url={"a": proxy.url})
        run_plan(
            plan, collect=world.collect, collect_cvm=world.collect_cvm
        )  # the first run passes through
        _expect_nothing_staged(world, plan, ProtocolError, "transcript mismatch")


def test_forged_answers_are_refused(world: World) -> None:
    a = world.holders["a"]

    def tamper(seen: Seen) -> Reply:
        env = Envelope.from_json(_forward(a.url, seen))
        doc = json.loads(env.answer)
        record = bytearray(base64.b64decode(doc["wraps"][0]["record"]))
        record[-1] ^= 1
        doc["wraps"][0]["record"] = base64.b64encode(record).decode()
        forged = Envelope(json.dumps(doc).encode(), env.holder_public_key, env.signature)
        return Reply(200, forged.to_json())

    mallory = generate_signing_key()

    def resign(seen: Seen) -> Reply:
        env = Envelope.from_json(_forward(a.url, seen))
        th = bytes.fromhex(json.loads(env.answer)["transcript_hash"])
        return Reply(200, sign_answer(mallory, env.answer, th).to_json())

    for behaviour, match in ((tamper, "signature does not verify"), (resign, "not by the pinned")):
        with serve(_proxy(a.url, behaviour)) as proxy:
            _expect_nothing_staged(
                world, _plan(world, ["a"], url={"a": proxy.url}), HolderAuthenticationError, match
            )


def test_unknown_holder_key_is_refused(world: World) -> None:
    other = "sha256:" + key_id(generate_signing_key())
    _expect_nothing_staged(
        world, _plan(world, ["a"], pin={"a": other}), HolderAuthenticationError, "not by the pinned"
    )


def test_holder_whose_policy_refuses_the_gpu(world: World) -> None:
    err = _expect_nothing_staged(
        world, _plan(world, ["refuser"]), HolderRefusedError, "refused the GPU"
    )
    assert "driver" in str(err)


def test_holder_that_hangs_times_out(world: World) -> None:
    a = world.holders["a"]
    with serve(_proxy(a.url, lambda s: Reply(200, b"{}", delay=4.0))) as proxy:
        started = time.monotonic()
        _expect_nothing_staged(
            world,
            _plan(world, ["a"], url={"a": proxy.url}, timeout=1.0),
            HolderUnreachableError,
            "did not answer within",
        )
        assert time.monotonic() - started < 3.5


def test_holder_that_drops_the_connection(world: World) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    stop = threading.Event()

    def drop() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.recv(1024)
            conn.close()

    thread = threading.Thread(target=drop, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        _expect_nothing_staged(
            world, _plan(world, ["a"], url={"a": url}), HolderUnreachableError, "connection failed"
        )
    finally:
        stop.set()
        thread.join()
        listener.close()


def test_dataset_whose_header_digest_differs_from_the_plan(world: World) -> None:
    _expect_nothing_staged(
        world, _plan(world, ["b"], digest={"b-0": "00" * 32}), DatasetDigestMismatchError, "b-0"
    )


def test_a_failed_visit_leaves_zeros_and_a_valid_log(world: World, tmp_path: Path) -> None:
    staged = Staged()
    okey = generate_signing_key()

    def step(buffers: Any, state: Any, holder: str) -> None:
        if holder == "b":
            raise RuntimeError("the training step failed")

    log = tmp_path / "log.jsonl"
    with pytest.raises(RuntimeError):
        run_plan(
            _plan(world, ["a", "b", "c"]),
            collect=world.collect,
            collect_cvm=world.collect_cvm,
            training_step=step,
            signing_key=okey,
            log_path=log,
            on_staged=staged,
        )
    assert [h for h, _, _ in staged.seen] == ["a", "a", "b"]
    assert staged.all_zero()
    assert verify_log(log, okey.public_key()).holders == ("a",)


def test_model_swapped_between_holders_is_caught(world: World) -> None:
    def swap(src: str, dst: str, state: Any) -> None:
        state["w"] = np.full(4, 7.0)

    staged = Staged()
    with pytest.raises(ModelDigestMismatchError, match="arriving at b"):
        run_plan(
            _plan(world, ["a", "b"]),
            collect=world.collect,
            collect_cvm=world.collect_cvm,
            model={"w": np.zeros(4)},
            transit=swap,
            on_staged=staged,
        )
    assert [h for h, _, _ in staged.seen] == ["a", "a"] and staged.all_zero()


def test_two_orchestrators_racing_for_one_challenge(world: World) -> None:
    a = world.holders["a"]
    client = HolderClient(a.url)
    challenge = client.challenge()
    bodies = [
        create_offer(challenge, world.collect, collect_cvm=world.collect_cvm)[0].to_json()
        for _ in range(2)
    ]
    statuses: list[int] = []
    barrier = threading.Barrier(2)

    def send(body: bytes) -> None:
        barrier.wait()
        statuses.append(requests.post(a.url + "/v1/offer", data=body, timeout=20).status_code)

    threads = [threading.Thread(target=send, args=(b,)) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(statuses) == [200, 409]


# --- the service's own limits -------------------------------------------------------


def test_service_limits(world: World) -> None:
    a = world.holders["a"]
    health = requests.get(a.url + "/healthz", timeout=5).json()
    assert health == {"status": "ok", "holder_key_id": key_id(a.key)}
    big = b"{" + b" " * (300 * 1024) + b"}"
    assert requests.post(a.url + "/v1/offer", data=big, timeout=5).status_code == 413

    def chunks() -> Iterator[bytes]:
        for _ in range(40):
            yield b" " * 8192

    assert requests.post(a.url + "/v1/offer", data=chunks(), timeout=5).status_code == 413
    assert requests.post(a.url + "/v1/offer", data=b"{nope", timeout=5).status_code == 400
    offer, _ = create_offer(os.urandom(32), world.collect, collect_cvm=world.collect_cvm)
    unknown = requests.post(a.url + "/v1/offer", data=offer.to_json(), timeout=5)
    assert unknown.status_code == 409 and "unknown challenge" in unknown.json()["message"]
    client = HolderClient(a.url)
    offer, _ = create_offer(client.challenge(), world.collect, collect_cvm=world.collect_cvm)
    assert requests.post(a.url + "/v1/offer", data=offer.to_json(), timeout=20).status_code == 200
    replay = requests.post(a.url + "/v1/offer", data=offer.to_json(), timeout=5)
    assert replay.status_code == 409 and "already used" in replay.json()["message"]


def test_rate_limit(world: World) -> None:
    limited = world.holders["limited"]
    codes = [requests.post(limited.url + "/v1/challenge", timeout=5).status_code for _ in range(6)]
    assert codes[:3] == [200, 200, 200] and codes[3:] == [429, 429, 429]


def test_sigterm_drains_the_request_in_flight(world: World) -> None:
    holder = _start(world, "drain", [4_096])
    _wait_healthy(holder)
    host, port = holder.url.removeprefix("http://").split(":")
    body = b'{"not": "an offer"}'
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(
            b"POST /v1/offer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body[:5]
        )
        time.sleep(0.3)
        holder.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert holder.proc.poll() is None  # still draining
        conn.sendall(body[5:])
        reply = conn.recv(4096)
    assert reply.startswith(b"HTTP/1.1 400")
    assert holder.proc.wait(timeout=15) in (0, 143)
    events = [
        json.loads(x).get("event") for x in holder.log.read_text().splitlines() if x.startswith("{")
    ]
    assert events[0] == "start" and events[-1] == "stopped"


# --- the GPU path ---------------------------------------------------------------------


class _FakeDeviceArray:
    """A device array stand-in that records when it is zeroed and read back."""

    def __init__(self, data: np.ndarray[Any, Any], name: str, events: list[str]) -> None:
        self.data = data
        self.name = name
        self.events = events
        self.nbytes = data.nbytes

    def fill(self, value: int) -> None:
        self.events.append(f"scrub {self.name}")
        self.data.fill(value)

    def astype(self, dtype: Any) -> _FakeDeviceArray:
        self.events.append(f"read back {self.name} on the device")
        return _FakeDeviceArray(self.data.astype(np.uint8), self.name, [])

    def sum(self) -> Any:
        return np.uint64(np.count_nonzero(self.data))


class _FakeGpuBackend:
    name = "gpu"

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def stage_sealed(self, dataset: Any, dataset_key: bytes, *, threads: Any, progress: Any) -> Any:
        from gpucc.staging.cpu import stage_cpu

        name = dataset.path.stem
        self.events.append(f"stage {name}")
        return _FakeDeviceArray(stage_cpu(dataset, dataset_key), name, self.events)

    def scrub(self, buf: Any) -> None:
        buf.fill(0)


def test_fake_device_ordering(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Per holder: attest, stage, train, then zero and read back every buffer on the device,
    and only then the next holder."""
    import gpucc.staging.api as api

    events: list[str] = []
    monkeypatch.setattr(api, "_gpu_backend", lambda gpus=None: _FakeGpuBackend(events))
    plan = parse_plan(
        {
            "version": 1,
            "device": "gpu",
            "holders": [
                {
                    "id": n,
                    "url": world.holders[n].url,
                    "public_key": "sha256:" + key_id(world.holders[n].key),
                    "datasets": [
                        {"name": d, "path": str(p), "header_digest": h.hex()}
                        for d, p, h, _ in world.holders[n].datasets
                    ],
                }
                for n in ("a", "b")
            ],
        }
    )

    def collect(nonce: bytes) -> CollectedEvidence:
        events.append("attest")
        return world.collect(nonce)

    def step(buffers: Any, state: Any, holder: str) -> None:
        assert all(np.count_nonzero(b.data) for b in buffers.values())
        events.append(f"train {holder}")

    result = run_plan(plan, collect=collect, collect_cvm=world.collect_cvm, training_step=step)
    assert events == [
        "attest", "stage a-0", "stage a-1", "train a",
        "scrub a-0", "read back a-0 on the device", "scrub a-1", "read back a-1 on the device",
        "attest", "stage b-0", "train b", "scrub b-0", "read back b-0 on the device",
    ]  # fmt: skip
    assert [r.device for v in result.visits for r in v.receipts] == ["gpu"] * 3


@pytest.mark.gpu
def test_gpu_scrub_reads_back_zero_on_the_device(world: World) -> None:
    pytest.importorskip("cupy")
    from gpucc.staging import gpu

    reason = gpu.unavailable_reason(0)
    if reason is not None:
        pytest.skip(reason)
    staged = []
    plan = parse_plan(
        {
            "version": 1,
            "device": "gpu",
            "holders": [
                {
                    "id": "a",
                    "url": world.holders["a"].url,
                    "public_key": "sha256:" + key_id(world.holders["a"].key),
                    "datasets": [
                        {"name": d, "path": str(p), "header_digest": h.hex()}
                        for d, p, h, _ in world.holders["a"].datasets
                    ],
                }
            ],
        }
    )
    plain = {n: p for n, _, _, p in world.holders["a"].datasets}

    def step(buffers: Any, state: Any, holder: str) -> None:
        for name, buf in buffers.items():
            assert bytes(buf.get()) == plain[name]

    result = run_plan(
        plan,
        collect=world.collect,
        collect_cvm=world.collect_cvm,
        training_step=step,
        on_staged=lambda h, n, b: staged.append(b),
    )
    assert [r.device for r in result.visits[0].receipts] == ["gpu", "gpu"]
    assert all(int((b != 0).sum().item()) == 0 for b in staged)


# --- TLS and the command line's one-line errors -----------------------------------------


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "tls.pem", tmp / "tls.key"
    cert_path.write_bytes(cert.public_bytes(Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    key_path.chmod(0o600)
    return cert_path, key_path


def test_holder_over_tls(world: World, tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    holder = _start(world, "tls", [12_345], "--tls-cert", str(cert), "--tls-key", str(key))
    holder.url = holder.url.replace("http://", "https://")
    world.holders["tls"] = holder
    deadline = time.monotonic() + 30
    while True:
        try:
            requests.get(holder.url + "/healthz", timeout=1, verify=str(cert))
            break
        except requests.RequestException:
            assert holder.proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    doc: dict[str, Any] = {
        "version": 1,
        "holders": [
            {
                "id": "tls",
                "url": holder.url,
                "public_key": "sha256:" + key_id(holder.key),
                "tls_ca": str(cert),
                "datasets": [
                    {"name": d, "path": str(p), "header_digest": h.hex()}
                    for d, p, h, _ in holder.datasets
                ],
            }
        ],
    }
    result = run_plan(parse_plan(doc), collect=world.collect, collect_cvm=world.collect_cvm)
    assert result.visits[0].bytes_staged == 12_345
    del doc["holders"][0]["tls_ca"]  # the system's CAs do not know this certificate
    err = _expect_nothing_staged(
        world, parse_plan(doc), HolderConnectionError, "TLS certificate not accepted: "
    )
    assert "SSLError" not in str(err) and "(" not in str(err).split("accepted: ")[1], err


def test_cli_errors_are_one_line(world: World, tmp_path: Path) -> None:
    b = world.holders["b"]
    plan = {
        "version": 1,
        "holders": [
            {
                "id": "gone",
                "url": f"http://127.0.0.1:{free_port()}",
                "public_key": "sha256:" + key_id(b.key),
                "datasets": [
                    {"name": d, "path": str(p), "header_digest": h.hex()}
                    for d, p, h, _ in b.datasets
                ],
            }
        ],
    }
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(json.dumps(plan))
    run = subprocess.run(
        [sys.executable, "-m", "gpucc.cli.travel", "run", str(plan_file), "--simulate", str(tmp_path / "sim")],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert run.returncode == 3, run.stderr
    assert "connection failed" in run.stderr and "Traceback" not in run.stderr
    lines = [x for x in run.stderr.splitlines() if not x.startswith("gpucc: SIMULATED")]
    assert len(lines) == 1
    data, kek, key = b.datasets[0][1].parent, tmp_path / "k", tmp_path / "hk"
    kek.write_bytes(b"")
    key.write_bytes(b"")
    serve_public = subprocess.run(
        [sys.executable, "-m", "gpucc.cli.holder", "serve", "--datasets", str(data),
         "--data-key", str(kek), "--holder-key", str(key), "--listen", "0.0.0.0:8443"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert serve_public.returncode == 2 and "--tls-cert" in serve_public.stderr


def test_slow_request_body_is_cut_off(world: World) -> None:
    host, port = world.holders["refuser"].url.removeprefix("http://").split(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(b"POST /v1/offer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        reply = conn.recv(4096)
    assert reply.startswith(b"HTTP/1.1 408") and time.monotonic() - started < 5


def test_holder_that_trickles_its_reply_is_cut_off(world: World) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    stop = threading.Event()

    def trickle() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.recv(4096)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
            with conn:
                while not stop.is_set():
                    try:
                        conn.sendall(b" ")
                    except OSError:
                        break
                    time.sleep(0.2)

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        started = time.monotonic()
        plan = _plan(world, ["a"], url={"a": url}, timeout=1.0)
        _expect_nothing_staged(world, plan, HolderUnreachableError, "did not answer within")
        assert time.monotonic() - started < 3.5
    finally:
        stop.set()
        thread.join()
        listener.close()


# --- the confidential VM: keys go only to an attested CVM holding an attested GPU ----------


def test_a_gpu_only_journey_gets_no_keys(world: World) -> None:
    staged = Staged()
    with pytest.raises(HolderRefusedError, match="GPU-only"):
        run_plan(_plan(world, ["a"]), collect=world.collect, on_staged=staged)
    assert staged.seen == []


def test_relayed_cvm_evidence_gets_no_keys(world: World) -> None:
    """A genuine quote of the same simulated platform, made for another session."""
    other = hashlib.sha512(b"another session").digest()
    staged = Staged()
    with pytest.raises(HolderRefusedError, match="does not commit"):
        run_plan(
            _plan(world, ["a"]),
            collect=world.collect,
            collect_cvm=lambda report_data: world.collect_cvm(other),
            on_staged=staged,
        )
    assert staged.seen == []


def test_a_holder_that_names_the_gpu_only_relaxation_releases_to_gpu_evidence(
    world: World,
) -> None:
    holder = world.holders["relaxed"]
    staged = Staged()
    result = run_plan(_plan(world, ["relaxed"]), collect=world.collect, on_staged=staged)
    assert [v.holder_id for v in result.visits] == ["relaxed"] and staged.all_zero()
    assert "cvm.allow_gpu_only" in holder.log.read_text()
    # The same holder still checks CVM evidence when it is offered.
    with pytest.raises(HolderRefusedError, match="does not commit"):
        run_plan(
            _plan(world, ["relaxed"]),
            collect=world.collect,
            collect_cvm=lambda report_data: world.collect_cvm(bytes(64)),
        )


# --- the plan names a holder's image policy: this CVM is checked before the journey -------


def _verifier_for(world: World) -> Any:
    return lambda policy: PlatformVerifier(Settings(policy=policy, simulation=world.roots))


def _offers_seen(holder: Holder) -> int:
    return holder.log.read_text().count('"path": "/v1/challenge"')


def test_a_plan_naming_the_holders_image_policy_travels(world: World, tmp_path: Path) -> None:
    holder = world.holders["imaged"]
    image = _image_policy(tmp_path / "image.yaml")
    staged = Staged()
    result = run_plan(
        _plan(world, ["imaged", "b"], cvm_policy={"imaged": str(image)}),
        collect=world.collect,
        collect_cvm=world.collect_cvm,
        on_staged=staged,
        cvm_verifier=_verifier_for(world),
    )
    assert [v.holder_id for v in result.visits] == ["imaged", "b"] and staged.all_zero()
    assert result.cvm_policies == {"imaged": hashlib.sha256(image.read_bytes()).hexdigest()}
    # the check came first; then the holder, enforcing the same file, was visited and released
    assert _offers_seen(holder) >= 1


def _refused_before_any_visit(world: World, plan: Plan, error: type[Exception], match: str) -> None:
    before = {n: _offers_seen(h) for n, h in world.holders.items()}
    staged = Staged()
    with pytest.raises(error, match=match) as caught:
        run_plan(
            plan,
            collect=world.collect,
            collect_cvm=world.collect_cvm,
            on_staged=staged,
            cvm_verifier=_verifier_for(world),
        )
    assert "\n" not in str(caught.value)
    assert staged.seen == []
    assert {n: _offers_seen(h) for n, h in world.holders.items()} == before


def test_a_cvm_running_another_image_never_leaves(world: World, tmp_path: Path) -> None:
    """The plan names b's image policy for another kernel: the journey stops before a
    (which would have released) is even asked for a challenge, and no log is written."""
    other = _image_policy(tmp_path / "other.yaml", kernel="ab" * 48)
    log = tmp_path / "log.jsonl"
    plan = _plan(world, ["a", "b"], cvm_policy={"b": str(other)}, log=log)
    _refused_before_any_visit(
        world, plan, CvmPolicyMismatchError, "b's image policy.*boot-application"
    )
    assert not log.exists()
    moved = _image_policy(tmp_path / "mrtd.yaml", mrtd=b"\x22" * 48)
    plan = _plan(world, ["a"], cvm_policy={"a": str(moved)})
    _refused_before_any_visit(world, plan, CvmPolicyMismatchError, "a's image policy.*mrtd")


def test_an_image_policy_that_pins_nothing_is_refused_as_the_holder_would(
    world: World, tmp_path: Path
) -> None:
    bare = tmp_path / "bare.yaml"
    bare.write_text("version: 1\nocsp:\n  require: false\n")
    plan = _plan(world, ["a"], cvm_policy={"a": str(bare)})
    _refused_before_any_visit(world, plan, CvmPolicyMismatchError, "pinned")


def test_bad_image_policy_files_stop_the_journey_before_it_starts(
    world: World, tmp_path: Path
) -> None:
    missing = str(tmp_path / "missing.yaml")
    _refused_before_any_visit(
        world, _plan(world, ["a"], cvm_policy={"a": missing}), FileAccessError, "missing.yaml"
    )
    cases = {
        "truncated.yaml": _image_policy(tmp_path / "t.yaml").read_text()[:200],
        "malformed.yaml": "version: 1\ncvm: [",
        "unknown.yaml": "version: 1\ncvm:\n  measurments: {}\n",
        "oversized.yaml": "version: 1\n" + "#" * (64 * 1024),
        "nul.yaml": "version: 1\x00\n",
    }
    for name, text in cases.items():
        path = tmp_path / name
        path.write_text(text)
        plan = _plan(world, ["a"], cvm_policy={"a": str(path)})
        _refused_before_any_visit(world, plan, MalformedPolicyError, "policy")


def test_an_image_policy_needs_cvm_evidence_to_check(world: World, tmp_path: Path) -> None:
    image = str(_image_policy(tmp_path / "image.yaml"))
    plan = _plan(world, ["a"], cvm_policy={"a": image})
    with pytest.raises(UsageError, match="no CVM evidence"):
        run_plan(plan, collect=world.collect, cvm_verifier=_verifier_for(world))
    with pytest.raises(UsageError, match="no CVM evidence"):
        run_plan(plan, collect=world.collect, collect_cvm=world.collect_cvm)


def test_cli_refuses_a_plan_whose_image_policy_this_cvm_does_not_meet(
    world: World, tmp_path: Path
) -> None:
    other = _image_policy(tmp_path / "other.yaml", kernel="cd" * 48)
    h = world.holders["a"]
    holder: dict[str, Any] = {
        "id": "a",
        "url": h.url,
        "public_key": "sha256:" + key_id(h.key),
        "cvm_policy": other.name,  # relative to the plan
        "datasets": [
            {"name": d, "path": str(p), "header_digest": x.hex()} for d, p, x, _ in h.datasets
        ],
    }
    plan = {"version": 1, "holders": [holder]}
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(json.dumps(plan))

    def travel() -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "gpucc.cli.travel", "run", str(plan_file)]
        try:
            return subprocess.run(
                [*cmd, "--simulate", str(world.roots)],
                capture_output=True,
                text=True,
                check=False,
                timeout=120,
            )
        finally:
            world.write_roots()  # the CLI made its own simulated GPU; restore ours

    run = travel()
    assert run.returncode == 1, run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("gpucc: error")]
    assert len(errors) == 1 and "a's image policy" in errors[0], run.stderr
    assert "Traceback" not in run.stderr
    # the same plan naming the simulated image itself passes the check and travels
    holder["cvm_policy"] = str(_image_policy(tmp_path / "image.yaml"))
    plan_file.write_text(json.dumps(plan))
    run = travel()
    assert run.returncode == 0, run.stderr
    assert "this CVM satisfied a's image policy" in run.stderr
    assert "visited 1 holder(s)" in run.stdout


def test_an_image_check_that_cannot_be_decided_stops_the_journey(
    world: World, tmp_path: Path
) -> None:
    """This CVM's quote without its collateral: the log matches, the signature's verdict is
    undecided, and so is the check (exit 3's family), before any holder is contacted."""
    image = str(_image_policy(tmp_path / "image.yaml"))
    plan = _plan(world, ["a"], cvm_policy={"a": image})

    def without_collateral(report_data: bytes) -> CollectedCvmEvidence:
        found = world.collect_cvm(report_data)
        return CollectedCvmEvidence(found.evidence, None, found.event_log)

    before = _offers_seen(world.holders["a"])
    with pytest.raises(CvmPolicyUndecidedError, match="cannot decide whether this CVM"):
        run_plan(
            plan,
            collect=world.collect,
            collect_cvm=without_collateral,
            cvm_verifier=_verifier_for(world),
        )
    assert _offers_seen(world.holders["a"]) == before
