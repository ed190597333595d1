"""Intel TDX DCAP quotes, verified offline against Intel's collateral at a given time.

The cryptography (PCK chain and CRLs, QE report signed by the PCK key, the attestation key
bound by the QE report, the quote signature, TCB info and QE identity signatures and the TCB
status of the platform and TDX module) is the ``dcap-qvl`` package's. gpucc adds what a strict
relying party needs around it:

- the quote's outer layout (size caps, a TDX quote of version 4 or 5, no trailing bytes), so
  an SGX quote, a truncated or an oversized one is malformed input, never a verdict;
- Intel's SGX Root CA pinned by fingerprint: every chain (the quote's PCK chain, the
  collateral's issuer chains) must end in exactly that certificate;
- collateral judged at ``now`` before anything else: TCB info or QE identity expired or not
  yet issued, a CRL past its next update, an issuer certificate or a certificate of the
  quote's own PCK chain out of its validity period are *stale* (the verdict is undecided,
  exit 3), not tampering. The quote's own cryptography is still checked, at the *sound
  time*: the time closest to ``now`` at which every piece of collateral and every
  certificate of the PCK chain is valid, so bad evidence with stale collateral is still
  refused whatever the order of those dates. Where no such time exists (a PCK certificate
  issued after the collateral expired, or expired before it was issued), the signatures of
  the quote, the QE report and the PCK chain are checked without dates
  (:mod:`.tdx_offline`) and the rest is undecided, with that reason.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any, TypeVar

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from gpucc.core.errors import MalformedEvidenceError
from gpucc.core.jsonio import loads_untrusted

from ..result import Check, CheckStatus
from ..trust import TrustRootError, cert_sha256
from ..x509chain import load_certificates
from .findings import CvmFindings, CvmKind

__all__ = [
    "INTEL_SGX_ROOT_SHA256",
    "MAX_COLLATERAL_BYTES",
    "MAX_QUOTE_BYTES",
    "TdxCollateral",
    "check_layout",
    "dcap",
    "intel_sgx_root",
    "looks_like_tdx_quote",
    "platform_of",
    "unverified_tdx_quote",
    "validity_windows",
    "verify_tdx_quote",
]

# SHA-256 over the DER encoding of Intel's SGX Root CA (roots SGX and TDX attestation).
INTEL_SGX_ROOT_SHA256 = "44a0196b2b99f889b8e149e95b807a350e7424964399e885a7cbb8ccfab674d3"
MAX_QUOTE_BYTES = 64 * 1024  # a quote with its PCK chain is about 5 KiB
MAX_COLLATERAL_BYTES = 4 * 1024 * 1024  # the PCK CRL is the large part

_HEADER = 48
_TEE_TDX = 0x81
_TEE_SGX = 0x00
_ECDSA_P256 = 2
# Quote v5 body types: TD report 1.0 and 1.5 (type 1 is an SGX enclave report).
_V5_BODIES = {2: ("1.0", 584), 3: ("1.5", 648)}
_V4_BODY = 584
_SECOND = dt.timedelta(seconds=1)
_DEBUG_BIT = 0x01  # TDATTRIBUTES bit 0 (first byte, little-endian)
_QE_REPORT_CERT = 6  # certification data: QE report, its signature, auth data, nested data
_PCK_CHAIN_CERT = 5  # nested certification data: the PCK certificate chain (PEM)

_COLLATERAL_TEXT = (
    "pck_crl_issuer_chain",
    "tcb_info_issuer_chain",
    "tcb_info",
    "qe_identity_issuer_chain",
    "qe_identity",
)
_COLLATERAL_HEX = ("root_ca_crl", "pck_crl", "tcb_info_signature", "qe_identity_signature")
_CHAINS = ("pck_crl_issuer_chain", "tcb_info_issuer_chain", "qe_identity_issuer_chain")


@functools.cache
def intel_sgx_root() -> x509.Certificate:
    """Intel's SGX Root CA from package data, checked against its pinned fingerprint.

    Raises:
        TrustRootError: the packaged root is missing or does not match its pin.
    """
    try:
        data = resources.files("gpucc.gpuattest._roots.intel").joinpath("sgx_root_ca.pem")
        cert = x509.load_pem_x509_certificate(data.read_bytes())
    except (OSError, ValueError) as exc:
        raise TrustRootError(f"the packaged Intel SGX Root CA cannot be loaded: {exc}") from None
    if cert_sha256(cert) != INTEL_SGX_ROOT_SHA256:
        raise TrustRootError("the packaged Intel SGX Root CA does not match its pin")
    return cert


@dataclass(frozen=True)
class TdxCollateral:
    """Intel's collateral for one quote, in the JSON shape a PCCS serves (hex for binary)."""

    fields: dict[str, str]

    @classmethod
    def from_json(cls, data: bytes) -> TdxCollateral:
        """Parse PCCS-shaped collateral JSON.

        Raises:
            MalformedEvidenceError: oversized, not strict JSON (duplicate keys, depth, numbers:
                :func:`~gpuattest._internal.jsonio.loads_untrusted`), missing or unknown keys,
                bad hex.
        """
        doc = loads_untrusted(
            data,
            what="TDX collateral",
            error=MalformedEvidenceError,
            max_bytes=MAX_COLLATERAL_BYTES,
        )
        if not isinstance(doc, dict):
            raise MalformedEvidenceError("TDX collateral must be a JSON object")
        known = set(_COLLATERAL_TEXT) | set(_COLLATERAL_HEX)
        unknown = sorted(set(doc) - known)
        missing = sorted(known - set(doc))
        if unknown or missing:
            what = f"unknown keys {unknown}" if unknown else f"missing keys {missing}"
            raise MalformedEvidenceError(f"TDX collateral has {what}")
        if not all(isinstance(v, str) for v in doc.values()):
            raise MalformedEvidenceError("TDX collateral values must be strings")
        for key in _COLLATERAL_HEX:
            try:
                bytes.fromhex(doc[key])
            except ValueError:
                raise MalformedEvidenceError(f"TDX collateral {key} is not hex") from None
        return cls(dict(doc))

    def to_json(self) -> bytes:
        """The PCCS JSON form."""
        return json.dumps(self.fields, sort_keys=True).encode()

    def _native(self) -> Any:
        import dcap_qvl

        f = self.fields
        return dcap_qvl.QuoteCollateralV3(
            f["pck_crl_issuer_chain"],
            bytes.fromhex(f["root_ca_crl"]),
            bytes.fromhex(f["pck_crl"]),
            f["tcb_info_issuer_chain"],
            f["tcb_info"],
            bytes.fromhex(f["tcb_info_signature"]),
            f["qe_identity_issuer_chain"],
            f["qe_identity"],
            bytes.fromhex(f["qe_identity_signature"]),
        )


