"""Hostile and careless files, run through the real ``gpucc`` process.

Outputs never replace a file without ``--force`` and never a file the command reads;
two writers of one output: exactly one wins; signals leave no temporary file; FIFOs,
symbolic links and other users' key files are refused promptly; deep JSON, odd versions
and non-datasets are malformed input; bundle text is escaped on the terminal; a
challenge is answered once; and an older sealed file under the same key still stages
(gpucc gives no rollback protection, as README states).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509 import ocsp as x509_ocsp

from gpucc.cli.terminal import safe_text
from gpucc.core.errors import FileAccessError, MalformedInputError
from gpucc.core.files import (
    OutputExistsError,
    SpecialFileError,
    exclusive_output,
    open_secret,
    read_capped,
    write_atomic,
)
from gpucc.core.jsonio import load_yaml_untrusted, loads_untrusted
from gpucc.gpuattest.bundle import BUNDLE_FORMAT
from gpucc.gpuattest.ocsp_response import CertId
from gpucc.keyrelease import protocol as release
from tests.support.cli import ENV, GPUCC, run_cli


def _env(work: Path) -> dict[str, str]:
    return {**ENV, "COLUMNS": "200", "GPUCC_STATE_DIR": str(work / "state")}


def run(*args: str | Path, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run gpucc; a hang fails the test (the timeout), a traceback too."""
    return run_cli(*args, cwd=cwd, timeout=timeout, env={"GPUCC_STATE_DIR": str(cwd / "state")})


