"""OcspClient against a real local OCSP responder built on cryptography's OCSPResponseBuilder."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.x509 import ocsp

from gpucc.core.errors import UsageError
from gpucc.core.transport import RequestsFetcher
from gpucc.gpuattest.collateral import ChainKind, OcspOutcome, OcspStatus
from gpucc.gpuattest.ocsp import OcspClient
from gpucc.gpuattest.ocsp_response import (
    NONCE_BYTES,
    CertId,
    OcspRules,
    build_request,
    describe_age,
    evaluate_response,
)
from tests.support.netfixtures import (
    NOW,
    LocalServer,
    NetPki,
    OcspBehaviour,
    OcspResponder,
    build_pki,
    free_port,
    ocsp_target,
    serve,
)

DEVICE = ChainKind.DEVICE
KEY = "nvapi-ocsp-SECRET"


@pytest.fixture(autouse=True)
def _no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture(scope="module")
def pki() -> NetPki:
    return build_pki()


@pytest.fixture
def responder(pki: NetPki) -> OcspResponder:
    return OcspResponder(pki)


@pytest.fixture
def server(responder: OcspResponder) -> Iterator[LocalServer]:
    with serve(responder) as srv:
        yield srv


@pytest.fixture
def fetcher() -> Iterator[RequestsFetcher]:
    with RequestsFetcher(timeout=(0.5, 0.5), retries=1, backoff=0.01) as f:
        yield f


@pytest.fixture
def client(server: LocalServer, fetcher: RequestsFetcher) -> OcspClient:
    return OcspClient(
        fetcher=fetcher,
        url=server.url,
    )


def check_brom(
    client: OcspClient,
    pki: NetPki,
    *,
    kind: ChainKind = DEVICE,
    now: dt.datetime = NOW,
    issuer_chain: list[x509.Certificate] | None = None,
) -> OcspOutcome:
    """OCSP for the BROM certificate (device index 1), issuer the Provisioner ICA."""
    chain = pki.device_chain
    return client.check(
        ocsp_target(
            chain[1],
            chain[2],
            kind=kind,
            anchor=pki.device_root.cert,
            now=now,
            issuer_chain=chain[3:] if issuer_chain is None else issuer_chain,
        )
    )


def assert_invalid(out: OcspOutcome, words: str) -> None:
    assert out.status is OcspStatus.UNKNOWN
    assert out.response_valid is False
    assert out.collateral_missing is False
    assert "invalid OCSP response" in out.reason
    assert words in out.reason


def assert_missing(out: OcspOutcome, words: str) -> None:
    assert out.status is OcspStatus.NOT_CHECKED
    assert out.collateral_missing is True
    assert words in out.reason


# --- good paths and the request form ----------------------------------------------


def test_device_chain_certificates_1_to_3_are_good(
    client: OcspClient, pki: NetPki, server: LocalServer, responder: OcspResponder
) -> None:
    chain = pki.device_chain
    for i in (3, 2, 1):
        out = client.check(
            ocsp_target(
                chain[i],
                chain[i + 1],
                kind=DEVICE,
                anchor=pki.device_root.cert,
                now=NOW,
                issuer_chain=chain[i + 2 :],
            )
        )
        assert out.status is OcspStatus.GOOD, out.reason
        assert out.response_valid is True
        assert out.nonce_match is True
        assert out.reason == ""
        assert out.this_update == NOW - dt.timedelta(hours=1)
        assert out.next_update == NOW + dt.timedelta(days=1)
    assert server.count == 3
    seen = server.seen[0]
    assert seen.method == "POST"
    assert seen.headers["Content-Type"] == "application/ocsp-request"
    assert seen.headers["Accept"] == "application/ocsp-response"
    request = responder.requests[0]
    assert isinstance(request.hash_algorithm, hashes.SHA1)
    nonce = request.extensions.get_extension_for_class(x509.OCSPNonce)
    assert nonce.critical is False
    assert len(nonce.value.nonce) == NONCE_BYTES
    # Every request carries a fresh nonce.
    nonces = {
        r.extensions.get_extension_for_class(x509.OCSPNonce).value.nonce for r in responder.requests
    }
    assert len(nonces) == 3


def test_rim_chain_certificates_0_to_2_are_good(client: OcspClient, pki: NetPki) -> None:
    chain = pki.rim_chain
    for i in (2, 1, 0):
        out = client.check(
            ocsp_target(
                chain[i],
                chain[i + 1],
                kind=ChainKind.DRIVER_RIM,
                anchor=pki.rim_root.cert,
                now=NOW,
                issuer_chain=chain[i + 2 :],
            )
        )
        assert out.status is OcspStatus.GOOD, out.reason


def test_without_nonce(
    server: LocalServer, fetcher: RequestsFetcher, pki: NetPki, responder: OcspResponder
) -> None:
    client = OcspClient(fetcher=fetcher, url=server.url, use_nonce=False)
    out = check_brom(client, pki)
    assert out.status is OcspStatus.GOOD
    assert out.nonce_match is None
    with pytest.raises(x509.ExtensionNotFound):
        responder.requests[0].extensions.get_extension_for_class(x509.OCSPNonce)


def test_delegated_responder_with_ocsp_signing_eku(
    client: OcspClient, pki: NetPki, responder: OcspResponder
) -> None:
    responder.set(signer="delegated")
    out = check_brom(client, pki)
    assert out.status is OcspStatus.GOOD, out.reason
    assert out.response_valid is True


@pytest.mark.parametrize("signer", ["issuer", "delegated"])
def test_responder_identified_by_name(
    client: OcspClient, pki: NetPki, responder: OcspResponder, signer: str
) -> None:
    responder.set(signer=signer, responder_id="name")
    assert check_brom(client, pki).status is OcspStatus.GOOD


def test_responder_chain_taken_from_the_response(
    client: OcspClient, pki: NetPki, responder: OcspResponder
) -> None:
    responder.set(signer="delegated", include_chain=True)
    assert check_brom(client, pki, issuer_chain=[]).status is OcspStatus.GOOD


def test_responder_chain_not_buildable_is_collateral_missing(
    client: OcspClient, pki: NetPki
) -> None:
    out = check_brom(client, pki, issuer_chain=[])
    assert_missing(out, "issuer_chain")
    assert out.response_valid is None


# --- statuses ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "name"),
    [
        (x509.ReasonFlags.key_compromise, "key_compromise"),
        (x509.ReasonFlags.ca_compromise, "ca_compromise"),
        (x509.ReasonFlags.superseded, "superseded"),
        (x509.ReasonFlags.cessation_of_operation, "cessation_of_operation"),
        (None, "unspecified"),
    ],
)
def test_revoked_with_reasons(
    client: OcspClient,
    pki: NetPki,
    responder: OcspResponder,
    reason: x509.ReasonFlags | None,
    name: str,
) -> None:
    responder.set(status="revoked", reason=reason)
    out = check_brom(client, pki)
    assert out.status is OcspStatus.REVOKED
    assert out.revocation_reason == name
    assert out.response_valid is True
    assert name in out.reason


def test_certificate_hold_is_reported_alike_on_every_chain(
    client: OcspClient, pki: NetPki, responder: OcspResponder
) -> None:
    """The OCSP layer only reports a hold; whether it is acceptable is the policy's one switch."""
    responder.set(status="revoked", reason=x509.ReasonFlags.certificate_hold)
    chain = pki.rim_chain
    rim = client.check(
        ocsp_target(
            chain[0],
            chain[1],
            kind=ChainKind.DRIVER_RIM,
            anchor=pki.rim_root.cert,
            now=NOW,
            issuer_chain=chain[2:],
        )
    )
    device = check_brom(client, pki)
    for out in (rim, device):
        assert out.status is OcspStatus.REVOKED
        assert out.revocation_reason == "certificate_hold"
        assert out.reason.startswith("revoked (certificate_hold) on ")
        assert "allowed" not in out.reason