def looks_like_tdx_quote(data: bytes) -> bool:
    """True when ``data`` starts like a DCAP quote (version 4/5, ECDSA-P256) of any TEE."""
    if len(data) < _HEADER:
        return False
    version, key_type, tee = struct.unpack_from("<HHI", data)
    return version in (4, 5) and key_type == _ECDSA_P256 and tee in (_TEE_TDX, _TEE_SGX)


def check_layout(quote: bytes) -> None:
    """Check a TDX quote's outer layout only (before fetching collateral for it).

    Raises:
        MalformedEvidenceError: truncated, oversized, SGX, unknown version or body type.
    """
    _layout(quote)


def td_report_span(quote: bytes) -> tuple[int, str, int, int]:
    """Where a TDX quote's TD report lies: quote version, TD report version, offset, size.

    Reads the header and (version 5) the body descriptor only; the rest of the quote is not
    looked at.

    Raises:
        MalformedEvidenceError: truncated, SGX, unknown version, key type or body type.
    """
    if len(quote) < _HEADER + 4:
        raise MalformedEvidenceError(f"the TDX quote is truncated ({len(quote)} bytes)")
    version, key_type, tee = struct.unpack_from("<HHI", quote)
    if version not in (4, 5):
        raise MalformedEvidenceError(f"unsupported quote version {version} (expected 4 or 5)")
    if tee == _TEE_SGX:
        raise MalformedEvidenceError("an SGX quote was given where a TDX quote is expected")
    if tee != _TEE_TDX:
        raise MalformedEvidenceError(f"unknown TEE type {tee:#x} in the quote header")
    if key_type != _ECDSA_P256:
        raise MalformedEvidenceError(f"unsupported attestation key type {key_type}")
    if version == 4:
        return version, "1.0", _HEADER, _V4_BODY
    if len(quote) < _HEADER + 6:
        raise MalformedEvidenceError("the TDX quote is truncated in its body descriptor")
    body_type, body_size = struct.unpack_from("<HI", quote, _HEADER)
    if body_type not in _V5_BODIES or _V5_BODIES[body_type][1] != body_size:
        raise MalformedEvidenceError(
            f"unsupported quote body (type {body_type}, {body_size} bytes)"
        )
    return version, _V5_BODIES[body_type][0], _HEADER + 6, body_size


