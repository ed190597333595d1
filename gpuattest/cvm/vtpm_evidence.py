"""vTPM evidence documents: CoCo's attestation-agent JSON (versions 0, 1, 2) and gpucc's own.

An Azure confidential VM's evidence is a TPM quote, the HCL report (:mod:`.hcl`) and, for
SEV-SNP, the VCEK; for TDX, the TD quote. CoCo's attestation agent writes it as JSON:

* version 0 (no ``version`` key): byte values as JSON arrays of numbers. SEV-SNP:
  ``{quote: {signature, message, pcrs}, report, vcek (PEM text)}``; TDX:
  ``{tpm_quote: {signature, message, pcrs}, hcl_report, td_quote}``.
* versions 1 and 2: ``{version, tpm_quote: {signature, message, pcrs} (hex), hcl_report,
  vcek | td_quote (base64url, padded)}``. Version 2 also has the relying party's report data
  in the runtime claims' ``user-data`` (zero-padded to 64 bytes).

gpucc's collected form (``gpucc evidence collect --cvm`` on a paravisor) is version 1's with
``format: "gpucc.vtpm/v1"`` in place of ``version`` and ``user_data: true|false`` (whether the
report data was written into ``user-data``, as in version 2). Every document is read strictly:
unknown or missing keys, wrong types, bad hex or base64url, and a VCEK beside a TDX HCL report
(or a TD quote beside an SEV-SNP one) are :class:`~gpuattest.errors.MalformedEvidenceError`.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from typing import Any

from gpucc.core.errors import MalformedEvidenceError
from gpucc.core.jsonio import loads_untrusted, require_int

from .hcl import HclReport, parse_hcl_report

__all__ = [
    "GPUCC_FORMAT",
    "VTPM_QUALIFYING_DATA_SIZE",
    "VtpmEvidence",
    "encode_vtpm_evidence",
    "looks_like_vtpm_evidence",
    "parse_vtpm_evidence",
    "vtpm_qualifying_data",
]

GPUCC_FORMAT = "gpucc.vtpm/v1"
_B64URL = re.compile(r"[A-Za-z0-9_-]*={0,2}")
_MAX_PCRS = 24


@dataclass(frozen=True)
class VtpmEvidence:
    """One vTPM evidence document, decoded.

    Attributes:
        version: ``"0"``, ``"1"``, ``"2"`` (CoCo) or :data:`GPUCC_FORMAT`.
        hcl: the parsed HCL report.
        quote: the TPMS_ATTEST bytes; ``signature`` the AK's signature over them.
        pcrs: the selected PCR values (SHA-256 bank) in ascending PCR order.
        vcek: SEV-SNP: the VCEK that came with the evidence (DER or PEM).
        td_quote: TDX: the TD quote.
        user_data_bound: the runtime claims' ``user-data`` must hold the report data.
    """

    version: str
    hcl: HclReport
    quote: bytes = field(repr=False)
    signature: bytes = field(repr=False)
    pcrs: tuple[bytes, ...] = field(repr=False)
    vcek: bytes | None = field(default=None, repr=False)
    td_quote: bytes | None = field(default=None, repr=False)
    user_data_bound: bool = False


def looks_like_vtpm_evidence(data: bytes) -> bool:
    """Whether ``data`` is a JSON object (the only vTPM evidence shape); proves nothing."""
    return data.lstrip()[:1] == b"{"


def _bad(what: str) -> MalformedEvidenceError:
    return MalformedEvidenceError(f"vTPM evidence: {what}")


def _keys(doc: Any, want: set[str], where: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise _bad(f"{where} is not a JSON object")
    if set(doc) != want:
        extra, missing = sorted(set(doc) - want), sorted(want - set(doc))
        raise _bad(f"{where} has unknown keys {extra}" if extra else f"{where} lacks {missing}")
    return doc


def _array(value: Any, what: str) -> bytes:
    if not isinstance(value, list) or not all(
        isinstance(b, int) and not isinstance(b, bool) and 0 <= b <= 255 for b in value
    ):
        raise _bad(f"'{what}' is not an array of byte values")
    return bytes(value)


def _hex(value: Any, what: str) -> bytes:
    try:
        if isinstance(value, str) and value.isascii():
            return bytes.fromhex(value)
    except ValueError:
        pass
    raise _bad(f"'{what}' is not hex")


def _b64url(value: Any, what: str) -> bytes:
    if not isinstance(value, str) or len(value) % 4 or not _B64URL.fullmatch(value):
        raise _bad(f"'{what}' is not padded base64url")
    try:
        return base64.urlsafe_b64decode(value)
    except ValueError:
        raise _bad(f"'{what}' is not padded base64url") from None


def _pcrs(values: Any, decode: Any) -> tuple[bytes, ...]:
    if not isinstance(values, list) or not 1 <= len(values) <= _MAX_PCRS:
        raise _bad(f"'pcrs' is not a list of 1 to {_MAX_PCRS} values")
    out = tuple(decode(v, "pcrs") for v in values)
    if any(len(v) != 32 for v in out):
        raise _bad("a PCR value is not 32 bytes (SHA-256)")
    return out


def _quote(doc: Any, decode: Any, where: str) -> tuple[bytes, bytes, tuple[bytes, ...]]:
    q = _keys(doc, {"signature", "message", "pcrs"}, where)
    return (
        decode(q["message"], "message"),
        decode(q["signature"], "signature"),
        _pcrs(q["pcrs"], decode),
    )


def _hcl(raw: bytes, tee: str) -> HclReport:
    hcl = parse_hcl_report(raw)
    if hcl.tee != tee:
        other = "a VCEK" if tee == "snp" else "a TD quote"
        raise _bad(f"the HCL report is from a {hcl.tee.upper()} VM but comes with {other}")
    return hcl


def parse_vtpm_evidence(data: bytes) -> VtpmEvidence:
    """Decode one vTPM evidence document (see the module docstring).

    Raises:
        MalformedEvidenceError: not one of the shapes above, or malformed JSON.
        MalformedHclReportError: the HCL report breaks its layout.
    """
    doc = loads_untrusted(data, what="vTPM evidence", error=MalformedEvidenceError, max_depth=8)
    if not isinstance(doc, dict):
        raise _bad("the document is not a JSON object")
    if "version" not in doc and "format" not in doc:
        return _version0(doc)
    if "format" in doc:
        if doc["format"] != GPUCC_FORMAT:
            raise _bad(f"unknown format {str(doc['format'])[:40]!r}")
        tail = "vcek" if "vcek" in doc else "td_quote"
        _keys(doc, {"format", "user_data", "tpm_quote", "hcl_report", tail}, "the document")
        if not isinstance(doc["user_data"], bool):
            raise _bad("'user_data' is not true or false")
        version, bound = GPUCC_FORMAT, bool(doc["user_data"])
    else:
        number = require_int(doc["version"], "vTPM evidence version", lo=1, hi=2, error=_bad)
        tail = "vcek" if "vcek" in doc else "td_quote"
        _keys(doc, {"version", "tpm_quote", "hcl_report", tail}, "the document")
        version, bound = str(number), number == 2
    message, signature, pcrs = _quote(doc["tpm_quote"], _hex, "'tpm_quote'")
    extra = _b64url(doc[tail], tail)
    hcl = _hcl(_b64url(doc["hcl_report"], "hcl_report"), "snp" if tail == "vcek" else "tdx")
    return VtpmEvidence(
        version,
        hcl,
        message,
        signature,
        pcrs,
        vcek=extra if tail == "vcek" else None,
        td_quote=extra if tail == "td_quote" else None,
        user_data_bound=bound,
    )


def _version0(doc: dict[str, Any]) -> VtpmEvidence:
    if "quote" in doc:  # SEV-SNP
        _keys(doc, {"quote", "report", "vcek"}, "the version 0 document")
        message, signature, pcrs = _quote(doc["quote"], _array, "'quote'")
        vcek = doc["vcek"]
        if not isinstance(vcek, str) or not vcek.isascii() or "BEGIN CERTIFICATE" not in vcek:
            raise _bad("'vcek' is not a PEM certificate")
        hcl = _hcl(_array(doc["report"], "report"), "snp")
        return VtpmEvidence("0", hcl, message, signature, pcrs, vcek=vcek.encode())
    _keys(doc, {"tpm_quote", "hcl_report", "td_quote"}, "the version 0 document")
    message, signature, pcrs = _quote(doc["tpm_quote"], _array, "'tpm_quote'")
    hcl = _hcl(_array(doc["hcl_report"], "hcl_report"), "tdx")
    td_quote = _array(doc["td_quote"], "td_quote")
    return VtpmEvidence("0", hcl, message, signature, pcrs, td_quote=td_quote)


def encode_vtpm_evidence(
    *,
    hcl_report: bytes,
    quote: bytes,
    signature: bytes,
    pcrs: list[bytes],
    vcek: bytes | None = None,
    td_quote: bytes | None = None,
    user_data: bool,
) -> dict[str, Any]:
    """gpucc's collected form (exactly one of ``vcek`` and ``td_quote``)."""
    if (vcek is None) == (td_quote is None):
        raise ValueError("give exactly one of vcek and td_quote")
    tail = ("vcek", vcek) if vcek is not None else ("td_quote", td_quote)
    assert tail[1] is not None
    return {
        "format": GPUCC_FORMAT,
        "user_data": user_data,
        "tpm_quote": {
            "signature": signature.hex(),
            "message": quote.hex(),
            "pcrs": [p.hex() for p in pcrs],
        },
        "hcl_report": base64.urlsafe_b64encode(hcl_report).decode(),
        tail[0]: base64.urlsafe_b64encode(tail[1]).decode(),
    }


#: The bytes of 64-byte CVM report data a vTPM quote carries as qualifying data: every TPM
#: accepts 32 (a TPM2B_DATA holds at most its largest digest; one without SHA-512, 48 bytes).
VTPM_QUALIFYING_DATA_SIZE = 32


def vtpm_qualifying_data(report_data: bytes) -> bytes:
    """The TPM quote's qualifying data standing for 64 bytes of CVM report data (the
    session binding of protocol version 2, or ``gpucc evidence collect --cvm``'s): their
    first 32 bytes. Truncating a SHA-512 value keeps it a 256-bit commitment."""
    if len(report_data) != 64:
        raise ValueError("CVM report data is 64 bytes")
    return report_data[:VTPM_QUALIFYING_DATA_SIZE]
