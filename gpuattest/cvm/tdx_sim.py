"""A simulated Intel TDX platform: quotes and collateral made the way Intel's are, signed by a
self-made root standing in for Intel's SGX Root CA.

Real quotes cannot carry gpucc's session binding (their report data was chosen by whoever made
them), so tests of the binding and of key release use these: a quote over chosen report data
and measurements, and collateral with a chosen TCB status, advisories, validity window and a
revoked PCK certificate if asked. The chain is PCK certificate (with Intel's SGX extension) ->
platform CA -> root; TCB info and QE identity are signed by a TCB-signing certificate under the
same root; CRLs are DER, signatures raw r||s, as Intel's PCS serves them. Nothing here is ever
trusted by default: verification must be given :attr:`SimulatedTdx.root`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import struct
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID

from .tdx import TdxCollateral

__all__ = [
    "SIMULATED_CMDLINE",
    "SIMULATED_KERNEL_DIGEST",
    "SIMULATED_MRTD",
    "SimulatedTdx",
    "simulated_boot_log",
    "simulated_tdx",
]

#: The MRTD of the simulated TD image (what a simulation's policy pins by default).
SIMULATED_MRTD = b"\x11" * 48
#: The simulated TD's boot: its kernel's Authenticode digest, initrd and command line.
SIMULATED_KERNEL_DIGEST = hashlib.sha384(b"gpucc simulated kernel").digest()
SIMULATED_INITRD = b"gpucc simulated initrd"
SIMULATED_CMDLINE = "console=hvc0 ro"


def simulated_boot_log(kernel_digest: bytes = SIMULATED_KERNEL_DIGEST) -> bytes:
    """The CC event log of the simulated TD's boot (:func:`.eventlog_build.boot_events`)."""
    from .eventlog_build import boot_events, build_event_log

    events = boot_events(
        kernel_digest=kernel_digest, initrd=SIMULATED_INITRD, cmdline=SIMULATED_CMDLINE
    )
    return build_event_log(events, padding=0)


_SGX_EXT = "1.2.840.113741.1.13.1"
_FMSPC = bytes.fromhex("50806f000000")
_PCE_ID = b"\x00\x00"
_CPUSVN = bytes([3, 3, 2, 2, 4, 1, 0, 5] + [0] * 8)
_PCESVN = 11
_QE_MRSIGNER = bytes.fromhex("dc9e2a7c6f948f17474e34a7fc43ed030f7c1563f1babddf6340c82e0e54a8c5")
_QE_VENDOR = bytes.fromhex("939a7233f79c4ca9940a0db3957f0607")
_TEE_TCB_SVN = bytes([6, 1, 3] + [0] * 13)  # TDX module version 1 (identity TDX_01), SVN 6


# --- minimal DER for Intel's SGX extension ----------------------------------------------------


def _tlv(tag: int, content: bytes) -> bytes:
    n = len(content)
    if n < 0x80:
        return bytes([tag, n]) + content
    size = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(size)]) + size + content


def _oid(dotted: str) -> bytes:
    arcs = [int(a) for a in dotted.split(".")]
    out = bytearray([40 * arcs[0] + arcs[1]])
    for arc in arcs[2:]:
        chunk = [arc & 0x7F]
        arc >>= 7
        while arc:
            chunk.append(0x80 | (arc & 0x7F))
            arc >>= 7
        out += bytes(reversed(chunk))
    return _tlv(0x06, bytes(out))


def _int(value: int) -> bytes:
    raw = value.to_bytes(value.bit_length() // 8 + 1, "big")
    return _tlv(0x02, raw)


def _seq(*items: bytes) -> bytes:
    return _tlv(0x30, b"".join(items))


def _entry(arc: str, value: bytes) -> bytes:
    return _seq(_oid(f"{_SGX_EXT}.{arc}"), value)


def _sgx_extension(ppid: bytes) -> bytes:
    tcb = [_entry(f"2.{i + 1}", _int(svn)) for i, svn in enumerate(_CPUSVN)]
    tcb += [_entry("2.17", _int(_PCESVN)), _entry("2.18", _tlv(0x04, _CPUSVN))]
    return _seq(
        _entry("1", _tlv(0x04, ppid)),
        _entry("2", _seq(*tcb)),
        _entry("3", _tlv(0x04, _PCE_ID)),
        _entry("4", _tlv(0x04, _FMSPC)),
        _entry("5", _tlv(0x0A, b"\x00")),  # SGX type: standard
    )


# --- keys, certificates, signatures -----------------------------------------------------------


def _name(cn: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, cn),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gpucc simulation (not Intel)"),
        ]
    )