def _layout(quote: bytes) -> tuple[int, str]:
    """Quote version and TD report version; the outer layout must hold exactly.

    Raises:
        MalformedEvidenceError: truncated, oversized, SGX, unknown version or body type.
    """
    if len(quote) > MAX_QUOTE_BYTES:
        raise MalformedEvidenceError(f"the TDX quote is larger than {MAX_QUOTE_BYTES} bytes")
    version, td_version, body, size = td_report_span(quote)
    offset = body + size
    if len(quote) < offset + 4:
        raise MalformedEvidenceError(f"the TDX quote is truncated ({len(quote)} bytes)")
    (sig_len,) = struct.unpack_from("<I", quote, offset)
    end = offset + 4 + sig_len
    if end > len(quote):
        raise MalformedEvidenceError(f"the TDX quote is truncated (signature data of {sig_len})")
    # Quote buffers are often handed over zero-padded; anything else after the quote is not.
    if quote[end:].strip(b"\0"):
        raise MalformedEvidenceError("the TDX quote is followed by extra bytes")
    _certification(quote[offset + 4 : end])
    return version, td_version


def _certification(sig: bytes) -> None:
    """The signature data's certification data: type 6 (QE report) holding type 5 (PCK chain),
    every size consistent. Nothing else is accepted, even where a parser would tolerate it.

    Raises:
        MalformedEvidenceError: another type, or sizes that do not add up.
    """
    outer = 128  # quote signature and attestation key
    if len(sig) < outer + 6:
        raise MalformedEvidenceError("the TDX quote's signature data is truncated")
    kind, size = struct.unpack_from("<HI", sig, outer)
    if kind != _QE_REPORT_CERT:
        raise MalformedEvidenceError(f"unsupported certification data type {kind} (expected 6)")
    if outer + 6 + size != len(sig):
        raise MalformedEvidenceError("the TDX quote's certification data size is inconsistent")
    inner = outer + 6 + 384 + 64  # QE report and its signature
    if len(sig) < inner + 2:
        raise MalformedEvidenceError("the TDX quote's QE report data is truncated")
    (auth,) = struct.unpack_from("<H", sig, inner)
    nested = inner + 2 + auth
    if len(sig) < nested + 6:
        raise MalformedEvidenceError("the TDX quote's QE authentication data is truncated")
    kind, size = struct.unpack_from("<HI", sig, nested)
    if kind != _PCK_CHAIN_CERT or nested + 6 + size != len(sig):
        raise MalformedEvidenceError(
            f"unsupported nested certification data (type {kind}; expected 5, the PCK chain)"
        )


