"""COSE_Sign1 signing of CoRIMs under the test RIM PKI, and CoRIM surgery for tests.

:func:`sign_corim` builds the envelope NVIDIA uses (RFC 9052 tag 18, ES384, ``x5chain``)
with ``cbor2`` and ``cryptography`` directly, apart from gpucc's reader; its keyword
arguments produce the deliberately wrong envelopes of NVIDIA's reject fixtures.
:func:`edit_comids` decodes a CoRIM's CoMIDs into plain lists and dicts, lets a test
change them, and encodes the result again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import cbor2
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from tests.support.paths import ROOT
from tests.support.rimpki import RimPki

DATA = ROOT / "tests" / "data" / "nvidia-current"
CORIMS = DATA / "corim"
ES384, ES256 = -35, -7


def corim_bytes(name: str) -> bytes:
    """One of NVIDIA's example CoRIMs (unsigned), by its file stem."""
    return (CORIMS / f"{name}.cbor").read_bytes()


def _der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


def sign_corim(
    payload: bytes,
    *,
    pki: RimPki,
    alg: int = ES384,
    key: ec.EllipticCurvePrivateKey | None = None,
    chain: list[x509.Certificate] | None = None,
    unprotected_chain: bool = False,
    x5t: bool = True,
    x5t_override: bytes | None = None,
    both: bool = False,
    detached: bool = False,
    empty_protected: bool = False,
    tamper: str = "",
) -> bytes:
    """``#6.18([protected, unprotected, payload, signature])`` over ``payload``."""
    certs = chain if chain is not None else pki.chain[:-1]  # leaf first, without the root
    x5chain: Any = [_der(c) for c in certs] if len(certs) > 1 else _der(certs[0])
    header: dict[int, Any] = {1: alg}
    unprotected: dict[int, Any] = {}
    if unprotected_chain or both:
        unprotected[33] = x5chain
        if x5t:
            header[34] = [-43, x5t_override or hashlib.sha384(_der(certs[0])).digest()]
    if not unprotected_chain or both:
        header[33] = x5chain
    protected = b"" if empty_protected else cbor2.dumps(header)
    to_sign = cbor2.dumps(["Signature1", protected, b"", payload])
    r, s = decode_dss_signature((key or pki.l4_key).sign(to_sign, ec.ECDSA(hashes.SHA384())))
    signature = r.to_bytes(48, "big") + s.to_bytes(48, "big")
    if tamper == "signature":
        signature = signature[:-1] + bytes([signature[-1] ^ 1])
    if tamper == "payload":
        payload = payload[:-1] + bytes([payload[-1] ^ 1])
    body = [protected, unprotected, None if detached else payload, signature]
    return cbor2.dumps(cbor2.CBORTag(18, body))


def _thaw(value: Any) -> Any:
    if isinstance(value, cbor2.CBORTag):
        return cbor2.CBORTag(value.tag, _thaw(value.value))
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_thaw(v) for v in value]
    return value


def edit_comids(corim: bytes, edit: Callable[[list[dict[int, Any]]], None]) -> bytes:
    """``corim`` with its CoMIDs passed, decoded and mutable, through ``edit``."""
    outer = _thaw(cbor2.loads(corim))
    tags = outer.value[1]
    comids = [_thaw(cbor2.loads(t.value)) for t in tags]
    edit(comids)
    outer.value[1] = [cbor2.CBORTag(506, cbor2.dumps(c)) for c in comids]
    return bytes(cbor2.dumps(outer, datetime_as_timestamp=True))


def oid(dotted: str) -> cbor2.CBORTag:
    """``#6.111`` of a dotted OID."""
    arcs = [int(a) for a in dotted.split(".")]
    body = bytearray()
    for arc in [40 * arcs[0] + arcs[1], *arcs[2:]]:
        chunk = [arc & 0x7F]
        arc >>= 7
        while arc:
            chunk.append(0x80 | (arc & 0x7F))
            arc >>= 7
        body.extend(reversed(chunk))
    return cbor2.CBORTag(111, bytes(body))


def comid(triples: dict[int, Any], tag_id: str = "c") -> cbor2.CBORTag:
    """A ``#6.506`` CoMID with these triples."""
    return cbor2.CBORTag(506, cbor2.dumps({1: {0: tag_id}, 4: triples}))


def small_corim(triples: dict[int, Any] | None = None, **extra: Any) -> bytes:
    """NVIDIA's smallest fixture shape: one CoMID, one vendor-only reference with SVN 1."""
    reference = {0: [[{0: {1: "V"}}, [{1: {1: 1}}]]]}
    corim: dict[int, Any] = {0: "c", 1: [comid(triples if triples is not None else reference)]}
    for key, value in extra.items():
        corim[int(key.removeprefix("k"))] = value
    return bytes(cbor2.dumps(cbor2.CBORTag(501, corim)))


def read_pem_chain(path: Path) -> list[x509.Certificate]:
    """The certificates of a PEM file, in order."""
    return x509.load_pem_x509_certificates(path.read_bytes())


#: The arc under which NVIDIA's Rubin CoRIMs name their environments.
NV = "1.3.6.1.4.1.5703.1300.1.1."
Edit = Callable[[list[dict[int, Any]]], None]


def reference_triple(comids: list[dict[int, Any]], env_oid: str) -> list[Any]:
    """The first CoMID's reference triple for the environment ``NV + env_oid``."""
    for triple in comids[0][4][0]:
        cls = triple[0][0]
        if 0 in cls and cls[0] == oid(NV + env_oid):
            return triple  # type: ignore[no-any-return]
    raise AssertionError(env_oid)


def flip_digest(env_oid: str, key_index: int = 0) -> Edit:
    """An edit flipping one bit of a reference digest."""

    def edit(comids: list[dict[int, Any]]) -> None:
        digest = reference_triple(comids, env_oid)[1][key_index][1][2][0]
        digest[1] = bytes([digest[1][0] ^ 1]) + digest[1][1:]

    return edit


def layer0_svn(tag: int, value: int) -> Edit:
    """An edit setting the layer-0 SVN (``tag`` 552 exact, 553 minimum) of a Rubin CoRIM."""

    def edit(comids: list[dict[int, Any]]) -> None:
        comids[0][4][0][0][1][0][1][1] = cbor2.CBORTag(tag, value)

    return edit


def fsp_raw_block1(value: bytes) -> Edit:
    """An edit setting the Blackwell FSP CoRIM's raw reference value of SPDM block 1."""

    def edit(comids: list[dict[int, Any]]) -> None:
        block1 = comids[0][4][0][1][1][0]
        assert block1[0] == 1
        block1[1][4] = cbor2.CBORTag(560, value)

    return edit
