"""RequestsFetcher against real local servers: every failure is a one-line NetworkError."""

from __future__ import annotations

import socket
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucc import __version__
from gpucc.cli.exitcodes import exit_code_for
from gpucc.core.errors import (
    CollateralUnavailableError,
    NetworkError,
    OfflineError,
    UsageError,
)
from gpucc.core.transport import (
    MAX_REDIRECTS,
    HttpStatusError,
    OriginGuard,
    RedirectRefusedError,
    RequestsFetcher,
    safe_url,
)
from tests.support.netfixtures import (
    Reply,
    Seen,
    free_port,
    read_request_head,
    self_signed_tls,
    serve,
    serve_raw,
)

KEY = "nvapi-SECRET-service-key-0123456789"


@pytest.fixture(autouse=True)
def _no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture
def fetcher() -> Iterator[RequestsFetcher]:
    with RequestsFetcher(timeout=(0.5, 0.5), retries=2, backoff=0.01) as f:
        yield f


def ok(body: bytes = b"hello") -> Reply:
    return Reply(200, body)


def assert_one_line_network_error(exc: BaseException) -> None:
    assert isinstance(exc, NetworkError)
    assert exit_code_for(exc) == 3
    text = exc.diagnostics()
    assert "\n" not in text
    assert KEY not in text
    assert "Traceback" not in text


def test_get_returns_body_with_user_agent_and_identity_encoding(fetcher: RequestsFetcher) -> None:
    with serve(lambda seen: ok()) as srv:
        assert fetcher.get(srv.url + "/x", max_bytes=100) == b"hello"
        headers = srv.seen[0].headers
    assert headers["User-Agent"] == f"gpucc/{__version__}"
    assert headers["Accept-Encoding"] == "identity"
    assert "Authorization" not in headers


def test_post_sends_body_and_content_type(fetcher: RequestsFetcher) -> None:
    with serve(lambda seen: ok(seen.body[::-1])) as srv:
        got = fetcher.post(srv.url, b"abc", content_type="application/ocsp-request", max_bytes=10)
        seen = srv.seen[0]
    assert got == b"cba"
    assert seen.method == "POST"
    assert seen.headers["Content-Type"] == "application/ocsp-request"


def test_bearer_key_is_sent_only_as_authorization_header(fetcher: RequestsFetcher) -> None:
    with serve(lambda seen: ok()) as srv:
        fetcher.get(srv.url + "/p", max_bytes=10, bearer=KEY)
        seen = srv.seen[0]
    assert seen.headers["Authorization"] == f"Bearer {KEY}"
    assert KEY not in seen.path
    assert KEY not in repr(fetcher)


def test_bearer_key_never_in_error_text(fetcher: RequestsFetcher) -> None:
    with serve(lambda seen: Reply(500, KEY.encode())) as srv:
        with pytest.raises(HttpStatusError) as info:
            fetcher.get(srv.url + "/p", max_bytes=10, bearer=KEY)
    assert_one_line_network_error(info.value)
    assert KEY not in str(info.value)


def test_bearer_key_refused_over_plain_http_to_remote_host(fetcher: RequestsFetcher) -> None:
    with pytest.raises(UsageError) as info:
        fetcher.get("http://collateral.example/v1/rim/X", max_bytes=10, bearer=KEY)
    assert KEY not in str(info.value)


def test_bearer_key_dropped_when_redirected_to_another_host(fetcher: RequestsFetcher) -> None:
    with serve(lambda seen: ok(b"landed")) as target:
        port = target.url.rsplit(":", 1)[1]
        # 127.0.0.1 -> localhost is a change of host: requests strips Authorization.
        redirect = Reply(302, headers={"Location": f"http://localhost:{port}/there"})
        with serve(lambda seen: redirect) as origin:
            assert fetcher.get(origin.url + "/here", max_bytes=10, bearer=KEY) == b"landed"
            assert origin.seen[0].headers["Authorization"] == f"Bearer {KEY}"
        assert "Authorization" not in target.seen[0].headers


