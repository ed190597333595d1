"""One naming scheme for keys and simulations (README "Option names"): every old spelling
still works, as a real process, and says its new spelling once on stderr; completion, help
and the docs show only the new names."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from gpucc.cli.aliases import RENAMED, renamed_args
from tests.support.cli import gpucc, run_cli

ROOT = Path(__file__).resolve().parents[2]
PAIRS = [(path, old, new) for path, table in RENAMED.items() for old, new in table.items()]
OLD_ONLY = (
    *("--key-file", "--dataset-keys", "--simulate-roots", "--private-key", "--public-key"),
    *("--signing-certificate", "--certificate-chain"),
)


def _note(old: str, new: str) -> str:
    return f"gpucc: {old} is deprecated; use {new}"


@pytest.mark.parametrize(("path", "old", "new"), PAIRS, ids=[f"{p}:{o}" for p, o, _ in PAIRS])
def test_each_old_spelling_is_read_as_the_new_one(
    path: str, old: str, new: str, tmp_path: Path
) -> None:
    """The old spelling reaches the new option: a missing file is reported under the new
    name (exit 8), never as an unknown option (exit 2), after one note."""
    missing = tmp_path / "sub" / "missing.pem"
    result = run_cli(*path.split(), f"{old}={missing}", old, str(missing), cwd=tmp_path)
    assert result.stderr.count(_note(old, new)) == 1, result.stderr
    assert "No such option" not in result.stderr, result.stderr
    assert f"{new} {missing}" in result.stderr or result.returncode in (1, 2, 8), result.stderr
    if result.returncode == 8:
        assert f"{new} {missing}" in result.stderr, result.stderr


def test_old_spellings_seal_and_stage_the_same_data_and_keep_json_stdout(tmp_path: Path) -> None:
    (tmp_path / "d.bin").write_bytes(b"x" * 5000)
    sealed = run_cli(
        "seal", "d.bin", "-o", "d.gcc", "--key-file", "d.key", "-f", "json", cwd=tmp_path
    )
    assert sealed.returncode == 0, sealed.stderr
    assert json.loads(sealed.stdout)["schema"] == "gpucc.seal/v1"  # one document, no note
    assert _note("--key-file", "--data-key") in sealed.stderr
    new = run_cli("stage", "d.gcc", "--data-key", "d.key", "-f", "json", cwd=tmp_path)
    old = run_cli("stage", "d.gcc", "--key-file=d.key", "-f", "json", cwd=tmp_path)
    assert new.returncode == old.returncode == 0, (new.stderr, old.stderr)
    assert json.loads(old.stdout)["verified"] is json.loads(new.stdout)["verified"] is True
    assert "deprecated" not in new.stderr and _note("--key-file", "--data-key") in old.stderr


def test_old_keygen_and_token_spellings_work(tmp_path: Path) -> None:
    made = run_cli("holder", "keygen", "--key", "h.key", "--pub", "h.pub", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "h.key").stat().st_mode & 0o077 == 0 and (tmp_path / "h.pub").is_file()
    assert (
        _note("--key", "--holder-key") in made.stderr
        and _note("--pub", "--holder-pub") in made.stderr
    )
    module = [sys.executable, "-m", "gpucc.cli.travel"]  # a group run alone knows its names too
    import subprocess

    alone = subprocess.run(
        [*module, "keygen", "--key", "o.key", "--pub", "o.pub"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert alone.returncode == 0, alone.stderr
    assert _note("--key", "--orchestrator-key") in alone.stderr


def test_a_value_that_looks_like_an_old_spelling_is_left_alone() -> None:
    args, used = renamed_args(
        "stage", ["--resource", "--key-file", "--key-file", "k"], ["--resource"]
    )
    assert args == ["--resource", "--key-file", "--data-key", "k"] and len(used) == 1
    args, used = renamed_args("stage", ["x", "--", "--key-file"], [])
    assert args == ["x", "--", "--key-file"] and used == []
    # --key is a private key in one command and a public key in another
    assert renamed_args("token verify", ["--key", "p"], [])[0] == ["--signer-pub", "p"]
    assert renamed_args("holder serve", ["--key=p"], [])[0] == ["--holder-key=p"]


@pytest.mark.parametrize("path", sorted(RENAMED))
def test_completion_and_help_show_the_new_names_only(path: str) -> None:
    env = {"_GPUCC_COMPLETE": "complete_bash", "COMP_WORDS": f"gpucc {path} --"}
    env["COMP_CWORD"] = str(len(path.split()) + 1)
    completion = gpucc(env=env)
    assert completion.returncode == 0, completion.stderr
    offered = set(completion.stdout.split())
    helped = gpucc(*path.split(), "--help", env={"COLUMNS": "200"}).stdout
    for old, new in RENAMED[path].items():
        assert new in offered, (path, new, sorted(offered))
        assert old not in offered, (path, old)
        assert re.search(rf"(?<![\w-]){re.escape(old)}(?![\w-])", helped) is None, (path, old)


def _docs() -> dict[str, str]:
    docs = {p.name: p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md"))}
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    # the "Option names" section lists the old spellings on purpose
    docs["README.md"] = re.sub(r"## Option names\n.*?(?=\n## )", "", readme, flags=re.S)
    docs["cli/examples.py"] = (ROOT / "cli" / "examples.py").read_text(encoding="utf-8")
    return docs


def test_docs_use_the_new_spellings() -> None:
    found = [
        f"{name}: {word}"
        for name, text in _docs().items()
        for word in OLD_ONLY
        if re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text)
    ]
    found += [
        f"{name}: {m.group(0)!r}"
        for name, text in _docs().items()
        for m in re.finditer(r"gpucc [a-z -]*?(?<![\w-])--(key|pub)(?![\w-])", text)
    ]
    assert not found, found


@pytest.mark.slow
def test_a_holder_configuration_with_the_old_keys_is_read(tmp_path: Path) -> None:
    """A stored configuration keeps working: ``dataset-keys``, ``key`` and ``simulate-roots``
    read as ``data-key``, ``holder-key`` and ``simulate``, one note each; the holder serves."""
    import datetime as dt
    import subprocess
    import time

    import requests

    from gpucc.gpuattest.simulate import SimulatedGpu
    from tests.e2e.test_travel_e2e import World, _holder_files
    from tests.support.netfixtures import free_port

    world = World(
        tmp=tmp_path, gpu=SimulatedGpu.create(now=dt.datetime.now(dt.UTC)), roots=tmp_path / "r"
    )
    world.write_roots()
    _holder_files(tmp_path, "cfg", [1_000])
    port = free_port()
    conf = tmp_path / "holder.yaml"
    conf.write_text(
        "datasets: cfg/data\ndataset-keys: cfg/data.key\nkey: cfg/holder.key\n"
        f"listen: '127.0.0.1:{port}'\nsimulate-roots: r\nstate: memory\n"
    )
    log = tmp_path / "holder.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpucc", "holder", "serve", "--config", str(conf)],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                assert requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1).ok
                break
            except requests.RequestException:
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    text = log.read_text()
    for old, new in (
        ("dataset-keys", "data-key"),
        ("key", "holder-key"),
        ("simulate-roots", "simulate"),
    ):
        assert text.count(f"holder configuration: {old} is deprecated; use {new}") == 1, text
