"""AES-GCM that refuses overlapping input and output, whatever ``cryptography``'s version.

cryptography 51 and later refuse ``encrypt_into``/``decrypt_into`` whose input and output
share memory ("data and buf must not overlap"); 50 accepted them. The suite runs on either,
so it cannot rely on the installed version to catch a call that works in place: every gpucc
module's ``AESGCM`` is replaced during each test (:func:`install`, from ``tests/conftest.py``)
and in every gpucc process the tests start (``tests/support/childhooks/sitecustomize.py``)
by :class:`GuardedAESGCM`, which checks the two buffers' address ranges first.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.ciphers import aead

__all__ = ["GuardedAESGCM", "OverlapError", "install", "overlaps"]

#: The class cryptography provides (a Rust type: it cannot be subclassed).
REAL = aead.AESGCM


class OverlapError(AssertionError):
    """An AEAD call was handed input and output that share memory."""


def overlaps(data: Any, buf: Any) -> bool:
    """Whether the bytes of ``data`` and ``buf`` share any address."""
    a = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    b = np.frombuffer(memoryview(buf).cast("B"), dtype=np.uint8)
    return bool(a.size and b.size and np.may_share_memory(a, b))


class GuardedAESGCM:
    """:class:`AESGCM` with the same methods; the ``*_into`` ones refuse overlapping buffers."""

    generate_key: Callable[[int], bytes] = staticmethod(REAL.generate_key)

    def __init__(self, key: bytes) -> None:
        self._aead = REAL(key)

    def encrypt(self, nonce: bytes, data: Any, associated_data: Any) -> bytes:
        return self._aead.encrypt(nonce, data, associated_data)

    def decrypt(self, nonce: bytes, data: Any, associated_data: Any) -> bytes:
        return self._aead.decrypt(nonce, data, associated_data)

    def encrypt_into(self, nonce: bytes, data: Any, associated_data: Any, buf: Any) -> None:
        if overlaps(data, buf):
            raise OverlapError("AESGCM.encrypt_into: data and buf overlap")
        self._aead.encrypt_into(nonce, data, associated_data, buf)

    def decrypt_into(self, nonce: bytes, data: Any, associated_data: Any, buf: Any) -> None:
        if overlaps(data, buf):
            raise OverlapError("AESGCM.decrypt_into: data and buf overlap")
        self._aead.decrypt_into(nonce, data, associated_data, buf)


def install(setattr_: Callable[[object, str, object], None]) -> list[str]:
    """Put :class:`GuardedAESGCM` in cryptography's module and in every loaded gpucc module
    that imported ``AESGCM``, with ``setattr_`` (e.g. ``monkeypatch.setattr``, which undoes
    it). A gpucc module imported later gets it from cryptography's module. Returns the
    gpucc modules patched."""
    setattr_(aead, "AESGCM", GuardedAESGCM)
    patched = []
    for name, module in list(sys.modules.items()):
        if name.startswith("gpucc.") and getattr(module, "AESGCM", None) is REAL:
            setattr_(module, "AESGCM", GuardedAESGCM)
            patched.append(name)
    return patched