_T = TypeVar("_T")


def dcap(call: Callable[[], _T], what: str) -> _T:
    """``call()``, a call into dcap-qvl on a quote from outside: the one place its exceptions
    become gpucc's.

    dcap-qvl reads the quote (and the PCK certificate inside it) when asked for a field, and
    raises ``ValueError`` for most faults, but any class may come out of a native library
    (a Rust panic arrives as ``PanicException``, a ``BaseException``).

    Raises:
        MalformedEvidenceError: ``what`` and dcap-qvl's reason, for any failure.
    """
    try:
        return call()
    except Exception as exc:  # whatever class the native library raises
        failure: BaseException = exc
    except BaseException as exc:
        if type(exc).__name__ != "PanicException":
            raise
        failure = exc
    text = " ".join(str(failure).split())[:300] or type(failure).__name__
    raise MalformedEvidenceError(f"{what}: {text}")


def _parse(quote: bytes) -> Any:
    import dcap_qvl

    parsed = dcap(lambda: dcap_qvl.parse_quote(quote), "the TDX quote cannot be parsed")
    if not dcap(parsed.is_tdx, "the TDX quote cannot be parsed"):
        raise MalformedEvidenceError("the quote is not a TDX quote")
    return parsed


def platform_of(quote: bytes) -> tuple[str, str]:
    """The platform a quote names: its FMSPC (12 hex digits) and PCK CA ("processor" or
    "platform"), read from the PCK certificate's Intel extension.

    Raises:
        MalformedEvidenceError: the quote cannot be parsed or names no (well-formed) platform.
    """
    import dcap_qvl

    what = "the TDX quote names no platform"
    parsed = dcap(lambda: dcap_qvl.parse_quote(quote), what)
    fmspc = dcap(lambda: str(parsed.fmspc()), what)
    ca = dcap(lambda: str(parsed.ca()), what)
    if not (len(fmspc) == 12 and all(c in "0123456789abcdefABCDEF" for c in fmspc)):
        raise MalformedEvidenceError("the TDX quote's FMSPC is malformed")
    if ca not in ("processor", "platform"):
        raise MalformedEvidenceError(f"the TDX quote's PCK CA {ca[:40]!r} is unknown")
    return fmspc, ca


def _chain(pem: bytes | str, what: str) -> list[x509.Certificate]:
    data = pem.encode() if isinstance(pem, str) else pem  # the strict reader's text: encodable
    return list(load_certificates(data, what=f"the {what}", error=MalformedEvidenceError))


def _collateral_chains(collateral: TdxCollateral) -> dict[str, list[x509.Certificate]]:
    """The collateral's certificate chains, parsed once, by what they are."""
    named = {name: name.replace("_", " ") for name in _CHAINS}
    return {what: _chain(collateral.fields[name], what) for name, what in named.items()}


def _root_check(
    parsed: Any, chains: dict[str, list[x509.Certificate]], root: x509.Certificate
) -> Check:
    pin = cert_sha256(root)
    pck = dcap(parsed.cert_chain_pem_bytes, "the TDX quote's PCK chain cannot be read")
    if pck is None:
        return Check(
            "cvm-root", "Chains end in Intel's root", CheckStatus.FAIL, "no PCK chain in quote"
        )
    every = {**chains, "quote's PCK chain": _chain(pck, "quote's PCK chain")}
    for what, certs in every.items():
        if not certs or cert_sha256(certs[-1]) != pin:
            reason = f"the {what} does not end in the pinned Intel SGX Root CA"
            return Check("cvm-root", "Chains end in Intel's root", CheckStatus.FAIL, reason)
    return Check("cvm-root", "Chains end in Intel's root", CheckStatus.PASS)


