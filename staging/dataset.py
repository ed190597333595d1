"""Opening a sealed dataset: its header, header tag and wrap record, checked against the file."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from gpucc.core.files import open_regular

from .chunks import ChunkCipher
from .errors import (
    ChunkAuthenticationError,
    DatasetKeyMismatchError,
    ExtendedDatasetError,
    HeaderAuthenticationError,
    KeyUnwrapError,
    MalformedDatasetError,
    StagingIOError,
)
from .format import (
    FORMAT_VERSION,
    HEADER_SIZE,
    MAGIC,
    PREFIX_SIZE,
    TAG_SIZE,
    Header,
    StrPath,
    WrapKind,
    WrapRecord,
    derive_chunk_key,
    header_tag_aad,
    header_tag_nonce,
    key_id,
    parse_wrap_section,
    unwrap_key,
)

if TYPE_CHECKING:
    from .sources.base import ObjectSource

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
    """A sealed dataset whose header parsed.

    Nothing here is authenticated yet: the header tag and chunks are checked once a key is
    known (:meth:`unwrap`, :meth:`check_key`, then staging). The file's length is compared
    with the one the header describes only once the header is authenticated
    (:meth:`check_key`), so a cut-off file is reported as the chunks it lacks.

    Attributes:
        path: the file.
        header: the parsed fixed header.
        header_tag: its 16-byte tag.
        wrap: the embedded wrap record, if the file has one.
        prefix: the raw bytes before chunk 0 (header, tag, wrap section), so staging can
            confirm it reads the same file that was opened.
        file_length: the file's size when it was opened (-1: unknown, a stream).
        source: where the chunks are read from when it is not the local file ``path``
            (:mod:`staging.sources`: an object store, a URL, standard input).
    """

    path: Path
    header: Header
    header_tag: bytes
    wrap: WrapRecord | None
    prefix: bytes
    file_length: int = -1
    source: ObjectSource | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def name(self) -> str:
        """How messages name the dataset: its path, or its source's name (a URL, ``-``)."""
        return self.source.name if self.source is not None else str(self.path)

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
        """A chunk cipher for ``dataset_key`` once the header tag verified under it and the
        file is as long as the (now authenticated) header says.

        Raises:
            HeaderAuthenticationError: wrong key or altered header.
            ChunkAuthenticationError: the file is shorter: it names the first missing chunk.
            ExtendedDatasetError: bytes follow the final chunk.
        """
        cipher = ChunkCipher(dataset_key, self.header)
        cipher.verify_header(self.header_tag)
        self.check_length()
        return cipher

    def check_length(self) -> None:
        """Compare the file's length with the one the header describes.

        Meaningful once the header is authenticated: then a shorter file has lost chunks
        (or the end of one), which is a data authentication failure, not malformed input.

        Raises:
            ChunkAuthenticationError: the file is shorter; names the first chunk cut off.
            ExtendedDatasetError: the file is longer.
        """
        header, size = self.header, self.file_length
        if size < 0 or size == header.file_size:
            return
        count = header.chunk_count
        if size > header.file_size:
            raise ExtendedDatasetError(
                f"{self.name}: {size - header.file_size} byte(s) follow the final chunk "
                f"(chunk {count - 1}) that the authenticated header describes"
            )
        first = next(
            i
            for i in range(count)
            if header.chunk_offset(i) + header.chunk_length(i) + TAG_SIZE > size
        )
        state = "is missing" if size <= header.chunk_offset(first) else "is cut off"
        after = ""
        if first == count - 2:
            after = f", and chunk {count - 1} is missing"
        elif first < count - 2:
            after = f", and chunks {first + 1} to {count - 1} are missing"
        raise ChunkAuthenticationError(
            first,
            f"{self.name} ends {header.file_size - size} byte(s) short of the length its "
            f"authenticated header describes: chunk {first} {state}{after} "
            f"(chunks 0 to {count - 1}; truncated, or chunks dropped)",
        )

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
        try:
            return self.unwrap_record(record, kek, verify_header=verify_header)
        except KeyUnwrapError:
            # The key id is this key file's: the record or the header digest it is bound to
            # was changed.
            raise KeyUnwrapError(
                f"{self.path}: the sealed header or its wrap record failed authentication "
                "(the wrap record is bound to the header digest; the key id matches this key "
                "file, so one of them was altered)"
            ) from None

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