def test_offline_raises_without_touching_the_network() -> None:
    with serve(lambda seen: ok()) as srv:
        offline = RequestsFetcher(offline=True)
        with pytest.raises(OfflineError) as info:
            offline.get(srv.url, max_bytes=10)
        with pytest.raises(OfflineError):
            offline.post(srv.url, b"x", content_type="a/b", max_bytes=10)
        assert srv.count == 0
    assert isinstance(info.value, CollateralUnavailableError)
    assert exit_code_for(info.value) == 3


def test_5xx_is_retried_then_succeeds(fetcher: RequestsFetcher) -> None:
    calls: list[int] = []

    def flaky(seen: Seen) -> Reply:
        calls.append(1)
        return Reply(503, b"busy") if len(calls) <= 2 else ok(b"finally")

    with serve(flaky) as srv:
        assert fetcher.get(srv.url, max_bytes=100) == b"finally"
        assert srv.count == 3


def test_5xx_retries_are_bounded(fetcher: RequestsFetcher) -> None:
    with serve(lambda seen: Reply(500, b"down")) as srv:
        with pytest.raises(HttpStatusError) as info:
            fetcher.get(srv.url + "/r", max_bytes=100)
        assert srv.count == 3  # the first attempt and two retries
    assert info.value.status == 500
    assert "HTTP 500" in str(info.value)
    assert_one_line_network_error(info.value)


def test_4xx_is_not_retried(fetcher: RequestsFetcher) -> None:
    with serve(lambda seen: Reply(404, b"no")) as srv:
        with pytest.raises(HttpStatusError) as info:
            fetcher.get(srv.url, max_bytes=100)
        assert srv.count == 1
    assert info.value.status == 404


def test_accepted_statuses_are_the_callers_choice(fetcher: RequestsFetcher) -> None:
    with serve(lambda seen: Reply(202, b"later")) as srv:
        assert fetcher.get(srv.url, max_bytes=100, accept=(200, 202)) == b"later"
        with pytest.raises(HttpStatusError):
            fetcher.get(srv.url, max_bytes=100)


def test_slow_answer_hits_the_read_timeout_without_retry(fetcher: RequestsFetcher) -> None:
    with serve(lambda seen: Reply(200, b"late", delay=1.5)) as srv:
        start = time.monotonic()
        with pytest.raises(NetworkError) as info:
            fetcher.get(srv.url, max_bytes=100)
        elapsed = time.monotonic() - start
        assert srv.count == 1
    assert elapsed < 1.4
    assert "read timeout" in str(info.value)
    assert_one_line_network_error(info.value)


def test_connection_refused(fetcher: RequestsFetcher) -> None:
    with pytest.raises(NetworkError) as info:
        fetcher.get(f"http://127.0.0.1:{free_port()}/x", max_bytes=10)
    assert "connection refused" in str(info.value)
    assert_one_line_network_error(info.value)


