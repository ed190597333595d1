"""One hostile corpus for every document gpucc reads: each case is refused as malformed
input (exit 4, one line, no traceback) by every command that reads that document, and by
the library readers of documents no command reads from a file."""

from __future__ import annotations

import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gpucc.core.errors import GpuccError, MalformedInputError
from gpucc.gpuattest.jwks import RemoteServiceError, parse_jwks
from gpucc.gpuattest.jws import parse_detached
from gpucc.keyrelease.protocol import Answer, Offer
from gpucc.staging.format import write_key_file
from gpucc.staging.model.manifest import Manifest
from gpucc.travel.log import verify_log_lines
from gpucc.travel.receipt import Receipt
from gpucc.travel.signing import Envelope, generate_signing_key, public_pem
from tests.support.cli import run_cli

pytestmark = pytest.mark.slow

_LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
)

#: name -> document bytes; every case must be refused wherever a document is read
CORPUS: dict[str, bytes] = {
    "deep nesting": b"[" * 50_000 + b"]" * 50_000,
    "deep mapping": b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    "duplicate keys": b'{"version": 1, "version": 1}',
    "duplicate keys (YAML)": b"version: 1\nversion: 1\n",
    "version: true": b"version: true\n",
    "version: 1.0": b"version: 1.0\n",
    "python tag": b"!!python/object/apply:os.system ['true']\n",
    "binary tag": b"version: !!binary aGk=\n",
    "billion laughs": _LAUGHS.encode(),
    "non-UTF-8": b'{"version": "\xff\xfe"}',
    "NaN": b'{"version": NaN}',
    "Infinity": b"version: .inf\n",
    "huge integer": b'{"version": 1' + b"0" * 100_000 + b"}",
    # characters: each one is otherwise an acceptable document (JSON is YAML)
    "NUL": b'{"version": 1\x00}',
    "NUL in a string": b'{"version": "1\x00"}',
    "control character": b'{"version": "1\x1b[2J"}',
    "backspace (YAML)": b"version: 1\x08\n",
    "invalid UTF-8 (overlong)": b'{"version": "\xc0\xaf"}',
    "invalid UTF-8 (surrogate)": b'{"version": "\xed\xa0\x80"}',
    "invalid UTF-8 (truncated)": b'{"version": 1}\xe2\x82',
    "byte-order mark": b'\xef\xbb\xbf{"version": 1}',
    "byte-order mark (YAML)": b"\xef\xbb\xbfversion: 1\n",
}

OVERSIZED = 65 * 1024 * 1024  # beyond every reader's cap


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("hostile")
    out: dict[str, Path] = {}
    for i, data in enumerate(CORPUS.values()):
        path = tmp / f"case{i}"
        path.write_bytes(data)
        out[str(i)] = path
    big = tmp / "oversized"
    with big.open("wb") as fh:
        fh.write(b"{")
        fh.truncate(OVERSIZED)
    out["oversized"] = big
    pub = tmp / "pub.pem"
    pub.write_bytes(public_pem(generate_signing_key()))
    out["pub"] = pub
    model = tmp / "model"
    model.mkdir()
    (model / "w.bin").write_bytes(b"weights")
    out["model"] = model
    key = tmp / "data.key"
    write_key_file(key)
    out["key"] = key
    out["tmp"] = tmp
    return out


#: document type -> the command line that reads it (DOC is replaced by the hostile file)
COMMANDS: dict[str, Callable[[dict[str, Path], Path], list[str]]] = {
    "travel plan": lambda f, doc: ["travel", "run", str(doc)],
    "policy": lambda f, doc: [
        "attest",
        "--sample",
        "--at",
        "2024-01-01T00:00:00Z",
        "--policy",
        str(doc),
    ],
    "travel log": lambda f, doc: [
        "travel",
        "verify-log",
        str(doc),
        "--orchestrator-pub",
        str(f["pub"]),
    ],
    "holder receipt": lambda f, doc: [
        "travel",
        "verify-log",
        str(f["pub"]),
        "--orchestrator-pub",
        str(f["pub"]),
        "--receipt",
        str(doc),
    ],
    "model manifest": lambda f, doc: ["model", "verify", str(f["model"]), "--manifest", str(doc)],
    "collateral bundle": lambda f, doc: ["collateral", "show", str(doc)],
    "evidence": lambda f, doc: ["attest", "--evidence", str(doc), "--offline"],
    "session offer": lambda f, doc: [
        "session",
        "answer",
        str(doc),
        "--challenge",
        "00" * 32,
        "--dataset",
        str(f["key"]),
        "--data-key",
        str(f["key"]),
        "-o",
        str(f["tmp"] / "never-written"),
    ],
    "session answer": lambda f, doc: ["session", "accept", str(doc), "--host-key", str(f["key"])],
    "attestation token": lambda f, doc: [
        "token",
        "verify",
        str(doc),
        "--signer-pub",
        str(f["pub"]),
        "--no-nonce",
    ],
}


#: the YAML documents and the log get the whole corpus through the CLI; the other JSON
#: documents the cases below (their reader is the same function, which the library test
#: gives the whole corpus for each of them)
WHOLE = {"travel plan", "policy", "travel log"}
JSON_CASES = {
    "deep nesting",
    "duplicate keys",
    "non-UTF-8",
    "NaN",
    "huge integer",
    "NUL",
    "control character",
    "byte-order mark",
}


def test_every_command_refuses_the_corpus_as_malformed(files: dict[str, Path]) -> None:
    cases = [(case, str(i)) for i, case in enumerate(CORPUS)] + [("oversized", "oversized")]
    jobs = [
        (doc_type, case, build(files, files[key]))
        for doc_type, build in COMMANDS.items()
        for case, key in cases
        if doc_type in WHOLE or case in JSON_CASES or case == "oversized"
    ]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda job: run_cli(*job[2], timeout=180), jobs))
    failures = []
    for (doc_type, case, _), result in zip(jobs, results, strict=True):
        lines = result.stderr.strip().splitlines()
        if result.returncode != 4 or len(lines) != 1:
            failures.append(f"{doc_type} / {case}: exit {result.returncode}: {lines[-3:]}")
    assert not (files["tmp"] / "never-written").exists()
    assert not failures, "\n".join(failures)


LIBRARY: dict[str, tuple[Callable[[bytes], object], type[GpuccError]]] = {
    "answer envelope": (Envelope.from_json, MalformedInputError),
    "holder receipt": (Receipt.from_json, MalformedInputError),
    "model manifest": (Manifest.parse, MalformedInputError),
    "session offer": (Offer.from_json, MalformedInputError),
    "session answer": (Answer.from_json, MalformedInputError),
    "attestation token": (parse_detached, MalformedInputError),
    "travel log": (
        lambda d: verify_log_lines([d], generate_signing_key().public_key()),
        MalformedInputError,
    ),
    # a key set comes from a remote service: a bad one is the service's failure (exit 3)
    "key set": (parse_jwks, RemoteServiceError),
}


@pytest.mark.parametrize("doc_type", sorted(LIBRARY))
@pytest.mark.parametrize("case", sorted(CORPUS))
def test_library_readers_refuse_the_corpus(doc_type: str, case: str) -> None:
    read, error = LIBRARY[doc_type]
    with pytest.raises(error):
        read(CORPUS[case])


def test_the_corpus_is_what_it_says() -> None:
    # the deep cases nest past the interpreter's recursion limit, the laughs expand
    assert CORPUS["deep nesting"].count(b"[") > 10 * sys.getrecursionlimit()
    assert CORPUS["billion laughs"].count(b"*") == 72
