"""One rule set for every chain: each kind of chain meets the same hostile chains, same refusal.

The kinds are the profiles the verifiers really pass (GPU device, RIM signing, OCSP responder,
JWKS x5c, SEV-SNP VCEK). Each hostile chain is built, for each kind, in that kind's own shape
(its length; RSA-PSS SHA-384 CA keys for SEV-SNP, ECDSA P-384 for NVIDIA's) and must be
refused with the same :class:`ChainFault`.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509.oid import NameOID

from gpucc.gpuattest.cvm.snp import VCEK_CHAIN
from gpucc.gpuattest.jwks import X5C_CHAIN
from gpucc.gpuattest.ocsp_response import RESPONDER_CHAIN
from gpucc.gpuattest.rim import RIM_CHAIN
from gpucc.gpuattest.verifier import DEVICE_CHAIN
from gpucc.gpuattest.x509chain import (
    MAX_CHAIN_CERTS,
    ChainFault,
    ChainProfile,
    ChainStatus,
    validate_chain,
    validity_fault,
)

UTC = dt.UTC
NOW = dt.datetime(2026, 1, 15, 12, tzinfo=UTC)
START = dt.datetime(2021, 1, 1, tzinfo=UTC)
END = dt.datetime(2099, 1, 1, tzinfo=UTC)
_PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA384()), salt_length=48)

Key = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


@dataclass(frozen=True)
class Kind:
    """A kind of chain: the profile its verifier passes and the shape of its chains."""

    profile: ChainProfile
    length: int  # the profile's exact length, or a typical one where it has none
    pss: bool  # CA keys RSA, certificates signed with RSA-PSS SHA-384 (AMD's shape)


KINDS = {
    "gpu-device": Kind(DEVICE_CHAIN, 5, pss=False),
    "rim": Kind(RIM_CHAIN, 4, pss=False),
    "ocsp-responder": Kind(RESPONDER_CHAIN, 3, pss=False),
    "jwks-x5c": Kind(X5C_CHAIN, 3, pss=False),
    "snp-vcek": Kind(VCEK_CHAIN, 3, pss=True),
}


@functools.cache
def _key(kind_pss: bool, index: int) -> Key:
    """Keys by position, made once: CA keys are RSA for the SEV-SNP shape."""
    if kind_pss and index > 0:
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return ec.generate_private_key(ec.SECP384R1())


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(
    *,
    subject: str,
    issuer: str,
    key: Key,
    signer: Key,
    ca: bool | None,
    path_length: int | None = None,
    cert_sign: bool = True,
    critical_oid: str | None = None,
    not_before: dt.datetime = START,
    not_after: dt.datetime = END,
) -> x509.Certificate:
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
    )
    if ca is not None:
        constraints = x509.BasicConstraints(ca=ca, path_length=path_length if ca else None)
        builder = builder.add_extension(constraints, critical=True)
    if ca:
        usage = x509.KeyUsage(
            digital_signature=False,
            content_commitment=False,
            key_encipherment=False,
            data_encipherment=False,
            key_agreement=False,
            key_cert_sign=cert_sign,
            crl_sign=True,
            encipher_only=False,
            decipher_only=False,
        )
        builder = builder.add_extension(usage, critical=True)
    if critical_oid is not None:
        ext = x509.UnrecognizedExtension(x509.ObjectIdentifier(critical_oid), b"\x05\x00")
        builder = builder.add_extension(ext, critical=True)
    if isinstance(signer, rsa.RSAPrivateKey):
        return builder.sign(signer, hashes.SHA384(), rsa_padding=_PSS)
    return builder.sign(signer, hashes.SHA384())


def build(
    kind: Kind,
    n: int,
    *,
    root_path_length: int | None = None,
    issuer_not_ca: bool = False,
    issuer_no_cert_sign: bool = False,
    leaf_critical: bool = False,
    leaf_window: tuple[dt.datetime, dt.datetime] = (START, END),
    forged_leaf: bool = False,
    pss: bool | None = None,
) -> list[x509.Certificate]:
    """A chain of ``n`` certificates in ``kind``'s shape, leaf first, root last."""
    pss = kind.pss if pss is None else pss
    names = [f"{'leaf' if i == 0 else 'ca'} {i} of {n}" for i in range(n)]
    keys = [_key(pss, i) for i in range(n)]
    certs: list[x509.Certificate] = []
    for i in range(n):
        is_root = i == n - 1
        issuer_i = i if is_root else i + 1
        signer = keys[issuer_i]
        if i == 0 and forged_leaf:  # the right issuer name, another key
            signer = _key(pss, n + 1)
        certs.append(
            _cert(
                subject=names[i],
                issuer=names[issuer_i],
                key=keys[i],
                signer=signer,
                ca=None if i == 0 else not (i == 1 and issuer_not_ca),
                path_length=root_path_length if is_root else None,
                cert_sign=not (i == 1 and issuer_no_cert_sign),
                critical_oid="1.3.6.1.4.1.99999.1" if i == 0 and leaf_critical else None,
                not_before=leaf_window[0] if i == 0 else START,
                not_after=leaf_window[1] if i == 0 else END,
            )
        )
    return certs