def test_dns_failure(fetcher: RequestsFetcher, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_dns(*args: object, **kwargs: object) -> list[object]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    # The resolver, not requests, is replaced: urllib3's own error path runs for real.
    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    with pytest.raises(NetworkError) as info:
        fetcher.get("http://rim.attestation.invalid/v1/rim/X", max_bytes=10)
    assert "cannot be resolved" in str(info.value)
    assert_one_line_network_error(info.value)


def test_tls_failure_with_untrusted_certificate(
    fetcher: RequestsFetcher, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    with serve(lambda seen: ok(), tls=self_signed_tls(tmp_path)) as srv:
        assert srv.url.startswith("https://")
        with pytest.raises(NetworkError) as info:
            fetcher.get(srv.url + "/x", max_bytes=10, bearer=KEY)
        assert srv.count == 0
    assert "TLS" in str(info.value)
    assert_one_line_network_error(info.value)


def test_redirect_loop_stops_after_the_limit(fetcher: RequestsFetcher) -> None:
    with serve(lambda seen: Reply(302, headers={"Location": seen.path})) as srv:
        with pytest.raises(NetworkError) as info:
            fetcher.get(srv.url + "/loop", max_bytes=10)
        assert srv.count == MAX_REDIRECTS + 1
    assert "redirects" in str(info.value)
    assert_one_line_network_error(info.value)


# --- the whole-call deadline ----------------------------------------------------------


@pytest.mark.parametrize(
    "reply",
    [
        Reply(200, b"x" * 500, drip=0.2),
        Reply(200, b"x" * 500, drip=0.2, no_length=True),
        Reply(200, b"x" * 50, headers={"X-Pad": "p" * 400}, drip=0.2, drip_headers=True),
    ],
    ids=["body", "body-until-close", "headers"],
)
def test_a_dripped_answer_ends_at_the_deadline(reply: Reply) -> None:
    # Each byte comes well within the read timeout: only the whole-call deadline ends it.
    with (
        RequestsFetcher(timeout=(0.5, 2.0), retries=2, total_timeout=1.0) as slow,
        serve(lambda seen: reply) as srv,
    ):
        start = time.monotonic()
        with pytest.raises(NetworkError) as info:
            slow.get(srv.url, max_bytes=10_000)
        elapsed = time.monotonic() - start
        assert srv.count == 1  # not retried
    assert "within the deadline of 1 s" in str(info.value)
    assert_one_line_network_error(info.value)
    assert elapsed < 1.8  # the drip would take 100 s


def test_the_deadline_bounds_retries_and_their_backoff() -> None:
    with (
        RequestsFetcher(timeout=(0.5, 0.5), retries=3, backoff=5.0, total_timeout=1.0) as f,
        serve(lambda seen: Reply(503, b"busy")) as srv,
    ):
        start = time.monotonic()
        with pytest.raises(NetworkError) as info:
            f.get(srv.url, max_bytes=100)
        elapsed = time.monotonic() - start
    assert "deadline" in str(info.value) or "HTTP 503" in str(info.value)
    assert elapsed < 1.8  # the backoff alone would sleep 10 s, then 20 s


def test_a_deadline_shuts_what_it_watches_and_only_until_it_ends() -> None:
    from gpucc.core.deadline import Deadline

    a, b = socket.socketpair()
    with a, b:
        a.settimeout(5.0)
        with Deadline(0.3) as deadline:
            deadline.watch(a)
            start = time.monotonic()
            assert a.recv(1) == b""  # blocked until the timer shut the connection down
            assert deadline.expired() and time.monotonic() - start < 2.0
    c, d = socket.socketpair()
    with c, d:
        with Deadline(0.1) as deadline:
            deadline.watch(c)
        time.sleep(0.3)  # the deadline has ended: its timer must not touch c
        c.sendall(b"x")
        assert d.recv(1) == b"x"


def test_answers_within_the_deadline_are_read() -> None:
    with (
        RequestsFetcher(timeout=(0.5, 0.5), retries=0, total_timeout=1.0) as f,
        serve(lambda seen: Reply(200, b"quick", delay=0.15)) as srv,
    ):
        for _ in range(3):
            assert f.get(srv.url, max_bytes=100) == b"quick"


def test_an_endless_stream_of_interim_answers_ends_at_the_deadline() -> None:
    # http.client skips "100 Continue" answers in a loop of its own: only the deadline ends it.
    def flood(conn: socket.socket) -> None:
        read_request_head(conn)
        while True:
            conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n" * 50)
            time.sleep(0.01)

    with (
        RequestsFetcher(timeout=(0.5, 2.0), retries=0, total_timeout=1.0) as f,
        serve_raw(flood) as url,
        pytest.raises(NetworkError) as info,
    ):
        f.get(url, max_bytes=100)
    assert "within the deadline of 1 s" in str(info.value)


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 70_000 + b"\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: a\r\n" % i for i in range(150)) + b"\r\nok",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 3\r\n\r\nhello",
        b"HTTP/1.1 99999999999 OK\r\nContent-Length: 2\r\n\r\nok",
        b"\x00\x01 not http at all\r\n\r\n",
    ],
    ids=["huge-header", "many-headers", "two-lengths", "bad-status", "not-http"],
)
def test_an_answer_that_is_not_http_is_named_so(fetcher: RequestsFetcher, answer: bytes) -> None:
    def send(conn: socket.socket) -> None:
        read_request_head(conn)
        conn.sendall(answer)
        time.sleep(0.5)

    with serve_raw(send) as url, pytest.raises(NetworkError) as info:
        fetcher.get(url, max_bytes=100)
    assert "not valid HTTP" in str(info.value)
    assert_one_line_network_error(info.value)


