"""Whether reference values are a CoRIM or an XML RIM, told by their first bytes.

Kept apart from :mod:`gpucc.gpuattest.corim` so that choosing the reader for an XML RIM does
not load the CoRIM reader and its CBOR codec (every ``gpucc attest`` of a Hopper GPU asks).
"""

from __future__ import annotations

__all__ = ["looks_like_corim"]


def looks_like_corim(data: bytes) -> bool:
    """Whether a file is a CoRIM by content (for ``--rim-dir``, ``--driver-rim``...): it
    starts with tag 501 (unsigned) or tag 18 (COSE_Sign1), where an XML RIM starts with
    text. Only a hint for choosing the reader: :func:`gpucc.gpuattest.corim.read_corim`
    decides.
    """
    return data[:3] == b"\xd9\x01\xf5" or data[:1] == b"\xd2"
