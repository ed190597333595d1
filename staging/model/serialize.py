"""Walking a model directory into the files and shards model_signing would hash.

The rules follow ``model_signing`` v1.x:

* every regular file under the model root is a resource, except paths under an ignored path
  (``.git``, ``.gitattributes``, ``.github``, ``.gitignore`` by default, plus the caller's);
* a model that is a single file is one resource named ``"."``;
* shards are ``[0, S), [S, 2S), ..., [kS, size)``; an empty file has no shards (but is a
  resource under file serialization);
* symbolic links are refused unless ``allow_symlinks``; with it, a link to a regular file
  inside the model directory is hashed as that file, and anything else is refused (a link
  that leaves the model directory, a link to a directory, a dangling link);
* special files (FIFOs, sockets, devices) are refused.

Each :class:`FileEntry` records the size, modification time and inode seen by the walk, so
the hashers can detect a file that changes while it is read.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .errors import ModelTreeError
from .manifest import GIT_IGNORE_PATHS, Serialization, path_sort_key

__all__ = ["FileEntry", "Item", "model_name", "plan_items", "relative_ignores", "walk_model"]


@dataclass(frozen=True)
class FileEntry:
    """A regular file of the model as the walk saw it."""

    name: str
    path: Path
    size: int
    mtime_ns: int
    dev: int
    ino: int


@dataclass(frozen=True)
class Item:
    """One resource to hash: bytes ``[start, end)`` of ``entry``, named as in the manifest."""

    entry: FileEntry
    start: int
    end: int
    name: str

    @property
    def length(self) -> int:
        return self.end - self.start


def model_name(root: Path) -> str:
    """The subject name model_signing uses: the last component of the model path."""
    name = root.name
    if not name or name == "..":
        name = os.path.basename(os.path.realpath(root))
    return name


def relative_ignores(root: Path, paths: Iterable[Path], *, git: bool = True) -> tuple[str, ...]:
    """Ignore paths relative to the model root (those outside it are dropped, as model_signing
    does); the git paths are included unless ``git`` is false."""
    out = set(GIT_IGNORE_PATHS) if git else set()
    base = os.path.realpath(root)
    for path in paths:
        rel = os.path.relpath(os.path.realpath(path), base)
        if rel == "." or rel == ".." or rel.startswith("../"):
            continue
        out.add(PurePosixPath(*Path(rel).parts).as_posix())
    return tuple(sorted(out))


def model_ignores(root: Path, paths: Iterable[Path | str]) -> tuple[str, ...]:
    """Ignore paths given relative to the model root (as model_signing takes them; an
    absolute path must lie inside the model), as canonical relative names.

    Raises:
        UsageError: a path outside the model, or the model itself.
    """
    from gpucc.core.errors import UsageError

    out = set()
    base = os.path.realpath(root)
    for path in paths:
        candidate = Path(path) if Path(path).is_absolute() else Path(base) / path
        rel = os.path.relpath(os.path.realpath(candidate), base)
        if rel == "." or rel == ".." or rel.startswith("../"):
            what = "is the model itself" if rel == "." else "is outside the model"
            raise UsageError(
                f"--ignore {path}: {what} {root} (ignore paths are relative to the model)"
            )
        out.add(PurePosixPath(*Path(rel).parts).as_posix())
    return tuple(sorted(out))


def _entry(name: str, path: Path, st: os.stat_result) -> FileEntry:
    return FileEntry(name, path, st.st_size, st.st_mtime_ns, st.st_dev, st.st_ino)


def _ignored(rel: PurePosixPath, ignores: tuple[PurePosixPath, ...]) -> bool:
    return any(rel == ign or rel.is_relative_to(ign) for ign in ignores)


def walk_model(root: Path, *, allow_symlinks: bool, ignore_paths: Iterable[str]) -> list[FileEntry]:
    """Every file of the model, in canonical order.

    Raises:
        ModelTreeError: a refused symlink or special file, or a path that cannot be read.
    """
    ignores = tuple(PurePosixPath(p) for p in ignore_paths)
    try:
        st = os.lstat(root)
    except OSError as exc:
        raise ModelTreeError(f"cannot read the model {root}: {exc.strerror}") from None
    real_root = Path(os.path.realpath(root))
    if stat.S_ISLNK(st.st_mode):
        if not allow_symlinks:
            raise ModelTreeError(f"the model path {root} is a symbolic link (see --allow-symlinks)")
        try:
            st = os.stat(root)
        except OSError as exc:
            raise ModelTreeError(
                f"the model path {root} is a broken link: {exc.strerror}"
            ) from None
    if stat.S_ISREG(st.st_mode):
        return [_entry(".", real_root, st)]
    if not stat.S_ISDIR(st.st_mode):
        raise ModelTreeError(f"the model path {root} is neither a file nor a directory")
    entries: list[FileEntry] = []
    _walk(real_root, real_root, PurePosixPath(), allow_symlinks, ignores, entries)
    entries.sort(key=lambda e: path_sort_key(e.name))
    return entries


def _walk(
    real_root: Path,
    directory: Path,
    rel_dir: PurePosixPath,
    allow_symlinks: bool,
    ignores: tuple[PurePosixPath, ...],
    out: list[FileEntry],
) -> None:
    try:
        with os.scandir(directory) as it:
            children = sorted(it, key=lambda e: e.name)
    except OSError as exc:
        raise ModelTreeError(f"cannot list {directory}: {exc.strerror}") from None
    for child in children:
        rel = rel_dir / child.name
        if _ignored(rel, ignores):
            continue
        path = Path(child.path)
        try:
            st = os.lstat(path)
        except OSError as exc:
            raise ModelTreeError(f"cannot read {rel}: {exc.strerror}") from None
        if stat.S_ISLNK(st.st_mode):
            out.append(_symlink_entry(real_root, path, rel, allow_symlinks))
        elif stat.S_ISDIR(st.st_mode):
            _walk(real_root, path, rel, allow_symlinks, ignores, out)
        elif stat.S_ISREG(st.st_mode):
            out.append(_entry(rel.as_posix(), path, st))
        else:
            raise ModelTreeError(f"{rel} is a special file (FIFO, socket or device); refusing it")


def _symlink_entry(real_root: Path, path: Path, rel: PurePosixPath, allow: bool) -> FileEntry:
    if not allow:
        raise ModelTreeError(f"{rel} is a symbolic link (see --allow-symlinks)")
    target = Path(os.path.realpath(path))
    if target != real_root and not target.is_relative_to(real_root):
        raise ModelTreeError(f"{rel} is a symbolic link that leaves the model directory")
    try:
        st = os.stat(target)
    except OSError as exc:
        raise ModelTreeError(f"{rel} is a broken symbolic link: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ModelTreeError(f"{rel} is a symbolic link to something other than a regular file")
    return _entry(rel.as_posix(), target, st)


def plan_items(entries: list[FileEntry], serialization: Serialization) -> list[Item]:
    """The resources to hash, in manifest order."""
    items: list[Item] = []
    size = serialization.shard_size
    for entry in entries:
        if size is None:
            items.append(Item(entry, 0, entry.size, entry.name))
            continue
        for start in range(0, entry.size, size):
            end = min(start + size, entry.size)
            items.append(Item(entry, start, end, f"{entry.name}:{start}:{end}"))
    return items
