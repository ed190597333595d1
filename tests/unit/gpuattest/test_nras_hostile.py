"""Remote verification against hostile loopback servers: the key set's origin holds across
redirects, every NRAS and key-set answer ends within the whole-call deadline, and claims
that are not plain JSON are refused."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpucc.cli.exitcodes import exit_code_for
from gpucc.core.errors import NetworkError, UsageError
from gpucc.core.transport import RedirectRefusedError, RequestsFetcher
from gpucc.gpuattest.evidence import EvidenceSet, GpuEvidence
from gpucc.gpuattest.jwks import JwksClient, JwksDiskCache, RemoteServiceError
from gpucc.gpuattest.jws import TokenCheckError
from gpucc.gpuattest.netconfig import NetworkSettings
from gpucc.gpuattest.nras import JWKS_PATH, NrasClient, RemoteVerdict, build_nras_client
from tests.support.netfixtures import NOW, LocalServer, Reply, Seen, serve
from tests.support.nras import KID, FakeNras, NrasPki, jwk_for, make_pki

NONCE = bytes.fromhex("4cff7f5380ead8fad8ec2c531c110aca4302a88f603792801a8ca29ee151af2e")
EVIDENCE = EvidenceSet(gpus=(GpuEvidence(report=b"report", cert_chain_pem=b"chain"),))


@pytest.fixture(scope="module")
def pki() -> NrasPki:
    return make_pki()


@pytest.fixture
def nras(pki: NrasPki) -> Iterator[tuple[FakeNras, LocalServer]]:
    fake = FakeNras(pki)
    with serve(fake) as server:
        fake.url = server.url
        yield fake, server


@pytest.fixture
def rogue(pki: NrasPki) -> Iterator[LocalServer]:
    """Another origin (another port) serving another key as the key set."""
    keys = json.dumps({"keys": [jwk_for(pki.other_signer, KID, None)]}).encode()
    with serve(lambda seen: Reply(200, keys)) as server:
        yield server


def attest(nras: FakeNras, *, allow: tuple[str, ...] = (), deadline: float = 60.0) -> RemoteVerdict:
    """Verify as the CLI does: no pinned NRAS root, so the key set is anchored by its origin."""
    fetch = RequestsFetcher(timeout=(1.0, 5.0), retries=1, backoff=0.0, total_timeout=deadline)
    jwks = JwksClient(fetcher=fetch, url=nras.url + JWKS_PATH, allowed_origins=allow)
    client = NrasClient(fetcher=fetch, jwks=jwks, base_url=nras.url, allowed_origins=allow)
    return client.attest(EVIDENCE, NONCE, now=NOW)


def redirect_to(url: str, status: int = 302) -> Reply:
    return Reply(status, b"", {"Location": url})


# --- the key set's origin -----------------------------------------------------------------


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_key_set_redirected_to_another_origin_is_never_trusted(
    nras: tuple[FakeNras, LocalServer], rogue: LocalServer, pki: NrasPki, status: int
) -> None:
    fake, _ = nras
    fake.signing_key = pki.other_signer.key  # tokens the rogue key set would vouch for
    fake.jwks_reply = redirect_to(rogue.url + JWKS_PATH, status)
    with pytest.raises(RedirectRefusedError) as info:
        attest(fake)
    assert exit_code_for(info.value) == 3
    assert rogue.url in str(info.value) and "\n" not in str(info.value)
    assert rogue.count == 0  # refused before it was asked


def test_a_key_set_redirected_to_a_named_origin_is_followed_and_reported(
    nras: tuple[FakeNras, LocalServer], rogue: LocalServer, pki: NrasPki
) -> None:
    fake, _ = nras
    fake.signing_key = pki.other_signer.key
    fake.jwks_reply = redirect_to(rogue.url + JWKS_PATH)
    verdict = attest(fake, allow=(rogue.url + "/",))
    assert verdict.trusted and verdict.key_anchor == "tls"
    assert verdict.key_origin == rogue.url and verdict.to_dict()["key_origin"] == rogue.url


def test_a_same_origin_redirect_is_followed(nras: tuple[FakeNras, LocalServer]) -> None:
    fake, server = nras
    keys = fake.jwks()

    def handler(seen: Seen) -> Reply:
        if seen.path == "/keys/current.json":
            return Reply(200, json.dumps(keys).encode())
        if seen.path == JWKS_PATH:
            return redirect_to("/keys/current.json", 307)
        return fake(seen)

    with serve(handler) as moved:
        fake.url = moved.url  # tokens name this server as issuer
        verdict = attest(fake)
    assert verdict.trusted and verdict.key_origin == moved.url
    assert server.count == 0


def test_the_attest_request_keeps_its_origin_too(
    nras: tuple[FakeNras, LocalServer], rogue: LocalServer
) -> None:
    fake, _ = nras
    fake.reply = redirect_to(rogue.url + "/v4/attest/gpu", 307)
    with pytest.raises(RedirectRefusedError):
        attest(fake)
    assert rogue.count == 0


def test_a_redirect_loop_or_to_another_scheme_is_collateral_unavailable(
    nras: tuple[FakeNras, LocalServer],
) -> None:
    fake, server = nras
    fake.jwks_reply = redirect_to(JWKS_PATH)
    with pytest.raises(NetworkError) as info:
        attest(fake)
    assert "redirects" in str(info.value) and exit_code_for(info.value) == 3
    fake.jwks_reply = redirect_to("https://" + fake.url.removeprefix("http://") + JWKS_PATH)
    with pytest.raises(RedirectRefusedError):
        attest(fake)


def test_named_origins_are_checked(pki: NrasPki) -> None:
    fetch = RequestsFetcher(offline=True)
    for bad in ("nras.example", "https://nras.example/keys", "https://u@nras.example", "ftp://x"):
        with pytest.raises(UsageError):
            JwksClient(fetcher=fetch, url="https://nras.example/jwks", allowed_origins=[bad])
    with pytest.raises(
        RemoteServiceError
    ):  # no pinned root: a remote plain-http origin is no anchor
        JwksClient(
            fetcher=fetch, url="https://nras.example/jwks", allowed_origins=["http://keys.example"]
        )
    with_roots = JwksClient(
        fetcher=fetch,
        url="https://nras.example/jwks",
        roots=[pki.root.cert],
        allowed_origins=["HTTPS://Keys.Example:443", "http://[::1]:8080/"],
    )
    assert with_roots.allowed_origins == ("https://keys.example", "http://[::1]:8080")


def test_the_disk_cache_keeps_the_origin_and_drops_entries_without_one(
    nras: tuple[FakeNras, LocalServer], pki: NrasPki, tmp_path: Path
) -> None:
    fake, server = nras
    settings = NetworkSettings(cache_dir=tmp_path, retries=0)
    for _ in range(2):
        c = build_nras_client(settings, roots=[pki.root.cert], nras_url=fake.url)
        assert c.attest(EVIDENCE, NONCE, now=NOW).key_origin == fake.url
    assert sum(1 for s in server.seen if s.path == JWKS_PATH) == 1
    url = fake.url + JWKS_PATH
    entry = JwksDiskCache(tmp_path).get(url, wall=time.time())
    assert entry is not None and entry[2] == fake.url
    (path,) = (tmp_path / "jwks").iterdir()
    doc = json.loads(path.read_text())
    del doc["origin"]
    path.write_text(json.dumps(doc))
    assert JwksDiskCache(tmp_path).get(url, wall=time.time()) is None


# --- the whole-answer deadline ------------------------------------------------------------


def _dripping(fake: FakeNras, what: str) -> None:
    body = json.dumps(fake.jwks()).encode() if what == "key set" else b"[" + b" " * 400 + b"]"
    reply = Reply(200, body, {"Content-Type": "application/json"}, drip=0.2)
    if what == "key set":
        fake.jwks_reply = reply
    else:
        fake.reply = reply


@pytest.mark.parametrize("what", ["answer", "key set"])
def test_a_dripped_answer_ends_in_exit_3_at_the_deadline(
    nras: tuple[FakeNras, LocalServer], what: str
) -> None:
    fake, server = nras
    _dripping(fake, what)
    start = time.monotonic()
    with pytest.raises(NetworkError) as info:
        attest(fake, deadline=1.0)
    elapsed = time.monotonic() - start
    assert exit_code_for(info.value) == 3
    assert "within the deadline of 1 s" in str(info.value)
    assert elapsed < 2.5  # one deadline (the answer), or the answer then one (the key set)
    assert sum(1 for s in server.seen if s.path == JWKS_PATH) <= 1  # not retried


def test_build_nras_client_takes_the_deadline_and_the_origins(
    nras: tuple[FakeNras, LocalServer], rogue: LocalServer, pki: NrasPki
) -> None:
    fake, _ = nras
    settings = NetworkSettings(use_cache=False, retries=0, deadline=7.5)
    c = build_nras_client(settings, roots=[], nras_url=fake.url, allowed_origins=[rogue.url])
    assert c.allowed_origins == c.jwks.allowed_origins == (rogue.url,)
    fetcher: Any = c._fetcher
    assert fetcher.total_timeout == 7.5
    with pytest.raises(UsageError):
        build_nras_client(settings.__class__(deadline=0), roots=[], nras_url=fake.url)


# --- claims that are not plain JSON ---------------------------------------------------------


@pytest.mark.parametrize("claim", ["exp", "nbf", "iat"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_times_are_refused(
    nras: tuple[FakeNras, LocalServer], claim: str, value: float
) -> None:
    # Python's json reads NaN and Infinity; a NaN exp compares false with everything, so
    # it would pass as "not expired". RFC 8259 has no such numbers: the answer is malformed.
    fake, _ = nras
    fake.overall_extra = {claim: value}
    with pytest.raises(RemoteServiceError) as info:
        attest(fake)
    assert exit_code_for(info.value) == 3 and "not JSON" in str(info.value)


def test_a_time_too_long_to_be_a_number_is_a_malformed_answer(
    nras: tuple[FakeNras, LocalServer],
) -> None:
    # The strict reader bounds number literals before Python converts them.
    fake, _ = nras
    fake.overall_extra = {"exp": 10**400}
    with pytest.raises(RemoteServiceError) as info:
        attest(fake)
    assert exit_code_for(info.value) == 3 and "401 digits" in str(info.value)


@pytest.mark.parametrize("value", ["1700000000", True])
def test_times_that_are_no_date_are_refused(
    nras: tuple[FakeNras, LocalServer], value: object
) -> None:
    fake, _ = nras
    fake.overall_extra = {"exp": value}
    with pytest.raises(TokenCheckError) as info:
        attest(fake)
    assert info.value.check == "exp" and "not a NumericDate" in str(info.value)


def test_device_token_names_are_shown_short_and_on_one_line(
    nras: tuple[FakeNras, LocalServer],
) -> None:
    fake, _ = nras

    def add_names(doc: list[Any]) -> bytes:
        for i in range(10):
            doc[1][f"GPU-{i}\n\x1b[32mTRUSTED" + "x" * 500] = doc[1]["GPU-0"]
        return json.dumps(doc).encode()

    fake.finish = add_names
    with pytest.raises(TokenCheckError) as info:
        attest(fake)
    text = str(info.value)
    assert info.value.check == "device-token" and "and 6 more" in text
    assert "\n" not in text and "\x1b" not in text and len(text) < 400