def _cert(
    cn: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    start: dt.datetime,
    *,
    ca: bool,
    serial: int,
    extra: bytes | None = None,
    end: dt.datetime | None = None,
) -> x509.Certificate:
    issuer_name, issuer_key = issuer if issuer else (_name(cn), key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(start)
        .not_valid_after(end if end is not None else start + dt.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=not ca,
                content_commitment=not ca,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=ca,
                crl_sign=ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
    )
    if extra is not None:
        ext = x509.UnrecognizedExtension(x509.ObjectIdentifier(_SGX_EXT), extra)
        builder = builder.add_extension(ext, critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _raw_sig(key: ec.EllipticCurvePrivateKey, data: bytes) -> bytes:
    r, s = decode_dss_signature(key.sign(data, ec.ECDSA(hashes.SHA256())))
    return r.to_bytes(32, "big") + s.to_bytes(32, "big")


def _raw_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    point = key.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    return point[1:]


def _pem(*certs: x509.Certificate) -> str:
    return "".join(c.public_bytes(serialization.Encoding.PEM).decode() for c in certs)


def _crl(
    issuer: x509.Certificate,
    key: ec.EllipticCurvePrivateKey,
    start: dt.datetime,
    end: dt.datetime,
    revoked: tuple[int, ...] = (),
) -> bytes:
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(issuer.subject)
        .last_update(start)
        .next_update(end)
        .add_extension(x509.CRLNumber(1), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), critical=False
        )
    )
    for serial in revoked:
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(start).build()
        )
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.DER)


_XFAM = bytes.fromhex("e702060000000000")


def _td_attributes(debug: bool) -> bytes:
    """TDATTRIBUTES: DEBUG (bit 0) as asked, SEPT_VE_DISABLE (bit 28) set."""
    return (0x01 if debug else 0x00).to_bytes(1, "little") + bytes([0, 0, 0x10]) + bytes(4)


