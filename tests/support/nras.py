"""A loopback NRAS and key-set server for tests: NVIDIA-shaped tokens signed with joserfc.

The fake signs with an ES384 key whose certificate chains to a throw-away root (not with
gpucc's own signer), so gpucc's checks meet tokens made by another JOSE implementation.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from joserfc import jwt as jose_jwt
from joserfc.jwk import ECKey

from gpucc.gpuattest.nras import ATTEST_GPU_PATH, JWKS_PATH
from tests.support.netfixtures import NOW, Node, Reply, Seen, make_node

KID = "nras-test-key-1"


def b64u(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass(frozen=True)
class NrasPki:
    root: Node
    ca: Node
    signer: Node
    other_root: Node
    other_signer: Node


def make_pki() -> NrasPki:
    """A signer under a CA under a root, and an unrelated root with its own signer."""
    root = make_node("NRAS Test Root", None, ca=True)
    ca = make_node("NRAS Test CA", root, ca=True, path_length=0)
    other = make_node("NRAS Other Root", None, ca=True)
    return NrasPki(
        root,
        ca,
        make_node("NRAS Test signer", ca, ca=False),
        other,
        make_node("NRAS Other signer", other, ca=False),
    )


def _der_b64(node: Node) -> str:
    return base64.b64encode(node.cert.public_bytes(serialization.Encoding.DER)).decode()


def jwk_for(node: Node, kid: str, chain: list[Node] | None) -> dict[str, Any]:
    jwk = dict(ECKey.import_key(node.key.public_key()).as_dict(private=False))
    jwk.update({"kid": kid, "use": "sig", "alg": "ES384"})
    if chain is not None:
        jwk["x5c"] = [_der_b64(n) for n in chain]
    return jwk


def sign(header: dict[str, Any], claims: dict[str, Any], key: ec.EllipticCurvePrivateKey) -> str:
    return jose_jwt.encode(header, claims, ECKey.import_key(key), algorithms=["ES384"])


@dataclass
class FakeNras:
    """NRAS v4 and its JWKS on one loopback server; knobs change one thing at a time."""

    pki: NrasPki
    url: str = ""
    overall_extra: dict[str, Any] = field(default_factory=dict)
    device_extra: dict[str, Any] = field(default_factory=dict)
    header_extra: dict[str, Any] = field(default_factory=dict)
    signing_key: ec.EllipticCurvePrivateKey | None = None
    drop_device: str | None = None
    extra_device: bool = False
    digest_of: Callable[[str], str] | None = None
    finish: Callable[[list[Any]], bytes] | None = None
    reply: Reply | None = None
    jwks_reply: Reply | None = None
    jwks_keys: list[dict[str, Any]] | None = None
    #: Claims 4.0's opaque-data mismatch records to report (only when asked for 4.0).
    opaque_mismatches: list[dict[str, Any]] | None = None
    claims_versions: list[str] = field(default_factory=list)

    def jwks(self) -> dict[str, Any]:
        if self.jwks_keys is not None:
            return {"keys": self.jwks_keys}
        p = self.pki
        return {"keys": [jwk_for(p.signer, KID, [p.signer, p.ca])]}

    def answer(self, body: dict[str, Any]) -> list[Any]:
        key = self.signing_key or self.pki.signer.key
        header = {"alg": "ES384", "kid": KID, "typ": "JWT", **self.header_extra}
        t = int(NOW.timestamp())
        common = {
            "iss": self.url,
            "iat": t,
            "nbf": t - 60,
            "exp": t + 3600,
            "eat_nonce": body["nonce"],
        }
        version = str(body.get("claims_version", "3.0"))
        self.claims_versions.append(version)
        names = [f"GPU-{i}" for i in range(len(body["evidence_list"]))]
        if self.extra_device:
            names.append(f"GPU-{len(names)}")
        devices: dict[str, str] = {}
        for i, name in enumerate(names):
            claims = {
                **common,
                "measres": "success",
                "hwmodel": "GH100 A01 GSP BROM",
                "ueid": str(1000 + i),
                "x-nvidia-gpu-arch-check": True,
                "x-nvidia-gpu-driver-version": "545.00",
                "jti": f"device-{i}",
                **self.device_extra,
            }
            if version == "4.0" and self.opaque_mismatches is not None:
                claims["x-nvidia-mismatch-opaque-data-records"] = self.opaque_mismatches
            devices[name] = sign(header, claims, key)
        digest = self.digest_of or (lambda tok: hashlib.sha256(tok.encode()).hexdigest())
        overall = {
            **common,
            "sub": "NVIDIA-PLATFORM-ATTESTATION",
            "jti": "overall",
            "x-nvidia-ver": version,
            "x-nvidia-overall-att-result": True,
            "submods": {n: ["DIGEST", ["SHA-256", digest(tok)]] for n, tok in devices.items()},
            **self.overall_extra,
        }
        if self.drop_device:
            devices.pop(self.drop_device)
        return [["JWT", sign(header, overall, key)], devices]

    def __call__(self, seen: Seen) -> Reply:
        if seen.path == JWKS_PATH:
            if self.jwks_reply is not None:
                return self.jwks_reply
            return Reply(200, json.dumps(self.jwks()).encode())
        if seen.path == ATTEST_GPU_PATH and seen.method == "POST":
            if self.reply is not None:
                return self.reply
            doc = self.answer(json.loads(seen.body))
            body = self.finish(doc) if self.finish else json.dumps(doc).encode()
            return Reply(200, body, {"Content-Type": "application/json"})
        return Reply(404, b"not found")
