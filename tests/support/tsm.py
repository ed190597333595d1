"""A stand-in for Linux's configfs-tsm report directory, so tests need no TDX or SNP guest.

configfs fills a new directory with attributes and lets ``rmdir`` take them away with it, which
a plain directory does not; the fake replaces the library's two hooks for that
(``tsm._make_entry`` and ``tsm._remove_entry``). Everything else is the library's own file I/O
against a temporary directory: ``provider``, ``generation``, ``privlevel_floor``, ``inblob``,
``privlevel`` and ``auxblob`` are plain files, and ``outblob`` is a FIFO whose other end a
thread holds, as the kernel would: when the library opens it, the thread reads what was
written to ``inblob`` and ``privlevel``, advances ``generation`` by one per attribute written
(plus what another writer is set to add) and writes evidence made from them.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpucc.gpuattest.cvm import tsm

MakeOutblob = Callable[[bytes, int | None], bytes]


@dataclass
class Entry:
    """What the fake saw of one entry: its name and what was written before it was removed."""

    name: str
    inblob: bytes | None = None
    privlevel: bytes | None = None
    served: bool = False
    removed: bool = False


class FakeTsm:
    """One fake report root; see the module docstring.

    Args:
        root: the directory to use as the report root (made if missing).
        make_outblob: the evidence for ``(inblob, privlevel)`` as written.
        provider: what ``provider`` reads.
        auxblob: the ``auxblob`` attribute's content; None: the entry has none.
        privlevels: the entry has ``privlevel`` and ``privlevel_floor`` (SNP does, TDX not).
        floor: ``privlevel_floor``.
        generation: ``generation`` when an entry is made.
        races: writes another writer makes to the n-th entry between its write and read.
        omit: attributes left out of new entries.
        outblob_dir: make ``outblob`` a directory, so reading it fails in the kernel.
        modes: permission bits for attributes (which root ignores).
        deny: ``mkdir`` fails with EACCES.
        rmdir_fails: ``rmdir`` fails with EBUSY (the entry is cleaned up by :meth:`close`).
    """

    def __init__(
        self,
        root: Path,
        make_outblob: MakeOutblob,
        *,
        provider: str = "sev_guest",
        auxblob: bytes | None = None,
        privlevels: bool = True,
        floor: int = 0,
        generation: int = 7,
        races: Sequence[int] = (),
        omit: Sequence[str] = (),
        outblob_dir: bool = False,
        modes: dict[str, int] | None = None,
        deny: bool = False,
        rmdir_fails: bool = False,
    ) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.make_outblob = make_outblob
        self.provider = provider
        self.auxblob = auxblob
        self.privlevels = privlevels
        self.floor = floor
        self.generation = generation
        self.races = list(races)
        self.omit = set(omit)
        self.outblob_dir = outblob_dir
        self.modes = modes or {}
        self.deny = deny
        self.rmdir_fails = rmdir_fails
        self.entries: list[Entry] = []
        self.errors: list[BaseException] = []
        self._threads: dict[str, tuple[threading.Thread, threading.Event]] = {}

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeTsm:
        """Route the library's entry creation and removal here."""
        monkeypatch.setattr(tsm, "_make_entry", self.mkdir)
        monkeypatch.setattr(tsm, "_remove_entry", self.rmdir)
        return self

    # --- the kernel's side ----------------------------------------------------------

    def mkdir(self, path: Path) -> None:
        if self.deny:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        os.mkdir(path)
        index = len(self.entries)
        self.entries.append(Entry(path.name))
        files = {"provider": f"{self.provider}\n", "generation": f"{self.generation}\n"}
        files |= {"inblob": ""}
        if self.privlevels:
            files |= {"privlevel": "", "privlevel_floor": f"{self.floor}\n"}
        for name, text in files.items():
            if name not in self.omit:
                (path / name).write_text(text)
        if self.auxblob is not None and "auxblob" not in self.omit:
            (path / "auxblob").write_bytes(self.auxblob)
        for name, mode in self.modes.items():
            (path / name).chmod(mode)
        if "outblob" in self.omit:
            return
        if self.outblob_dir:
            (path / "outblob").mkdir()
            return
        os.mkfifo(path / "outblob")
        race = self.races[index] if index < len(self.races) else 0
        stop = threading.Event()
        thread = threading.Thread(target=self._serve, args=(path, index, race, stop), daemon=True)
        self._threads[path.name] = (thread, stop)
        thread.start()

    def _serve(self, path: Path, index: int, race: int, stop: threading.Event) -> None:
        try:
            fd = os.open(path / "outblob", os.O_WRONLY)  # waits for the reader, as a read would
        except OSError as exc:
            self.errors.append(exc)
            return
        try:
            if stop.is_set():
                return
            inblob = (path / "inblob").read_bytes() if (path / "inblob").exists() else b""
            level = (path / "privlevel").read_bytes() if self.privlevels else b""
            writes = int(bool(inblob)) + int(bool(level)) + race
            (path / "generation").write_text(f"{self.generation + writes}\n")
            self.entries[index].served = True
            data = memoryview(self.make_outblob(inblob, int(level) if level else None))
            while data:
                data = data[os.write(fd, data) :]
        except BrokenPipeError:
            pass  # the reader stopped reading (an oversized outblob)
        except Exception as exc:  # noqa: BLE001 - reported by assert_clean
            self.errors.append(exc)
        finally:
            os.close(fd)

    def _stop(self, path: Path) -> None:
        found = self._threads.pop(path.name, None)
        if found is None:
            return
        thread, stop = found
        stop.set()
        while thread.is_alive():  # a thread still waiting for a reader: be that reader
            fd = os.open(path / "outblob", os.O_RDONLY | os.O_NONBLOCK)
            thread.join(0.05)
            os.close(fd)

    def rmdir(self, path: Path) -> None:
        if self.rmdir_fails:
            raise OSError(errno.EBUSY, "Device or resource busy", str(path))
        self._stop(path)
        entry = next(e for e in self.entries if e.name == path.name)
        if (path / "inblob").is_file():
            entry.inblob = (path / "inblob").read_bytes()
        if (path / "privlevel").is_file():
            entry.privlevel = (path / "privlevel").read_bytes()
        for child in path.iterdir():
            if child.is_dir():
                child.rmdir()
            else:
                child.unlink()
        os.rmdir(path)
        entry.removed = True

    # --- for tests ------------------------------------------------------------------

    def assert_clean(self) -> None:
        """Every entry was removed, no serving thread is left and none failed."""
        assert [e.name for e in self.entries if not e.removed] == []
        assert list(self.root.iterdir()) == []
        assert not self._threads
        assert self.errors == []

    def close(self) -> None:
        """Stop what is left (after a test that failed, or a removal that was made to fail)."""
        self.rmdir_fails = False
        for path in list(self.root.iterdir()):
            if path.name in self._threads or any(e.name == path.name for e in self.entries):
                self.rmdir(path)
