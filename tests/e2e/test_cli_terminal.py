"""What reaches a terminal or a pipe, on real processes: untrusted names never arrive as
control characters, and a reader that goes away is exit 141 in every command and format."""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import unicodedata
from pathlib import Path

import pytest

from tests.support.cli import ENV, GPUCC, run_cli

AT = "2024-01-01T00:00:00Z"
#: A name that would clear the screen, retitle the window, overwrite the line, reverse the
#: text that follows and start a C1 control sequence, were it printed raw.
HOSTILE = "x\x1b[2J\x1b]0;owned\x07\r\u202ey\u009b31m\tz"


def raw_controls(text: str) -> list[str]:
    """Control and format characters other than line breaks."""
    return sorted(
        {
            repr(ch)
            for ch in text
            if ch != "\n" and unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Co", "Cn")
        }
    )


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from gpucc.staging import seal_file, write_key_file
    from gpucc.staging.model import digest_model, make_serialization

    work = tmp_path_factory.mktemp("hostile")
    kek = write_key_file(work / "k.key")
    (work / f"{HOSTILE}.bin").write_bytes(os.urandom(5000))
    (work / "data").mkdir()
    seal_file(work / f"{HOSTILE}.bin", work / "data" / f"{HOSTILE}.gcc", kek=kek, chunk_size=4096)
    model = work / "model"
    model.mkdir()
    (model / f"{HOSTILE}.bin").write_bytes(b"a" * 100)
    (work / "m.json").write_bytes(digest_model(model, make_serialization(model)).to_bytes())
    (model / f"{HOSTILE}.bin").write_bytes(b"b" * 100)  # a mismatch
    (model / f"{HOSTILE}.extra").write_bytes(b"c")  # an extra file
    # A staged file checked against a manifest whose only resource has a hostile name.
    single = work / "single"
    single.mkdir()
    (single / f"{HOSTILE}.w").write_bytes(b"w" * 3000)
    (work / "s.json").write_bytes(digest_model(single, make_serialization(single)).to_bytes())
    (work / "w.bin").write_bytes(b"v" * 3000)
    seal_file(work / "w.bin", work / "w.gcc", kek=kek, chunk_size=4096)
    return work


@pytest.mark.slow
def test_hostile_names_never_reach_the_terminal_raw(hostile: Path) -> None:
    runs = [
        ("model", "verify", "model", "--manifest", "m.json"),
        ("model", "verify", "model", "--manifest", "m.json", "-f", "json"),
        ("model", "digest", "model", "-v"),
        ("model", "digest", "model", "-f", "json"),
        ("model", "digest", "single", "-o", f"{HOSTILE}.manifest.json"),
        ("seal", f"{HOSTILE}.bin", "-o", f"{HOSTILE}.gcc", "--data-key", "k.key", "-v"),
        ("stage", f"data/{HOSTILE}.gcc", "--data-key", "k.key", "-v"),
        ("stage", "w.gcc", "--data-key", "k.key", "--manifest", "s.json",
         "--resource", f"{HOSTILE}.w"),
        ("holder", "datasets", "--datasets", "data"),
        ("seal", f"{HOSTILE}.missing", "-o", "o.gcc", "--data-key", "k.key"),
        ("attest", "--evidence", f"{HOSTILE}.json"),
        ("model", "sign", "model", "--signer-key", f"{HOSTILE}.pem", "--signature", "s.sig"),
        ("session", "offer", "--challenge", "00" * 32, "-o", f"{HOSTILE}.offer",
         "--host-key", f"{HOSTILE}.hk", "--simulate", "sim"),
    ]  # fmt: skip

    def one(args: tuple[str, ...]) -> tuple[tuple[str, ...], subprocess.CompletedProcess[str]]:
        return args, run_cli(*args, cwd=hostile, timeout=60)

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(one, runs))
    shown = 0
    for args, result in results:
        text = result.stdout + result.stderr
        assert not raw_controls(text), (args, raw_controls(text), text)
        shown += "\\x1b[2J" in text or "\\u001b[2J" in text  # the name is there, escaped
    assert shown >= len(runs) - 1
    verify = results[0][1]
    assert verify.returncode == 6 and "\\x1b" in verify.stdout
    assert all(line.startswith(("mismatch: ", "extra: ")) for line in verify.stdout.splitlines())
    staged = results[7][1]
    assert staged.returncode == 6, staged.stderr


