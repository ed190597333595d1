"""File helpers shared by the libraries and the CLI: the one place files are opened.

Inputs: :func:`open_regular` opens without blocking (``O_NONBLOCK``) and refuses anything
that is not a regular file before a byte is read, so a FIFO, a device, a directory or a
socket gets a one-line error instead of a hang; :func:`read_capped` reads through it
without trusting the file's size. :func:`open_secret` adds the rules for secrets: no
symbolic link (``O_NOFOLLOW``), owned by the current user, no group or other access.

Outputs: :func:`exclusive_output` (streaming) and :func:`write_atomic` (bytes) write to a
temporary name created with ``O_EXCL`` beside the target and publish it only once it is
complete and flushed, by an exclusive hard link (never replacing a file unless ``force``);
of two concurrent writers exactly one succeeds. :func:`refuse_inputs_as_output` keeps a
command from replacing a file it reads, compared by device and inode.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from .errors import FileAccessError, GpuccError

__all__ = [
    "OutputExistsError",
    "SpecialFileError",
    "exclusive_output",
    "fsync_dir",
    "open_regular",
    "open_secret",
    "read_capped",
    "read_regular",
    "refuse_existing",
    "refuse_inputs_as_output",
    "write_all",
    "write_atomic",
]

PathLike = os.PathLike[str] | str


class SpecialFileError(FileAccessError):
    """A FIFO, device, directory, socket or symbolic link was given where a file belongs."""


class OutputExistsError(FileAccessError):
    """The output exists and replacing it was not asked for, or it is one of the inputs.

    Attributes:
        replaceable: whether asking to replace it (``force``) would have been allowed.
    """

    def __init__(self, message: str, *, replaceable: bool = True) -> None:
        super().__init__(message)
        self.replaceable = replaceable


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a regular file"


def _describe_open_error(path: Path, what: str, exc: OSError, nofollow: bool) -> FileAccessError:
    if nofollow and exc.errno == errno.ELOOP:
        return SpecialFileError(
            f"{what} {path} is a symbolic link; refusing to follow it (give the file itself)"
        )
    if exc.errno == errno.ENXIO:  # opening a socket
        return SpecialFileError(f"{what} {path} is a socket, not a regular file")
    if exc.errno == errno.ENOENT:
        return FileAccessError(f"{what} {path} does not exist")
    return FileAccessError(f"cannot open {what} {path}: {exc.strerror or exc}")


def open_regular(path: PathLike, *, what: str = "file", nofollow: bool = False) -> int:
    """Open ``path`` read-only and return the descriptor once it is known to be a regular file.

    The open itself cannot block (``O_NONBLOCK``: a FIFO without a writer opens at once),
    ``fstat`` on the open descriptor decides (no race with a rename), and blocking reads
    are restored for the caller. ``nofollow`` refuses a symbolic link as the last component.

    Raises:
        SpecialFileError: a FIFO, device, directory, socket (or, with ``nofollow``, a link).
        FileAccessError: missing, or cannot be opened.
    """
    path = Path(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_NOFOLLOW if nofollow else 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise _describe_open_error(path, what, exc, nofollow) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SpecialFileError(f"{what} {path} is {_kind(st.st_mode)}, not a regular file")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except OSError as exc:
        os.close(fd)
        raise FileAccessError(f"cannot open {what} {path}: {exc.strerror or exc}") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_secret(
    path: PathLike,
    *,
    what: str = "key file",
    exposed: Callable[[str], GpuccError] = FileAccessError,
) -> int:
    """Open a secret file: regular, not a symbolic link, owned by us, no group/other access.

    ``exposed(message)`` builds the error for a file that is readable or replaceable by
    someone else (wrong owner or mode); each message says how to fix it.

    Raises:
        SpecialFileError: a symbolic link, FIFO, device, directory or socket.
        FileAccessError: missing or unreadable.
        GpuccError: from ``exposed``: wrong owner, or group/other permission bits.
    """
    path = Path(path)
    fd = open_regular(path, what=what, nofollow=True)
    try:
        st = os.fstat(fd)
        euid = os.geteuid()
        if st.st_uid != euid:
            raise exposed(
                f"{what} {path} is owned by uid {st.st_uid}, not by you (uid {euid}): its "
                f"owner knows or can replace the secret; use a file you created, or as root "
                f"run: chown {euid} {path}"
            )
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077:
            raise exposed(
                f"{what} {path} is accessible by group or others (mode {mode:04o}); "
                f"run: chmod 600 {path}"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_fd(fd: int, path: Path, what: str, limit: int) -> bytes:
    try:
        with os.fdopen(fd, "rb", closefd=True) as fh:
            return fh.read(limit + 1)
    except OSError as exc:
        raise FileAccessError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


def read_capped(path: PathLike, limit: int, *, what: str = "file") -> bytes:
    """Read at most ``limit + 1`` bytes of the regular file ``path``.

    Callers refuse a result longer than ``limit``: reading one byte more is how they tell a
    file of exactly ``limit`` bytes from a larger one without trusting its size.

    Raises:
        SpecialFileError: not a regular file (never blocks on a FIFO).
        FileAccessError: the file cannot be opened or read (one line, exit 8).
    """
    return _read_fd(open_regular(path, what=what), Path(path), what, limit)


def read_secret(
    path: PathLike,
    limit: int,
    *,
    what: str = "key file",
    exposed: Callable[[str], GpuccError] = FileAccessError,
) -> bytes:
    """Read at most ``limit + 1`` bytes of a secret file checked by :func:`open_secret`.

    Raises:
        SpecialFileError, FileAccessError: as :func:`open_secret`, or unreadable.
        GpuccError: from ``exposed``: wrong owner, or group/other permission bits.
    """
    return _read_fd(open_secret(path, what=what, exposed=exposed), Path(path), what, limit)


def read_regular(path: PathLike, limit: int, *, what: str = "file") -> bytes:
    """:func:`read_capped`, refusing a file longer than ``limit`` with a one-line error.

    Raises:
        FileAccessError: not a regular file, unreadable, or larger than ``limit``.
    """
    data = read_capped(path, limit, what=what)
    if len(data) > limit:
        raise FileAccessError(f"{what} {path} is larger than {limit} bytes")
    return data


def refuse_inputs_as_output(output: PathLike, inputs: Iterable[PathLike | None]) -> None:
    """Refuse an output that is one of the inputs (same device and inode, whatever the name).

    Raises:
        OutputExistsError: ``output`` names (or links to) a file this command reads.
    """
    try:
        out = os.stat(output)
    except OSError:
        return
    for item in inputs:
        if item is None:
            continue
        try:
            st = os.stat(item)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (out.st_dev, out.st_ino):
            raise OutputExistsError(
                f"the output {output} is the input {item}: refusing to replace a file this "
                "command reads, even when asked to replace the output; choose another output",
                replaceable=False,
            )


def _exists_error(path: Path) -> OutputExistsError:
    return OutputExistsError(f"{path} already exists; not replacing it")


def refuse_existing(path: PathLike, *, force: bool = False) -> None:
    """Fail early when ``path`` exists and replacing it was not asked for.

    The exclusive publication in :func:`exclusive_output` is what guarantees it; this only
    saves the work of a run whose output could not be published.

    Raises:
        OutputExistsError: ``path`` exists (a dangling symbolic link counts) and not ``force``.
    """
    if not force and os.path.lexists(path):
        raise _exists_error(Path(path))


def fsync_dir(directory: Path) -> None:
    """Flush a directory's entries (a rename or a new file in it) to disk; best effort."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def _publish(tmp: Path, path: Path, force: bool) -> None:
    """Give the complete temporary file its name: exclusive unless ``force``."""
    if force:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)
        return
    except FileExistsError:
        raise _exists_error(path) from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK):
            raise
    # No hard links on this filesystem: claim the name exclusively, then rename onto it.
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    except FileExistsError:
        raise _exists_error(path) from None
    os.replace(tmp, path)