# --- redirects and their origin ---------------------------------------------------------


def test_a_guard_refuses_a_redirect_to_another_port_before_following_it(
    fetcher: RequestsFetcher,
) -> None:
    with serve(lambda seen: ok(b"elsewhere")) as other:
        redirect = Reply(302, headers={"Location": other.url + "/keys"})
        with serve(lambda seen: redirect) as origin:
            guard = OriginGuard(origin.url + "/keys")
            with pytest.raises(RedirectRefusedError) as info:
                fetcher.get(origin.url + "/keys", max_bytes=100, guard=guard)
            assert fetcher.get(origin.url + "/keys", max_bytes=100) == b"elsewhere"  # unguarded
            allowed = OriginGuard(origin.url + "/keys", [other.url])
            assert fetcher.get(origin.url + "/keys", max_bytes=100, guard=allowed) == b"elsewhere"
            assert allowed.final_origin == other.url and guard.final_origin == origin.url
        assert other.count == 2  # the refused redirect was never followed
    assert other.url in str(info.value)
    assert_one_line_network_error(info.value)


@pytest.mark.parametrize(
    "location",
    ["/moved", "moved", "//127.0.0.1:{port}/moved", "http://127.0.0.1:{port}/moved"],
)
def test_a_guard_follows_same_origin_redirects(fetcher: RequestsFetcher, location: str) -> None:
    def handler(seen: Seen) -> Reply:
        if seen.path.endswith("/moved"):
            return ok(b"here")
        return Reply(301, headers={"Location": location.format(port=port)})

    with serve(handler) as srv:
        port = srv.url.rsplit(":", 1)[1]
        guard = OriginGuard(srv.url + "/a/b")
        assert fetcher.get(srv.url + "/a/b", max_bytes=100, guard=guard, bearer=KEY) == b"here"
        assert all(s.headers["Authorization"] == f"Bearer {KEY}" for s in srv.seen)
        assert guard.final_origin == srv.url


@pytest.mark.parametrize(
    "location",
    [
        "https://127.0.0.1:{port}/moved",  # scheme
        "http://localhost:{port}/moved",  # host
        "http://127.0.0.1:1/moved",  # port
        "ftp://127.0.0.1:{port}/moved",
        "file:///etc/passwd",
        "http://[::1/moved",
        "http://127.0.0.1:99999/moved",
    ],
)
def test_a_guard_refuses_any_other_origin(fetcher: RequestsFetcher, location: str) -> None:
    with serve(lambda seen: Reply(302, headers={"Location": location.format(port=port)})) as srv:
        port = srv.url.rsplit(":", 1)[1]
        with pytest.raises(NetworkError) as info:
            fetcher.get(srv.url, max_bytes=100, guard=OriginGuard(srv.url))
        assert srv.count == 1
    assert_one_line_network_error(info.value)


def test_a_downgrade_from_https_to_http_is_refused_or_loses_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tls = self_signed_tls(tmp_path)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tmp_path / "tls.pem"))
    with serve(lambda seen: ok(b"plain")) as plain:
        down = Reply(302, headers={"Location": plain.url + "/keys"})
        with (
            serve(lambda seen: down, tls=tls) as secure,
            RequestsFetcher(timeout=(0.5, 0.5), retries=0) as f,
        ):
            with pytest.raises(RedirectRefusedError):
                f.get(
                    secure.url + "/keys", max_bytes=100, guard=OriginGuard(secure.url), bearer=KEY
                )
            assert plain.count == 0
            assert f.get(secure.url + "/keys", max_bytes=100, bearer=KEY) == b"plain"  # unguarded
            assert secure.seen[-1].headers["Authorization"] == f"Bearer {KEY}"
        assert "Authorization" not in plain.seen[0].headers


@pytest.mark.parametrize("location", ["http://\xff\xfe\x1b[31m/", "", "   "])
def test_an_unusable_location_is_a_network_error(fetcher: RequestsFetcher, location: str) -> None:
    with serve(lambda seen: Reply(302, headers={"Location": location})) as srv:
        with pytest.raises(NetworkError) as info:
            fetcher.get(srv.url, max_bytes=100)
        assert srv.count == 1
    assert "redirected to an unusable URL" in str(info.value)
    assert_one_line_network_error(info.value)