def test_unknown(client: OcspClient, pki: NetPki, responder: OcspResponder) -> None:
    responder.set(status="unknown")
    out = check_brom(client, pki)
    assert out.status is OcspStatus.UNKNOWN
    assert out.response_valid is True
    assert "does not know" in out.reason


def test_matching_single_response_is_chosen_not_the_first(
    client: OcspClient, pki: NetPki, responder: OcspResponder
) -> None:
    # First SingleResponse: "good" for another serial; second: ours, revoked.
    responder.set(status="revoked", reason=x509.ReasonFlags.key_compromise, extra_before=True)
    out = check_brom(client, pki)
    assert out.status is OcspStatus.REVOKED
    assert out.revocation_reason == "key_compromise"


# --- nonce ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["wrong", "omit"])
def test_nonce_not_echoed(
    client: OcspClient, pki: NetPki, responder: OcspResponder, mode: str
) -> None:
    responder.set(nonce=mode)
    out = check_brom(client, pki)
    assert out.status is OcspStatus.GOOD
    assert out.nonce_match is False
    assert out.response_valid is True
    assert "nonce" in out.reason


# --- freshness ---------------------------------------------------------------------------


def test_stale_response(client: OcspClient, pki: NetPki, responder: OcspResponder) -> None:
    responder.set(this_update=dt.timedelta(days=-5), next_update=dt.timedelta(days=-3))
    out = check_brom(client, pki)
    assert_missing(out, "stale")
    assert "expired 3 days ago" in out.reason
    assert out.response_valid is True
    assert out.next_update == NOW - dt.timedelta(days=3)


