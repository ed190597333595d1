"""What a TDX quote proves without Intel's collateral: everything but TCB status and revocation.

Without TCB info, QE identity and CRLs for the platform's FMSPC a verdict cannot be reached,
but the quote's own cryptography can be checked, so evidence that is forged or bound to
something else is refused rather than left undecided:

1. ``tdx-pck-chain``: the PCK chain in the quote (PCK certificate, PCK Platform CA, Intel SGX
   Root CA) passes :func:`~gpuattest.x509chain.validate_chain` with :data:`PCK_CHAIN` to the
   pinned root; outside its validity at ``now`` is a collateral problem (undecided).
2. ``tdx-qe-report``: the QE report's ECDSA P-256 signature verifies with the PCK key, and its
   report data is SHA-256(attestation key || QE authentication data) followed by 32 zeros.
3. ``tdx-quote-signature``: the quote's ECDSA P-256 signature over header and TD report
   verifies with the attestation key.
4. ``cvm-collateral``: not checked, collateral missing; the reason names the FMSPC and what
   Intel publishes for it (TCB info, QE identity, PCK CRL, root CA CRL).

The layout itself is :func:`.tdx.check_layout`'s (zero padding after the quote is accepted).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import struct

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from gpucc.core.errors import MalformedEvidenceError

from ..result import Check, CheckStatus
from ..x509chain import ChainProfile, ChainStatus, load_certificates, validate_chain

__all__ = ["PCK_CHAIN", "offline_quote_checks"]

#: PCK certificate, PCK Platform (or Processor) CA, Intel SGX Root CA.
PCK_CHAIN = ChainProfile("Intel PCK", expected_length=3)


def _p256(raw: bytes) -> ec.EllipticCurvePublicKey:
    try:
        return ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), b"\x04" + raw)
    except ValueError:
        raise MalformedEvidenceError(
            "the TDX quote's attestation key is not a P-256 point"
        ) from None


def _verify(key: ec.EllipticCurvePublicKey, sig: bytes, data: bytes) -> bool:
    r, s = int.from_bytes(sig[:32], "big"), int.from_bytes(sig[32:64], "big")
    try:
        key.verify(encode_dss_signature(r, s), data, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return False
    return True


def offline_quote_checks(
    quote: bytes, signed_end: int, fmspc: str, root: x509.Certificate, now: dt.datetime
) -> list[Check]:
    """The checks above for a quote whose layout :func:`.tdx.check_layout` accepted.

    Args:
        quote: the quote (zero padding after it allowed).
        signed_end: where header and TD report end (the signature data length follows).
        fmspc: the platform's FMSPC (hex), for the collateral check's reason.
        root: the pinned Intel SGX Root CA.
        now: the verification time.

    Raises:
        MalformedEvidenceError: the PCK chain or the attestation key cannot be read.
    """
    (sig_len,) = struct.unpack_from("<I", quote, signed_end)
    sig = quote[signed_end + 4 : signed_end + 4 + sig_len]
    quote_sig, att_key = sig[:64], sig[64:128]
    qe_report, qe_sig = sig[134 : 134 + 384], sig[518:582]
    (auth_len,) = struct.unpack_from("<H", sig, 582)
    auth = sig[584 : 584 + auth_len]
    nested = 584 + auth_len
    (pem_len,) = struct.unpack_from("<I", sig, nested + 2)
    certs = load_certificates(
        sig[nested + 6 : nested + 6 + pem_len],
        what="the TDX quote's PCK chain",
        error=MalformedEvidenceError,
    )
    checks: list[Check] = []
    chain = validate_chain(certs, root, now, PCK_CHAIN)
    title = "PCK chain to Intel's root (PCK, Platform CA, SGX Root CA)"
    if chain.status is ChainStatus.INVALID:
        checks.append(Check("tdx-pck-chain", title, CheckStatus.FAIL, chain.reason))
    elif chain.status is ChainStatus.EXPIRED:
        checks.append(Check("tdx-pck-chain", title, CheckStatus.NOT_CHECKED, chain.reason, True))
    else:
        checks.append(Check("tdx-pck-chain", title, CheckStatus.PASS))
    pck = certs[0].public_key()
    title = "QE report (signed by the PCK key, binds the attestation key)"
    if not isinstance(pck, ec.EllipticCurvePublicKey) or not _verify(pck, qe_sig, qe_report):
        checks.append(Check("tdx-qe-report", title, CheckStatus.FAIL, "the QE report signature "
                            "does not verify with the PCK certificate's key"))  # fmt: skip
    else:
        bound = hashlib.sha256(att_key + auth).digest() + bytes(32)
        ok = hmac.compare_digest(qe_report[320:384], bound)
        reason = "" if ok else "the QE report does not commit to the quote's attestation key"
        checks.append(Check("tdx-qe-report", title, CheckStatus.PASS if ok else CheckStatus.FAIL,
                            reason))  # fmt: skip
    ok = _verify(_p256(att_key), quote_sig, quote[:signed_end])
    checks.append(
        Check(
            "tdx-quote-signature",
            "Quote signature (attestation key, ECDSA P-256)",
            CheckStatus.PASS if ok else CheckStatus.FAIL,
            "" if ok else "the quote signature does not verify with its attestation key",
        )
    )
    checks.append(
        Check(
            "cvm-collateral",
            "Collateral current",
            CheckStatus.NOT_CHECKED,
            f"no Intel collateral for FMSPC {fmspc.upper()} was given or fetched (TDX TCB info, "
            "QE identity, PCK CRL, root CA CRL): TCB status and revocation cannot be decided",
            collateral_missing=True,
        )
    )
    return checks