@contextlib.contextmanager
def exclusive_output(
    path: PathLike, *, mode: int = 0o644, force: bool = False, what: str = "output"
) -> Iterator[int]:
    """Yield a descriptor to write ``path``'s new content into; publish it on success.

    The temporary file ``.NAME.tmp-RANDOM`` is created beside ``path`` with ``O_EXCL``,
    ``O_NOFOLLOW`` and ``mode`` (never looser). When the block ends normally the file is
    fsynced and published: by an exclusive hard link, so an existing ``path`` is never
    replaced (the loser of two concurrent writers gets :class:`OutputExistsError`), or
    with ``force`` by an atomic rename. On any exception, a signal included, the temporary
    file is removed and nothing appears under ``path``.

    Raises:
        OutputExistsError: ``path`` exists and ``force`` is not set.
        FileAccessError: the directory is not writable, or the disk is full.
    """
    path = Path(path)
    refuse_existing(path, force=force)
    directory = path.parent if str(path.parent) else Path(".")
    tmp = directory / f".{path.name}.tmp-{os.urandom(6).hex()}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, mode)
    except OSError as exc:
        raise FileAccessError(f"cannot create {what} {path}: {exc.strerror or exc}") from None
    try:
        try:
            os.fchmod(fd, mode)  # the umask could only have removed bits; be exact
        except OSError as exc:
            raise FileAccessError(f"cannot write {what} {path}: {exc.strerror or exc}") from None
        yield fd
        try:
            os.fsync(fd)
            os.close(fd)
            fd = -1
            _publish(tmp, path, force)
        except OSError as exc:
            raise FileAccessError(f"cannot write {what} {path}: {exc.strerror or exc}") from None
    finally:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    fsync_dir(directory)


def write_all(fd: int, data: bytes | memoryview, offset: int | None = None) -> None:
    """Write every byte of ``data`` (at ``offset``, or at the current position)."""
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        if offset is None:
            done += os.write(fd, view[done:])
        else:
            done += os.pwrite(fd, view[done:], offset + done)


def write_atomic(
    path: PathLike, data: bytes, *, mode: int = 0o644, force: bool = False, what: str = "output"
) -> None:
    """Write ``data`` to ``path`` so that readers see no file (or the old one) or the whole new one.

    See :func:`exclusive_output`: an existing ``path`` is replaced only with ``force``.

    Raises:
        OutputExistsError: ``path`` exists and ``force`` is not set.
        FileAccessError: the directory is not writable or the disk is full; no partial
            file is left behind.
    """
    with exclusive_output(path, mode=mode, force=force, what=what) as fd:
        try:
            write_all(fd, data)
        except OSError as exc:
            raise FileAccessError(f"cannot write {what} {path}: {exc.strerror or exc}") from None