def test_next_update_within_clock_skew_is_accepted(
    client: OcspClient, pki: NetPki, responder: OcspResponder
) -> None:
    responder.set(this_update=dt.timedelta(days=-1), next_update=dt.timedelta(minutes=-2))
    assert check_brom(client, pki).status is OcspStatus.GOOD


def test_not_yet_valid_beyond_skew(
    client: OcspClient, pki: NetPki, responder: OcspResponder
) -> None:
    responder.set(this_update=dt.timedelta(hours=2), next_update=dt.timedelta(days=2))
    out = check_brom(client, pki)
    assert_missing(out, "not yet valid")
    assert "2 hours" in out.reason


def test_this_update_slightly_ahead_within_skew(
    client: OcspClient, pki: NetPki, responder: OcspResponder
) -> None:
    responder.set(this_update=dt.timedelta(minutes=3))
    assert check_brom(client, pki).status is OcspStatus.GOOD


def test_no_next_update_is_bounded_by_max_age(
    client: OcspClient, pki: NetPki, responder: OcspResponder
) -> None:
    responder.set(this_update=dt.timedelta(hours=-2), next_update=None)
    assert check_brom(client, pki).status is OcspStatus.GOOD
    responder.set(this_update=dt.timedelta(days=-2), next_update=None)
    out = check_brom(client, pki)
    assert_missing(out, "no nextUpdate")


def test_next_update_before_this_update_is_invalid(
    client: OcspClient, pki: NetPki, responder: OcspResponder
) -> None:
    responder.set(this_update=dt.timedelta(hours=-1), next_update=dt.timedelta(hours=-2))
    assert_invalid(check_brom(client, pki), "nextUpdate is before")


# --- invalid responses ----------------------------------------------------------------------


def test_signed_by_an_unauthorised_key(
    client: OcspClient, pki: NetPki, responder: OcspResponder
) -> None:
    responder.set(signer="rogue")
    assert_invalid(check_brom(client, pki), "not authorised")


def test_forged_signature(client: OcspClient, pki: NetPki, responder: OcspResponder) -> None:
    responder.set(signer="forged")
    assert_invalid(check_brom(client, pki), "signature does not verify")


def test_delegated_responder_without_ocsp_signing_eku(
    client: OcspClient, pki: NetPki, responder: OcspResponder
) -> None:
    responder.set(signer="delegated-no-eku")
    assert_invalid(check_brom(client, pki), "OCSP-signing")


def test_delegated_responder_of_another_ca(
    client: OcspClient, pki: NetPki, responder: OcspResponder
) -> None:
    responder.set(signer="stranger")
    assert_invalid(check_brom(client, pki), "not issued by")


def test_answer_about_another_certificate(
    client: OcspClient, pki: NetPki, responder: OcspResponder
) -> None:
    responder.set(answer_for="other")
    assert_invalid(check_brom(client, pki), "CertID")


def test_responder_chain_must_reach_the_given_anchor(client: OcspClient, pki: NetPki) -> None:
    chain = pki.device_chain
    out = client.check(
        ocsp_target(
            chain[1],
            chain[2],
            kind=DEVICE,
            anchor=pki.rim_root.cert,
            now=NOW,
            issuer_chain=chain[3:],
        )
    )
    assert_invalid(out, "chain")


def test_responder_chain_is_checked_at_now(client: OcspClient, pki: NetPki) -> None:
    # The test PKI's device root is valid from 2021; at 2020 the chain is expired.
    before = dt.datetime(2020, 6, 1, tzinfo=dt.UTC)
    assert_invalid(check_brom(client, pki, now=before), "chain is expired")


# --- failures to obtain an answer ----------------------------------------------------


def test_http_500(
    client: OcspClient, pki: NetPki, responder: OcspResponder, server: LocalServer
) -> None:
    responder.set(http_status=500)
    out = check_brom(client, pki)
    assert_missing(out, "HTTP 500")
    assert out.response_valid is None
    assert server.count == 2  # one retry


def test_connection_refused(fetcher: RequestsFetcher, pki: NetPki) -> None:
    client = OcspClient(fetcher=fetcher, url=f"http://127.0.0.1:{free_port()}")
    assert_missing(check_brom(client, pki), "connection refused")


def test_garbage_body(client: OcspClient, pki: NetPki, responder: OcspResponder) -> None:
    responder.set(body="garbage")
    assert_missing(check_brom(client, pki), "not an OCSP response")