def open_sealed(
    path: StrPath, *, kek: bytes | None = None, key: bytes | None = None
) -> SealedDataset:
    """Parse a sealed dataset's header and wrap section.

    The file's length is not judged here: once a key verifies the header,
    :meth:`SealedDataset.check_key` reports a short file as its missing chunks.

    With ``kek`` (the key-file key) or ``key`` (the dataset key), a header whose fields do
    not parse is first authenticated as raw bytes: an altered header is reported as such
    (a data authentication failure), not as malformed input.

    Raises:
        MalformedDatasetError: not a sealed dataset (the message says what the file looks
            like: empty, too short, damaged magic, text, other bytes), or a bad field or
            wrap section that could not be authenticated (no key given), or that
            authenticated (a bug in whatever sealed it).
        HeaderAuthenticationError: with a key, the raw header failed authentication.
        DatasetKeyMismatchError: with ``kek``, the file was sealed for another key.
        FileAccessError: missing, not a regular file (never blocks on a FIFO), unreadable.
    """
    path = Path(path)
    fd = open_regular(path, what="sealed dataset")
    try:
        with os.fdopen(fd, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            sample = fh.read(max(PREFIX_SIZE, 512))
            if len(sample) < PREFIX_SIZE or sample[: len(MAGIC)] != MAGIC:
                raise MalformedDatasetError(
                    f"{path} is not a sealed dataset: {describe_unsealed(sample, size)}"
                )
            head = sample[:PREFIX_SIZE]
            fh.seek(PREFIX_SIZE)
            tail = fh.read(_MAX_RECORD)
    except OSError as exc:
        raise io_error("read", path, exc) from None
    try:
        header = Header.parse(head[:HEADER_SIZE])
        wrap_bytes = tail[: header.wrap_length]
        if len(wrap_bytes) != header.wrap_length:
            raise MalformedDatasetError(f"{path} ends inside its wrap section")
        wrap = parse_wrap_section(wrap_bytes)
    except MalformedDatasetError as exc:
        # A version this code does not know may authenticate differently: reported as is.
        known = int.from_bytes(head[8:10], "little") == FORMAT_VERSION
        if known and (kek is not None or key is not None):
            _authenticate_raw(path, head, tail, kek=kek, key=key)
        raise exc from None
    return SealedDataset(
        path=path,
        header=header,
        header_tag=head[HEADER_SIZE:PREFIX_SIZE],
        wrap=wrap,
        prefix=head + wrap_bytes,
        file_length=size,
    )


#: The most bytes a wrap record can take (context up to 1024 bytes).
_MAX_RECORD = 4 + 1024 + 12 + 48


def _record_at(tail: bytes) -> WrapRecord | None:
    """The wrap record at the start of ``tail``, found by its own length field."""
    if len(tail) < 4:
        return None
    length = 4 + int.from_bytes(tail[2:4], "little") + 12 + 48
    try:
        return WrapRecord.parse(tail[:length])
    except MalformedDatasetError:
        return None


def _authenticate_raw(
    path: Path, head: bytes, tail: bytes, *, kek: bytes | None, key: bytes | None
) -> None:
    """Authenticate a header that does not parse, as the raw bytes it is.

    Returns only when the header is authentic (or cannot be checked: no wrap record for
    ``kek``); the caller then reports it as malformed.

    Raises:
        HeaderAuthenticationError: the raw header does not verify: it was altered.
        DatasetKeyMismatchError: the wrap record is for another key file.
        KeyUnwrapError: the wrap record's key id was altered.
    """
    raw = head[:HEADER_SIZE]
    digest = hashlib.sha256(raw).digest()
    if kek is not None and key is None:
        record = _record_at(tail)
        if record is None or record.kind is not WrapKind.KEY_FILE:
            return
        ours = key_id(kek)
        if record.context != ours:
            try:
                unwrap_key(kek, dataclasses.replace(record, context=ours), digest)
            except KeyUnwrapError:
                raise DatasetKeyMismatchError(
                    f"{path} was sealed for key id {record.context.hex()}, "
                    f"this key file has key id {ours.hex()}"
                ) from None
            raise KeyUnwrapError(f"{path}: the wrap record's key id was altered")
        try:
            key = unwrap_key(kek, record, digest)
        except KeyUnwrapError:
            raise HeaderAuthenticationError(
                f"{path}: the sealed header failed authentication: its wrap record, bound to "
                "the header digest, does not verify under this key file (the header was altered)"
            ) from None
    if key is None:
        return
    dataset_id = raw[16:32]
    try:
        AESGCM(derive_chunk_key(key, dataset_id)).decrypt(
            header_tag_nonce(dataset_id), head[HEADER_SIZE:PREFIX_SIZE], header_tag_aad(raw)
        )
    except InvalidTag:
        raise HeaderAuthenticationError(
            f"{path}: the sealed header failed authentication (wrong key, or the header was "
            "altered)"
        ) from None