def _swap_first_two(certs: list[x509.Certificate]) -> list[x509.Certificate]:
    return [certs[1], certs[0], *certs[2:]]


HOUR = dt.timedelta(hours=1)
# (case, chain maker for a kind, the fault every kind must report)
CASES: list[tuple[str, Callable[[Kind], list[x509.Certificate]], ChainFault]] = [
    ("unknown critical extension", lambda k: build(k, k.length, leaf_critical=True),
     ChainFault.UNKNOWN_CRITICAL),
    ("CA:FALSE issuer", lambda k: build(k, k.length, issuer_not_ca=True), ChainFault.NOT_CA),
    ("issuer without keyCertSign", lambda k: build(k, k.length, issuer_no_cert_sign=True),
     ChainFault.KEY_USAGE),
    ("path length exceeded", lambda k: build(k, k.length, root_path_length=0),
     ChainFault.PATH_LENGTH),
    ("expired at now", lambda k: build(k, k.length, leaf_window=(START, NOW - HOUR)),
     ChainFault.EXPIRED),
    ("not yet valid at now", lambda k: build(k, k.length, leaf_window=(NOW + HOUR, END)),
     ChainFault.NOT_YET_VALID),
    ("wrong issuer signature", lambda k: build(k, k.length, forged_leaf=True),
     ChainFault.BAD_SIGNATURE),
    ("wrong order", lambda k: _swap_first_two(build(k, k.length)), ChainFault.WRONG_ISSUER),
    ("repeated certificate", lambda k: [*(c := build(k, k.length - 1)), c[-1]],
     ChainFault.REPEATED),
    ("oversize chain", lambda k: build(k, MAX_CHAIN_CERTS + 1), ChainFault.TOO_LONG),
]  # fmt: skip


@pytest.mark.parametrize("kind_name", KINDS)
def test_every_kind_accepts_its_own_well_formed_chain(kind_name: str) -> None:
    kind = KINDS[kind_name]
    certs = build(kind, kind.length)
    result = validate_chain(certs, certs[-1], NOW, kind.profile)
    assert result.ok and result.fault is None, result.reason


@pytest.mark.parametrize("kind_name", KINDS)
@pytest.mark.parametrize(("case", "make", "fault"), CASES, ids=[c[0] for c in CASES])
def test_the_same_hostile_chain_gets_the_same_refusal_in_every_kind(
    kind_name: str, case: str, make: Callable[[Kind], list[x509.Certificate]], fault: ChainFault
) -> None:
    kind = KINDS[kind_name]
    certs = make(kind)
    result = validate_chain(certs, certs[-1], NOW, kind.profile)
    expired = fault in (ChainFault.EXPIRED, ChainFault.NOT_YET_VALID)
    assert result.status is (ChainStatus.EXPIRED if expired else ChainStatus.INVALID), case
    assert result.fault is fault, f"{kind_name}, {case}: {result.reason}"
    assert result.reason and not result.ok


def test_only_the_snp_kind_requires_rsa_pss_sha384() -> None:
    """The one declared difference in signatures: AMD's chains are RSA-PSS SHA-384 only."""
    for name, kind in KINDS.items():
        ecdsa = build(kind, kind.length, pss=False)
        result = validate_chain(ecdsa, ecdsa[-1], NOW, kind.profile)
        if name == "snp-vcek":
            assert result.fault is ChainFault.SIGNATURE_ALGORITHM
            assert "not signed with RSA-PSS SHA-384" in result.reason
        else:
            assert result.ok, (name, result.reason)


def test_a_chain_that_does_not_end_in_the_anchor_is_refused_in_every_kind() -> None:
    for kind in KINDS.values():
        certs, other = build(kind, kind.length), build(kind, 2)
        result = validate_chain(certs, other[-1], NOW, kind.profile)
        assert result.fault is ChainFault.NOT_ANCHORED


def test_validity_bounds_are_inclusive_and_name_the_certificate() -> None:
    kind = KINDS["ocsp-responder"]
    edge = NOW - HOUR
    certs = build(kind, 3, leaf_window=(START, edge))
    assert validity_fault(certs, edge) is None
    assert validity_fault(certs, edge + dt.timedelta(microseconds=1)) == (ChainFault.EXPIRED, 0)
    result = validate_chain(certs, certs[-1], NOW, kind.profile)
    assert result.position == 0 and "expired on" in result.reason