def test_unsuccessful_response_status(
    client: OcspClient, pki: NetPki, responder: OcspResponder
) -> None:
    responder.set(body="unauthorized")
    assert_missing(check_brom(client, pki), "'unauthorized'")


def test_offline(server: LocalServer, pki: NetPki) -> None:
    client = OcspClient(fetcher=RequestsFetcher(offline=True), url=server.url)
    out = check_brom(client, pki)
    assert_missing(out, "offline")
    assert server.count == 0


# --- service key --------------------------------------------------------------------------


def test_service_key_sent_as_bearer_and_hidden(
    server: LocalServer, fetcher: RequestsFetcher, pki: NetPki
) -> None:
    client = OcspClient(fetcher=fetcher, url=server.url, service_key=KEY)
    assert check_brom(client, pki).status is OcspStatus.GOOD
    assert server.seen[0].headers["Authorization"] == f"Bearer {KEY}"
    assert KEY not in repr(client)


def test_service_key_refused_for_plain_http_remote(fetcher: RequestsFetcher) -> None:
    with pytest.raises(UsageError):
        OcspClient(fetcher=fetcher, url="http://ocsp.ndis.nvidia.com", service_key=KEY)


# --- the pure core ----------------------------------------------------------------------


def test_evaluate_response_never_raises_on_junk(pki: NetPki) -> None:
    chain = pki.device_chain
    for junk in (b"", b"\x30\x00", b"\x30\x03\x0a\x01\x00", bytes(range(256))):
        out = evaluate_response(
            junk, ocsp_target(chain[1], chain[2], anchor=chain[4], now=NOW, kind=DEVICE)
        )
        assert out.status is OcspStatus.NOT_CHECKED
    with pytest.raises(ValueError):
        evaluate_response(
            b"",
            ocsp_target(
                chain[1], chain[2], anchor=chain[4], now=NOW.replace(tzinfo=None), kind=DEVICE
            ),
        )


def test_evaluate_uses_rules(pki: NetPki, responder: OcspResponder) -> None:
    chain = pki.device_chain
    request = ocsp.load_der_ocsp_request(build_request(chain[1], chain[2], nonce=None))
    responder.set(this_update=dt.timedelta(hours=-3), next_update=None)
    der = responder.respond(pki.brom, request, responder.behaviour)
    strict = OcspRules(max_age_without_next_update=dt.timedelta(hours=1))
    for rules, status in ((OcspRules(), OcspStatus.GOOD), (strict, OcspStatus.NOT_CHECKED)):
        out = evaluate_response(
            der,
            ocsp_target(
                chain[1], chain[2], anchor=chain[4], now=NOW, kind=DEVICE, issuer_chain=chain[3:]
            ),
            rules=rules,
        )
        assert out.status is status


def test_cert_id_identity(pki: NetPki) -> None:
    chain = pki.device_chain
    a = CertId.for_certificate(chain[1], chain[2])
    assert a == CertId.for_certificate(chain[1], chain[2])
    assert a.key != CertId.for_certificate(chain[2], chain[3]).key
    assert a.key != CertId.for_certificate(chain[1], chain[2], "sha256").key
    assert a.der()[0] == 0x30
    with pytest.raises(ValueError):
        CertId.for_certificate(chain[1], chain[2], "md5")


def test_describe_age() -> None:
    assert describe_age(dt.timedelta(seconds=40)) == "40 seconds"
    assert describe_age(dt.timedelta(minutes=12)) == "12 minutes"
    assert describe_age(dt.timedelta(hours=5)) == "5 hours"
    assert describe_age(dt.timedelta(days=3, hours=4)) == "3 days"


def test_default_behaviour_is_good() -> None:
    assert OcspBehaviour().status == "good"


def test_every_single_byte_corruption_is_handled(pki: NetPki, responder: OcspResponder) -> None:
    """Flip each byte of a good response: never an exception, never a forged "good"."""
    chain = pki.device_chain
    request = ocsp.load_der_ocsp_request(build_request(chain[1], chain[2], nonce=None))
    responder.set(signer="delegated")
    der = responder.respond(pki.brom, request, responder.behaviour)
    original_tbs = ocsp.load_der_ocsp_response(der).tbs_response_bytes
    goods = 0
    for i in range(len(der)):
        mutated = der[:i] + bytes([der[i] ^ 0x01]) + der[i + 1 :]
        out = evaluate_response(
            mutated,
            ocsp_target(
                chain[1], chain[2], anchor=chain[4], now=NOW, kind=DEVICE, issuer_chain=chain[3:]
            ),
        )
        if out.status is OcspStatus.GOOD:
            goods += 1
            # Only bytes outside the signed data may change without detection.
            assert ocsp.load_der_ocsp_response(mutated).tbs_response_bytes == original_tbs
    assert goods < len(der) // 4
