"""``gpucc seal``: plaintext in, sealed dataset out (plus helpers shared by ``gpucc stage``)."""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from gpucc.core.errors import UsageError
from gpucc.core.files import refuse_existing

from .options import FormatOption, OutputFormat
from .output import detail, emit, format_bytes, format_rate, note
from .safety_options import ForceOption, check_output, force_hint

__all__ = ["byte_progress", "chunk_summary", "format_rate", "format_size", "parse_size", "seal"]

_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
_SIZE = re.compile(r"^\s*(\d+)\s*([kmg]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str, option: str = "--chunk-size") -> int:
    """``4MiB``, ``512KiB``, ``4M`` or ``4194304`` (binary units).

    Raises:
        UsageError: not a size.
    """
    match = _SIZE.match(text)
    if not match:
        raise UsageError(f"{option} {text!r} is not a size (examples: 1MiB, 4MiB, 65536)")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def check_chunk_size(size: int, text: str) -> None:
    """Refuse a chunk size the format does not allow, as a usage error."""
    from gpucc.staging import valid_chunk_size

    if not valid_chunk_size(size):
        raise UsageError(f"--chunk-size {text}: must be a multiple of 16 between 4KiB and 256MiB")


def format_size(nbytes: int) -> str:
    """A size in decimal units (kB, MB, GB = 10^3, 10^6, 10^9 bytes)."""
    return format_bytes(nbytes)


def chunk_summary(count: int, plaintext: int, chunk_size: int) -> str:
    """``1 chunk (6 bytes; chunk size 4 MiB)`` or ``3 chunks of 4 MiB (10.5 MB)``."""
    if count == 1:
        return f"1 chunk ({format_size(plaintext)}; chunk size {chunk_size_text(chunk_size)})"
    return f"{count} chunks of {chunk_size_text(chunk_size)} ({format_size(plaintext)})"


def chunk_size_text(size: int) -> str:
    """A chunk size as it is written on the command line (``4 MiB``, ``64 KiB``)."""
    if size % (1 << 20) == 0:
        return f"{size >> 20} MiB"
    if size % (1 << 10) == 0:
        return f"{size >> 10} KiB"
    return f"{size} bytes"


@contextmanager
def byte_progress(description: str, total: int) -> Iterator[Callable[[int, int], None]]:
    """A Rich progress bar on stderr in decimal units (MB, MB/s), only when stderr is a terminal.

    Yields the ``progress(done, total)`` callback the staging library calls.
    """
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    from .invocation import current
    from .output import console as make_console

    console = make_console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=False),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not console.is_terminal or current().quiet,
        transient=False,
    ) as progress:
        task = progress.add_task(description, total=max(total, 1))

        def update(done: int, _total: int) -> None:
            progress.update(task, completed=done)

        yield update
        progress.update(task, completed=max(total, 1))


def load_or_create_key_file(path: Path) -> bytes:
    """The key-file key, creating the file (mode 0600) with a notice when it is absent.

    Raises:
        KeyFileError: unreadable, exposed (group/world access) or malformed.
    """
    from gpucc.staging import read_key_file, write_key_file

    if os.path.lexists(path):
        return read_key_file(path)
    key = write_key_file(path)
    note(f"created key file {path} (mode 0600); keep it apart from the sealed data")
    return key