def _iso(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class SimulatedTdx:
    """One simulated platform: its root, CAs, PCK and attestation keys (see the module doc)."""

    root: x509.Certificate
    _root_key: ec.EllipticCurvePrivateKey
    _platform_ca: x509.Certificate
    _platform_key: ec.EllipticCurvePrivateKey
    _pck: x509.Certificate
    _pck_key: ec.EllipticCurvePrivateKey
    _tcb_signer: x509.Certificate
    _tcb_key: ec.EllipticCurvePrivateKey
    _attestation_key: ec.EllipticCurvePrivateKey
    created: dt.datetime

    def quote(
        self,
        report_data: bytes,
        *,
        mrtd: bytes = SIMULATED_MRTD,
        rtmrs: tuple[bytes, bytes, bytes, bytes] = (
            b"\x20" * 48,
            b"\x21" * 48,
            b"\x22" * 48,
            bytes(48),
        ),
        debug: bool = False,
        version: int = 4,
        td_report: str = "1.0",
        event_log: bytes | None = None,
    ) -> bytes:
        """A TDX quote (version 4, or 5 with TD report 1.0 or 1.5) over ``report_data``.

        With ``event_log`` (a CC event log, :mod:`.eventlog_build`) the RTMRs are the log's
        replay instead of ``rtmrs``: the TD booted what the log says.
        """
        if len(report_data) != 64:
            raise ValueError("report data is 64 bytes")
        if event_log is not None:
            from .eventlog import parse_event_log

            replayed = parse_event_log(event_log).replay()
            rtmrs = (replayed["rtmr0"], replayed["rtmr1"], replayed["rtmr2"], replayed["rtmr3"])
        header = struct.pack("<HHIHH", version, 2, 0x81, 0, 0) + _QE_VENDOR + bytes(20)
        attributes = _td_attributes(debug)
        body = b"".join(
            [
                _TEE_TCB_SVN,
                b"\x5b" * 48,  # MRSEAM
                bytes(48),  # MRSIGNERSEAM (Intel's TDX module: zero)
                bytes(8),  # SEAMATTRIBUTES
                attributes,  # TDATTRIBUTES
                _XFAM,
                mrtd,
                bytes(48 * 3),  # MRCONFIGID, MROWNER, MROWNERCONFIG
                *rtmrs,
                report_data,
            ]
        )
        if td_report == "1.5":
            body += _TEE_TCB_SVN + bytes(48)  # TEE_TCB_SVN2, MRSERVICETD
        if version == 5:
            body = struct.pack("<HI", 2 if td_report == "1.0" else 3, len(body)) + body
        auth = b"\xa5" * 32
        att_key = _raw_key(self._attestation_key)
        qe_data = hashlib.sha256(att_key + auth).digest() + bytes(32)
        qe_report = b"".join(
            [
                _CPUSVN,
                bytes(4),  # MISCSELECT
                bytes(28),
                bytes.fromhex("11000000000000000000000000000000"),  # ATTRIBUTES
                b"\x42" * 32,  # MRENCLAVE
                bytes(32),
                _QE_MRSIGNER,
                bytes(96),
                struct.pack("<HH", 2, 6),  # ISVPRODID, ISVSVN
                bytes(60),
                qe_data,
            ]
        )
        chain = _pem(self._pck, self._platform_ca, self.root).encode()
        inner = (
            qe_report
            + _raw_sig(self._pck_key, qe_report)
            + struct.pack("<H", len(auth))
            + auth
            + struct.pack("<HI", 5, len(chain))
            + chain
        )
        signed = header + body
        sig_data = (
            _raw_sig(self._attestation_key, signed)
            + att_key
            + struct.pack("<HI", 6, len(inner))
            + inner
        )
        return signed + struct.pack("<I", len(sig_data)) + sig_data

    def td_report(
        self,
        report_data: bytes,
        *,
        mrtd: bytes = SIMULATED_MRTD,
        rtmrs: tuple[bytes, bytes, bytes, bytes] = (
            b"\x20" * 48,
            b"\x21" * 48,
            b"\x22" * 48,
            bytes(48),
        ),
        debug: bool = False,
    ) -> bytes:
        """A TDREPORT (1024 bytes, type 0x81) of a TD on this platform, as TDG.MR.REPORT
        returns it and an Azure paravisor stores it in its HCL report; its MAC is not
        simulated. :meth:`quote_td_report` turns it into the quote :meth:`quote` would give."""
        if len(report_data) != 64:
            raise ValueError("report data is 64 bytes")
        out = bytearray(1024)
        out[0:4] = bytes([0x81, 0, 0, 0])  # REPORTTYPE: TDX, subtype 0, version 0
        out[16:32] = _CPUSVN
        out[128:192] = report_data
        out[512:520] = _td_attributes(debug)
        out[520:528] = _XFAM
        out[528:576] = mrtd
        out[720:912] = b"".join(rtmrs)
        return bytes(out)

    def quote_td_report(self, td_report: bytes, *, version: int = 4) -> bytes:
        """The quote of a TDREPORT from :meth:`td_report`: what the platform's quoting
        enclave (on Azure, behind the paravisor's quote endpoint) answers.

        Raises:
            ValueError: not a 1024-byte TDREPORT of type 0x81.
        """
        if len(td_report) != 1024 or td_report[0] != 0x81:
            raise ValueError("a TDREPORT is 1024 bytes of type 0x81")
        rtmrs = tuple(td_report[720 + 48 * i : 768 + 48 * i] for i in range(4))
        return self.quote(
            td_report[128:192],
            mrtd=td_report[528:576],
            rtmrs=(rtmrs[0], rtmrs[1], rtmrs[2], rtmrs[3]),
            debug=bool(td_report[512] & 0x01),
            version=version,
        )

    def collateral(
        self,
        *,
        issued: dt.datetime,
        valid_days: int = 30,
        tcb_status: str = "UpToDate",
        advisories: tuple[str, ...] = (),
        revoke_pck: bool = False,
    ) -> TdxCollateral:
        """Collateral issued at ``issued``, valid ``valid_days``; the platform's TCB level
        carries ``tcb_status`` and ``advisories``."""
        end = issued + dt.timedelta(days=valid_days)
        sgx = [{"svn": svn} for svn in _CPUSVN]
        tdx = [{"svn": svn} for svn in (5, 0, 2)] + [{"svn": 0}] * 13
        level: dict[str, object] = {
            "tcb": {"sgxtcbcomponents": sgx, "pcesvn": _PCESVN, "tdxtcbcomponents": tdx},
            "tcbDate": "2024-03-13T00:00:00Z",
            "tcbStatus": tcb_status,
        }
        if advisories:
            level["advisoryIDs"] = list(advisories)
        module = {"mrsigner": "00" * 48, "attributes": "00" * 8, "attributesMask": "FF" * 8}
        identity = {
            "id": "TDX_01",
            **module,
            "tcbLevels": [
                {"tcb": {"isvsvn": 4}, "tcbDate": "2024-03-13T00:00:00Z", "tcbStatus": "UpToDate"}
            ],
        }
        tcb_info = json.dumps(
            {
                "id": "TDX",
                "version": 3,
                "issueDate": _iso(issued),
                "nextUpdate": _iso(end),
                "fmspc": _FMSPC.hex().upper(),
                "pceId": _PCE_ID.hex(),
                "tcbType": 0,
                "tcbEvaluationDataNumber": 17,
                "tdxModule": module,
                "tdxModuleIdentities": [identity],
                "tcbLevels": [level],
            },
            separators=(",", ":"),
        )
        qe_identity = json.dumps(
            {
                "id": "TD_QE",
                "version": 2,
                "issueDate": _iso(issued),
                "nextUpdate": _iso(end),
                "tcbEvaluationDataNumber": 17,
                "miscselect": "00000000",
                "miscselectMask": "FFFFFFFF",
                "attributes": "11000000000000000000000000000000",
                "attributesMask": "FBFFFFFFFFFFFFFF0000000000000000",
                "mrsigner": _QE_MRSIGNER.hex().upper(),
                "isvprodid": 2,
                "tcbLevels": [
                    {
                        "tcb": {"isvsvn": 4},
                        "tcbDate": "2024-03-13T00:00:00Z",
                        "tcbStatus": "UpToDate",
                    }
                ],
            },
            separators=(",", ":"),
        )
        revoked = (self._pck.serial_number,) if revoke_pck else ()
        signer_chain = _pem(self._tcb_signer, self.root)
        fields = {
            "pck_crl_issuer_chain": _pem(self._platform_ca, self.root),
            "root_ca_crl": _crl(self.root, self._root_key, issued, end).hex(),
            "pck_crl": _crl(self._platform_ca, self._platform_key, issued, end, revoked).hex(),
            "tcb_info_issuer_chain": signer_chain,
            "tcb_info": tcb_info,
            "tcb_info_signature": _raw_sig(self._tcb_key, tcb_info.encode()).hex(),
            "qe_identity_issuer_chain": signer_chain,
            "qe_identity": qe_identity,
            "qe_identity_signature": _raw_sig(self._tcb_key, qe_identity.encode()).hex(),
        }
        return TdxCollateral(fields)


def simulated_tdx(
    created: dt.datetime, *, pck_valid: tuple[dt.datetime, dt.datetime] | None = None
) -> SimulatedTdx:
    """A fresh simulated platform; its certificates are valid from a year before ``created``
    for ten years, except the PCK certificate where ``pck_valid`` (not before, not after)
    gives its own window (a platform certified later, or a PCK certificate that expired)."""
    keys = [ec.generate_private_key(ec.SECP256R1()) for _ in range(5)]
    root_key, platform_key, pck_key, tcb_key, attestation_key = keys
    start = created - dt.timedelta(days=365)
    root = _cert("Simulated SGX Root CA", root_key, None, start, ca=True, serial=1)
    anchor = (root.subject, root_key)
    platform = _cert("Simulated PCK Platform CA", platform_key, anchor, start, ca=True, serial=2)
    pck = _cert(
        "Simulated PCK Certificate",
        pck_key,
        (platform.subject, platform_key),
        pck_valid[0] if pck_valid is not None else start,
        ca=False,
        serial=int.from_bytes(hashlib.sha256(_raw_key(pck_key)).digest()[:8], "big"),
        extra=_sgx_extension(hashlib.sha256(_raw_key(pck_key)).digest()[:16]),
        end=pck_valid[1] if pck_valid is not None else None,
    )
    signer = _cert("Simulated TCB Signing", tcb_key, anchor, start, ca=False, serial=3)
    return SimulatedTdx(
        root,
        root_key,
        platform,
        platform_key,
        pck,
        pck_key,
        signer,
        tcb_key,
        attestation_key,
        created,
    )