def test_terminal_console_escapes_what_it_renders() -> None:
    """The one rich console: untrusted text inside tables and styled text comes out escaped."""
    import io

    from rich.table import Table
    from rich.text import Text

    from gpucc.cli.output import console

    buffer = io.StringIO()
    con = console(stderr=True, file=buffer, width=120, force_terminal=False)
    table = Table()
    table.add_column("name")
    table.add_row(Text(HOSTILE.replace("\n", "")))
    con.print(table)
    con.print(Text(f"verdict {HOSTILE}", style="bold"))
    assert not raw_controls(buffer.getvalue())
    assert "\\x1b[2J" in buffer.getvalue()


# --- pipes ---------------------------------------------------------------------------------


def into_closed_pipe(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run gpucc with stdout a pipe whose reader has already gone."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [GPUCC, *map(str, args)],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            env={**ENV, "COLUMNS": "120"},
            check=False,
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize(
    "args",
    [
        ("attest", "--sample", "--offline", "--at", AT),
        ("attest", "--sample", "--offline", "--at", AT, "-f", "json"),
        ("attest", "--sample", "--offline", "--at", AT, "--nonce", "11" * 32, "-f", "json"),
        ("demo", "--size-mib", "0"),
        ("demo", "--size-mib", "0", "-f", "json"),
        ("session", "challenge"),
        ("session", "challenge", "-f", "json"),
        ("model", "digest", "model"),
        ("model", "verify", "model", "--manifest", "m.json"),
        ("holder", "datasets", "--datasets", "data"),
        ("seal", "d.bin", "-o", "x.gcc", "--data-key", "k.key", "-f", "json"),
        ("attest", "--help"),
        ("--version",),
    ],
    ids=lambda a: " ".join(a)[:60],
)
def test_a_closed_stdout_is_141(args: tuple[str, ...], tmp_path: Path) -> None:
    from gpucc.staging import seal_file, write_key_file
    from gpucc.staging.model import digest_model, make_serialization

    kek = write_key_file(tmp_path / "k.key")
    (tmp_path / "d.bin").write_bytes(b"d" * 5000)
    (tmp_path / "data").mkdir()
    seal_file(tmp_path / "d.bin", tmp_path / "data" / "d.gcc", kek=kek, chunk_size=4096)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "a").write_bytes(b"a")
    model = tmp_path / "model"
    (tmp_path / "m.json").write_bytes(digest_model(model, make_serialization(model)).to_bytes())
    result = into_closed_pipe(*args, cwd=tmp_path)
    assert result.returncode == 141, result.stderr
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr


def test_one_large_write_into_a_pipe_that_closes_is_141(tmp_path: Path) -> None:
    """``gpucc model digest BIG | head -c1``: the manifest is far larger than the pipe's
    buffer; the reader takes one byte and goes, and the rest must not vanish silently."""
    model = tmp_path / "big"
    model.mkdir()
    for i in range(1500):
        (model / f"file-{i:05d}.bin").write_bytes(b"%d" % i)
    script = f"{GPUCC} model digest big | head -c1; status=${{PIPESTATUS[0]}}; echo; exit $status"
    result = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env=ENV, check=False,
    )  # fmt: skip
    assert result.stdout.strip() == "{"
    assert result.returncode == 141, result.stderr
    whole = run_cli("model", "digest", "big", cwd=tmp_path)
    assert len(whole.stdout) > 3 * 65536 and json.loads(whole.stdout)["predicate"]["resources"]


def test_a_hostile_token_kid_and_log_fields_are_escaped(tmp_path: Path) -> None:
    """Strings inside a signed result (its ``kid``) are the signer's, not ours: escaped."""
    import datetime as dt

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from gpucc.gpuattest.eat import evidence_digest, sign_result_claims

    key = ec.generate_private_key(ec.SECP384R1())
    now = dt.datetime(2026, 1, 15, 12, 0, tzinfo=dt.UTC)
    nonce = "ab" * 32
    eat = sign_result_claims(
        [{"measres": "success"}], private_key=key, nonce=bytes.fromhex(nonce), now=now,
        overall_result=True, evidence_digests=[evidence_digest(b"r")], kid=HOSTILE,
    )  # fmt: skip
    (tmp_path / "r.eat.json").write_text(eat.to_json())
    (tmp_path / "pub.pem").write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    args = ("token", "verify", "r.eat.json", "--signer-pub", "pub.pem", "--nonce", nonce,
            "--at", "2026-01-15T12:01:00Z", "-vv")  # fmt: skip
    result = run_cli(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert not raw_controls(result.stdout + result.stderr)
    assert "\\x1b[2J" in result.stdout
