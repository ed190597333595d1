"""Every exit status the documentation states is the one table's (``cli/exitcodes.py``).

Three kinds of statement are read from README.md and every docs/*.md:

* lists and tables of codes (a paragraph opening with "Exit codes", or "exits per the
  common table:", and the rows of a table under an "Exit codes" heading): each item's words
  must not name a situation the table gives another code (:data:`PHRASES`);
* an error class named next to its status ("`ProtocolError`, exit 1", "is 1
  (`ProtocolError`)"): the class must exist and map to that status;
* every "exit N" / "exits N": N must be a status of the table (or a signal's).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucc.cli.exitcodes import SIGNAL_CODES, TABLE, outcome_for
from gpucc.core.errors import GpuccError
from tests.support.paths import ROOT

DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
CODES = {o.code for o in TABLE} | set(SIGNAL_CODES.values())

#: words that belong to one code only: an item of a list or table of codes that uses
#: them for another code contradicts the table
PHRASES: dict[str, int] = {
    "not trusted": 1,
    "not-trusted": 1,
    "usage": 2,
    "collateral": 3,
    "could not decide": 3,
    "cannot decide": 3,
    "unreachable": 3,
    "malformed": 4,
    "not json": 4,
    "nvml": 5,
    "environment": 5,
    "integrity": 6,
    "unwrap": 6,
    "tamper": 6,
    "wrong key": 7,
    "exposed key file": 8,
    "group/other access": 8,
    "group or others": 8,
    "readable by others": 8,
    "another user's": 8,
    "file access": 8,
    "without `--force`": 8,
    "not a regular file": 8,
    "one of the command's inputs": 8,
    "one the command reads": 8,
}

#: statuses documented that are not gpucc's own, and why
FOREIGN = {("NVATTEST.md", 248): "nvattest's own status for its result code 504"}

_ITEM = re.compile(r"(?:(?<=: )|(?<=, )|(?<=; ))(\d{1,3}) (?=[a-z(`])")
_ROW = re.compile(r"^\|\s*(\d{1,3})\s*\|(.*)$")
_EXIT = re.compile(r"\bexit(?:s| status| code)? (\d{1,3})\b")
_CLASS_THEN_CODE = re.compile(r"`(\w+Error)`[^.;`]{0,80}?\bexits? (\d{1,3})\b")
_CODE_THEN_CLASS = re.compile(r"\b(?:is|are|exits?) (\d{1,3}) \((?:an? )?`(\w+Error)`\)")


def _paragraphs(text: str) -> Iterator[tuple[int, str]]:
    line = 1
    for block in text.split("\n\n"):
        yield line, " ".join(block.split())
        line += block.count("\n") + 2


def listed(text: str) -> Iterator[tuple[int, int, str]]:
    """(line, code, the item's words) for each item of a list or table of codes."""
    for line, para in _paragraphs(text):
        start = max(para.find("Exit codes"), para.find("exits per the common table:"))
        if start < 0:
            continue
        body = para[start:]
        marks = list(_ITEM.finditer(body))
        for mark, after in zip(marks, [*marks[1:], None], strict=False):
            end = after.start() if after is not None else len(body)
            yield line, int(mark.group(1)), body[mark.end() : end]
    heading = ""
    for number, row in enumerate(text.splitlines(), 1):
        if row.startswith("#"):
            heading = row.lower()
        match = _ROW.match(row)
        if match and ("exit code" in heading or "exit status" in heading):
            yield number, int(match.group(1)), match.group(2)


def contradictions(text: str) -> list[str]:
    """The items of lists and tables whose words belong to another code."""
    out = []
    for line, code, words in listed(text):
        for phrase, owner in PHRASES.items():
            if phrase in words.lower() and owner != code:
                out.append(f"line {line}: {code} is said of {phrase!r}, which is {owner}")
    return out


@functools.cache
def _error_classes() -> dict[str, type[GpuccError]]:
    """Every error class of the libraries, by name (their modules imported first)."""
    import gpucc.gpuattest
    import gpucc.staging
    import gpucc.travel

    for package in (gpucc.gpuattest, gpucc.staging, gpucc.travel):
        for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            with contextlib.suppress(ImportError):
                importlib.import_module(module.name)
    found: dict[str, type[GpuccError]] = {}
    stack: list[type[GpuccError]] = [GpuccError]
    while stack:
        cls = stack.pop()
        found[cls.__name__] = cls
        stack.extend(cls.__subclasses__())
    return found


def class_statements(text: str) -> Iterator[tuple[int, str, int]]:
    """(line, error class, code) for each class named next to a status."""
    for line, para in _paragraphs(text):
        for match in _CLASS_THEN_CODE.finditer(para):
            yield line, match.group(1), int(match.group(2))
        for match in _CODE_THEN_CLASS.finditer(para):
            yield line, match.group(2), int(match.group(1))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_lists_and_tables_of_codes_agree_with_the_table(doc: Path) -> None:
    assert not contradictions(doc.read_text(encoding="utf-8"))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_error_classes_are_documented_with_their_code(doc: Path) -> None:
    classes = _error_classes()
    wrong = []
    for line, name, code in class_statements(doc.read_text(encoding="utf-8")):
        cls = classes.get(name)
        if cls is None:
            wrong.append(f"line {line}: {name} is no error class")
        elif outcome_for(cls.__new__(cls)).code != code:
            wrong.append(f"line {line}: {name} is {outcome_for(cls.__new__(cls)).code}, not {code}")
    assert not wrong


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_status_stated_is_in_the_table(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    stated = {int(m.group(1)) for m in _EXIT.finditer(text)}
    stated |= {code for _, code, _ in listed(text)}
    foreign = {code for (name, code) in FOREIGN if name == doc.name}
    assert stated - foreign <= CODES, sorted(stated - foreign - CODES)


def test_the_checks_see_what_they_check() -> None:
    # the statements are found where the docs make them, and a drift is caught
    everything = "\n\n".join(doc.read_text(encoding="utf-8") for doc in DOCS)
    assert len(list(listed(everything))) >= 30
    assert len(list(class_statements(everything))) >= 5
    drifted = "Exit codes: 0 done, 4 malformed file or exposed key file, 8 file access."
    assert contradictions(drifted) == ["line 1: 4 is said of 'exposed key file', which is 8"]
    assert list(class_statements("refused with `ProtocolError`, exit 6.")) == [
        (1, "ProtocolError", 6)
    ]