def _parse_date(text: Any, what: str) -> dt.datetime:
    if not isinstance(text, str):
        raise MalformedEvidenceError(f"TDX collateral {what} is missing")
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise MalformedEvidenceError(f"TDX collateral {what} is not a date") from None
    if when.tzinfo is None:
        raise MalformedEvidenceError(f"TDX collateral {what} has no time zone")
    return when


def validity_windows(
    collateral: TdxCollateral, chains: dict[str, list[x509.Certificate]] | None = None
) -> list[tuple[str, dt.datetime, dt.datetime]]:
    """(what, not before, not after) for every dated piece of collateral.

    ``chains``: the collateral's chains if the caller parsed them already.

    Raises:
        MalformedEvidenceError: a piece cannot be parsed or has no dates.
    """
    if chains is None:
        chains = _collateral_chains(collateral)
    f = collateral.fields
    out: list[tuple[str, dt.datetime, dt.datetime]] = []
    for key, name in (("tcb_info", "TCB info"), ("qe_identity", "QE identity")):
        doc = loads_untrusted(f[key], what=f"TDX collateral {name}", error=MalformedEvidenceError)
        if not isinstance(doc, dict):
            raise MalformedEvidenceError(f"TDX collateral {name} is not a JSON object")
        issued = _parse_date(doc.get("issueDate"), f"{name} issueDate")
        out.append((name, issued, _parse_date(doc.get("nextUpdate"), f"{name} nextUpdate")))
    for key, name in (("root_ca_crl", "root CA CRL"), ("pck_crl", "PCK CRL")):
        try:
            crl = x509.load_der_x509_crl(bytes.fromhex(f[key]))
        except ValueError:
            raise MalformedEvidenceError(f"TDX collateral {name} is not a DER CRL") from None
        if crl.next_update_utc is None:
            raise MalformedEvidenceError(f"TDX collateral {name} has no next update")
        out.append((name, crl.last_update_utc, crl.next_update_utc))
    for certs in chains.values():
        for cert in certs:
            name = f"certificate {cert.subject.rfc4514_string()}"
            out.append((name, cert.not_valid_before_utc, cert.not_valid_after_utc))
    return out


def _sound_time(
    windows: list[tuple[str, dt.datetime, dt.datetime]], now: dt.datetime
) -> tuple[dt.datetime | None, str]:
    """The time closest to ``now`` at which every window is open, or None and why none is.

    A window is open from its start to a second before its end: dcap-qvl, like a CRL's
    ``nextUpdate``, takes the end itself as expired, and it judges whole seconds.
    """
    latest = max(windows, key=lambda w: w[1])
    earliest = min(windows, key=lambda w: w[2])
    last = earliest[2] - _SECOND
    if latest[1] > last:
        why = (
            f"no time exists at which the collateral and the quote's PCK chain are all valid:"
            f" {earliest[0]} expired at {earliest[2]:%Y-%m-%dT%H:%M:%SZ}, before"
            f" {latest[0]} became valid at {latest[1]:%Y-%m-%dT%H:%M:%SZ}"
        )
        return None, why
    return min(max(now, latest[1]), last), ""


def _collateral_check(
    collateral: TdxCollateral,
    chains: dict[str, list[x509.Certificate]],
    now: dt.datetime,
    pck_chain: list[x509.Certificate],
) -> tuple[Check, dt.datetime | None, str]:
    """Whether every piece of collateral and every certificate of the quote's PCK chain is
    valid at ``now``; else the time closest to ``now`` at which all are (the *sound time*
    the quote's authenticity is checked at), or None and why no such time exists.

    A PCK certificate out of its validity is stale evidence, as stale collateral is: Intel
    reissues both, and neither says the quote was forged.
    """
    own = [
        (f"the quote's certificate {c.subject.rfc4514_string()}", c.not_valid_before_utc,
         c.not_valid_after_utc)
        for c in pck_chain
    ]  # fmt: skip
    windows = validity_windows(collateral, chains) + own
    for what, start, end in windows:
        if now < start or now >= end:
            state = f"not valid until {start:%Y-%m-%dT%H:%M:%SZ}"
            if now >= end:
                state = f"expired at {end:%Y-%m-%dT%H:%M:%SZ}"
            reason = f"{what} {state} (verification time {now:%Y-%m-%dT%H:%M:%SZ})"
            inside, why = _sound_time(windows, now)
            check = Check(
                "cvm-collateral",
                "Collateral current",
                CheckStatus.NOT_CHECKED,
                reason,
                collateral_missing=True,
            )
            return check, inside, why
    return Check("cvm-collateral", "Collateral current", CheckStatus.PASS), now, ""


