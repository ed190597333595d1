"""gpucc's signed results: docs/EAT.md vectors, checks, key files, and a joserfc cross-check."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import given, settings
from hypothesis import strategies as st
from joserfc import jwt as jose_jwt
from joserfc.jwk import ECKey

from gpucc.cli.exitcodes import exit_code_for
from gpucc.core.errors import FileAccessError, KeyFileError, UsageError
from gpucc.core.files import SpecialFileError
from gpucc.gpuattest.eat import (
    SignedEat,
    evidence_digest,
    key_id,
    load_private_key_pem,
    load_public_key_pem,
    policy_digest,
    public_jwk,
    sign_attestation_result,
    sign_result_claims,
    verify_eat,
)
from gpucc.gpuattest.jws import MalformedTokenError, TokenCheckError, b64url_decode
from tests.support.paths import ROOT

DOC = ROOT / "docs" / "EAT.md"
NOW = dt.datetime(2026, 1, 15, 12, 0, 0, tzinfo=dt.UTC)
NONCE = bytes.fromhex("4cff7f5380ead8fad8ec2c531c110aca4302a88f603792801a8ca29ee151af2e")


def vectors() -> dict[str, str]:
    text = DOC.read_text()
    found = re.findall(r"<!-- vector: (\w+) -->\n```[a-z]*\n(.*?)\n```", text, re.S)
    return dict(found)


def _b64u(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@pytest.fixture(scope="module")
def key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP384R1())


def signed(key: ec.EllipticCurvePrivateKey, n: int = 2, **kw: Any) -> SignedEat:
    args: dict[str, Any] = {
        "private_key": key,
        "nonce": NONCE,
        "now": NOW,
        "overall_result": True,
        "evidence_digests": [evidence_digest(f"report-{i}".encode()) for i in range(n)],
        "policy_digest": "ab" * 32,
    }
    args.update(kw)
    claims = [{"measres": "success", "ueid": str(i)} for i in range(n)]
    return sign_result_claims(claims, **args)


# --- known-answer vectors ------------------------------------------------------------


def test_doc_vectors_match_the_code() -> None:
    v = vectors()
    assert {
        "pem",
        "pub",
        "inputs",
        "kid",
        "header",
        "gpu0_payload",
        "gpu0_signing_input",
        "gpu0_digest",
        "overall_payload",
        "overall_signing_input",
        "sample",
    } <= set(v)
    private = serialization.load_pem_private_key(v["pem"].encode(), password=None)
    assert isinstance(private, ec.EllipticCurvePrivateKey)
    scalar = int.from_bytes(hashlib.sha384(b"gpucc EAT known-answer vector key").digest(), "big")
    n = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFC7634D81F4372DDF581A0DB248B0A77AECEC196ACCC52973
    assert private.private_numbers().private_value == scalar % n
    public = serialization.load_pem_public_key(v["pub"].encode())
    assert isinstance(public, ec.EllipticCurvePublicKey)
    assert public.public_numbers() == private.public_key().public_numbers()
    assert key_id(public) == v["kid"]

    inputs = json.loads(v["inputs"])
    now = dt.datetime.fromisoformat(inputs["now"].replace("Z", "+00:00"))
    result = sign_result_claims(
        inputs["gpu_claims"],
        private_key=private,
        nonce=bytes.fromhex(inputs["nonce"]),
        now=now,
        overall_result=inputs["overall_result"],
        evidence_digests=inputs["evidence_digests"],
        policy_digest=inputs["policy_digest"],
        jti=inputs["jti"],
    )
    assert result.kid == v["kid"]
    gpu0 = dict(result.device_tokens)["GPU-0"]
    head, payload, _ = gpu0.split(".")
    assert b64url_decode(head, "h").decode() == v["header"]
    assert b64url_decode(payload, "p").decode() == v["gpu0_payload"]
    assert f"{head}.{payload}" == v["gpu0_signing_input"]
    ohead, opayload, _ = result.overall_token.split(".")
    assert b64url_decode(ohead, "h").decode() == v["header"]
    fresh = json.loads(b64url_decode(opayload, "p"))
    documented = json.loads(v["overall_payload"])
    assert fresh.pop("submods").keys() == documented.pop("submods").keys()
    assert fresh == documented

    # The sample: verifies, and its pieces are the documented bytes.
    verified = verify_eat(v["sample"], public, nonce=bytes.fromhex(inputs["nonce"]), now=now)
    assert verified.overall_result and verified.kid == v["kid"]
    sample = json.loads(v["sample"])
    s_gpu0 = sample[1]["GPU-0"]
    assert s_gpu0.rsplit(".", 1)[0] == v["gpu0_signing_input"]
    assert hashlib.sha256(s_gpu0.encode()).hexdigest() == v["gpu0_digest"]
    s_head, s_payload, _ = sample[0][1].split(".")
    assert b64url_decode(s_payload, "p").decode() == v["overall_payload"]
    assert f"{s_head}.{s_payload}" == v["overall_signing_input"]
    assert f'"GPU-0":["DIGEST",["SHA-256","{v["gpu0_digest"]}"]]' in v["overall_payload"]
    # An independent implementation agrees.
    jkey = ECKey.import_key(public)
    for token in (sample[0][1], s_gpu0):
        assert jose_jwt.decode(token, jkey, algorithms=["ES384"]).header["alg"] == "ES384"


# --- round trip and claims -----------------------------------------------------------


def test_round_trip(key: ec.EllipticCurvePrivateKey) -> None:
    eat = signed(key, 3)
    got = verify_eat(eat.to_json(), key.public_key(), nonce=NONCE, now=NOW)
    assert got.overall_result and list(got.devices) == ["GPU-0", "GPU-1", "GPU-2"]
    assert got.devices["GPU-1"]["ueid"] == "1"
    assert got.devices["GPU-2"]["x-gpucc-evidence-digest"] == [
        "SHA-256",
        evidence_digest(b"report-2"),
    ]
    assert got.overall["x-gpucc-policy-digest"] == ["SHA-256", "ab" * 32]
    assert got.overall["exp"] - got.overall["iat"] == 3600
    assert got.to_dict()["kid"] == key_id(key.public_key())
    assert eat.to_json().endswith("\n") and "\n" not in eat.to_json()[:-1]


def test_overall_false_is_returned_not_hidden(key: ec.EllipticCurvePrivateKey) -> None:
    got = verify_eat(signed(key, overall_result=False).to_json(), key.public_key(), now=NOW)
    assert got.overall_result is False


def test_reserved_claims_are_replaced(key: ec.EllipticCurvePrivateKey) -> None:
    eat = sign_result_claims(
        [{"measres": "success", "iss": "evil", "eat_nonce": "00", "exp": 1 << 40}],
        private_key=key,
        nonce=NONCE,
        now=NOW,
        overall_result=True,
        evidence_digests=["00" * 32],
    )
    got = verify_eat(eat.to_json(), key.public_key(), nonce=NONCE, now=NOW)
    assert got.devices["GPU-0"]["iss"] == "gpucc"
    assert got.devices["GPU-0"]["eat_nonce"] == NONCE.hex()
    assert "x-gpucc-policy-digest" not in got.overall


def test_single_compact_token_without_submods(key: ec.EllipticCurvePrivateKey) -> None:
    from gpucc.gpuattest.jws import sign_es384

    t = int(NOW.timestamp())
    token = sign_es384(
        {"typ": "JWT"},
        {"iss": "gpucc", "iat": t, "nbf": t, "exp": t + 60, "eat_nonce": NONCE.hex()},
        key,
    )
    assert verify_eat(token, key.public_key(), nonce=NONCE, now=NOW).devices == {}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"evidence_digests": ["00" * 32]},
        {"evidence_digests": ["zz" * 32, "00" * 32]},
        {"policy_digest": "abc"},
        {"now": dt.datetime(2026, 1, 1)},
        {"lifetime": dt.timedelta(0)},
        {"private_key": ec.generate_private_key(ec.SECP256R1())},
    ],
)
def test_sign_refuses_bad_arguments(
    key: ec.EllipticCurvePrivateKey, kwargs: dict[str, Any]
) -> None:
    with pytest.raises(ValueError):
        signed(key, 2, **kwargs)


# --- refusals ----------------------------------------------------------------------


def _refused(text: str, public: ec.EllipticCurvePublicKey, check: str, **kw: Any) -> None:
    kw.setdefault("now", NOW)
    with pytest.raises(TokenCheckError) as info:
        verify_eat(text, public, **kw)
    assert info.value.check == check, str(info.value)
    assert exit_code_for(info.value) == 1


def _with(eat: SignedEat, overall: str | None = None, **devices: str | None) -> str:
    doc = eat.detached()
    if overall is not None:
        doc[0][1] = overall
    for name, token in devices.items():
        name = name.replace("_", "-")
        if token is None:
            doc[1].pop(name)
        else:
            doc[1][name] = token
    return json.dumps(doc)


def _retamper(token: str, **changes: Any) -> str:
    head, payload, sig = token.split(".")
    claims = json.loads(b64url_decode(payload, "p"))
    claims.update(changes)
    return ".".join([head, _b64u(json.dumps(claims).encode()), sig])


def test_tampered_tokens(key: ec.EllipticCurvePrivateKey) -> None:
    eat = signed(key)
    pub = key.public_key()
    forged = _retamper(eat.overall_token, **{"x-nvidia-overall-att-result": False})
    _refused(_with(eat, forged), pub, "signature")
    gpu0 = dict(eat.device_tokens)["GPU-0"]
    _refused(_with(eat, GPU_0=_retamper(gpu0, measres="fail")), pub, "submods")


def test_wrong_key(key: ec.EllipticCurvePrivateKey) -> None:
    other = ec.generate_private_key(ec.SECP384R1()).public_key()
    _refused(signed(key).to_json(), other, "signature")
    with pytest.raises(TokenCheckError) as info:
        verify_eat(
            signed(key).to_json(), ec.generate_private_key(ec.SECP256R1()).public_key(), now=NOW
        )
    assert info.value.check == "key"


def test_times(key: ec.EllipticCurvePrivateKey) -> None:
    text = signed(key).to_json()
    pub = key.public_key()
    _refused(text, pub, "exp", now=NOW + dt.timedelta(hours=1, seconds=120))
    verify_eat(text, pub, now=NOW + dt.timedelta(hours=1, seconds=119))
    _refused(text, pub, "nbf", now=NOW - dt.timedelta(seconds=121))
    verify_eat(text, pub, now=NOW - dt.timedelta(seconds=119))


def test_issuer_and_nonce(key: ec.EllipticCurvePrivateKey) -> None:
    pub = key.public_key()
    _refused(signed(key, issuer="someone-else").to_json(), pub, "iss")
    verify_eat(signed(key, issuer="me").to_json(), pub, now=NOW, issuer="me")
    _refused(signed(key).to_json(), pub, "eat_nonce", nonce=b"\x00" * 32)


def test_device_token_with_another_nonce(key: ec.EllipticCurvePrivateKey) -> None:
    a = signed(key)
    b = signed(key, nonce=b"\x01" * 32)
    # Re-sign the overall so that its submods name b's GPU-0 token: only eat_nonce differs.
    from gpucc.gpuattest.jws import sign_es384, token_digest

    b0 = dict(b.device_tokens)["GPU-0"]
    claims = json.loads(b64url_decode(a.overall_token.split(".")[1], "p"))
    claims["submods"]["GPU-0"] = ["DIGEST", ["SHA-256", token_digest(b0)]]
    overall = sign_es384({"kid": a.kid, "typ": "JWT"}, claims, key)
    _refused(_with(a, overall, GPU_0=b0), key.public_key(), "eat_nonce")


def test_missing_and_extra_device_tokens(key: ec.EllipticCurvePrivateKey) -> None:
    eat = signed(key)
    pub = key.public_key()
    _refused(_with(eat, GPU_1=None), pub, "device-token")
    _refused(_with(eat, GPU_7=dict(eat.device_tokens)["GPU-0"]), pub, "device-token")
    swapped = dict(eat.device_tokens)
    _refused(_with(eat, GPU_0=swapped["GPU-1"], GPU_1=swapped["GPU-0"]), pub, "submods")


@pytest.mark.parametrize("alg", ["none", "HS256", "ES256", "RS256", "ES512"])
def test_other_algorithms(key: ec.EllipticCurvePrivateKey, alg: str) -> None:
    import hmac

    eat = signed(key)
    _, payload, _ = eat.overall_token.split(".")
    head = _b64u(json.dumps({"alg": alg, "typ": "JWT"}).encode())
    pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    sig = (
        ""
        if alg == "none"
        else _b64u(hmac.new(pem, f"{head}.{payload}".encode(), "sha256").digest())
    )
    _refused(_with(eat, f"{head}.{payload}.{sig}"), key.public_key(), "alg")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not a token",
        "a.b",
        "!!.e30.AA",
        "[1, 2]",
        '[["JWT", "x.y.z"]]',
        '[["JWT", "e30.e30.AA"], []]',
        '{"a": 1, "a": 2}',
    ],
)
def test_malformed(key: ec.EllipticCurvePrivateKey, text: str) -> None:
    with pytest.raises(MalformedTokenError) as info:
        verify_eat(text, key.public_key(), now=NOW)
    assert exit_code_for(info.value) == 4


def test_payload_not_an_object_after_a_good_signature(key: ec.EllipticCurvePrivateKey) -> None:
    import jwt

    from gpucc.gpuattest.jws import verify_es384

    token = jwt.PyJWS().encode(b"[1]", key, algorithm="ES384")
    with pytest.raises(MalformedTokenError, match="not a JSON object"):
        verify_es384(token, key.public_key())


# --- cross-check with joserfc ------------------------------------------------------


def test_gpucc_tokens_verify_with_joserfc(key: ec.EllipticCurvePrivateKey) -> None:
    eat = signed(key)
    jkey = ECKey.import_key(key.public_key())
    assert jkey.thumbprint() == key_id(key.public_key()) == eat.kid
    overall = jose_jwt.decode(eat.overall_token, jkey, algorithms=["ES384"])
    assert overall.header == {"alg": "ES384", "kid": eat.kid, "typ": "JWT"}
    assert overall.claims["eat_nonce"] == NONCE.hex()
    for name, token in eat.device_tokens:
        digest = hashlib.sha256(token.encode()).hexdigest()
        assert overall.claims["submods"][name] == ["DIGEST", ["SHA-256", digest]]
        assert jose_jwt.decode(token, jkey, algorithms=["ES384"]).claims["iss"] == "gpucc"
    jwk = public_jwk(key.public_key())
    as_import: dict[str, str | list[str]] = dict(jwk)
    assert ECKey.import_key(as_import).thumbprint() == jwk["kid"]


def test_joserfc_tokens_verify_with_gpucc(key: ec.EllipticCurvePrivateKey) -> None:
    jkey = ECKey.import_key(key)
    t = int(NOW.timestamp())
    common = {"iss": "gpucc", "iat": t, "nbf": t, "exp": t + 600, "eat_nonce": NONCE.hex()}
    header = {"alg": "ES384", "kid": "from-joserfc"}
    device = jose_jwt.encode(header, {**common, "measres": "success"}, jkey, algorithms=["ES384"])
    digest = hashlib.sha256(device.encode()).hexdigest()
    overall = jose_jwt.encode(
        header,
        {
            **common,
            "x-nvidia-overall-att-result": True,
            "submods": {"GPU-0": ["DIGEST", ["SHA256", digest]]},  # NVIDIA's local spelling
        },
        jkey,
        algorithms=["ES384"],
    )
    text = json.dumps([["JWT", overall], {"GPU-0": device}])
    got = verify_eat(text, key.public_key(), nonce=NONCE, now=NOW)
    assert got.overall_result and got.kid == "from-joserfc"
    assert got.devices["GPU-0"]["measres"] == "success"


# --- key files ---------------------------------------------------------------------


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey, mode: int = 0o600, **kw: Any) -> Path:
    enc = kw.get("encryption", serialization.NoEncryption())
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc)
    )
    os.chmod(path, mode)
    return path


def test_private_key_file_rules(tmp_path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    good = _write_key(tmp_path / "k.pem", key)
    assert load_private_key_pem(good).private_numbers() == key.private_numbers()
    assert load_private_key_pem(_write_key(tmp_path / "ro.pem", key, 0o400)) is not None
    secret = str(key.private_numbers().private_value)
    for mode in (0o640, 0o604, 0o644, 0o666):
        path = _write_key(tmp_path / f"m{mode:o}.pem", key, mode)
        with pytest.raises(KeyFileError) as info:
            load_private_key_pem(path)
        assert (
            "chmod 600" in str(info.value) and exit_code_for(info.value) == 8
        )  # permissions: file access
        assert secret not in str(info.value)
    link = tmp_path / "link.pem"
    link.symlink_to(good)
    with pytest.raises(SpecialFileError) as linked:  # refused, never followed (exit 8)
        load_private_key_pem(link)
    assert exit_code_for(linked.value) == 8
    with pytest.raises(KeyFileError, match="encrypted"):
        load_private_key_pem(
            _write_key(
                tmp_path / "enc.pem",
                key,
                encryption=serialization.BestAvailableEncryption(b"pw"),
            )
        )
    with pytest.raises(KeyFileError, match="P-384"):
        load_private_key_pem(
            _write_key(tmp_path / "p256.pem", ec.generate_private_key(ec.SECP256R1()))
        )
    junk = tmp_path / "junk.pem"
    junk.write_bytes(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    junk.chmod(0o600)
    with pytest.raises(KeyFileError, match="not a PEM private key"):
        load_private_key_pem(junk)
    with pytest.raises(FileAccessError, match="does not exist"):
        load_private_key_pem(tmp_path / "absent.pem")
    with pytest.raises(SpecialFileError, match="directory"):
        load_private_key_pem(tmp_path)


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")
def test_private_key_owned_by_someone_else(tmp_path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path = _write_key(tmp_path / "k.pem", key)
    os.chown(path, 65534, 65534)
    with pytest.raises(KeyFileError, match="owned by uid"):
        load_private_key_pem(path)


def test_public_key_files(tmp_path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    from tests.support.netfixtures import make_node

    pub = tmp_path / "pub.pem"
    pub.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    assert load_public_key_pem(pub).public_numbers() == key.public_key().public_numbers()
    node = make_node("EAT signer", None, ca=False)
    cert = tmp_path / "cert.pem"
    cert.write_bytes(node.cert.public_bytes(serialization.Encoding.PEM))
    assert load_public_key_pem(cert).public_numbers() == node.key.public_key().public_numbers()
    bad = tmp_path / "bad.pem"
    bad.write_text("hello")
    with pytest.raises(KeyFileError):
        load_public_key_pem(bad)


# --- signing a local verification result ------------------------------------------


@dataclass(frozen=True)
class _Policy:
    rules: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return self.rules


@dataclass(frozen=True)
class _Gpu:
    claims: dict[str, Any]
    report_digest: bytes


@dataclass(frozen=True)
class _Result:
    gpus: tuple[_Gpu, ...]
    trusted: bool
    verified_at: dt.datetime
    expected_nonce: bytes | None
    policy: _Policy


def test_sign_attestation_result(key: ec.EllipticCurvePrivateKey) -> None:
    gpus = tuple(
        _Gpu({"measres": "success", "hwmodel": f"h{i}"}, hashlib.sha256(b"r%d" % i).digest())
        for i in range(2)
    )
    policy = _Policy({"version": 1, "nonce": {"require": True}})
    result = _Result(gpus, True, NOW, NONCE, policy)
    eat = sign_attestation_result(result, private_key=key)
    got = verify_eat(eat.to_json(), key.public_key(), nonce=NONCE, now=NOW)
    assert got.overall_result
    assert got.overall["x-gpucc-policy-digest"] == ["SHA-256", policy_digest(policy.rules)]
    assert (
        policy_digest(policy.rules)
        == hashlib.sha256(b'{"nonce":{"require":true},"version":1}').hexdigest()
    )
    assert got.devices["GPU-1"]["hwmodel"] == "h1"
    assert got.devices["GPU-1"]["x-gpucc-evidence-digest"][1] == gpus[1].report_digest.hex()
    with pytest.raises(UsageError):
        sign_attestation_result(_Result(gpus, True, NOW, None, policy), private_key=key)


# --- hostile input never escapes the two error families -------------------------------

_FIXED_KEY = ec.generate_private_key(ec.SECP384R1())
_FIXED_EAT = sign_result_claims(
    [{"measres": "success"}, {"measres": "success"}],
    private_key=_FIXED_KEY,
    nonce=NONCE,
    now=NOW,
    overall_result=True,
    evidence_digests=["00" * 32, "11" * 32],
).to_json()


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300) | st.binary(max_size=300))
def test_arbitrary_input_is_malformed_or_refused(data: str | bytes) -> None:
    try:
        verify_eat(data, _FIXED_KEY.public_key(), now=NOW)
    except (MalformedTokenError, TokenCheckError):
        return
    raise AssertionError("arbitrary input was accepted")


@settings(max_examples=300, deadline=None)
@given(
    st.integers(min_value=0, max_value=len(_FIXED_EAT) - 2),
    st.characters(exclude_categories=["Cs"]),
)
def test_any_one_character_change_is_refused(position: int, char: str) -> None:
    mutated = _FIXED_EAT[:position] + char + _FIXED_EAT[position + 1 :]
    original = verify_eat(_FIXED_EAT, _FIXED_KEY.public_key(), now=NOW)
    try:
        got = verify_eat(mutated, _FIXED_KEY.public_key(), now=NOW)
    except (MalformedTokenError, TokenCheckError):
        return
    # Only an equivalent encoding (JSON whitespace, unused base64 bits) may pass.
    assert got.to_dict() == original.to_dict()


def test_deeply_nested_json_is_malformed(key: ec.EllipticCurvePrivateKey) -> None:
    with pytest.raises(MalformedTokenError):
        verify_eat("[" * 100_000, key.public_key(), now=NOW)
    import jwt

    token = jwt.PyJWS().encode(b"[" * 100_000, key, algorithm="ES384")
    with pytest.raises(MalformedTokenError, match="nests deeper"):
        verify_eat(token, key.public_key(), now=NOW)


def test_non_ascii_token_text_is_malformed(key: ec.EllipticCurvePrivateKey) -> None:
    eat = signed(key)
    head, payload, sig = dict(eat.device_tokens)["GPU-0"].split(".")
    with pytest.raises(MalformedTokenError, match="ASCII"):
        verify_eat(_with(eat, GPU_0=f"{head}.{payload}é.{sig}"), key.public_key(), now=NOW)
