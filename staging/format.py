"""The sealed dataset format, version 1 (``docs/FORMAT.md``), as pure functions and values.

Everything here works on bytes: building and parsing the fixed header, the per-chunk nonce
and associated data, the chunk-key derivation, wrap records and key files. The per-chunk
derivations (:func:`chunk_nonce`, :func:`chunk_aad`, :func:`derive_chunk_key`) are public
because the GPU kernel and its tests implement the same layout and check themselves
against these functions.

Parsing is strict: a :class:`Header` or :class:`WrapRecord` that exists is well formed, and
anything that is not raises :class:`~staging.errors.MalformedDatasetError`.
"""

from __future__ import annotations

import enum
import hashlib
import os
import secrets
import struct
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from gpucc.core.errors import ExposedKeyFileError
from gpucc.core.files import open_secret, write_atomic

from .errors import (
    HeaderAuthenticationError,
    KeyFileError,
    KeyUnwrapError,
    MalformedDatasetError,
)

__all__ = [
    "ALGORITHM_AES_256_GCM",
    "DEFAULT_CHUNK_SIZE",
    "FORMAT_VERSION",
    "HEADER_SIZE",
    "KEY_FILE_SIZE",
    "KEY_SIZE",
    "MAGIC",
    "MAX_CHUNK_SIZE",
    "MAX_WRAP_LENGTH",
    "MIN_CHUNK_SIZE",
    "NONCE_SIZE",
    "PREFIX_SIZE",
    "StrPath",
    "TAG_SIZE",
    "Header",
    "WrapKind",
    "WrapRecord",
    "chunk_aad",
    "chunk_count_for",
    "chunk_nonce",
    "compute_header_tag",
    "derive_chunk_key",
    "header_tag_aad",
    "header_tag_nonce",
    "key_id",
    "new_dataset_key",
    "parse_wrap_section",
    "read_key_file",
    "read_secret_file",
    "sealed_size",
    "unwrap_key",
    "valid_chunk_size",
    "verify_header_tag",
    "wrap_aad",
    "wrap_key",
    "write_key_file",
    "write_secret_file",
]

MAGIC = b"GPUCCSD\x00"
FORMAT_VERSION = 1
ALGORITHM_AES_256_GCM = 1

HEADER_SIZE = 64
TAG_SIZE = 16
NONCE_SIZE = 12
KEY_SIZE = 32
DATASET_ID_SIZE = 16
HEADER_DIGEST_SIZE = 32
#: Fixed header plus header tag: where the wrap section starts.
PREFIX_SIZE = HEADER_SIZE + TAG_SIZE

MIN_CHUNK_SIZE = 4096
MAX_CHUNK_SIZE = 256 * 1024 * 1024
MAX_WRAP_LENGTH = 65536

#: 4 MiB. The CPU sweet spot measured on the dev VM is 1-4 MiB (performance.md §6: both reach
#: ~16 GB/s with two threads using ``*_into``; 16 MiB falls to ~7 GB/s once a chunk outgrows
#: L2). Between the two, 4 MiB is the better fit for the GPU path that shares this format: a
#: quarter of the per-chunk work (tags, status words, launches, Python bookkeeping) and larger
#: PCIe copies, for a per-chunk tag overhead of 0.0004%. The in-flight window stays small
#: (two chunks per thread).
DEFAULT_CHUNK_SIZE = 4 * 1024 * 1024

#: A filesystem path argument.
StrPath = os.PathLike[str] | str

_HEADER_STRUCT = struct.Struct("<8sHHI16sQQI12s")
assert _HEADER_STRUCT.size == HEADER_SIZE

_CHUNK_KEY_INFO = b"gpucc/sealed-dataset/v1/chunk-key"
_HEADER_TAG_LABEL = b"gpucc/sealed-dataset/v1/header"
_WRAP_LABEL = b"gpucc/wrap/v1"
_KEY_ID_LABEL = b"gpucc/key-id/v1"
_HEADER_TAG_INDEX = b"\xff" * 8

# --- header -----------------------------------------------------------------