def _one_error_line(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    lines = [
        line
        for line in result.stderr.strip().splitlines()
        if not line.startswith("gpucc: SIMULATED GPU")  # the --simulate warning
    ]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("gpucc: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if ".tmp-" in p.name)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "d.bin").write_bytes(os.urandom(3 * 4096 + 7))
    return tmp_path


def _seal(work: Path, src: str = "d.bin", out: str = "d.gcc", *extra: str) -> None:
    result = run(
        "seal", src, "-o", out, "--data-key", "k.key", "--chunk-size", "4KiB", *extra, cwd=work
    )
    assert result.returncode == 0, result.stderr


# --- 1. outputs ---------------------------------------------------------------------------


def test_seal_replaces_an_output_only_with_force(work: Path) -> None:
    (work / "x.gcc").write_bytes(b"precious")
    again = run("seal", "d.bin", "-o", "x.gcc", "--data-key", "k.key", cwd=work)
    assert again.returncode == 8
    _one_error_line(again, "x.gcc already exists", "--force")
    assert (work / "x.gcc").read_bytes() == b"precious"
    assert not (work / "k.key").exists()  # refused before a key file was made for nothing
    forced = run("seal", "d.bin", "-o", "x.gcc", "--data-key", "k.key", "--force", cwd=work)
    assert forced.returncode == 0, forced.stderr
    assert (work / "x.gcc").read_bytes()[:8] == b"GPUCCSD\x00"
    assert _leftovers(work) == []


@pytest.mark.parametrize("force", [(), ("--force",)])
def test_seal_never_replaces_its_key_file_or_dataset(work: Path, force: tuple[str, ...]) -> None:
    # The key file does not exist yet: same name.
    fresh = run("seal", "d.bin", "-o", "k.key", "--data-key", "k.key", *force, cwd=work)
    assert fresh.returncode == 2
    _one_error_line(fresh, "k.key")
    assert not (work / "k.key").exists()
    _seal(work)
    key = (work / "k.key").read_bytes()
    # Existing key file: same name, a hard link, a symbolic link, another spelling.
    os.link(work / "k.key", work / "hard.key")
    (work / "soft.key").symlink_to("k.key")
    for name in ("k.key", "hard.key", "soft.key", "./k.key"):
        result = run("seal", "d.bin", "-o", name, "--data-key", "k.key", *force, cwd=work)
        assert result.returncode == 8, (name, result.stderr)  # an existing output
        _one_error_line(result)
        assert (work / "k.key").read_bytes() == key
    data = (work / "d.bin").read_bytes()
    for name in ("d.bin", "./d.bin"):
        result = run("seal", "d.bin", "-o", name, "--data-key", "k.key", *force, cwd=work)
        assert result.returncode == 8
        assert (work / "d.bin").read_bytes() == data
    assert _leftovers(work) == []


def test_session_outputs_never_replace_keys(work: Path) -> None:
    value = run("session", "challenge", cwd=work).stdout.strip()
    same = run(
        "session", "offer", "--challenge", value, "-o", "hk.key", "--host-key", "hk.key",
        "--simulate", "sim", "--force", cwd=work,
    )  # fmt: skip
    assert same.returncode == 2
    _one_error_line(same, "hk.key")
    assert not (work / "hk.key").exists()
    offer = run(
        "session", "offer", "--challenge", value, "-o", "offer.json", "--host-key", "hk.key",
        "--simulate", "sim", cwd=work,
    )  # fmt: skip
    assert offer.returncode == 0, offer.stderr
    _seal(work)
    key = (work / "k.key").read_bytes()
    for force in ((), ("--force",)):
        answer = run(
            "session", "answer", "offer.json", "--challenge", value, "--dataset", "d.gcc",
            "--data-key", "k.key", "-o", "k.key", "--simulate", "sim", *force, cwd=work,
        )  # fmt: skip
        assert answer.returncode == 8  # an existing output, and an input
        assert (work / "k.key").read_bytes() == key
    (work / "answer.json").write_text("keep me")
    exists = run(
        "session", "answer", "offer.json", "--challenge", value, "--dataset", "d.gcc",
        "--data-key", "k.key", "-o", "answer.json", "--simulate", "sim", cwd=work,
    )  # fmt: skip
    assert exists.returncode == 8
    _one_error_line(exists, "already exists", "--force")
    assert (work / "answer.json").read_text() == "keep me"


def test_two_concurrent_seals_of_one_output_exactly_one_wins(work: Path) -> None:
    (work / "big.bin").write_bytes(os.urandom(16 * 1024 * 1024))
    _seal(work)  # creates k.key
    procs = [
        subprocess.Popen(
            [GPUCC, "seal", "big.bin", "-o", "same.gcc", "--data-key", "k.key", "--threads", "1"],
            cwd=work,
            env=_env(work),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = [(p.wait(timeout=120), p.stderr.read() if p.stderr else "") for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 8], results
    loser = next(err for code, err in results if code == 8)
    assert "same.gcc already exists" in loser and "Traceback" not in loser
    staged = run("stage", "same.gcc", "--data-key", "k.key", cwd=work)
    assert staged.returncode == 0, staged.stderr
    assert _leftovers(work) == []


def test_exclusive_output_loser_gets_exists_and_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "out"
    with pytest.raises(OutputExistsError, match="already exists"), exclusive_output(target) as fd:
        os.write(fd, b"first")
        write_atomic(target, b"second")
    assert target.read_bytes() == b"second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    write_atomic(target, b"third", force=True)
    assert target.read_bytes() == b"third"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_signal_during_a_large_seal_removes_the_temporary_file(
    work: Path, signum: signal.Signals
) -> None:
    _seal(work)
    with (work / "big.bin").open("wb") as fh:  # sparse: cheap to make, slow enough to seal
        fh.truncate(1024**3)
    proc = subprocess.Popen(
        [GPUCC, "seal", "big.bin", "-o", "big.gcc", "--data-key", "k.key", "--threads", "1",
         "--chunk-size", "64KiB"],
        cwd=work,
        env=_env(work),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not _leftovers(work) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _leftovers(work), "the seal never started writing"
    time.sleep(0.2)
    proc.send_signal(signum)
    code = proc.wait(timeout=30)
    err = proc.stderr.read() if proc.stderr else ""
    assert code == 128 + signum, err
    said = "gpucc: interrupted" if signum == signal.SIGINT else f"gpucc: terminated ({signum.name})"
    assert said in err and "Traceback" not in err
    assert _leftovers(work) == []
    assert not (work / "big.gcc").exists()


# --- 2. secret files ------------------------------------------------------------------------


def test_key_file_symlink_fifo_and_mode_are_refused(work: Path) -> None:
    _seal(work)
    (work / "link.key").symlink_to("k.key")
    linked = run("stage", "d.gcc", "--data-key", "link.key", cwd=work)
    assert linked.returncode == 8
    _one_error_line(linked, "symbolic link")
    os.mkfifo(work / "fifo.key")
    fifo = run("seal", "d.bin", "-o", "y.gcc", "--data-key", "fifo.key", cwd=work, timeout=20)
    assert fifo.returncode == 8
    _one_error_line(fifo, "FIFO")
    (work / "k.key").chmod(0o640)
    exposed = run("stage", "d.gcc", "--data-key", "k.key", cwd=work)
    assert exposed.returncode == 8  # permissions: file access
    _one_error_line(exposed, "chmod 600")


def test_new_key_files_are_0600_even_under_umask_000(work: Path) -> None:
    old = os.umask(0)
    try:
        _seal(work)
    finally:
        os.umask(old)
    assert stat.S_IMODE((work / "k.key").stat().st_mode) == 0o600


@pytest.mark.skipif(os.geteuid() != 0, reason="making a file owned by another user needs root")
def test_key_file_owned_by_another_user_is_refused(work: Path) -> None:
    _seal(work)
    os.chown(work / "k.key", 65534, 65534)
    result = run("stage", "d.gcc", "--data-key", "k.key", cwd=work)
    assert result.returncode == 8  # permissions: file access
    _one_error_line(result, "owned by uid 65534", "chown")
    again = run("seal", "d.bin", "-o", "z.gcc", "--data-key", "k.key", cwd=work)
    assert again.returncode == 8 and not (work / "z.gcc").exists()


def test_open_secret_in_the_library(tmp_path: Path) -> None:
    path = tmp_path / "s"
    write_atomic(path, b"x", mode=0o600)
    os.close(open_secret(path))
    (tmp_path / "l").symlink_to(path)
    with pytest.raises(SpecialFileError, match="symbolic link"):
        open_secret(tmp_path / "l")
    path.chmod(0o604)
    with pytest.raises(FileAccessError, match="chmod 600"):
        open_secret(path)


# --- 3. special files never hang --------------------------------------------------------------


def test_fifos_everywhere_exit_promptly(work: Path) -> None:
    _session(work)  # a real host key: its own checks come before the answer is read
    os.mkfifo(work / "f")
    cases = [
        ("seal", "f", "-o", "f.gcc", "--data-key", "k.key"),
        ("stage", "f", "--data-key", "k.key"),
        ("stage", "f"),
        ("stage", "d.gcc", "--session", "f", "--host-key", "k.key"),
        ("collateral", "show", "f"),
        ("session", "accept", "f", "--host-key", "host.key"),
        ("attest", "--evidence", "f"),
    ]
    for args in cases:
        started = time.monotonic()
        result = run(*args, cwd=work, timeout=20)
        assert result.returncode == 8, (args, result.stderr)
        assert "FIFO" in result.stderr.strip().splitlines()[-1], (args, result.stderr)
        assert time.monotonic() - started < 20
    assert _leftovers(work) == []


def test_read_capped_refuses_directories_and_devices(tmp_path: Path) -> None:
    with pytest.raises(SpecialFileError, match="directory"):
        read_capped(tmp_path, 10)
    with pytest.raises(SpecialFileError, match="character device"):
        read_capped(Path("/dev/null"), 10)
    os.mkfifo(tmp_path / "p")
    with pytest.raises(SpecialFileError, match="FIFO"):
        read_capped(tmp_path / "p", 10)


# --- 4. JSON ------------------------------------------------------------------------------------


def test_deep_json_is_malformed_input_everywhere(work: Path) -> None:
    _seal(work)
    deep = "[" * 100_000 + "]" * 100_000
    (work / "deep.json").write_text(deep)
    (work / "deep-obj.json").write_text('{"a":' * 5000 + "1" + "}" * 5000)
    value = "00" * 32
    cases = [
        ("attest", "--evidence", "deep.json"),
        ("collateral", "show", "deep.json"),
        ("collateral", "show", "deep-obj.json"),
        ("session", "answer", "deep.json", "--challenge", value, "--dataset", "d.gcc",
         "--data-key", "k.key", "-o", "a.json", "--simulate", "sim"),
    ]  # fmt: skip
    for args in cases:
        result = run(*args, cwd=work)
        assert result.returncode == 4, (args, result.stderr)
        _one_error_line(result, "nests deeper")
    assert not (work / "a.json").exists()


@pytest.mark.parametrize(
    "data",
    [
        b"[" * 100_000,
        b'{"a": 1e99999999}',
        b'{"a": ' + b"9" * 5000 + b"}",
        b'{"a": NaN}',
        b'{"a": "\xff"}',
        b"",
    ],
)
def test_loads_untrusted_turns_every_failure_into_malformed_input(data: bytes) -> None:
    with pytest.raises(MalformedInputError):
        loads_untrusted(data, what="document", error=MalformedInputError)


@pytest.mark.parametrize(
    ("read", "data"),
    [
        (loads_untrusted, b'{"a": "\\ud800"}'),
        (loads_untrusted, b'{"\\udfff": 1}'),
        (loads_untrusted, b'[[{"a": ["x", "\\ud83d"]}]]'),
        (load_yaml_untrusted, b'a: "\\ud800"\n'),
        (load_yaml_untrusted, b'"\\udc00": 1\n'),
        (load_yaml_untrusted, b'a: [b, {c: "\\ud800"}]\n'),
    ],
)
def test_strings_that_are_no_unicode_text_are_malformed_input(
    read: Callable[..., object], data: bytes
) -> None:
    # an escaped lone surrogate parses, then fails wherever the text is encoded
    with pytest.raises(MalformedInputError, match="^the document holds a string that is not"):
        read(data, what="document", error=MalformedInputError)


def test_an_escaped_surrogate_pair_is_one_character_in_json() -> None:
    doc = loads_untrusted(b'{"a": "\\ud83d\\ude00"}', what="d", error=MalformedInputError)
    assert doc == {"a": "\U0001f600"}


def test_loads_untrusted_limits_depth_below_the_recursion_limit() -> None:
    assert loads_untrusted(b"[" * 64 + b"]" * 64, what="d", error=MalformedInputError)
    with pytest.raises(MalformedInputError, match="nests deeper than 64"):
        loads_untrusted(b"[" * 65 + b"]" * 65, what="d", error=MalformedInputError)


def _session(work: Path) -> str:
    value = run("session", "challenge", cwd=work).stdout.strip()
    offer = run(
        "session", "offer", "--challenge", value, "-o", "offer.json", "--host-key", "host.key",
        "--simulate", "sim", cwd=work,
    )  # fmt: skip
    assert offer.returncode == 0, offer.stderr
    _seal(work)
    return value


def _answer(
    work: Path, value: str, out: str, offer: str = "offer.json"
) -> subprocess.CompletedProcess[str]:
    return run(
        "session", "answer", offer, "--challenge", value, "--dataset", "d.gcc",
        "--data-key", "k.key", "-o", out, "--simulate", "sim", cwd=work,
    )  # fmt: skip


@pytest.mark.parametrize("version", [True, 1.0])
def test_session_versions_are_checked_by_type(work: Path, version: object) -> None:
    value = _session(work)
    doc = json.loads((work / "offer.json").read_text())
    doc["version"] = version
    (work / "odd.json").write_text(json.dumps(doc))
    result = _answer(work, value, "a.json", "odd.json")
    assert result.returncode == 4, result.stderr
    _one_error_line(result, "version must be an integer")
    answered = _answer(work, value, "a.json")
    assert answered.returncode == 0, answered.stderr
    doc = json.loads((work / "a.json").read_text())
    doc["version"] = version
    (work / "odd-answer.json").write_text(json.dumps(doc))
    accept = run("session", "accept", "odd-answer.json", "--host-key", "host.key", cwd=work)
    assert accept.returncode == 4, accept.stderr
    staged = run(
        "stage", "d.gcc", "--session", "odd-answer.json", "--host-key", "host.key", cwd=work
    )
    assert staged.returncode == 4, staged.stderr


def test_accept_prints_authenticated_header_digests_not_answer_ids(work: Path) -> None:
    value = _session(work)
    assert _answer(work, value, "a.json").returncode == 0
    doc = json.loads((work / "a.json").read_text())
    forged_id = "ee" * 16
    doc["wraps"][0]["dataset_id"] = forged_id  # not authenticated by anything
    (work / "a.json").write_text(json.dumps(doc))
    accept = run("session", "accept", "a.json", "--host-key", "host.key", cwd=work)
    assert accept.returncode == 0, accept.stderr
    assert forged_id not in accept.stdout
    assert doc["wraps"][0]["header_digest"] in accept.stdout and "header digest" in accept.stdout
    doc["wraps"][0]["header_digest"] = "00" * 32  # what is printed is what unwraps
    (work / "a.json").write_text(json.dumps(doc))
    forged = run("session", "accept", "a.json", "--host-key", "host.key", cwd=work)
    assert forged.returncode == 6, forged.stderr
    assert "00" * 32 not in forged.stdout


# --- 5. terminal escapes --------------------------------------------------------------------------


def _bundle_with_subject(subject: str) -> bytes:
    response = x509_ocsp.OCSPResponseBuilder.build_unsuccessful(
        x509_ocsp.OCSPResponseStatus.UNAUTHORIZED
    ).public_bytes(Encoding.DER)
    cert_id = CertId(
        hash_algorithm="sha1",
        issuer_name_hash=bytes(20),
        issuer_key_hash=bytes(20),
        serial_number=1,
    )
    doc = {
        "format": BUNDLE_FORMAT,
        "version": 1,
        "created": dt.datetime(2026, 1, 1, tzinfo=dt.UTC).isoformat(),
        "rims": {},
        "ocsp": [
            {
                "cert_id": cert_id.key,
                "hash_algorithm": "sha1",
                "issuer_name_hash": "00" * 20,
                "issuer_key_hash": "00" * 20,
                "serial_number": "1",
                "subject": subject,
                "issuer": "x",
                "response": base64.b64encode(response).decode(),
            }
        ],
    }
    return json.dumps(doc).encode()


def test_collateral_show_escapes_terminal_sequences(work: Path) -> None:
    hostile = "GPU\x1b[2J\x1b]0;owned\x07\rOK trusted\nforged line\u202e"
    (work / "b.json").write_bytes(_bundle_with_subject(hostile))
    result = run("collateral", "show", "b.json", cwd=work)
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout
    assert "\r" not in result.stdout and "\u202e" not in result.stdout
    lines = result.stdout.splitlines()
    assert len(lines) == 2  # "created ..." and one OCSP line: no forged line
    assert "GPU\\x1b[2J\\x1b]0;owned\\x07\\rOK trusted\\nforged line\\u202e" in lines[1]


def test_safe_text() -> None:
    assert safe_text("plain text, ünïcode") == "plain text, ünïcode"
    assert safe_text("a\x1b[31mb") == "a\\x1b[31mb"
    assert safe_text("a\nb\rc\td") == "a\\nb\\rc\\td"
    assert safe_text("\x9b1m\u2028") == "\\x9b1m\\u2028"
    assert safe_text("back\\x1b") == "back\\\\x1b"  # escaped input stays distinguishable


# --- 6. not a sealed dataset ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "looks"),
    [
        (b"", "empty"),
        (b"GPUCCSD\x00" + bytes(10), "too short"),
        (b"hello, this is a text file\n" * 20, "text"),
        (bytes(range(256)) * 4, "binary"),
    ],
)
def test_non_datasets_with_a_key_are_malformed(work: Path, content: bytes, looks: str) -> None:
    _seal(work)
    (work / "x.gcc").write_bytes(content)
    result = run("stage", "x.gcc", "--data-key", "k.key", cwd=work)
    assert result.returncode == 4, result.stderr
    _one_error_line(result, "not a sealed dataset", looks)


def test_flipped_magic_with_a_session_is_malformed(work: Path) -> None:
    value = _session(work)
    assert _answer(work, value, "a.json").returncode == 0
    blob = bytearray((work / "d.gcc").read_bytes())
    blob[2] ^= 0x01
    (work / "d.gcc").write_bytes(bytes(blob))
    result = run("stage", "d.gcc", "--session", "a.json", "--host-key", "host.key", cwd=work)
    assert result.returncode == 4, result.stderr
    _one_error_line(result, "magic is damaged")


# --- 7. a file named like an option -------------------------------------------------------------


def test_file_named_dash_v_after_double_dash(work: Path) -> None:
    (work / "-v").write_bytes(b"data named like an option")
    result = run("seal", "-o", "v.gcc", "--data-key", "k.key", "--", "-v", cwd=work)
    assert result.returncode == 0, result.stderr
    staged = run("stage", "v.gcc", "--data-key", "k.key", cwd=work)
    assert staged.returncode == 0, staged.stderr


# --- 8. replay and rollback ---------------------------------------------------------------------


def test_a_challenge_is_answered_once(work: Path) -> None:
    value = _session(work)
    first = _answer(work, value, "a1.json")
    assert first.returncode == 0, first.stderr
    second = _answer(work, value, "a2.json")
    assert second.returncode == 1
    _one_error_line(second, "already answered")
    assert not (work / "a2.json").exists()
    records = list((work / "state" / "answered-challenges").iterdir())
    # one record for the challenge, named by a labelled hash of it (never the challenge), and
    # one for the simulated GPU's report over it (a replayed device report is refused too)
    label = b"gpucc/session/v1/answered-challenge"
    name = hashlib.sha256(label + bytes.fromhex(value)).hexdigest() + ".answered"
    assert name in {r.name for r in records} and len(records) == 2, records
    assert all(stat.S_IMODE(r.stat().st_mode) == 0o600 for r in records)
    assert not any(value in r.name for r in records)


def test_no_rollback_protection_under_one_key(work: Path) -> None:
    """README: an older sealed file under the same key still stages (exit 0)."""
    (work / "v1.bin").write_bytes(b"version one" * 100)
    (work / "v2.bin").write_bytes(b"version two" * 100)
    _seal(work, "v1.bin", "data.gcc")
    shutil.copy(work / "data.gcc", work / "old.gcc")
    _seal(work, "v2.bin", "data.gcc", "--force")
    shutil.copy(work / "old.gcc", work / "data.gcc")  # an attacker puts the old one back
    staged = run("stage", "data.gcc", "--data-key", "k.key", cwd=work)
    assert staged.returncode == 0, staged.stderr


def test_replay_stores_in_the_library(tmp_path: Path) -> None:
    challenge = os.urandom(32)
    memory = release.MemoryReplayStore()
    memory.claim(challenge)
    with pytest.raises(release.ChallengeReplayError, match="already answered"):
        memory.claim(challenge)
    memory.claim(os.urandom(32))
    expiring = release.MemoryReplayStore(ttl=dt.timedelta(seconds=0))
    expiring.claim(challenge)
    expiring.claim(challenge)  # expired at once: pruned, so it is claimed again

    store = release.FileReplayStore(tmp_path / "replay")
    store.claim(challenge)
    with pytest.raises(release.ChallengeReplayError):
        release.FileReplayStore(tmp_path / "replay").claim(challenge)  # another process
    assert stat.S_IMODE((tmp_path / "replay").stat().st_mode) == 0o700
    short = release.FileReplayStore(tmp_path / "replay", ttl=dt.timedelta(seconds=-1))
    short.claim(os.urandom(32))
    short.claim(os.urandom(32))  # prunes the record above, keeps the 30-day one
    assert len(list((tmp_path / "replay").iterdir())) == 2
    (tmp_path / "replay").chmod(0o777)
    with pytest.raises(FileAccessError, match="chmod 700"):
        store.claim(os.urandom(32))


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_replay_records_expire_on_the_given_clock(tmp_path: Path, kind: str) -> None:
    now = [1_000_000.0]
    ttl = dt.timedelta(seconds=10)

    def store() -> release.ReplayStore:
        if kind == "memory":
            return memory
        return release.FileReplayStore(tmp_path / "replay", ttl=ttl, clock=lambda: now[0])

    memory = release.MemoryReplayStore(ttl=ttl, clock=lambda: now[0])
    challenge = os.urandom(32)
    store().claim(challenge)
    now[0] += 9.5
    with pytest.raises(release.ChallengeReplayError):
        store().claim(challenge)  # still inside its ten seconds
    now[0] += 1.0
    store().claim(challenge)  # expired: answered again, and recorded anew
    with pytest.raises(release.ChallengeReplayError):
        store().claim(challenge)


def test_data_holder_answers_each_challenge_once() -> None:
    from gpucc.gpuattest.simulate import SimulatedGpu
    from tests.unit.keyrelease.test_protocol import NOW, _attester, _collector

    gpu = SimulatedGpu.create(now=NOW)
    challenge = release.new_challenge()
    offer, _ = release.create_offer(challenge, _collector(gpu))
    holder = release.DataHolder(_attester(gpu), allow_gpu_only=True)
    holder.accept(offer, challenge)
    with pytest.raises(release.ChallengeReplayError):
        holder.accept(offer, challenge)
    other = release.new_challenge()
    offer2, _ = release.create_offer(other, _collector(gpu))
    holder.accept(offer2, other)


def test_policy_and_rim_files_never_hang(tmp_path: Path) -> None:
    from gpucc.core.errors import MalformedPolicyError
    from gpucc.gpuattest.policy import load_policy

    os.mkfifo(tmp_path / "p")
    with pytest.raises(SpecialFileError, match="FIFO"):
        load_policy(tmp_path / "p")
    (tmp_path / "deep.yaml").write_text("[" * 5000 + "]" * 5000)
    with pytest.raises(MalformedPolicyError):
        load_policy(tmp_path / "deep.yaml")
    from gpucc.gpuattest.collateral import FileRimSource

    with pytest.raises(SpecialFileError, match="FIFO"):
        FileRimSource(driver=tmp_path / "p").get_rim("NV_RIM_DRIVER_X")
