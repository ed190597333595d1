"""The sealing loop is written once: a whole file and every shard of a set go through
``staging.seal.seal_chunks``."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from gpucc.staging import seal, shards
from tests.support.paths import ROOT


def _callers(path: Path, name: str) -> set[str]:
    """The top-level functions of ``path`` that call ``name``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for top in tree.body:
        if not isinstance(top, ast.FunctionDef):
            continue
        for node in ast.walk(top):
            if isinstance(node, ast.Call):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if called == name:
                    found.add(top.name)
    return found


def test_chunks_are_sealed_into_files_by_one_loop() -> None:
    staging = ROOT / "staging"
    assert _callers(staging / "shards.py", "run_chunks") == set()
    assert _callers(staging / "shards.py", "encrypt_into") == set()
    # seal_bytes seals into memory; every file is sealed by seal_chunks
    assert _callers(staging / "seal.py", "encrypt_into") == {"seal_bytes", "seal_chunks"}


def test_a_file_and_each_shard_run_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    loop = seal.seal_chunks

    def counting(*args: Any, **kwargs: Any) -> None:
        calls.append(kwargs.get("start", 0))
        loop(*args, **kwargs)

    monkeypatch.setattr(seal, "seal_chunks", counting, raising=True)
    monkeypatch.setattr(shards, "seal_chunks", counting, raising=True)
    src = tmp_path / "plain.bin"
    src.write_bytes(bytes(range(256)) * 64)  # 16 KiB: four chunks of 4 KiB
    seal.seal_file(src, tmp_path / "whole.gcc", kek=b"k" * 32, chunk_size=4096)
    shards.seal_shards(src, tmp_path, 2, kek=b"k" * 32, chunk_size=4096)
    assert calls == [0, 0, 8192]
