"""Remote verification against a local NRAS and key-set server on 127.0.0.1.

The fake NRAS signs its tokens with joserfc (not with gpucc's signer), using an
ES384 key whose certificate chains to a throw-away root; that root is the pinned
root the client is given.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from joserfc.jwk import ECKey

from gpucc.cli.exitcodes import exit_code_for
from gpucc.core.errors import (
    CollateralUnavailableError,
    NetworkError,
    OfflineError,
)
from gpucc.core.transport import HttpStatusError, RequestsFetcher
from gpucc.gpuattest.evidence import EvidenceSet, GpuEvidence
from gpucc.gpuattest.jwks import JwksClient, JwksDiskCache, RemoteServiceError, parse_jwks
from gpucc.gpuattest.jws import TokenCheckError
from gpucc.gpuattest.netconfig import NetworkSettings
from gpucc.gpuattest.nras import (
    ATTEST_GPU_PATH,
    DEFAULT_NRAS_BASE_URL,
    JWKS_PATH,
    NRAS_URL_ENV,
    NrasClient,
    build_nras_client,
    verdict_claims,
)
from tests.support.netfixtures import NOW, Reply, make_node, serve
from tests.support.nras import KID, FakeNras, NrasPki, b64u, jwk_for

NONCE = bytes.fromhex("4cff7f5380ead8fad8ec2c531c110aca4302a88f603792801a8ca29ee151af2e")


@pytest.fixture(scope="module")
def pki() -> NrasPki:
    root = make_node("Test Attestation Root", None, ca=True)
    ca = make_node("Test Attestation CA", root, ca=True, path_length=0)
    signer = make_node("Test NRAS signer", ca, ca=False)
    other_root = make_node("Other Root", None, ca=True)
    other_signer = make_node("Other signer", other_root, ca=False)
    return NrasPki(root, ca, signer, other_root, other_signer)


@pytest.fixture
def fake(pki: NrasPki) -> Iterator[tuple[FakeNras, Any]]:
    nras = FakeNras(pki)
    with serve(nras) as server:
        nras.url = server.url
        yield nras, server


def evidence(n: int = 2) -> EvidenceSet:
    return EvidenceSet(
        gpus=tuple(
            GpuEvidence(report=f"report-{i}".encode(), cert_chain_pem=f"chain-{i}".encode())
            for i in range(n)
        )
    )


def fetcher(read: float = 2.0) -> RequestsFetcher:
    return RequestsFetcher(timeout=(1.0, read), retries=1, backoff=0.0, trust_env=False)


def client(
    nras: FakeNras, pki: NrasPki, *, roots: list[Any] | None = None, read: float = 2.0
) -> NrasClient:
    fetch = fetcher(read)
    anchors = [pki.root.cert] if roots is None else roots
    jwks = JwksClient(fetcher=fetch, url=nras.url + JWKS_PATH, roots=anchors)
    return NrasClient(fetcher=fetch, jwks=jwks, base_url=nras.url)


def refused(nras: FakeNras, pki: NrasPki, check: str, n: int = 2) -> TokenCheckError:
    with pytest.raises(TokenCheckError) as info:
        client(nras, pki).attest(evidence(n), NONCE, now=NOW)
    assert info.value.check == check, str(info.value)
    assert exit_code_for(info.value) == 1
    assert f"{check} check failed" in str(info.value)
    assert "\n" not in str(info.value)
    return info.value


def unavailable(nras: FakeNras, pki: NrasPki, kind: type[Exception], read: float = 2.0) -> str:
    with pytest.raises(kind) as info:
        client(nras, pki, read=read).attest(evidence(), NONCE, now=NOW)
    exc = info.value
    assert isinstance(exc, CollateralUnavailableError)
    assert exit_code_for(exc) == 3
    assert not isinstance(exc, TokenCheckError)
    assert "\n" not in str(exc)
    return str(exc)


# --- accepted -----------------------------------------------------------------------


def test_good_answer_is_accepted(fake: tuple[FakeNras, Any], pki: NrasPki) -> None:
    nras, server = fake
    verdict = client(nras, pki).attest(evidence(), NONCE, now=NOW)
    assert verdict.trusted and verdict.overall_result
    assert verdict.kid == KID and verdict.key_anchor == "x5c-chain"
    assert [g.name for g in verdict.gpus] == ["GPU-0", "GPU-1"]
    assert verdict.issuer == nras.url and verdict.nonce == NONCE
    assert verdict.overall_claims["eat_nonce"] == NONCE.hex()
    claims = verdict_claims(verdict)
    assert [c["ueid"] for c in claims] == ["1000", "1001"]
    assert all(c["measres"] == "success" and c["eat_nonce"] == NONCE.hex() for c in claims)
    claims[0]["measres"] = "changed"  # a copy: the verdict stays as verified
    assert verdict.gpus[0].claims["measres"] == "success"
    doc = json.loads(json.dumps(verdict.to_dict()))
    assert doc["verifier"] == "remote" and doc["trusted"] and doc["nonce"] == NONCE.hex()
    assert doc["verified_at"] == "2026-01-15T12:00:00Z" and len(doc["claims"]) == 2
    shape = verdict.detached_eat()
    assert shape[0][0] == "JWT" and set(shape[1]) == {"GPU-0", "GPU-1"}

    posts = [s for s in server.seen if s.method == "POST"]
    assert len(posts) == 1 and posts[0].path == ATTEST_GPU_PATH
    body = json.loads(posts[0].body)
    assert body["nonce"] == NONCE.hex() and body["arch"] == "HOPPER"
    assert body["claims_version"] == "3.0"
    assert body["evidence_list"][1] == {
        "evidence": base64.b64encode(b"report-1").decode(),
        "certificate": base64.b64encode(b"chain-1").decode(),
    }
    assert posts[0].headers["Content-Type"] == "application/json"


def test_within_the_clock_skew_is_accepted(fake: tuple[FakeNras, Any], pki: NrasPki) -> None:
    nras, _ = fake
    t = int(NOW.timestamp())
    nras.overall_extra = {"exp": t - 60, "iat": t + 60, "nbf": t + 60}
    assert client(nras, pki).attest(evidence(), NONCE, now=NOW).trusted


def test_overall_false_and_device_errors_are_not_trusted(
    fake: tuple[FakeNras, Any], pki: NrasPki
) -> None:
    nras, _ = fake
    nras.overall_extra = {"x-nvidia-overall-att-result": False}
    verdict = client(nras, pki).attest(evidence(), NONCE, now=NOW)
    assert not verdict.trusted and not verdict.overall_result
    nras.overall_extra = {}
    nras.device_extra = {"x-nvidia-error-details": {"code": 4010, "message": "NONCE"}}
    verdict = client(nras, pki).attest(evidence(), NONCE, now=NOW)
    assert verdict.overall_result and not verdict.trusted
    assert verdict.gpus[0].error_details["code"] == 4010
    nras.device_extra = {"measres": "fail"}
    verdict = client(nras, pki).attest(evidence(), NONCE, now=NOW)
    assert verdict.overall_result and not verdict.trusted


def test_no_roots_trusts_the_channel_and_says_so(fake: tuple[FakeNras, Any], pki: NrasPki) -> None:
    nras, _ = fake
    verdict = client(nras, pki, roots=[]).attest(evidence(), NONCE, now=NOW)
    assert verdict.trusted and verdict.key_anchor == "tls"


# --- refused: token checks (exit 1) -------------------------------------------------


def test_tampered_payload(fake: tuple[FakeNras, Any], pki: NrasPki) -> None:
    nras, _ = fake

    def tamper(doc: list[Any]) -> bytes:
        head, payload, sig = doc[0][1].split(".")
        claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
        claims["x-nvidia-overall-att-result"] = True
        claims["jti"] = "forged"
        doc[0][1] = ".".join([head, b64u(json.dumps(claims).encode()), sig])
        return json.dumps(doc).encode()

    nras.finish = tamper
    refused(nras, pki, "signature")


def test_wrong_kid_names_a_key_that_did_not_sign(fake: tuple[FakeNras, Any], pki: NrasPki) -> None:
    nras, _ = fake
    nras.signing_key = pki.other_signer.key  # the header still names KID
    refused(nras, pki, "signature")


def test_key_not_in_the_set_refetches_once_then_refuses(
    fake: tuple[FakeNras, Any], pki: NrasPki
) -> None:
    nras, server = fake
    c = client(nras, pki)
    c.attest(evidence(), NONCE, now=NOW)
    nras.header_extra = {"kid": "rotated-away"}
    with pytest.raises(TokenCheckError) as info:
        c.attest(evidence(), NONCE, now=NOW)
    assert info.value.check == "kid" and "rotated-away" in str(info.value)
    assert sum(1 for s in server.seen if s.path == JWKS_PATH) == 2


def test_expired(fake: tuple[FakeNras, Any], pki: NrasPki) -> None:
    nras, _ = fake
    nras.overall_extra = {"exp": int(NOW.timestamp()) - 3600}
    assert "expired" in str(refused(nras, pki, "exp"))


def test_not_yet_valid(fake: tuple[FakeNras, Any], pki: NrasPki) -> None:
    nras, _ = fake
    nras.device_extra = {"nbf": int(NOW.timestamp()) + 3600}
    assert "GPU-0 token" in str(refused(nras, pki, "nbf"))


def test_issued_in_the_future(fake: tuple[FakeNras, Any], pki: NrasPki) -> None:
    nras, _ = fake
    nras.overall_extra = {"iat": int(NOW.timestamp()) + 3600}
    refused(nras, pki, "iat")


def test_missing_exp(fake: tuple[FakeNras, Any], pki: NrasPki) -> None:
    nras, _ = fake
    nras.overall_extra = {"exp": None}
    refused(nras, pki, "exp")


def test_wrong_issuer(fake: tuple[FakeNras, Any], pki: NrasPki) -> None:
    nras, _ = fake
    nras.overall_extra = {"iss": "https://attacker.example"}
    refused(nras, pki, "iss")


def test_wrong_nonce(fake: tuple[FakeNras, Any], pki: NrasPki) -> None:
    nras, _ = fake
    nras.overall_extra = {"eat_nonce": "00" * 32}
    refused(nras, pki, "eat_nonce")


def test_wrong_nonce_in_a_device_token(fake: tuple[FakeNras, Any], pki: NrasPki) -> None:
    nras, _ = fake
    nras.device_extra = {"eat_nonce": "11" * 32}
    refused(nras, pki, "eat_nonce")


def test_missing_device_token(fake: tuple[FakeNras, Any], pki: NrasPki) -> None:
    nras, _ = fake
    nras.drop_device = "GPU-1"
    assert "GPU-1" in str(refused(nras, pki, "device-token"))


def test_device_token_for_a_gpu_not_in_the_evidence(
    fake: tuple[FakeNras, Any], pki: NrasPki
) -> None:
    nras, _ = fake
    nras.extra_device = True
    assert "GPU-2" in str(refused(nras, pki, "device-token"))


def test_digest_mismatch(fake: tuple[FakeNras, Any], pki: NrasPki) -> None:
    nras, _ = fake
    nras.digest_of = lambda tok: hashlib.sha256(tok.encode() + b"x").hexdigest()
    refused(nras, pki, "submods")


def test_digest_of_the_wrong_shape(fake: tuple[FakeNras, Any], pki: NrasPki) -> None:
    nras, _ = fake
    nras.overall_extra = {"submods": {"GPU-0": ["DIGEST", ["MD5", "00" * 16]], "GPU-1": "x"}}
    refused(nras, pki, "submods")


def test_swapped_device_tokens(fake: tuple[FakeNras, Any], pki: NrasPki) -> None:
    nras, _ = fake

    def swap(doc: list[Any]) -> bytes:
        d = doc[1]
        d["GPU-0"], d["GPU-1"] = d["GPU-1"], d["GPU-0"]
        return json.dumps(doc).encode()

    nras.finish = swap
    refused(nras, pki, "submods")


def test_one_token_for_two_gpus(fake: tuple[FakeNras, Any], pki: NrasPki) -> None:
    nras, _ = fake
    nras.digest_of = None

    def same(doc: list[Any]) -> bytes:
        doc[1]["GPU-1"] = doc[1]["GPU-0"]
        return json.dumps(doc).encode()

    nras.finish = same
    assert "one token for several" in str(refused(nras, pki, "device-token"))


@pytest.mark.parametrize(
    ("header", "expect"),
    [
        ({"alg": "none"}, "alg none"),
        ({"alg": "HS256"}, "shared-secret"),
        ({"alg": "ES256"}, "not ES384"),
        ({"alg": "RS384"}, "not ES384"),
    ],
)
def test_other_algorithms_are_refused_before_any_key(
    fake: tuple[FakeNras, Any], pki: NrasPki, header: dict[str, str], expect: str
) -> None:
    nras, server = fake

    def forge(doc: list[Any]) -> bytes:
        _, payload, _ = doc[0][1].split(".")
        head = b64u(json.dumps({**header, "kid": KID, "typ": "JWT"}).encode())
        sig = "" if header["alg"] == "none" else b64u(b"\x00" * 32)
        doc[0][1] = f"{head}.{payload}.{sig}"
        return json.dumps(doc).encode()

    nras.finish = forge
    assert expect in str(refused(nras, pki, "alg"))
    assert not any(s.path == JWKS_PATH for s in server.seen)


def test_hs256_signed_with_the_public_key_is_refused(
    fake: tuple[FakeNras, Any], pki: NrasPki
) -> None:
    """The classic confusion: an HMAC keyed with the published public key bytes."""
    import hmac

    nras, _ = fake
    pem = pki.signer.key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )

    def forge(doc: list[Any]) -> bytes:
        _, payload, _ = doc[0][1].split(".")
        head = b64u(json.dumps({"alg": "HS256", "kid": KID}).encode())
        mac = hmac.new(pem, f"{head}.{payload}".encode(), hashlib.sha256).digest()
        doc[0][1] = f"{head}.{payload}.{b64u(mac)}"
        return json.dumps(doc).encode()

    nras.finish = forge
    refused(nras, pki, "alg")


def test_token_without_kid(fake: tuple[FakeNras, Any], pki: NrasPki) -> None:
    nras, _ = fake

    def drop_kid(doc: list[Any]) -> bytes:
        _, payload, sig = doc[0][1].split(".")
        head = b64u(json.dumps({"alg": "ES384", "typ": "JWT"}).encode())
        doc[0][1] = f"{head}.{payload}.{sig}"
        return json.dumps(doc).encode()

    nras.finish = drop_kid
    refused(nras, pki, "kid")


# --- refused: the key set ----------------------------------------------------------


def test_x5c_chain_to_another_root(fake: tuple[FakeNras, Any], pki: NrasPki) -> None:
    nras, _ = fake
    nras.signing_key = pki.other_signer.key
    nras.jwks_keys = [jwk_for(pki.other_signer, KID, [pki.other_signer, pki.other_root])]
    assert "pinned root" in str(refused(nras, pki, "x5c"))


def test_key_without_x5c_when_roots_are_pinned(fake: tuple[FakeNras, Any], pki: NrasPki) -> None:
    nras, _ = fake
    nras.jwks_keys = [jwk_for(pki.signer, KID, None)]
    refused(nras, pki, "x5c")


def test_x5c_that_does_not_hold_the_key_makes_it_unusable(
    fake: tuple[FakeNras, Any], pki: NrasPki
) -> None:
    nras, _ = fake
    bad = jwk_for(pki.signer, KID, [pki.other_signer])
    nras.jwks_keys = [bad]
    assert "x5c[0]" in str(refused(nras, pki, "kid"))


def test_expired_signing_certificate(fake: tuple[FakeNras, Any], pki: NrasPki) -> None:
    nras, _ = fake
    old = make_node(
        "Old signer",
        pki.ca,
        ca=False,
        not_before=dt.datetime(2020, 1, 1, tzinfo=dt.UTC),
        not_after=dt.datetime(2025, 1, 1, tzinfo=dt.UTC),
    )
    nras.signing_key = old.key
    nras.jwks_keys = [jwk_for(old, KID, [old, pki.ca, pki.root])]
    assert "expired" in str(refused(nras, pki, "x5c"))


def test_non_p384_keys_are_unusable() -> None:
    p256 = ec.generate_private_key(ec.SECP256R1())
    jwk = dict(ECKey.import_key(p256.public_key()).as_dict(private=False))
    jwk["kid"] = "small"
    keys = parse_jwks(json.dumps({"keys": [jwk, {"kid": "rsa", "kty": "RSA"}]}).encode())
    assert not keys.keys and set(keys.unusable) == {"small", "rsa"}


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b'{"keys": 1}',
        b'{"keys": [{"kty": "EC"}]}',
        b'{"keys": [{"kid": "a"}, {"kid": "a"}]}',
    ],
)
def test_malformed_key_set_is_collateral_unavailable(
    fake: tuple[FakeNras, Any], pki: NrasPki, body: bytes
) -> None:
    nras, _ = fake
    nras.jwks_reply = Reply(200, body)
    unavailable(nras, pki, RemoteServiceError)


def test_key_set_service_failing(fake: tuple[FakeNras, Any], pki: NrasPki) -> None:
    nras, _ = fake
    nras.jwks_reply = Reply(503, b"down")
    assert "503" in unavailable(nras, pki, HttpStatusError)


def test_key_set_over_plain_http_needs_pinned_roots() -> None:
    with pytest.raises(RemoteServiceError):
        JwksClient(fetcher=fetcher(), url="http://nras.example/.well-known/jwks.json")
    JwksClient(
        fetcher=fetcher(),
        url="http://nras.example/jwks",
        roots=[make_node("r", None, ca=True).cert],
    )


def test_key_set_is_cached_until_it_expires(fake: tuple[FakeNras, Any], pki: NrasPki) -> None:
    nras, server = fake
    clock = [0.0]
    fetch = fetcher()
    jwks = JwksClient(
        fetcher=fetch,
        url=nras.url + JWKS_PATH,
        roots=[pki.root.cert],
        ttl=100,
        clock=lambda: clock[0],
    )
    c = NrasClient(fetcher=fetch, jwks=jwks, base_url=nras.url)
    for _ in range(3):
        c.attest(evidence(1), NONCE, now=NOW)
    assert sum(1 for s in server.seen if s.path == JWKS_PATH) == 1
    clock[0] = 101.0
    c.attest(evidence(1), NONCE, now=NOW)
    assert sum(1 for s in server.seen if s.path == JWKS_PATH) == 2


def _jwks_fetches(server: Any) -> int:
    return sum(1 for s in server.seen if s.path == JWKS_PATH)


def test_key_set_is_kept_on_disk_between_runs(
    fake: tuple[FakeNras, Any], pki: NrasPki, tmp_path: Path
) -> None:
    nras, server = fake
    settings = NetworkSettings(cache_dir=tmp_path, retries=0)
    for _ in range(3):  # three runs: three clients
        c = build_nras_client(settings, roots=[pki.root.cert], nras_url=nras.url)
        assert c.attest(evidence(1), NONCE, now=NOW).trusted
    assert _jwks_fetches(server) == 1
    entries = list((tmp_path / "jwks").iterdir())
    assert len(entries) == 1
    assert entries[0].stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "jwks").stat().st_mode & 0o777 == 0o700
    doc = json.loads(entries[0].read_text())
    assert doc["url"] == nras.url + JWKS_PATH and doc["kind"] == "jwks"

    # A corrupt entry is a miss: fetched again and rewritten.
    entries[0].write_text(json.dumps({**doc, "sha256": "00" * 32}))
    build_nras_client(settings, roots=[pki.root.cert], nras_url=nras.url).attest(
        evidence(1), NONCE, now=NOW
    )
    assert _jwks_fetches(server) == 2
    assert json.loads(entries[0].read_text())["sha256"] == doc["sha256"]


def test_disk_key_set_expires(fake: tuple[FakeNras, Any], pki: NrasPki, tmp_path: Path) -> None:
    nras, server = fake
    wall = [1_000_000.0]
    disk = JwksDiskCache(tmp_path)

    def run() -> None:
        fetch = fetcher()
        jwks = JwksClient(
            fetcher=fetch,
            url=nras.url + JWKS_PATH,
            roots=[pki.root.cert],
            ttl=100,
            disk=disk,
            wall_clock=lambda: wall[0],
        )
        NrasClient(fetcher=fetch, jwks=jwks, base_url=nras.url).attest(evidence(1), NONCE, now=NOW)

    run()
    wall[0] += 99
    run()
    assert _jwks_fetches(server) == 1
    wall[0] += 2
    run()
    assert _jwks_fetches(server) == 2


def test_a_cached_key_is_chain_checked_again(
    fake: tuple[FakeNras, Any], pki: NrasPki, tmp_path: Path
) -> None:
    """A key set planted in the cache gives no trust: its keys still need the pinned root."""
    nras, _ = fake
    url = nras.url + JWKS_PATH
    planted = {"keys": [jwk_for(pki.other_signer, KID, [pki.other_signer, pki.other_root])]}
    JwksDiskCache(tmp_path).put(url, json.dumps(planted).encode(), expires=4e9)
    nras.signing_key = pki.other_signer.key
    settings = NetworkSettings(cache_dir=tmp_path, retries=0)
    c = build_nras_client(settings, roots=[pki.root.cert], nras_url=nras.url)
    with pytest.raises(TokenCheckError) as info:
        c.attest(evidence(1), NONCE, now=NOW)
    assert info.value.check == "x5c"


def test_no_disk_cache_without_pinned_roots(
    fake: tuple[FakeNras, Any], pki: NrasPki, tmp_path: Path
) -> None:
    nras, _ = fake
    settings = NetworkSettings(cache_dir=tmp_path, retries=0)
    c = build_nras_client(settings, roots=[], nras_url=nras.url)
    assert c.attest(evidence(1), NONCE, now=NOW).key_anchor == "tls"
    assert not (tmp_path / "jwks").exists()


# --- refused: the service (exit 3) -------------------------------------------------


def test_service_failing(fake: tuple[FakeNras, Any], pki: NrasPki) -> None:
    nras, server = fake
    nras.reply = Reply(500, b"internal")
    assert "HTTP 500" in unavailable(nras, pki, HttpStatusError)
    assert sum(1 for s in server.seen if s.method == "POST") == 2  # one retry


def test_service_refusing_the_request(fake: tuple[FakeNras, Any], pki: NrasPki) -> None:
    nras, _ = fake
    nras.reply = Reply(400, b'{"errorCode": 4010}')
    unavailable(nras, pki, HttpStatusError)


def test_slow_service(fake: tuple[FakeNras, Any], pki: NrasPki) -> None:
    nras, _ = fake
    nras.reply = Reply(200, b"[]", delay=1.5)
    assert "read timeout" in unavailable(nras, pki, NetworkError, read=0.3)


def test_oversized_answer(fake: tuple[FakeNras, Any], pki: NrasPki) -> None:
    nras, _ = fake
    nras.reply = Reply(200, b"[" + b" " * (3 * 1024 * 1024) + b"]")
    assert "exceeds" in unavailable(nras, pki, NetworkError)


def test_oversized_answer_without_length(fake: tuple[FakeNras, Any], pki: NrasPki) -> None:
    nras, _ = fake
    nras.reply = Reply(200, b"[" + b" " * (3 * 1024 * 1024) + b"]", no_length=True)
    assert "exceeds" in unavailable(nras, pki, NetworkError)


@pytest.mark.parametrize(
    "body",
    [
        b"<html>oops</html>",
        b"{}",
        b'[["JWT", 1], {}]',
        b'[["JWT", "a.b"], {}]',
        b'[["JWT", "!!!.e30.AA"], {}]',
        b'[["XYZ", "a.b.c"], {}]',
        b"\xff\xfe",
    ],
)
def test_malformed_answer(fake: tuple[FakeNras, Any], pki: NrasPki, body: bytes) -> None:
    nras, _ = fake
    nras.reply = Reply(200, body)
    unavailable(nras, pki, RemoteServiceError)


def test_offline_never_posts(pki: NrasPki) -> None:
    settings = NetworkSettings(offline=True, use_cache=False)
    c = build_nras_client(settings, roots=[pki.root.cert], nras_url="http://127.0.0.1:9")
    with pytest.raises(OfflineError):
        c.attest(evidence(), NONCE, now=NOW)


def test_service_down(pki: NrasPki) -> None:
    from tests.support.netfixtures import free_port

    url = f"http://127.0.0.1:{free_port()}"
    fetch = fetcher()
    jwks = JwksClient(fetcher=fetch, url=url + JWKS_PATH, roots=[pki.root.cert])
    with pytest.raises(NetworkError) as info:
        NrasClient(fetcher=fetch, jwks=jwks, base_url=url).attest(evidence(), NONCE, now=NOW)
    assert exit_code_for(info.value) == 3 and "refused" in str(info.value)


# --- building the client -----------------------------------------------------------


def test_url_precedence_and_service_key(pki: NrasPki, tmp_path: Path) -> None:
    settings = NetworkSettings(service_key="sekrit-key", cache_dir=tmp_path)
    roots = [pki.root.cert]
    assert build_nras_client(settings, roots=roots).url == DEFAULT_NRAS_BASE_URL + "/v4/attest/gpu"
    env = {NRAS_URL_ENV: "https://nras.example/"}
    c = build_nras_client(settings, roots=roots, environ=env)
    assert c.url == "https://nras.example/v4/attest/gpu" and c.issuer == "https://nras.example"
    assert c.jwks.url == "https://nras.example/.well-known/jwks.json"
    c = build_nras_client(settings, roots=roots, environ=env, nras_url="https://other.example")
    assert c.base_url == "https://other.example"
    assert "sekrit" not in repr(c) and "sekrit" not in repr(c.jwks)


def test_service_key_is_sent_as_bearer(
    fake: tuple[FakeNras, Any], pki: NrasPki, tmp_path: Path
) -> None:
    nras, server = fake
    settings = NetworkSettings(service_key="sekrit-key", retries=0, cache_dir=tmp_path)
    c = build_nras_client(settings, roots=[pki.root.cert], nras_url=nras.url)
    assert c.attest(evidence(), NONCE, now=NOW).trusted
    assert all(s.headers.get("Authorization") == "Bearer sekrit-key" for s in server.seen)


def test_mixed_architectures_are_refused(fake: tuple[FakeNras, Any], pki: NrasPki) -> None:
    from gpucc.core.errors import MalformedEvidenceError

    nras, server = fake
    gpus = (
        GpuEvidence(report=b"a", cert_chain_pem=b"b", arch="HOPPER"),
        GpuEvidence(report=b"a", cert_chain_pem=b"b", arch="BLACKWELL"),
    )
    with pytest.raises(MalformedEvidenceError):
        client(nras, pki).attest(EvidenceSet(gpus=gpus), NONCE, now=NOW)
    assert server.count == 0


# --- hostile answers never escape the two outcome families ---------------------------


class _KeySetOnly:
    """A Fetcher that serves one key set and refuses everything else."""

    def __init__(self, jwks: bytes) -> None:
        self.jwks = jwks

    def get(self, url: str, *, max_bytes: int, **_: object) -> bytes:
        return self.jwks

    def post(self, url: str, body: bytes, **_: object) -> bytes:
        raise NetworkError("no posting in this test")


def _offline_client(pki: NrasPki, base: str) -> NrasClient:
    jwks = json.dumps({"keys": [jwk_for(pki.signer, KID, [pki.signer, pki.ca])]}).encode()
    fetch = _KeySetOnly(jwks)
    keys = JwksClient(fetcher=fetch, url=base + JWKS_PATH, roots=[pki.root.cert])
    return NrasClient(fetcher=fetch, jwks=keys, base_url=base)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=400) | st.text(max_size=400).map(str.encode))
def test_arbitrary_answers_are_service_errors_or_refusals(pki: NrasPki, data: bytes) -> None:
    c = _offline_client(pki, "https://nras.test")
    try:
        c.check_answer(data, gpu_count=1, nonce=NONCE, now=NOW)
    except (RemoteServiceError, TokenCheckError):
        return
    raise AssertionError("an arbitrary answer was accepted")


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(position=st.integers(min_value=0), char=st.characters(exclude_categories=["Cs"]))
def test_one_character_changes_to_an_answer(pki: NrasPki, position: int, char: str) -> None:
    base = "https://nras.test"
    nras = FakeNras(pki, url=base)
    good = json.dumps(nras.answer({"nonce": NONCE.hex(), "evidence_list": [{}, {}]}))
    c = _offline_client(pki, base)
    original = c.check_answer(good.encode(), gpu_count=2, nonce=NONCE, now=NOW)
    i = position % len(good)
    mutated = (good[:i] + char + good[i + 1 :]).encode()
    try:
        got = c.check_answer(mutated, gpu_count=2, nonce=NONCE, now=NOW)
    except (RemoteServiceError, TokenCheckError):
        return
    assert got.overall_claims == original.overall_claims
    assert [dict(g.claims) for g in got.gpus] == [dict(g.claims) for g in original.gpus]


def test_deeply_nested_answer_is_a_service_error(pki: NrasPki) -> None:
    with pytest.raises(RemoteServiceError):
        _offline_client(pki, "https://nras.test").check_answer(
            b"[" * 500_000, gpu_count=1, nonce=NONCE, now=NOW
        )


# --- claims 4.0: NVIDIA's current evidence ------------------------------------------------


def _current(folder: Path) -> EvidenceSet:
    from gpucc.gpuattest.evidence import load_evidence_file

    return load_evidence_file(folder / "evidence.cmw.json")


def test_current_evidence_asks_for_claims_4(fake: tuple[FakeNras, Any], pki: NrasPki) -> None:
    from gpucc.gpuattest.nras import claims_version_for
    from tests.support.samples import FSP, NVDAOD_H100, RUBIN, SET_A_REPORT, report_bytes

    legacy = EvidenceSet(gpus=(GpuEvidence(report_bytes(SET_A_REPORT), b"", "HOPPER"),))
    versioned = EvidenceSet(gpus=(GpuEvidence(report_bytes(NVDAOD_H100), b"", "HOPPER"),))
    assert claims_version_for(legacy) == "3.0"
    assert claims_version_for(versioned) == "4.0"
    assert claims_version_for(_current(FSP)) == "4.0"  # no opaque data at all
    assert claims_version_for(_current(RUBIN)) == "4.0"
    nras, server = fake
    verdict = client(nras, pki).attest(_current(RUBIN), NONCE, now=NOW)
    assert verdict.trusted and nras.claims_versions[-1] == "4.0"
    assert verdict.overall_claims["x-nvidia-ver"] == "4.0"
    body = json.loads([s for s in server.seen if s.method == "POST"][-1].body)
    assert body["arch"] == "RUBIN" and body["claims_version"] == "4.0"


def test_opaque_mismatch_claims_make_it_not_trusted(
    fake: tuple[FakeNras, Any], pki: NrasPki
) -> None:
    from tests.support.samples import RUBIN

    nras, _ = fake
    record = {
        "id": 37,
        "name": "GSP_SVN",
        "goldenType": "MIN_SVN",
        "goldenValue": 5,
        "runtimeType": "MIN_SVN",
        "runtimeValue": 4,
    }
    nras.opaque_mismatches = [record]  # with measres "success": the record alone decides
    try:
        verdict = client(nras, pki).attest(_current(RUBIN), NONCE, now=NOW)
    finally:
        nras.opaque_mismatches = None
    assert not verdict.trusted and verdict.overall_result
    assert verdict.gpus[0].mismatches == (record,)
