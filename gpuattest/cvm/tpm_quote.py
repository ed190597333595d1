"""TPM 2.0 quotes: the signed ``TPMS_ATTEST`` a vTPM's attestation key (AK) makes over PCRs.

A quote is the marshalled ``TPMS_ATTEST`` structure (TPM 2.0 Library, Part 2), big-endian::

    u32 magic (0xFF544347, TPM_GENERATED_VALUE)   u16 type (0x8018, TPM_ST_ATTEST_QUOTE)
    TPM2B_NAME qualifiedSigner                     TPM2B_DATA extraData (the qualifying data)
    TPMS_CLOCK_INFO (u64 clock, u32 resetCount, u32 restartCount, u8 safe)
    u64 firmwareVersion
    TPMS_QUOTE_INFO: TPML_PCR_SELECTION (u32 count; per bank u16 hash, u8 sizeofSelect,
                     a bitmap, PCR n in bit n%8 of byte n//8) and TPM2B_DIGEST pcrDigest

and a signature over those exact bytes. gpucc reads one shape only, the one Azure's paravisor
and ``gpucc evidence collect --cvm`` produce: one SHA-256 bank, an RSASSA-PKCS1-v1_5/SHA-256
signature (the raw signature bytes, as long as the AK's modulus) and the selected PCR values
given beside the quote in ascending PCR order; ``pcrDigest`` is SHA-256 of those values
concatenated. Anything else (another magic or type, bytes left over, a second bank, a
selection that names no PCR) is :class:`MalformedTpmQuoteError` (exit 4). The quote's
``extraData`` is where the relying party's freshness value lives.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from gpucc.core.errors import MalformedInputError

__all__ = [
    "MAX_QUOTE_BYTES",
    "MalformedTpmQuoteError",
    "TpmQuote",
    "parse_tpm_quote",
    "pcr_digest_matches",
    "verify_quote_signature",
]

MAX_QUOTE_BYTES = 1024
TPM_GENERATED = 0xFF544347
ST_ATTEST_QUOTE = 0x8018
ALG_SHA256 = 0x000B
MAX_EXTRA_DATA = 64
PCR_COUNT = 24


class MalformedTpmQuoteError(MalformedInputError):
    """The bytes are not a TPM 2.0 quote of the shape gpucc reads."""


@dataclass(frozen=True)
class TpmQuote:
    """One parsed quote; ``raw`` is what the signature covers."""

    raw: bytes
    qualified_signer: bytes
    extra_data: bytes
    clock: int
    reset_count: int
    restart_count: int
    safe: bool
    firmware_version: int
    pcr_indices: tuple[int, ...]
    pcr_digest: bytes


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int, what: str) -> bytes:
        if self.pos + n > len(self.data):
            raise MalformedTpmQuoteError(f"the TPM quote is truncated in its {what}")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def u(self, fmt: str, what: str) -> int:
        (value,) = struct.unpack(">" + fmt, self.take(struct.calcsize(fmt), what))
        return int(value)

    def sized(self, what: str, limit: int) -> bytes:
        size = self.u("H", what)
        if size > limit:
            raise MalformedTpmQuoteError(
                f"the TPM quote's {what} has {size} bytes (at most {limit})"
            )
        return self.take(size, what)


def parse_tpm_quote(data: bytes) -> TpmQuote:
    """Parse a quote strictly (see the module docstring).

    Raises:
        MalformedTpmQuoteError: anything but one SHA-256-bank quote, exactly consumed.
    """
    if not data or len(data) > MAX_QUOTE_BYTES:
        raise MalformedTpmQuoteError(
            f"a TPM quote has 1 to {MAX_QUOTE_BYTES} bytes, this has {len(data)}"
        )
    r = _Reader(bytes(data))
    if r.u("I", "magic") != TPM_GENERATED:
        raise MalformedTpmQuoteError("the TPM quote does not start with TPM_GENERATED_VALUE")
    kind = r.u("H", "type")
    if kind != ST_ATTEST_QUOTE:
        raise MalformedTpmQuoteError(f"the TPM attestation has type 0x{kind:04X}, not a quote")
    signer = r.sized("qualified signer", 68)
    extra = r.sized("qualifying data", MAX_EXTRA_DATA)
    clock = r.u("Q", "clock")
    resets, restarts = r.u("I", "reset count"), r.u("I", "restart count")
    safe = r.u("B", "clock safe flag")
    if safe > 1:
        raise MalformedTpmQuoteError("the TPM quote's clock safe flag is not 0 or 1")
    firmware = r.u("Q", "firmware version")
    if r.u("I", "PCR selection count") != 1:
        raise MalformedTpmQuoteError("the TPM quote must select exactly one PCR bank")
    if r.u("H", "PCR bank") != ALG_SHA256:
        raise MalformedTpmQuoteError("the TPM quote's PCR bank is not SHA-256")
    size = r.u("B", "PCR selection size")
    if not 1 <= size <= PCR_COUNT // 8:
        raise MalformedTpmQuoteError(f"the TPM quote's PCR selection has {size} bytes")
    bitmap = r.take(size, "PCR selection")
    indices = tuple(i for i in range(size * 8) if bitmap[i // 8] >> (i % 8) & 1)
    if not indices:
        raise MalformedTpmQuoteError("the TPM quote selects no PCR")
    digest = r.sized("PCR digest", 64)
    if len(digest) != 32:
        raise MalformedTpmQuoteError("the TPM quote's PCR digest is not a SHA-256 digest")
    if r.pos != len(r.data):
        raise MalformedTpmQuoteError(f"the TPM quote has {len(r.data) - r.pos} bytes left over")
    return TpmQuote(
        raw=r.data,
        qualified_signer=signer,
        extra_data=extra,
        clock=clock,
        reset_count=resets,
        restart_count=restarts,
        safe=bool(safe),
        firmware_version=firmware,
        pcr_indices=indices,
        pcr_digest=digest,
    )


def verify_quote_signature(quote: TpmQuote, signature: bytes, ak: rsa.RSAPublicKey) -> bool:
    """Whether ``signature`` (RSASSA-PKCS1-v1_5, SHA-256) over the quote verifies with ``ak``."""
    if len(signature) != (ak.key_size + 7) // 8:
        return False
    try:
        ak.verify(signature, quote.raw, padding.PKCS1v15(), hashes.SHA256())
    except InvalidSignature:
        return False
    return True


def pcr_digest_matches(quote: TpmQuote, pcrs: dict[int, bytes]) -> bool:
    """Whether the quote's ``pcrDigest`` is SHA-256 of ``pcrs``'s values for exactly the
    selected PCRs, in ascending order."""
    if sorted(pcrs) != list(quote.pcr_indices):
        return False
    joined = b"".join(pcrs[i] for i in quote.pcr_indices)
    return hmac.compare_digest(hashlib.sha256(joined).digest(), quote.pcr_digest)
