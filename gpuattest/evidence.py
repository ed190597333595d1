"""GPU evidence: the value objects and the file formats they travel in.

Formats read:

* NVAT evidence JSON (what ``nvattest collect-evidence`` and ``gpucc evidence
  collect`` write): a JSON array of ``{"arch", "nonce", "evidence": base64
  report, "certificate": base64 PEM chain}``; also the ``{"evidences": [...]}``
  wrapper ``nvattest --format json`` prints. Unknown keys are ignored; gpucc adds
  optional ``uuid``, ``driver_version``, ``vbios_version`` and ``cc_state``.
* NVIDIA's CMW evidence files (a JSON object with ``"__cmwc_t"``), recognised by
  content wherever evidence JSON is read (:mod:`gpuattest.cmw`).
* A raw report (lower-case hex text, as NVIDIA's samples come, or binary) with a
  separate PEM chain file.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpucc.core.errors import MalformedEvidenceError
from gpucc.core.files import read_capped
from gpucc.core.jsonio import loads_untrusted

__all__ = [
    "MAX_EVIDENCE_FILE_BYTES",
    "CcState",
    "EvidenceSet",
    "GpuEvidence",
    "NotEvidenceJsonError",
    "arch_of_chain",
    "dump_cmw",
    "dump_evidence_json",
    "load_cmw",
    "load_evidence_file",
    "load_evidence_json",
    "load_raw_evidence",
    "parse_nonce_hex",
]

# 64 GPUs of 8 KiB reports and 5 KiB chains, base64: far below this.
MAX_EVIDENCE_FILE_BYTES = 4 * 1024 * 1024
MAX_GPUS = 64

#: The NVSwitch architectures whose evidence gpucc verifies (nvattest's name: LS10).
SWITCH_ARCHITECTURES = frozenset({"LS10"})


def is_switch_arch(arch: str) -> bool:
    """True for an NVSwitch architecture name (case-insensitive)."""
    return arch.strip().upper() in SWITCH_ARCHITECTURES


class NotEvidenceJsonError(MalformedEvidenceError):
    """A file read as evidence JSON is not JSON at all (perhaps a raw report)."""


def parse_nonce_hex(text: str) -> bytes:
    """A 32-byte nonce from 64 hex characters.

    Raises:
        MalformedEvidenceError: not exactly 64 hex characters.
    """
    cleaned = text.strip().lower()
    if cleaned.startswith("0x"):
        cleaned = cleaned[2:]
    if len(cleaned) != 64:
        raise MalformedEvidenceError(f"a nonce is 64 hex characters, got {len(cleaned)}")
    try:
        return bytes.fromhex(cleaned)
    except ValueError:
        raise MalformedEvidenceError("the nonce is not hexadecimal") from None


@dataclass(frozen=True)
class CcState:
    """Confidential-computing state as reported by NVML (self-reported, unsigned)."""

    cc_feature: bool
    devtools_mode: bool
    multi_gpu_mode: int

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "cc_feature": self.cc_feature,
            "devtools_mode": self.devtools_mode,
            "multi_gpu_mode": self.multi_gpu_mode,
        }


@dataclass(frozen=True)
class GpuEvidence:
    """Evidence for one GPU: its report and certificate chain as collected."""

    report: bytes = field(repr=False)
    cert_chain_pem: bytes = field(repr=False)
    arch: str = "HOPPER"
    nonce: bytes | None = None
    uuid: str | None = None
    driver_version: str | None = None
    vbios_version: str | None = None
    #: Unsigned hints that came with the evidence (a CMW file's ``hints``): used only to
    #: choose which reference values to look up, never to decide.
    hints: Mapping[str, str] | None = None


@dataclass(frozen=True)
class EvidenceSet:
    """Evidence for every GPU of one host, plus where it came from."""

    gpus: tuple[GpuEvidence, ...]
    source: str = "file"
    cc: CcState | None = None


def _b64(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise MalformedEvidenceError(f"{what} must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise MalformedEvidenceError(f"{what} is not valid base64") from None


def _opt_str(entry: dict[str, Any], key: str, i: int) -> str | None:
    value = entry.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise MalformedEvidenceError(f"evidence entry {i}: {key} must be a string")
    return value


def load_evidence_json(data: bytes) -> EvidenceSet:
    """Parse NVAT evidence JSON.

    Raises:
        MalformedEvidenceError: not JSON, wrong shape, bad base64 or hex.
    """
    if len(data) > MAX_EVIDENCE_FILE_BYTES:
        raise MalformedEvidenceError(f"evidence is larger than {MAX_EVIDENCE_FILE_BYTES} bytes")
    doc = loads_untrusted(data, what="evidence", error=MalformedEvidenceError)
    if isinstance(doc, dict) and "__cmwc_t" in doc:  # a CMW collection (cmw.is_cmw)
        return load_cmw(doc)
    source = "file"
    cc: CcState | None = None
    if isinstance(doc, dict) and isinstance(doc.get("evidences"), list):
        entries = doc["evidences"]
    elif isinstance(doc, list):
        entries = doc
    else:
        raise MalformedEvidenceError("evidence JSON must be a list of GPU evidence objects")
    if not entries:
        raise MalformedEvidenceError("evidence JSON holds no GPU evidence")
    if len(entries) > MAX_GPUS:
        raise MalformedEvidenceError(f"evidence JSON holds more than {MAX_GPUS} entries")
    gpus: list[GpuEvidence] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise MalformedEvidenceError(f"evidence entry {i} is not an object")
        for key in ("evidence", "certificate"):
            if key not in entry:
                raise MalformedEvidenceError(f"evidence entry {i} lacks '{key}'")
        arch = entry.get("arch", "HOPPER")
        if not isinstance(arch, str):
            raise MalformedEvidenceError(f"evidence entry {i}: arch must be a string")
        nonce_text = entry.get("nonce")
        nonce = None
        if nonce_text is not None:
            if not isinstance(nonce_text, str):
                raise MalformedEvidenceError(f"evidence entry {i}: nonce must be hex text")
            nonce = parse_nonce_hex(nonce_text)
        state = entry.get("cc_state")
        if isinstance(state, dict):
            try:
                cc = CcState(
                    cc_feature=bool(state["cc_feature"]),
                    devtools_mode=bool(state["devtools_mode"]),
                    multi_gpu_mode=int(state.get("multi_gpu_mode", 0)),
                )
            except (KeyError, TypeError, ValueError):
                raise MalformedEvidenceError(f"evidence entry {i}: cc_state is malformed") from None
            source = str(entry.get("source", "file"))
        gpus.append(
            GpuEvidence(
                report=_b64(entry["evidence"], f"evidence entry {i} report"),
                cert_chain_pem=_b64(entry["certificate"], f"evidence entry {i} certificate"),
                arch=arch.upper(),
                nonce=nonce,
                uuid=_opt_str(entry, "uuid", i),
                driver_version=_opt_str(entry, "driver_version", i),
                vbios_version=_opt_str(entry, "vbios_version", i),
            )
        )
    return EvidenceSet(gpus=tuple(gpus), source=source, cc=cc)


def load_cmw(doc: Any) -> EvidenceSet:
    """The evidence in a parsed CMW collection (:mod:`gpuattest.cmw`); each device's
    architecture is read from its leaf certificate, as for a raw report.

    Raises:
        UnsupportedFormatError, MalformedEvidenceError: see :func:`gpuattest.cmw.read_cmw`.
    """
    from .cmw import read_cmw

    items = read_cmw(doc)
    if len(items) > MAX_GPUS:
        raise MalformedEvidenceError(f"CMW evidence holds more than {MAX_GPUS} items")
    return EvidenceSet(
        gpus=tuple(
            GpuEvidence(
                report=item.report,
                cert_chain_pem=item.chain,
                arch=arch_of_chain(item.chain),
                nonce=item.nonce,
                hints=item.hints,
            )
            for item in items
        )
    )


def dump_cmw(evidence: EvidenceSet) -> bytes:
    """Serialise to NVIDIA's CMW verifier input: ``gpu_N`` and ``switch_N`` items."""
    counts = {"gpu": 0, "switch": 0}
    from .cmw import CmwItem, write_cmw

    items: list[CmwItem] = []
    for gpu in evidence.gpus:
        kind = "switch" if is_switch_arch(gpu.arch) else "gpu"
        items.append(CmwItem(f"{kind}_{counts[kind]}", gpu.report, gpu.cert_chain_pem, gpu.nonce))
        counts[kind] += 1
    return write_cmw(items)