@pytest.mark.parametrize("follow", [True, False], ids=["followed", "refused"])
def test_a_redirect_body_is_never_read(follow: bool) -> None:
    # Read, this body would take 100 s; the deadline would end the call with an error.
    there = "/there" if follow else "http://localhost:1/there"
    endless = Reply(302, b"z" * 500, headers={"Location": there}, drip=0.2)

    def handler(seen: Seen) -> Reply:
        return ok(b"there") if seen.path == "/there" else endless

    with (
        RequestsFetcher(timeout=(0.5, 2.0), retries=0, total_timeout=1.0) as f,
        serve(handler) as srv,
    ):
        if follow:
            assert f.get(srv.url + "/here", max_bytes=100) == b"there"
        else:
            with pytest.raises(RedirectRefusedError):
                f.get(srv.url + "/here", max_bytes=100, guard=OriginGuard(srv.url))


def test_a_post_redirected_with_303_becomes_a_get(fetcher: RequestsFetcher) -> None:
    def handler(seen: Seen) -> Reply:
        if seen.path == "/result":
            return ok(seen.method.encode())
        return Reply(303, headers={"Location": "/result"})

    with serve(handler) as srv:
        assert fetcher.post(srv.url, b"{}", content_type="a/b", max_bytes=100) == b"GET"
        assert "Content-Type" not in srv.seen[1].headers


@pytest.mark.parametrize("no_length", [False, True], ids=["content-length", "read-until-close"])
def test_oversized_body_is_refused(fetcher: RequestsFetcher, no_length: bool) -> None:
    with serve(lambda seen: Reply(200, b"x" * 300_000, no_length=no_length)) as srv:
        with pytest.raises(NetworkError) as info:
            fetcher.get(srv.url, max_bytes=100_000)
    assert "exceeds 100000 bytes" in str(info.value)
    assert_one_line_network_error(info.value)


def test_a_compression_bomb_stops_at_the_cap(fetcher: RequestsFetcher) -> None:
    # 64 MiB of zeros in about 64 KiB of gzip, sent although identity was asked for.
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    bomb = b"".join(packer.compress(bytes(1 << 20)) for _ in range(64)) + packer.flush()
    reply = Reply(200, bomb, headers={"Content-Encoding": "gzip"})
    with serve(lambda seen: reply) as srv, pytest.raises(NetworkError) as info:
        fetcher.get(srv.url, max_bytes=1 << 20)
    assert "exceeds 1048576 bytes" in str(info.value)
    assert srv.seen[0].headers["Accept-Encoding"] == "identity"


def test_constructor_ceiling_caps_callers(fetcher: RequestsFetcher) -> None:
    small = RequestsFetcher(timeout=(0.5, 0.5), max_bytes=10)
    with serve(lambda seen: ok(b"y" * 11)) as srv, pytest.raises(NetworkError):
        small.get(srv.url, max_bytes=1_000)


def test_proxy_from_environment_is_used(
    fetcher: RequestsFetcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    with serve(lambda seen: ok(b"via proxy")) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.setenv("NO_PROXY", "")
        with RequestsFetcher(timeout=(0.5, 0.5), retries=0) as via_env:
            got = via_env.get("http://rim.collateral.test/v1/rim/ABC", max_bytes=100)
        assert got == b"via proxy"
        # A forward proxy receives the absolute URL.
        assert proxy.seen[0].path == "http://rim.collateral.test/v1/rim/ABC"


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/x", "file:///etc/passwd", "not a url", "http://"])
def test_unsupported_urls_are_network_errors(fetcher: RequestsFetcher, url: str) -> None:
    with pytest.raises(NetworkError) as info:
        fetcher.get(url, max_bytes=10)
    assert_one_line_network_error(info.value)


def test_safe_url_drops_credentials() -> None:
    assert safe_url("https://user:pw@host.example/a?b=1") == "https://host.example/a?b=1"
    with pytest.raises(ValueError):
        RequestsFetcher(retries=-1)