def chunk_count_for(plaintext_length: int, chunk_size: int) -> int:
    """``n = max(1, ceil(plaintext_length / chunk_size))``: an empty dataset has one chunk."""
    return max(1, -(-plaintext_length // chunk_size))


def sealed_size(plaintext_length: int, chunk_size: int, wrap_length: int = 0) -> int:
    """Size of the sealed file for a plaintext: ``80 + wrap_length + length + 16 * n``."""
    count = chunk_count_for(plaintext_length, chunk_size)
    return PREFIX_SIZE + wrap_length + plaintext_length + TAG_SIZE * count


def valid_chunk_size(chunk_size: int) -> bool:
    """Whether the format allows this chunk size: a multiple of 16 from 4 KiB to 256 MiB."""
    return MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE and chunk_size % 16 == 0


def _check_chunk_size(chunk_size: int) -> None:
    if not valid_chunk_size(chunk_size):
        raise MalformedDatasetError(
            f"chunk size {chunk_size} is not a multiple of 16 between "
            f"{MIN_CHUNK_SIZE} and {MAX_CHUNK_SIZE}"
        )


@dataclass(frozen=True)
class Header:
    """The 64-byte fixed header of a sealed dataset, validated on construction.

    Attributes:
        chunk_size: plaintext bytes per chunk (the last chunk may be shorter).
        dataset_id: 16 random bytes naming the dataset; salt of the chunk key.
        plaintext_length: total plaintext bytes.
        wrap_length: length of the wrap section that follows the header tag.
    """

    chunk_size: int
    dataset_id: bytes
    plaintext_length: int
    wrap_length: int = 0

    def __post_init__(self) -> None:
        _check_chunk_size(self.chunk_size)
        if len(self.dataset_id) != DATASET_ID_SIZE:
            raise MalformedDatasetError("dataset id must be 16 bytes")
        if not 0 <= self.plaintext_length < 2**64:
            raise MalformedDatasetError("plaintext length out of range")
        if not 0 <= self.wrap_length <= MAX_WRAP_LENGTH:
            raise MalformedDatasetError(
                f"wrap section length {self.wrap_length} exceeds {MAX_WRAP_LENGTH}"
            )

    @classmethod
    def new(
        cls, plaintext_length: int, *, chunk_size: int = DEFAULT_CHUNK_SIZE, wrap_length: int = 0
    ) -> Header:
        """A header with a fresh random dataset id."""
        return cls(
            chunk_size=chunk_size,
            dataset_id=secrets.token_bytes(DATASET_ID_SIZE),
            plaintext_length=plaintext_length,
            wrap_length=wrap_length,
        )

    @property
    def chunk_count(self) -> int:
        """Number of chunks, ``max(1, ceil(plaintext_length / chunk_size))``."""
        return chunk_count_for(self.plaintext_length, self.chunk_size)

    def to_bytes(self) -> bytes:
        """The 64-byte encoding."""
        return _HEADER_STRUCT.pack(
            MAGIC,
            FORMAT_VERSION,
            ALGORITHM_AES_256_GCM,
            self.chunk_size,
            self.dataset_id,
            self.chunk_count,
            self.plaintext_length,
            self.wrap_length,
            bytes(12),
        )

    @classmethod
    def parse(cls, data: bytes) -> Header:
        """Parse and validate every field of a 64-byte header.

        Raises:
            MalformedDatasetError: wrong size or magic, unknown version or algorithm, a chunk
                size out of range, a chunk count that disagrees with the lengths, a wrap
                section too long, or non-zero reserved bytes.
        """
        if len(data) != HEADER_SIZE:
            raise MalformedDatasetError(
                f"sealed header is {len(data)} bytes, expected {HEADER_SIZE}"
            )
        (magic, version, algorithm, chunk_size, dataset_id, count, length, wrap_length, rsv) = (
            _HEADER_STRUCT.unpack(data)
        )
        if magic != MAGIC:
            raise MalformedDatasetError("not a gpucc sealed dataset (bad magic)")
        if version != FORMAT_VERSION:
            raise MalformedDatasetError(f"unsupported sealed dataset version {version}")
        if algorithm != ALGORITHM_AES_256_GCM:
            raise MalformedDatasetError(f"unsupported sealed dataset algorithm {algorithm}")
        if rsv != bytes(12):
            raise MalformedDatasetError("sealed header reserved bytes are not zero")
        header = cls(
            chunk_size=chunk_size,
            dataset_id=dataset_id,
            plaintext_length=length,
            wrap_length=wrap_length,
        )
        if count != header.chunk_count:
            raise MalformedDatasetError(
                f"sealed header chunk count {count} does not match its lengths "
                f"(expected {header.chunk_count})"
            )
        return header

    @property
    def digest(self) -> bytes:
        """``header_digest`` = SHA-256 of the 64-byte header."""
        return hashlib.sha256(self.to_bytes()).digest()

    @property
    def chunks_offset(self) -> int:
        """File offset of chunk 0."""
        return PREFIX_SIZE + self.wrap_length

    @property
    def file_size(self) -> int:
        """The exact size a file with this header must have."""
        return self.chunks_offset + self.plaintext_length + TAG_SIZE * self.chunk_count

    def chunk_length(self, index: int) -> int:
        """Plaintext bytes in chunk ``index`` (``chunk_size`` except for the last)."""
        count = self.chunk_count
        if not 0 <= index < count:
            raise IndexError(f"chunk {index} out of range 0..{count - 1}")
        if index < count - 1:
            return self.chunk_size
        return self.plaintext_length - (count - 1) * self.chunk_size

    def chunk_offset(self, index: int) -> int:
        """File offset of chunk ``index`` (its ciphertext, followed by its tag)."""
        return self.chunks_offset + index * (self.chunk_size + TAG_SIZE)

    def is_final(self, index: int) -> bool:
        """Whether chunk ``index`` is the last one (its AAD final flag)."""
        return index == self.chunk_count - 1


# --- per-chunk derivations --------------------------------------------------


def derive_chunk_key(dataset_key: bytes, dataset_id: bytes) -> bytes:
    """``CK`` = HKDF-SHA-384(IKM = dataset key, salt = dataset id, info = chunk-key label), 32 B."""
    if len(dataset_key) != KEY_SIZE:
        raise ValueError("a dataset key is 32 bytes")
    if len(dataset_id) != DATASET_ID_SIZE:
        raise ValueError("a dataset id is 16 bytes")
    return HKDF(
        algorithm=hashes.SHA384(), length=KEY_SIZE, salt=dataset_id, info=_CHUNK_KEY_INFO
    ).derive(dataset_key)


def chunk_nonce(dataset_id: bytes, index: int) -> bytes:
    """``nonce_i = dataset_id[0:4] || uint64_be(i)`` (12 bytes)."""
    if len(dataset_id) != DATASET_ID_SIZE:
        raise ValueError("a dataset id is 16 bytes")
    if not 0 <= index < 2**64 - 1:
        # 2**64 - 1 is the header tag's index.
        raise ValueError("chunk index out of range")
    return dataset_id[:4] + index.to_bytes(8, "big")


def chunk_aad(header_digest: bytes, index: int, final: bool) -> bytes:
    """``aad_i = header_digest || uint64_le(i) || final_i`` (41 bytes)."""
    if len(header_digest) != HEADER_DIGEST_SIZE:
        raise ValueError("a header digest is 32 bytes")
    if not 0 <= index < 2**64 - 1:
        raise ValueError("chunk index out of range")
    return header_digest + index.to_bytes(8, "little") + (b"\x01" if final else b"\x00")


def header_tag_nonce(dataset_id: bytes) -> bytes:
    """Nonce of the header tag: ``dataset_id[0:4] || 0xFFFFFFFFFFFFFFFF``."""
    if len(dataset_id) != DATASET_ID_SIZE:
        raise ValueError("a dataset id is 16 bytes")
    return dataset_id[:4] + _HEADER_TAG_INDEX


def header_tag_aad(header_bytes: bytes) -> bytes:
    """Associated data of the header tag: the header label followed by the 64-byte header."""
    if len(header_bytes) != HEADER_SIZE:
        raise ValueError("a header is 64 bytes")
    return _HEADER_TAG_LABEL + header_bytes


def compute_header_tag(chunk_key: bytes, header: Header) -> bytes:
    """The 16-byte header tag: AES-256-GCM under ``CK`` over no plaintext."""
    return AESGCM(chunk_key).encrypt(
        header_tag_nonce(header.dataset_id), b"", header_tag_aad(header.to_bytes())
    )


def verify_header_tag(chunk_key: bytes, header: Header, tag: bytes) -> None:
    """Check the header tag (constant time, inside AES-GCM).

    Raises:
        HeaderAuthenticationError: wrong key or altered header.
    """
    try:
        AESGCM(chunk_key).decrypt(
            header_tag_nonce(header.dataset_id), tag, header_tag_aad(header.to_bytes())
        )
    except InvalidTag:
        raise HeaderAuthenticationError(
            "sealed header failed authentication (wrong key, or the header was altered)"
        ) from None


def new_dataset_key() -> bytes:
    """32 fresh random bytes."""
    return secrets.token_bytes(KEY_SIZE)


# --- wrap records -----------------------------------------------------------


class WrapKind(enum.IntEnum):
    """Who a wrap record is for."""

    KEY_FILE = 1
    SESSION = 2


_CONTEXT_SIZE = {WrapKind.KEY_FILE: 16, WrapKind.SESSION: 48}
_WRAPPED_SIZE = KEY_SIZE + TAG_SIZE
_MAX_CONTEXT = 1024


def wrap_aad(header_digest: bytes, kind: WrapKind, context: bytes) -> bytes:
    """``wrap_aad = "gpucc/wrap/v1" || header_digest || kind || context``."""
    if len(header_digest) != HEADER_DIGEST_SIZE:
        raise ValueError("a header digest is 32 bytes")
    return _WRAP_LABEL + header_digest + bytes([kind]) + context


@dataclass(frozen=True)
class WrapRecord:
    """A dataset key encrypted for one recipient (a key file or an attested session).

    Attributes:
        kind: the recipient type.
        context: the key id (kind 1, 16 bytes) or the session transcript hash (kind 2, 48).
        wrap_nonce: 12 random bytes.
        wrapped: 32-byte ciphertext of the dataset key followed by its 16-byte tag.
    """

    kind: WrapKind
    context: bytes
    wrap_nonce: bytes
    wrapped: bytes

    def __post_init__(self) -> None:
        if len(self.context) != _CONTEXT_SIZE[self.kind]:
            raise MalformedDatasetError(
                f"wrap record kind {int(self.kind)} needs a {_CONTEXT_SIZE[self.kind]}-byte "
                f"context, got {len(self.context)}"
            )
        if len(self.wrap_nonce) != NONCE_SIZE:
            raise MalformedDatasetError("wrap nonce must be 12 bytes")
        if len(self.wrapped) != _WRAPPED_SIZE:
            raise MalformedDatasetError("wrapped key must be 48 bytes")

    def to_bytes(self) -> bytes:
        """Encoding: kind, reserved, uint16_le context length, context, nonce, wrapped key."""
        return (
            struct.pack("<BBH", self.kind, 0, len(self.context))
            + self.context
            + self.wrap_nonce
            + self.wrapped
        )

    @classmethod
    def parse(cls, data: bytes) -> WrapRecord:
        """Parse exactly one record that fills ``data``.

        Raises:
            MalformedDatasetError: unknown kind, non-zero reserved byte, wrong lengths.
        """
        if len(data) < 4:
            raise MalformedDatasetError("wrap record is truncated")
        kind_value, reserved, context_length = struct.unpack_from("<BBH", data)
        try:
            kind = WrapKind(kind_value)
        except ValueError:
            raise MalformedDatasetError(f"unknown wrap record kind {kind_value}") from None
        if reserved != 0:
            raise MalformedDatasetError("wrap record reserved byte is not zero")
        if context_length > _MAX_CONTEXT:
            raise MalformedDatasetError("wrap record context is too long")
        expected = 4 + context_length + NONCE_SIZE + _WRAPPED_SIZE
        if len(data) != expected:
            raise MalformedDatasetError(
                f"wrap record is {len(data)} bytes, its fields need {expected}"
            )
        end_context = 4 + context_length
        return cls(
            kind=kind,
            context=bytes(data[4:end_context]),
            wrap_nonce=bytes(data[end_context : end_context + NONCE_SIZE]),
            wrapped=bytes(data[end_context + NONCE_SIZE :]),
        )


def parse_wrap_section(data: bytes) -> WrapRecord | None:
    """The wrap section of a file: empty, or exactly one record.

    Raises:
        MalformedDatasetError: the section is not one well-formed record.
    """
    if not data:
        return None
    return WrapRecord.parse(data)


def wrap_key(
    kek: bytes,
    dataset_key: bytes,
    header_digest: bytes,
    kind: WrapKind,
    context: bytes,
    *,
    wrap_nonce: bytes | None = None,
) -> WrapRecord:
    """Encrypt ``dataset_key`` under ``kek`` for one dataset and one recipient.

    ``wrap_nonce`` is random unless given (known-answer tests only: never reuse one).
    """
    if len(kek) != KEY_SIZE or len(dataset_key) != KEY_SIZE:
        raise ValueError("keys are 32 bytes")
    nonce = secrets.token_bytes(NONCE_SIZE) if wrap_nonce is None else wrap_nonce
    if len(nonce) != NONCE_SIZE:
        raise ValueError("a wrap nonce is 12 bytes")
    wrapped = AESGCM(kek).encrypt(nonce, dataset_key, wrap_aad(header_digest, kind, context))
    return WrapRecord(kind=kind, context=context, wrap_nonce=nonce, wrapped=wrapped)


def unwrap_key(kek: bytes, record: WrapRecord, header_digest: bytes) -> bytes:
    """Recover the dataset key from ``record``.

    Raises:
        KeyUnwrapError: wrong key, another dataset or session, or a tampered record.
    """
    if len(kek) != KEY_SIZE:
        raise KeyUnwrapError("a key-encryption key is 32 bytes")
    try:
        return AESGCM(kek).decrypt(
            record.wrap_nonce,
            record.wrapped,
            wrap_aad(header_digest, record.kind, record.context),
        )
    except InvalidTag:
        what = "key file" if record.kind is WrapKind.KEY_FILE else "session"
        raise KeyUnwrapError(
            f"the dataset key did not unwrap: wrong {what}, another dataset, or a tampered record"
        ) from None


# --- key files ----------------------------------------------------------------

_KEY_FILE_MAGIC = b"gpucc-key v1\n"
KEY_FILE_SIZE = len(_KEY_FILE_MAGIC) + KEY_SIZE


def key_id(key: bytes) -> bytes:
    """First 16 bytes of SHA-256(``"gpucc/key-id/v1" || key``)."""
    return hashlib.sha256(_KEY_ID_LABEL + key).digest()[:16]


def write_secret_file(path: StrPath, data: bytes, *, overwrite: bool = False) -> None:
    """Write a secret file with mode 0600, atomically.

    ``data`` goes to a temporary file created with mode 0600, ``O_EXCL`` and
    ``O_NOFOLLOW`` in the same directory, is flushed to disk, and only then appears under
    ``path``: by an exclusive hard link (an existing file is never replaced) or, with
    ``overwrite``, by rename (:func:`gpuattest.files.exclusive_output`).

    Raises:
        FileAccessError: ``path`` exists (without ``overwrite``) or cannot be written.
    """
    write_atomic(path, data, mode=0o600, force=overwrite, what="key file")


def read_secret_file(path: StrPath, max_size: int, *, what: str = "key file") -> bytes:
    """Read a secret file that only its owner can access.

    Opened with ``O_NOFOLLOW`` and ``O_NONBLOCK``; at most ``max_size + 1`` bytes are
    read, so a caller can tell a file that is too long.

    Raises:
        FileAccessError: missing, a symbolic link, or not a regular file (a FIFO, device,
            directory or socket is refused before it is read).
        KeyFileError: owned by another user, or any group or world permission (the secret
            could be read, or replaced by someone else's); the message says how to fix it.
    """
    path = Path(path)
    fd = open_secret(path, what=what, exposed=ExposedKeyFileError)
    try:
        with os.fdopen(fd, "rb") as fh:
            return fh.read(max_size + 1)
    except OSError as exc:
        raise KeyFileError(f"cannot read {what} {path}: {exc.strerror}") from None


def write_key_file(path: StrPath, key: bytes | None = None, *, overwrite: bool = False) -> bytes:
    """Write a key file (``docs/FORMAT.md``) with mode 0600, atomically; return its key.

    The key is fresh and random unless given. An existing file is never replaced unless
    ``overwrite`` is set.

    Raises:
        FileAccessError: ``path`` exists (without ``overwrite``) or cannot be written.
    """
    key = new_dataset_key() if key is None else key
    if len(key) != KEY_SIZE:
        raise ValueError("a key is 32 bytes")
    write_secret_file(path, _KEY_FILE_MAGIC + key, overwrite=overwrite)
    return key


def read_key_file(path: StrPath) -> bytes:
    """Read a key file's 32-byte key.

    Raises:
        FileAccessError: missing, a symbolic link, or not a regular file.
        KeyFileError: another user's, any group or world permission (the key could be
            read, or replaced by someone else's), or not a gpucc key file.
    """
    data = read_secret_file(path, KEY_FILE_SIZE)
    if len(data) != KEY_FILE_SIZE or not data.startswith(_KEY_FILE_MAGIC):
        raise KeyFileError(f"{path} is not a gpucc key file")
    return data[len(_KEY_FILE_MAGIC) :]