def _claims(parsed: Any, quote_version: int, td_version: str) -> dict[str, Any]:
    report = parsed.report
    td_attributes: bytes = report.td_attributes
    claims: dict[str, Any] = {
        "kind": str(CvmKind.TDX),
        "quote_version": quote_version,
        "td_report_version": td_version,
        "report_data": report.report_data.hex(),
        "debug": bool(td_attributes[0] & _DEBUG_BIT),
        "mrtd": report.mr_td.hex(),
        "rtmr0": report.rt_mr0.hex(),
        "rtmr1": report.rt_mr1.hex(),
        "rtmr2": report.rt_mr2.hex(),
        "rtmr3": report.rt_mr3.hex(),
        "mrseam": report.mr_seam.hex(),
        "mrsignerseam": report.mr_signer_seam.hex(),
        "mrconfigid": report.mr_config_id.hex(),
        "mrowner": report.mr_owner.hex(),
        "mrownerconfig": report.mr_owner_config.hex(),
        "td_attributes": td_attributes.hex(),
        "xfam": report.xfam.hex(),
        "tee_tcb_svn": report.tee_tcb_svn.hex(),
        "tcb_status": None,
        "advisory_ids": [],
    }
    return claims


def _verify_native(
    quote: bytes, collateral: TdxCollateral, root: x509.Certificate, at: dt.datetime
) -> tuple[str | None, list[str], str]:
    """dcap-qvl's verdict at ``at``: (TCB status, advisories, failure reason or "")."""
    import dcap_qvl

    root_der = root.public_bytes(serialization.Encoding.DER)
    native = dcap(collateral._native, "the TDX collateral cannot be read")

    def verify() -> Any:
        try:
            return dcap_qvl.verify_with_root_ca(quote, native, root_der, int(at.timestamp()))
        except ValueError as refusal:  # dcap-qvl's verdict: the reason is the check's
            return refusal

    report = dcap(verify, "the TDX quote cannot be verified")
    if isinstance(report, ValueError):
        text = " ".join(str(report).split())
        if "Revoked" in text and "TCB status" in text:
            return "Revoked", [], "the platform's TCB status is Revoked"
        return None, [], text.removeprefix("Verification failed: ")
    return dcap(
        lambda: (str(report.status), [str(a) for a in report.advisory_ids], ""),
        "the TDX quote's verification result",
    )


