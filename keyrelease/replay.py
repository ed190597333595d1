"""Answering each challenge at most once: where a data holder records what it answered.

An offer is single-use: a data holder that answered a challenge refuses a second offer to
it (``keyrelease.protocol.accept_offer`` claims the challenge before it releases anything).
:class:`MemoryReplayStore` serves one long-running process; :class:`FileReplayStore` keeps
the record on disk, so that separate command-line runs share it. Both take the clock as an
argument (``clock``: seconds since the epoch, :func:`time.time` by default).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import os
import stat
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from gpucc.core.errors import FileAccessError, GpuccError
from gpucc.core.files import read_capped, write_all
from gpucc.staging.errors import ProtocolError
from gpucc.staging.format import StrPath

__all__ = [
    "DEFAULT_REPLAY_TTL",
    "ChallengeReplayError",
    "DeviceReportReplayError",
    "FileReplayStore",
    "MemoryReplayStore",
    "ReplayStore",
    "claim_device_reports",
]


class ChallengeReplayError(ProtocolError):
    """This data holder already answered an offer to this challenge (offers are single-use)."""


class DeviceReportReplayError(ProtocolError):
    """This data holder already accepted this device's report over this nonce."""


class ReplayStore(Protocol):
    """Where a data holder records the challenges it answered."""

    def claim(self, challenge: bytes) -> None:
        """Record ``challenge`` as answered; raise :class:`ChallengeReplayError` if it was."""
        ...

    def answered(self, challenge: bytes) -> bool:
        """Whether ``challenge`` is recorded as answered (for messages; :meth:`claim` decides)."""
        ...


#: How long an answered challenge is remembered by default.
DEFAULT_REPLAY_TTL = dt.timedelta(days=30)
_REPLAY_LABEL = b"gpucc/session/v1/answered-challenge"


def _replay_error(challenge: bytes) -> ChallengeReplayError:
    return ChallengeReplayError(
        f"challenge {challenge.hex()[:16]}... was already answered by this data holder; "
        "each challenge is answered at most once: make a fresh challenge and ask the host "
        "for a new offer"
    )


class MemoryReplayStore:
    """Answered challenges kept in memory, each for ``ttl`` (one process, e.g. a service)."""

    def __init__(
        self, *, ttl: dt.timedelta = DEFAULT_REPLAY_TTL, clock: Callable[[], float] = time.time
    ) -> None:
        self.ttl = ttl
        self.clock = clock
        self._seen: dict[bytes, float] = {}
        self._lock = threading.Lock()

    def claim(self, challenge: bytes) -> None:
        """Record ``challenge``; raise :class:`ChallengeReplayError` if it is recorded."""
        now = self.clock()
        digest = hashlib.sha256(_REPLAY_LABEL + challenge).digest()
        with self._lock:
            for key in [k for k, expires in self._seen.items() if expires <= now]:
                del self._seen[key]
            if digest in self._seen:
                raise _replay_error(challenge)
            self._seen[digest] = now + self.ttl.total_seconds()

    def answered(self, challenge: bytes) -> bool:
        """Whether ``challenge`` is recorded and not yet expired."""
        digest = hashlib.sha256(_REPLAY_LABEL + challenge).digest()
        with self._lock:
            expires = self._seen.get(digest)
        return expires is not None and expires > self.clock()


class FileReplayStore:
    """Answered challenges recorded as files in a private directory (for the command line).

    One record per challenge: a file named by a hash of the challenge, created with
    ``O_EXCL`` (of two concurrent answers to one challenge exactly one claims it) and mode
    0600, holding its expiry time. The directory is created with mode 0700 and refused
    when it is a symbolic link, another user's, or writable by group or others. Expired
    records are removed on each claim.
    """

    def __init__(
        self,
        directory: StrPath,
        *,
        ttl: dt.timedelta = DEFAULT_REPLAY_TTL,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = Path(directory)
        self.ttl = ttl
        self.clock = clock

    def _checked_directory(self) -> None:
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = os.lstat(self.directory)
        except OSError as exc:
            raise FileAccessError(
                f"cannot use the replay store {self.directory}: {exc.strerror or exc}"
            ) from None
        if not stat.S_ISDIR(st.st_mode):
            raise FileAccessError(f"replay store {self.directory} is not a directory")
        if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o022:
            raise FileAccessError(
                f"replay store {self.directory} is another user's or writable by others; "
                f"run: chmod 700 {self.directory} (as its owner)"
            )

    def _prune(self, now: float) -> None:
        with os.scandir(self.directory) as entries:
            for entry in entries:
                if not entry.name.endswith(".answered"):
                    continue
                try:
                    text = read_capped(entry.path, 64, what="replay record").decode("ascii")
                    expires = float(text.strip())
                except (GpuccError, ValueError):
                    continue  # unreadable: keep it (fail closed)
                if expires <= now:
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)

    def claim(self, challenge: bytes) -> None:
        """Record ``challenge``; raise :class:`ChallengeReplayError` if it is recorded.

        Raises:
            ChallengeReplayError: already answered (and not yet expired).
            FileAccessError: the store cannot be used.
        """
        now = self.clock()
        self._checked_directory()
        self._prune(now)
        name = hashlib.sha256(_REPLAY_LABEL + challenge).hexdigest() + ".answered"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(self.directory / name, flags, 0o600)
        except FileExistsError:
            raise _replay_error(challenge) from None
        except OSError as exc:
            raise FileAccessError(
                f"cannot record the challenge in {self.directory}: {exc.strerror or exc}"
            ) from None
        try:
            write_all(fd, f"{now + self.ttl.total_seconds():.0f}\n".encode())
            os.fsync(fd)
        except OSError as exc:
            raise FileAccessError(
                f"cannot record the challenge in {self.directory}: {exc.strerror or exc}"
            ) from None
        finally:
            os.close(fd)

    def answered(self, challenge: bytes) -> bool:
        """Whether a record for ``challenge`` exists (expired records are pruned by claims)."""
        name = hashlib.sha256(_REPLAY_LABEL + challenge).hexdigest() + ".answered"
        return os.path.lexists(self.directory / name)


_DEVICE_REPORT_LABEL = b"gpucc/session/v1/accepted-device-report\0"


def claim_device_reports(replay: ReplayStore, devices: Sequence[str], nonce: bytes) -> None:
    """Record each device's report over ``nonce`` as accepted, in the store that records
    answered challenges (so every holder process sharing that state sees it), for its TTL.

    ``devices`` are the identities of the devices whose reports an offer carries (the
    ``ueid`` claim: their leaf certificate's serial), in offer order: a device named twice
    in one offer is a repeated report too.

    Raises:
        DeviceReportReplayError: a device's report over this nonce was accepted before,
            naming the device.
        FileAccessError, StateUnavailableError: the store cannot be used.
    """
    for device in devices:
        key = hashlib.sha256(device.encode() + b"\0" + nonce).digest()
        try:
            replay.claim(_DEVICE_REPORT_LABEL + key)
        except ChallengeReplayError:
            raise DeviceReportReplayError(
                f"the report of device {device} over nonce {nonce.hex()[:16]}... was already "
                "accepted by this data holder (a replayed or repeated device report)"
            ) from None
