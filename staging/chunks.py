"""Per-chunk AES-256-GCM for one sealed dataset: the code every staging path shares.

The CPU path uses both directions; the GPU path uses :meth:`ChunkCipher.encrypt_into` for
the host side of the bounce-buffer model (host encrypts, device decrypts) and checks its
kernel against :meth:`ChunkCipher.decrypt_into`.
"""

from __future__ import annotations

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .errors import ChunkAuthenticationError
from .format import (
    TAG_SIZE,
    Header,
    chunk_aad,
    chunk_nonce,
    compute_header_tag,
    derive_chunk_key,
    verify_header_tag,
)

__all__ = ["ChunkCipher", "zero"]

_Writable = memoryview | bytearray


def zero(buf: _Writable) -> None:
    """Overwrite a writable buffer with zeros in place."""
    view = memoryview(buf).cast("B")
    if view.nbytes:
        np.frombuffer(view, dtype=np.uint8)[:] = 0


class ChunkCipher:
    """Encrypts and decrypts the chunks of one dataset under its chunk key.

    Safe to share between threads: every call is independent and ``cryptography`` (50 and
    later) releases the GIL inside AES-GCM, so threads scale.
    """

    __slots__ = ("_aead", "_chunk_key", "_digest", "header")

    def __init__(self, dataset_key: bytes, header: Header) -> None:
        self.header = header
        self._chunk_key = derive_chunk_key(dataset_key, header.dataset_id)
        self._aead = AESGCM(self._chunk_key)
        self._digest = header.digest

    def __repr__(self) -> str:
        return f"ChunkCipher(dataset_id={self.header.dataset_id.hex()})"

    def header_tag(self) -> bytes:
        """The header tag for this header and key."""
        return compute_header_tag(self._chunk_key, self.header)

    def verify_header(self, tag: bytes) -> None:
        """Check the header tag.

        Raises:
            HeaderAuthenticationError: wrong key or altered header.
        """
        verify_header_tag(self._chunk_key, self.header, tag)

    def _check(self, index: int, plain_length: int) -> None:
        expected = self.header.chunk_length(index)
        if plain_length != expected:
            raise ValueError(f"chunk {index} holds {expected} bytes, not {plain_length}")

    def encrypt_into(self, index: int, plaintext: memoryview | bytes, out: _Writable) -> None:
        """Write ``ct_i || tag_i`` for chunk ``index`` into ``out`` (plaintext length + 16)."""
        self._check(index, len(plaintext))
        self._aead.encrypt_into(
            chunk_nonce(self.header.dataset_id, index),
            plaintext,
            chunk_aad(self._digest, index, self.header.is_final(index)),
            out,
        )

    def decrypt_into(self, index: int, sealed: memoryview | bytes, out: _Writable) -> None:
        """Verify ``ct_i || tag_i`` and write the plaintext of chunk ``index`` into ``out``.

        ``cryptography`` writes the plaintext before it checks the tag, so on failure ``out``
        is zeroed before the error is raised: no unverified plaintext is left behind.

        Raises:
            ChunkAuthenticationError: the chunk (or its position, or its dataset) is not the
                one that was sealed.
        """
        self._check(index, len(sealed) - TAG_SIZE)
        try:
            self._aead.decrypt_into(
                chunk_nonce(self.header.dataset_id, index),
                sealed,
                chunk_aad(self._digest, index, self.header.is_final(index)),
                out,
            )
        except InvalidTag:
            zero(out)
            raise ChunkAuthenticationError(index) from None