def dump_evidence_json(evidence: EvidenceSet) -> bytes:
    """Serialise to NVAT evidence JSON (plus gpucc's optional keys)."""
    out: list[dict[str, Any]] = []
    for gpu in evidence.gpus:
        entry: dict[str, Any] = {
            "arch": gpu.arch,
            "nonce": gpu.nonce.hex() if gpu.nonce is not None else None,
            "evidence": base64.b64encode(gpu.report).decode(),
            "certificate": base64.b64encode(gpu.cert_chain_pem).decode(),
        }
        for key in ("uuid", "driver_version", "vbios_version"):
            value = getattr(gpu, key)
            if value is not None:
                entry[key] = value
        if evidence.cc is not None:
            entry["cc_state"] = evidence.cc.to_dict()
            entry["source"] = evidence.source
        out.append(entry)
    return (json.dumps(out, indent=2) + "\n").encode()


def _read_capped(path: Path, what: str) -> bytes:
    data = read_capped(path, MAX_EVIDENCE_FILE_BYTES, what=what)
    if len(data) > MAX_EVIDENCE_FILE_BYTES:
        raise MalformedEvidenceError(f"{what} {path} exceeds {MAX_EVIDENCE_FILE_BYTES} bytes")
    return data


def _decode_report(data: bytes) -> bytes:
    """Hex text (with optional whitespace) or binary."""
    stripped = data.strip()
    if stripped and all(c in b"0123456789abcdefABCDEF" for c in stripped):
        if len(stripped) % 2:
            raise MalformedEvidenceError("hex report has an odd number of digits")
        return bytes.fromhex(stripped.decode())
    if data[:1] == b"\x11":
        return data
    raise MalformedEvidenceError("report is neither hex text nor a binary SPDM report")