def seal(
    dataset: Annotated[
        Path,
        typer.Argument(
            metavar="DATASET",
            exists=True,
            dir_okay=False,
            readable=True,
            help="Plaintext file to seal.",
        ),
    ],
    output: Annotated[
        Path,
        typer.Option(
            "-o", "--output", help="Sealed dataset to write (with --shards: a directory)."
        ),
    ],
    key_file: Annotated[
        Path | None,
        typer.Option(
            "--data-key",
            envvar=["GPUCC_DATA_KEY", "GPUCC_KEY_FILE"],
            dir_okay=False,
            help="Key file whose key wraps the dataset key; created (mode 0600) if absent.",
        ),
    ] = None,
    chunk_size: Annotated[
        str, typer.Option("--chunk-size", help="Plaintext bytes per chunk, 4KiB to 256MiB.")
    ] = "4MiB",
    threads: Annotated[
        int | None,
        typer.Option("--threads", min=1, help="Worker threads (default: all CPUs)."),
    ] = None,
    shards: Annotated[
        int | None,
        typer.Option(
            "--shards",
            min=1,
            help="Split into N bound shards (-o is then a directory, created if absent): a "
            "missing, reordered or foreign shard is refused when the set is opened.",
        ),
    ] = None,
    force: ForceOption = False,
    fmt: FormatOption = OutputFormat.TEXT,
) -> None:
    """Seal DATASET with AES-256-GCM into a gpucc sealed dataset (docs/FORMAT.md).

    The output appears only once it is complete and flushed (written to a temporary name,
    then linked into place); an existing output is replaced only with --force, and never
    the dataset or the key file. A fresh dataset key is wrapped for the key file's key.
    """
    from gpucc.staging import HostArena, seal_file

    if key_file is None:
        raise UsageError("seal needs --data-key (or GPUCC_DATA_KEY): the key that will open it")
    size = parse_size(chunk_size)
    check_chunk_size(size, chunk_size)
    if shards is not None:
        _seal_shards(dataset, output, key_file, size, shards, threads, force, fmt)
        return
    if output.is_dir():
        raise UsageError(f"-o {output} is a directory (a directory takes --shards N)")
    check_output(output, dataset, key_file)
    with force_hint():  # before a key file is created for nothing
        refuse_existing(output, force=force)
    kek = load_or_create_key_file(key_file)
    check_output(output, dataset, key_file)  # the key file exists now: compare inodes
    total = dataset.stat().st_size
    started = time.perf_counter()
    # The chunk buffers that hold plaintext are lent by this command's arena, closed (every
    # page zeroed) before it reports.
    with HostArena() as arena, force_hint(), byte_progress("sealing", total) as progress:
        result = seal_file(
            dataset,
            output,
            kek=kek,
            chunk_size=size,
            threads=threads,
            progress=progress,
            force=force,
            arena=arena,
        )
    seconds = time.perf_counter() - started
    header = result.header
    if fmt is OutputFormat.JSON:
        from gpucc.staging.format import key_id

        emit(result.to_dict(dataset, output, key_id=key_id(kek), seconds=seconds))
    from gpucc.staging import default_threads
    from gpucc.staging.format import key_id as _key_id

    detail(
        f"{output}: {header.file_size} bytes sealed for key id {_key_id(kek).hex()} "
        f"({key_file}), {threads or default_threads()} thread(s)"
    )
    note(
        f"sealed {format_size(header.plaintext_length)} into {output}: "
        f"{chunk_summary(header.chunk_count, header.plaintext_length, header.chunk_size)}, "
        f"dataset id {header.dataset_id.hex()}, in {seconds:.2f} s "
        f"({format_rate(header.plaintext_length, seconds)})"
    )


def _seal_shards(
    dataset: Path,
    out_dir: Path,
    key_file: Path,
    chunk_size: int,
    shards: int,
    threads: int | None,
    force: bool,
    fmt: OutputFormat,
) -> None:
    """``seal --shards N``: one dataset key, N files bound together by their headers.

    ``out_dir`` is created when it does not exist (and removed again if sealing fails).
    No shard may be the dataset or the key file, whatever ``--force`` says.
    """
    from gpucc.staging import HostArena
    from gpucc.staging.format import key_id
    from gpucc.staging.shards import seal_shards, shard_path

    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"with --shards, -o names a directory ({out_dir} is not one)")
    outputs = [shard_path(out_dir, dataset.stem, i, shards) for i in range(shards)]
    for path in outputs:
        check_output(path, dataset, key_file)
    with force_hint():  # before a directory or a key file is created for nothing
        for path in outputs:
            refuse_existing(path, force=force)
    created = _make_dir(out_dir)
    try:
        kek = load_or_create_key_file(key_file)
        for path in outputs:
            check_output(path, dataset, key_file)  # the key file exists now: compare inodes
        started = time.perf_counter()
        with (
            HostArena() as arena,
            force_hint(),
            byte_progress("sealing", dataset.stat().st_size) as progress,
        ):
            result = seal_shards(
                dataset,
                out_dir,
                shards,
                kek=kek,
                chunk_size=chunk_size,
                threads=threads,
                progress=progress,
                force=force,
                arena=arena,
            )
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                out_dir.rmdir()  # only if still empty: nothing of anyone else's is removed
        raise
    seconds = time.perf_counter() - started
    if fmt is OutputFormat.JSON:
        emit(result.to_dict(dataset, key_id=key_id(kek), seconds=seconds))
    for path, chunks in zip(result.paths, result.chunk_counts, strict=True):
        detail(f"{path}: {chunks} chunk(s), key id {key_id(kek).hex()}")
    note(
        f"sealed {format_size(result.plaintext_length)} into {len(result.paths)} bound shards "
        f"in {out_dir} (set {result.set_id.hex()}) in {seconds:.2f} s"
    )


def _make_dir(path: Path) -> bool:
    """Create the shard directory (and missing parents); whether it was created here.

    Raises:
        FileAccessError: it cannot be created.
    """
    from gpucc.core.errors import FileAccessError

    if path.is_dir():
        return False
    try:
        path.mkdir(parents=True)
    except FileExistsError:
        if path.is_dir():
            return False
        raise UsageError(f"with --shards, -o names a directory ({path} is not one)") from None
    except OSError as exc:
        reason = exc.strerror or exc
        raise FileAccessError(f"cannot create the directory {path}: {reason}") from None
    return True