def verify_tdx_quote(
    quote: bytes,
    collateral: TdxCollateral,
    *,
    now: dt.datetime,
    root: x509.Certificate | None = None,
) -> CvmFindings:
    """Verify a TDX quote against ``collateral`` at ``now``; no policy applied.

    Args:
        quote: the raw quote (as configfs-tsm's ``outblob`` gives it).
        collateral: Intel's collateral for the quote's platform (FMSPC).
        now: the verification time (timezone-aware).
        root: the trust anchor; Intel's pinned SGX Root CA when None.

    Returns:
        The findings: checks ``cvm-format``, ``cvm-root``, ``cvm-collateral``,
        ``cvm-quote`` and the claims.

    Raises:
        ValueError: ``now`` is naive.
        MalformedEvidenceError: the quote or the collateral cannot be parsed.
        TrustRootError: the packaged Intel root is damaged.
    """
    if now.tzinfo is None:
        raise ValueError("the verification time must be timezone-aware")
    quote_version, td_version = _layout(quote)
    parsed = _parse(quote)
    anchor = root if root is not None else intel_sgx_root()
    claims = dcap(lambda: _claims(parsed, quote_version, td_version), "the TD report")
    checks = [Check("cvm-format", "Quote parsed", CheckStatus.PASS)]
    chains = _collateral_chains(collateral)
    root_check = _root_check(parsed, chains, anchor)
    checks.append(root_check)
    pck_pem = parsed.cert_chain_pem_bytes()
    pck_chain = _chain(pck_pem, "quote's PCK chain") if pck_pem is not None else []
    current, at, no_time = _collateral_check(collateral, chains, now, pck_chain)
    checks.append(current)
    title = "Quote, PCK chain, QE and TCB info"
    if root_check.status is not CheckStatus.PASS:
        checks.append(Check("cvm-quote", title, CheckStatus.NOT_CHECKED, root_check.reason))
    elif at is None:
        # No time at which dcap-qvl could judge the quote against this collateral: its
        # signatures are still checked (they do not depend on time), so a forged quote is
        # refused, and TCB status and revocation stay undecided.
        from .tdx_offline import offline_quote_checks

        _, _, body, size = td_report_span(quote)
        fmspc = str(parsed.fmspc())
        checks += offline_quote_checks(quote, body + size, fmspc, anchor, now)[:-1]
        checks.append(Check("cvm-quote", title, CheckStatus.NOT_CHECKED, no_time, True))
    else:
        status, advisories, failure = _verify_native(quote, collateral, anchor, at)
        claims["tcb_status"], claims["advisory_ids"] = status, advisories
        if failure:
            checks.append(Check("cvm-quote", title, CheckStatus.FAIL, failure))
        else:
            note = ""
            if at != now:
                note = (
                    f"checked at {at:%Y-%m-%dT%H:%M:%SZ}, when the collateral and the quote's"
                    " PCK chain are all valid"
                )
            checks.append(Check("cvm-quote", title, CheckStatus.PASS, note=note))
    return CvmFindings(
        kind=CvmKind.TDX,
        checks=tuple(checks),
        claims=claims,
        report_data=bytes(parsed.report.report_data),
        evidence_sha256=hashlib.sha256(quote).digest(),
    )


def unverified_tdx_quote(
    quote: bytes, reason: str, *, now: dt.datetime, root: x509.Certificate | None = None
) -> CvmFindings:
    """A TDX quote judged without Intel's collateral: every collateral-free check (the PCK
    chain to ``root``, the QE report, the quote signature; :mod:`.tdx_offline`) and an
    undecided collateral check whose reason ends with ``reason`` (why there is none).

    TCB status and revocation stay undecided, but a check that ran and failed, here or in the
    policy (report data, debug, measurements, an event log), refuses the quote.

    Raises:
        MalformedEvidenceError: the quote cannot be parsed.
    """
    from .tdx_offline import offline_quote_checks

    quote_version, td_version = _layout(quote)
    parsed = _parse(quote)
    _, _, body, size = td_report_span(quote)
    anchor = root if root is not None else intel_sgx_root()
    checks = [Check("cvm-format", "Quote parsed", CheckStatus.PASS)]
    fmspc, _ = platform_of(quote)
    checks += offline_quote_checks(quote, body + size, fmspc, anchor, now)
    if reason:
        last = checks[-1]
        checks[-1] = Check(
            last.id, last.title, last.status, f"{last.reason} ({reason})", collateral_missing=True
        )
    return CvmFindings(
        kind=CvmKind.TDX,
        checks=tuple(checks),
        claims=dcap(lambda: _claims(parsed, quote_version, td_version), "the TD report"),
        report_data=bytes(parsed.report.report_data),
        evidence_sha256=hashlib.sha256(quote).digest(),
    )
