"""Opening a sealed dataset: its header, header tag and wrap record, checked against the file."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from .chunks import ChunkCipher
from .errors import (
    DatasetKeyMismatchError,
    KeyUnwrapError,
    MalformedDatasetError,
    StagingIOError,
)
from .format import (
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

__all__ = ["SealedDataset", "io_error", "is_sealed", "open_sealed", "read_exact"]


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
        StagingIOError: the file cannot be read.
    """
    try:
        with open(path, "rb") as fh:
            return fh.read(len(MAGIC)) == MAGIC
    except OSError as exc:
        raise io_error("read", path, exc) from None


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
        MalformedDatasetError: not a sealed dataset, a bad field, a bad wrap section, or a
            size that is not exactly the one the header implies (truncated or extended).
        StagingIOError: the file cannot be read.
    """
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            head = fh.read(PREFIX_SIZE)
            if len(head) < PREFIX_SIZE:
                raise MalformedDatasetError(
                    f"{path} is {size} bytes, too short for a sealed dataset"
                )
            header = Header.parse(head[:64])
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