# The chip in the leaf certificate's common name, and the architecture it belongs to.
_LEAF_CHIPS = (
    ("GB1", "BLACKWELL"),
    ("GB2", "BLACKWELL"),
    ("GH1", "HOPPER"),
    ("GR1", "RUBIN"),
    ("LS_10", "LS10"),
)


def arch_of_chain(chain_pem: bytes) -> str:
    """The architecture a raw report's chain names in its leaf's common name (``GH100 A01
    GSP FMC LF`` is Hopper, ``GB100 ...`` Blackwell, ``LS_10 ...`` an NVSwitch); HOPPER
    when the leaf names none of them (the chain check then judges the chain).

    Raises:
        MalformedCertificateError: the chain cannot be parsed (any certificate in it).
    """
    from cryptography import x509

    from .chain import load_pem_chain

    leaf = load_pem_chain(chain_pem)[0]  # MalformedCertificateError for a corrupt chain
    names = leaf.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    cn = str(names[0].value) if names else ""
    for prefix, arch in _LEAF_CHIPS:
        if cn.startswith(prefix):
            return arch
    return "HOPPER"


def load_raw_evidence(report_path: Path, chain_path: Path, arch: str | None = None) -> EvidenceSet:
    """One device's evidence from a raw report file and a PEM chain file (``arch`` None:
    read from the chain's leaf, see :func:`arch_of_chain`).

    Raises:
        MalformedEvidenceError: unreadable or undecodable files.
        MalformedCertificateError: the chain cannot be parsed.
    """
    report = _decode_report(_read_capped(report_path, "report"))
    chain = _read_capped(chain_path, "certificate chain")
    arch = arch or arch_of_chain(chain)
    return EvidenceSet(gpus=(GpuEvidence(report=report, cert_chain_pem=chain, arch=arch),))


def load_evidence_file(
    path: Path, cert_chain: Path | None = None, *, arch: str | None = None
) -> EvidenceSet:
    """Load evidence JSON, or a raw report when ``cert_chain`` is given.

    Raises:
        NotEvidenceJsonError: without ``cert_chain``, the file is not JSON.
        MalformedEvidenceError: unreadable or malformed input.
    """
    if cert_chain is not None:
        return load_raw_evidence(path, cert_chain, arch)
    data = _read_capped(path, "evidence file")
    if data.lstrip()[:1] in (b"[", b"{"):
        try:
            return load_evidence_json(data)
        except MalformedEvidenceError as exc:
            if getattr(exc, "path", None) is None:
                exc.path = path  # type: ignore[attr-defined]  # the file it is about
            raise
    raise NotEvidenceJsonError(f"{path} is not evidence JSON")
