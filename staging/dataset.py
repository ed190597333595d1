"""Opening a sealed dataset: its header, header tag and wrap record, checked against the file."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from gpucc.gpuattest.files import open_regular

from .chunks import ChunkCipher
from .errors import (
    DatasetKeyMismatchError,
    KeyUnwrapError,
    MalformedDatasetError,
    StagingIOError,
)
from .format import (
    HEADER_SIZE,
    MAGIC,
    PREFIX_SIZE,
    Header,
    StrPath,
    WrapKind,
    WrapRecord,
    key_id,
    parse_wrap_section,
    unwrap_key,
)

__all__ = [
    "SealedDataset",
    "describe_unsealed",
    "io_error",
    "is_sealed",
    "open_sealed",
    "read_exact",
]


def io_error(action: str, path: StrPath, exc: OSError) -> StagingIOError:
    """A one-line typed error for an ``OSError`` (message without a traceback's details)."""
    return StagingIOError(f"cannot {action} {path}: {exc.strerror or exc}")


def read_exact(fd: int, buf: memoryview, offset: int) -> None:
    """Fill ``buf`` from ``fd`` at ``offset`` (into private memory: never a shared mapping).

    Raises:
        MalformedDatasetError: the file ended early (it shrank after it was checked).
        OSError: the read failed.
    """
    done = 0
    total = len(buf)
    while done < total:
        n = os.preadv(fd, [buf[done:]], offset + done)
        if n == 0:
            raise MalformedDatasetError("the file ended early (was it truncated while in use?)")
        done += n


def is_sealed(path: StrPath) -> bool:
    """Whether ``path`` starts with the sealed-dataset magic.

    Raises:
        FileAccessError: the file is missing, not a regular file (never blocks on a
            FIFO), or cannot be read.
    """
    fd = open_regular(path, what="dataset")
    try:
        with os.fdopen(fd, "rb") as fh:
            return fh.read(len(MAGIC)) == MAGIC
    except OSError as exc:
        raise io_error("read", path, exc) from None


def _printable(data: bytes) -> bool:
    text = sum(1 for b in data if 32 <= b < 127 or b in (9, 10, 13))
    return text >= 0.95 * len(data)


def describe_unsealed(head: bytes, size: int) -> str:
    """What a file that is not a sealed dataset looks like, from its first bytes."""
    if size == 0:
        return "it is empty"
    if head[: len(MAGIC)] == MAGIC:
        return f"it has the sealed-dataset magic but is too short ({size} bytes): truncated"
    if size < len(MAGIC) and MAGIC.startswith(head):
        return f"it is too short ({size} bytes): a truncated sealed dataset"
    differ = sum(1 for x, y in zip(head[: len(MAGIC)], MAGIC, strict=False) if x != y)
    if len(head) >= len(MAGIC) and differ <= 2:
        return f"its magic is damaged ({differ} of its first {len(MAGIC)} bytes differ)"
    sample = head[:512]
    if _printable(sample):
        return "it looks like text (wrong magic)"
    return "it looks like binary data without the sealed-dataset magic (random bytes?)"


@dataclass(frozen=True)
class SealedDataset:
    """A sealed dataset whose framing was validated against its file.

    Nothing here is authenticated yet: the header tag and chunks are checked once a key is
    known (:meth:`unwrap`, :meth:`check_key`, then staging).

    Attributes:
        path: the file.
        header: the parsed fixed header.
        header_tag: its 16-byte tag.
        wrap: the embedded wrap record, if the file has one.
        prefix: the raw bytes before chunk 0 (header, tag, wrap section), so staging can
            confirm it reads the same file that was opened.
    """

    path: Path
    header: Header
    header_tag: bytes
    wrap: WrapRecord | None
    prefix: bytes

    @property
    def dataset_id(self) -> bytes:
        """The 16-byte dataset id."""
        return self.header.dataset_id

    @property
    def header_digest(self) -> bytes:
        """SHA-256 of the fixed header."""
        return self.header.digest

    @property
    def plaintext_length(self) -> int:
        """Plaintext bytes."""
        return self.header.plaintext_length

    def check_key(self, dataset_key: bytes) -> ChunkCipher:
        """A chunk cipher for ``dataset_key`` once the header tag verified under it.

        Raises:
            HeaderAuthenticationError: wrong key or altered header.
        """
        cipher = ChunkCipher(dataset_key, self.header)
        cipher.verify_header(self.header_tag)
        return cipher

    def unwrap(self, kek: bytes, *, verify_header: bool = True) -> bytes:
        """The dataset key, from the embedded key-file wrap record and the key-file key.

        ``verify_header=False`` leaves the header-tag check to the caller, for callers that
        hand the key to staging, which checks it before decrypting anything.

        Raises:
            DatasetKeyMismatchError: no key-file record, or a key of another key id.
            KeyUnwrapError: the key id matches but the record does not unwrap (tampered).
            HeaderAuthenticationError: the key unwrapped but the header tag does not verify.
        """
        record = self.wrap
        if record is None or record.kind is not WrapKind.KEY_FILE:
            raise DatasetKeyMismatchError(f"{self.path} holds no key-file wrap record")
        ours = key_id(kek)
        if record.context != ours:
            # Wrong key, or an altered key id? The key id is authenticated by the wrap: if
            # the record unwraps under our key id, only the key id field was changed.
            try:
                unwrap_key(kek, dataclasses.replace(record, context=ours), self.header_digest)
            except KeyUnwrapError:
                raise DatasetKeyMismatchError(
                    f"{self.path} was sealed for key id {record.context.hex()}, "
                    f"this key file has key id {ours.hex()}"
                ) from None
            raise KeyUnwrapError(f"{self.path}: the wrap record's key id was altered")
        return self.unwrap_record(record, kek, verify_header=verify_header)

    def unwrap_record(self, record: WrapRecord, kek: bytes, *, verify_header: bool = True) -> bytes:
        """The dataset key from any wrap record for this dataset (e.g. a session's).

        Raises:
            KeyUnwrapError: wrong key, another dataset or session, or a tampered record.
            HeaderAuthenticationError: the key unwrapped but the header tag does not verify.
        """
        dataset_key = unwrap_key(kek, record, self.header_digest)
        if verify_header:
            self.check_key(dataset_key)
        return dataset_key


def open_sealed(path: StrPath) -> SealedDataset:
    """Parse and validate a sealed dataset's framing, including its exact size.

    Raises:
        MalformedDatasetError: not a sealed dataset (the message says what the file looks
            like: empty, too short, damaged magic, text, other bytes), a bad field, a bad
            wrap section, or a size that is not exactly the one the header implies.
        FileAccessError: missing, not a regular file (never blocks on a FIFO), unreadable.
    """
    path = Path(path)
    fd = open_regular(path, what="sealed dataset")
    try:
        with os.fdopen(fd, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            head = fh.read(max(PREFIX_SIZE, 512))
            if len(head) < PREFIX_SIZE or head[: len(MAGIC)] != MAGIC:
                raise MalformedDatasetError(
                    f"{path} is not a sealed dataset: {describe_unsealed(head, size)}"
                )
            header = Header.parse(head[:HEADER_SIZE])
            fh.seek(PREFIX_SIZE)
            head = head[:PREFIX_SIZE]
            wrap_bytes = fh.read(header.wrap_length)
    except OSError as exc:
        raise io_error("read", path, exc) from None
    if len(wrap_bytes) != header.wrap_length:
        raise MalformedDatasetError(f"{path} ends inside its wrap section")
    wrap = parse_wrap_section(wrap_bytes)
    if size != header.file_size:
        raise MalformedDatasetError(
            f"{path} is {size} bytes but its header describes {header.file_size} "
            "(truncated, extended, or a dropped chunk)"
        )
    return SealedDataset(
        path=path,
        header=header,
        header_tag=head[64:PREFIX_SIZE],
        wrap=wrap,
        prefix=head + wrap_bytes,
    )
