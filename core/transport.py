"""The one HTTP layer: every collateral request (RIM service, OCSP) goes through here.

:class:`Fetcher` is the seam the RIM and OCSP clients are given; the production
implementation, :class:`RequestsFetcher`, sits on ``requests`` with:

* explicit timeouts (connect, read) plus a deadline on the whole call (connect, TLS,
  headers, body, retries and redirects together; see :mod:`.deadline`), so a
  server that drips one byte per read timeout cannot hold us for ever;
* urllib3 ``Retry`` with exponential backoff on connection errors and on
  HTTP 500/502/503/504, bounded in count; read timeouts are not retried (a slow
  service would otherwise cost several full read timeouts) and ``Retry-After``
  is ignored (a server must not be able to make us sleep for hours);
* at most :data:`MAX_REDIRECTS` redirects, followed here rather than by requests, so that
  a redirect's body is never read, ``Authorization`` is sent to the first origin only,
  and a caller can keep a request on its origin (an
  :class:`~gpucc.core.origins.OriginGuard`);
* proxies from ``HTTP_PROXY``/``HTTPS_PROXY``/``NO_PROXY`` (requests'
  ``trust_env``), and the CA bundle from ``REQUESTS_CA_BUNDLE``;
* a streaming read with a hard size cap (``Content-Length`` is checked first,
  then the bytes actually received), with ``Accept-Encoding: identity``; a body
  compressed anyway is inflated a chunk at a time and the cap counts inflated bytes;
* every failure turned into a one-line :class:`~gpuattest.errors.NetworkError`
  (exit 3). The service key is only ever sent as ``Authorization: Bearer``; it
  never appears in messages, logs or reprs, and it is refused over plain HTTP
  except to a loopback address (local proxies and tests).

``offline=True`` makes every call raise :class:`~gpuattest.errors.OfflineError`
before anything touches the network.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urljoin, urlsplit, urlunsplit

if TYPE_CHECKING:  # imported lazily at run time: they cost ~85 ms of start-up
    import requests

from gpucc import __version__

from .errors import (
    HttpStatusError,
    NetworkError,
    OfflineError,
    ServiceAccessDeniedError,
    UsageError,
)
from .origins import OriginGuard, RedirectRefusedError, origin_of

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_READ_TIMEOUT",
    "DEFAULT_TOTAL_TIMEOUT",
    "DEFAULT_USER_AGENT",
    "MAX_REDIRECTS",
    "Fetcher",
    "HttpStatusError",
    "OriginGuard",
    "RedirectRefusedError",
    "RequestsFetcher",
    "ServiceAccessDeniedError",
    "plain_http_to_remote",
    "safe_url",
]

_log = logging.getLogger(__name__)

# NVAT: connect timeout 5 s; NVIDIA's Python verifier: 10 s for OCSP and RIM.
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_READ_TIMEOUT = 10.0
# NVIDIA's retry counter is 3 (disabled in Python); NVAT retries 5 times. Three attempts after
# the first, with backoff 0, 2b, 4b seconds, keeps a dead service to well under a minute.
DEFAULT_RETRIES = 3
DEFAULT_BACKOFF = 0.5
# Upper bound for one whole call (connect, headers and body, retries and redirects included);
# a per-read timeout alone does not bound a server that sends a byte just before every timeout.
DEFAULT_TOTAL_TIMEOUT = 60.0
MAX_REDIRECTS = 3
# No collateral document comes anywhere near this; callers pass tighter caps per call.
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
DEFAULT_USER_AGENT = f"gpucc/{__version__}"

_RETRY_STATUSES = frozenset({500, 502, 503, 504})
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_CHUNK = 64 * 1024


class Fetcher(Protocol):
    """Fetches bytes over HTTP; any failure is a :class:`NetworkError`."""

    def get(
        self,
        url: str,
        *,
        max_bytes: int,
        accept: Collection[int] = (200,),
        headers: Mapping[str, str] | None = None,
        bearer: str | None = None,
        guard: OriginGuard | None = None,
    ) -> bytes:
        """GET ``url`` and return the body.

        Args:
            url: absolute http(s) URL.
            max_bytes: the largest body accepted.
            accept: HTTP statuses that count as success.
            headers: extra request headers.
            bearer: a service key, sent as ``Authorization: Bearer``.
            guard: where redirects may lead (None: anywhere over http(s)); it records
                where the answer came from.

        Raises:
            HttpStatusError: any status outside ``accept`` (after retries for 5xx).
            RedirectRefusedError: a redirect the guard refused.
            NetworkError: timeout, deadline, connection, DNS, TLS, redirect or size failure.
            OfflineError: the fetcher is offline.
            UsageError: a service key would go over plain HTTP to a remote host.
        """
        ...

    def post(
        self,
        url: str,
        body: bytes,
        *,
        content_type: str,
        max_bytes: int,
        accept: Collection[int] = (200,),
        headers: Mapping[str, str] | None = None,
        bearer: str | None = None,
        guard: OriginGuard | None = None,
    ) -> bytes:
        """POST ``body`` to ``url`` and return the answer; same errors as :meth:`get`."""
        ...


def safe_url(url: str) -> str:
    """``url`` without any ``user:password@`` part, for messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<invalid URL>"
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))


def plain_http_to_remote(url: str) -> bool:
    """Whether ``url`` is plain http to a host other than a loopback address."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
    except ValueError:
        return False
    return parts.scheme == "http" and not _is_loopback(host)


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """The exception and everything it wraps (args, ``reason``, cause, context)."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        cur = todo.pop(0)
        if id(cur) in seen:
            continue
        seen.add(id(cur))
        yield cur
        todo.extend(a for a in cur.args if isinstance(a, BaseException))
        reason = getattr(cur, "reason", None)
        if isinstance(reason, BaseException):
            todo.append(reason)
        for linked in (cur.__cause__, cur.__context__):
            if linked is not None:
                todo.append(linked)


def _first(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    return next((e for e in _causes(exc) if isinstance(e, kind)), None)


def _retries(response: Any) -> int:
    """How many times urllib3 retried the request that got ``response``."""
    retries = getattr(getattr(response, "raw", None), "retries", None)
    return len(getattr(retries, "history", ()) or ())


def _one_line(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _session_class() -> type[requests.Session]:
    import requests

    class Session(requests.Session):
        """A session that leaves redirects to :meth:`RequestsFetcher._follow`.

        requests looks at a redirect even with ``allow_redirects=False`` (to offer the
        next request), reading the redirect's whole body, inflated, without a cap.
        """

        def resolve_redirects(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
            yield from ()

    return Session


class RequestsFetcher:
    """:class:`Fetcher` on a ``requests.Session`` with retries, caps and typed errors.

    Args:
        timeout: (connect, read) timeouts in seconds.
        retries: retries after the first attempt, for connection errors and 5xx answers.
        backoff: urllib3 backoff factor (sleeps 0, 2*backoff, 4*backoff ... seconds).
        max_bytes: a ceiling on any body, whatever a caller asks for.
        user_agent: the ``User-Agent`` header.
        offline: refuse every request with :class:`OfflineError`.
        trust_env: take proxies and CA bundle from the environment (requests' default).
        total_timeout: the longest one call may take to deliver its body.
    """

    def __init__(
        self,
        *,
        timeout: tuple[float, float] = (DEFAULT_CONNECT_TIMEOUT, DEFAULT_READ_TIMEOUT),
        retries: int = DEFAULT_RETRIES,
        backoff: float = DEFAULT_BACKOFF,
        max_bytes: int = DEFAULT_MAX_BYTES,
        user_agent: str = DEFAULT_USER_AGENT,
        offline: bool = False,
        trust_env: bool = True,
        total_timeout: float = DEFAULT_TOTAL_TIMEOUT,
    ) -> None:

        if retries < 0 or max_bytes <= 0 or min(timeout) <= 0 or total_timeout <= 0:
            raise ValueError("retries, max_bytes and timeouts must be positive")
        self.timeout = timeout
        self.retries = retries
        self.max_bytes = max_bytes
        self.user_agent = user_agent
        self.offline = offline
        self.total_timeout = total_timeout
        self._trust_env = trust_env
        self._backoff = backoff
        # Built on first use, so offline and file-only runs never import requests.
        self._session: requests.Session | None = None

    def _get_session(self) -> requests.Session:
        if self._session is not None:
            return self._session

        from .deadline import DeadlineRetry, WatchedAdapter

        session = _session_class()()
        session.trust_env = self._trust_env
        session.headers["User-Agent"] = self.user_agent
        retry = DeadlineRetry(
            total=self.retries,
            connect=self.retries,
            read=0,
            redirect=0,
            status=self.retries,
            other=0,
            allowed_methods=frozenset({"GET", "POST"}),  # OCSP POSTs are safe to repeat
            status_forcelist=_RETRY_STATUSES,
            backoff_factor=self._backoff,
            backoff_max=max(self._backoff * 8, 0.0),
            raise_on_status=False,
            respect_retry_after_header=False,
        )
        adapter = WatchedAdapter(max_retries=retry)
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        self._session = session
        return session

    def __repr__(self) -> str:
        return (
            f"RequestsFetcher(timeout={self.timeout!r}, retries={self.retries}, "
            f"offline={self.offline})"
        )

    def close(self) -> None:
        """Close pooled connections."""
        if self._session is not None:
            self._session.close()

    def __enter__(self) -> RequestsFetcher:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def get(
        self,
        url: str,
        *,
        max_bytes: int,
        accept: Collection[int] = (200,),
        headers: Mapping[str, str] | None = None,
        bearer: str | None = None,
        guard: OriginGuard | None = None,
    ) -> bytes:
        """GET ``url``; see :meth:`Fetcher.get`."""
        return self._request("GET", url, None, None, max_bytes, accept, headers, bearer, guard)

    def post(
        self,
        url: str,
        body: bytes,
        *,
        content_type: str,
        max_bytes: int,
        accept: Collection[int] = (200,),
        headers: Mapping[str, str] | None = None,
        bearer: str | None = None,
        guard: OriginGuard | None = None,
    ) -> bytes:
        """POST ``body``; see :meth:`Fetcher.post`."""
        return self._request(
            "POST", url, body, content_type, max_bytes, accept, headers, bearer, guard
        )

    def get_with_headers(
        self,
        url: str,
        *,
        max_bytes: int,
        accept: Collection[int] = (200,),
        guard: OriginGuard | None = None,
        bearer: str | None = None,
    ) -> tuple[bytes, dict[str, str]]:
        """GET ``url``: the body and the response headers (names in lower case).

        For services that put signed data's issuer chains in headers (Intel's PCS), and for
        the collateral mirror; the same limits and errors as :meth:`get`.
        """
        seen: list[dict[str, str]] = []
        body = self._request(
            "GET", url, None, None, max_bytes, accept, None, bearer, guard, response_headers=seen
        )
        return body, seen[0] if seen else {}

    # -- internals ---------------------------------------------------------

    def _request(
        self,
        method: str,
        url: str,
        body: bytes | None,
        content_type: str | None,
        max_bytes: int,
        accept: Collection[int],
        headers: Mapping[str, str] | None,
        bearer: str | None,
        guard: OriginGuard | None,
        response_headers: list[dict[str, str]] | None = None,
    ) -> bytes:
        shown = safe_url(url)
        if self.offline:
            raise OfflineError(f"running offline: not contacting {shown}")
        import requests
        import urllib3.exceptions

        from .deadline import Deadline, DeadlineExceeded

        self._check_url(url, shown, bearer)
        limit = min(max_bytes, self.max_bytes)
        send: dict[str, str] = {"Accept-Encoding": "identity"}
        if headers:
            send.update(headers)
        if content_type is not None:
            send["Content-Type"] = content_type
        if bearer:
            send["Authorization"] = f"Bearer {bearer}"
        late = self._late(shown)
        started = time.monotonic()
        logged = self._scrub(shown, bearer)
        try:
            with Deadline(self.total_timeout) as deadline:
                try:
                    response = self._follow(method, url, body, send, shown, guard)
                except DeadlineExceeded:
                    raise NetworkError(late) from None
                except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
                    if deadline.expired():
                        raise NetworkError(late) from None
                    text = f"{shown}: {self._describe(exc)}"
                    raise NetworkError(self._scrub(text, bearer)) from None
                try:
                    status = response.status_code
                    if status not in accept:
                        reason = _one_line(response.reason or "", 60)
                        text = f"{shown} answered HTTP {status}" + (f" {reason}" if reason else "")
                        raise HttpStatusError(self._scrub(text, bearer), status=status)
                    if response_headers is not None:
                        headers_seen = {k.lower(): v for k, v in response.headers.items()}
                        response_headers.append(headers_seen)
                    data = self._read_body(response, shown, limit, deadline.expired, bearer)
                finally:
                    response.close()
                if deadline.expired():  # a connection shut by the timer can end like a body
                    raise NetworkError(late)
        except NetworkError as exc:
            _log.debug(
                "%s %s failed after %.3f s: %s", method, logged, time.monotonic() - started, exc
            )
            raise
        _log.debug(
            "%s %s: HTTP %d, %d bytes in %.3f s, %d retries",
            method,
            logged,
            status,
            len(data),
            time.monotonic() - started,
            _retries(response),
        )
        return data

    def _follow(
        self,
        method: str,
        url: str,
        body: bytes | None,
        send: dict[str, str],
        shown: str,
        guard: OriginGuard | None,
    ) -> requests.Response:
        """Send the request, following at most MAX_REDIRECTS redirects; the last answer.

        A redirect's body is not read. ``Authorization`` goes to the first origin only;
        303, and 301/302 after a POST, turn the request into a GET without a body (as
        browsers and requests do); ``guard`` may refuse a target before it is asked.
        """
        session = self._get_session()
        first = origin_of(url)
        for _ in range(MAX_REDIRECTS + 1):
            response = session.request(
                method,
                url,
                data=body,
                headers=send,
                timeout=self.timeout,
                stream=True,
                allow_redirects=False,
            )
            location = response.headers.get("Location")
            if response.status_code not in _REDIRECT_STATUSES or location is None:
                return response
            response.close()
            url = self._redirect_url(url, location, shown)
            if guard is not None:
                guard.follow(url, shown)
            if origin_of(url) != first:
                send = {k: v for k, v in send.items() if k.lower() != "authorization"}
            if response.status_code == 303 or (
                response.status_code in (301, 302) and method == "POST"
            ):
                method, body = "GET", None
                send = {k: v for k, v in send.items() if k.lower() != "content-type"}
        raise NetworkError(f"{shown}: more than {MAX_REDIRECTS} redirects")

    @staticmethod
    def _redirect_url(current: str, location: str, shown: str) -> str:
        """The absolute http(s) URL a ``Location`` header names, relative to ``current``.

        The header arrives decoded as Latin-1; its bytes are read as UTF-8 (as browsers
        do), and what is not UTF-8, is empty or is not http(s) is refused.
        """
        from requests.utils import requote_uri

        try:
            text = location.encode("latin-1").decode("utf-8").strip()
            if not text:
                raise ValueError("empty")
            target = urljoin(current, requote_uri(text))
            origin_of(target)
        except (UnicodeError, ValueError):
            raise NetworkError(f"{shown}: redirected to an unusable URL") from None
        return target

    def _check_url(self, url: str, shown: str, bearer: str | None) -> None:
        try:
            parts = urlsplit(url)
            host = parts.hostname or ""
        except ValueError:
            raise NetworkError(f"invalid URL {shown}") from None
        if parts.scheme not in ("http", "https") or not host:
            raise NetworkError(f"invalid URL {shown}: only http and https URLs are supported")
        try:
            origin_of(url)
        except ValueError:
            raise NetworkError(f"invalid URL {shown}: bad port") from None
        if bearer and plain_http_to_remote(url):
            raise UsageError(
                f"refusing to send the service key over plain http to {host}; use an https URL"
            )

    def _read_body(
        self,
        response: requests.Response,
        shown: str,
        limit: int,
        expired: Callable[[], bool],
        bearer: str | None,
    ) -> bytes:
        import requests
        import urllib3.exceptions

        declared = response.headers.get("Content-Length")
        if declared is not None and declared.strip().isdigit() and int(declared) > limit:
            raise NetworkError(f"{shown}: response of {int(declared)} bytes exceeds {limit} bytes")
        chunks: list[bytes] = []
        size = 0
        try:
            for chunk in response.iter_content(chunk_size=_CHUNK):
                size += len(chunk)
                if size > limit:
                    raise NetworkError(f"{shown}: response exceeds {limit} bytes")
                if expired():
                    raise NetworkError(self._late(shown))
                chunks.append(chunk)
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
            if expired():
                raise NetworkError(self._late(shown)) from None
            raise NetworkError(self._scrub(f"{shown}: {self._describe(exc)}", bearer)) from None
        return b"".join(chunks)

    def _late(self, shown: str) -> str:
        return f"{shown}: no complete answer within the deadline of {self.total_timeout:g} s"

    def _describe(self, exc: BaseException) -> str:
        """A short, secret-free description of a transport failure."""
        import http.client
        import ssl

        import requests
        import urllib3.exceptions

        connect, read = self.timeout
        # Checked first: urllib3's NewConnectionError (and so NameResolutionError) subclasses
        # ConnectTimeoutError for historical reasons.
        if _first(exc, urllib3.exceptions.NameResolutionError):
            return "host name cannot be resolved"
        if _first(exc, ConnectionRefusedError):
            return "connection refused"
        if isinstance(exc, requests.exceptions.ConnectTimeout) or any(
            isinstance(e, urllib3.exceptions.ConnectTimeoutError)
            and not isinstance(e, urllib3.exceptions.NewConnectionError)
            for e in _causes(exc)
        ):
            return f"connection timed out after {connect:g} s"
        if isinstance(exc, requests.exceptions.ReadTimeout) or _first(
            exc, urllib3.exceptions.ReadTimeoutError
        ):
            return f"no answer within the read timeout of {read:g} s"
        if isinstance(exc, requests.exceptions.ProxyError):
            return "the proxy refused or could not be reached"
        if isinstance(exc, requests.exceptions.SSLError) or _first(exc, ssl.SSLError):
            verify = _first(exc, ssl.SSLCertVerificationError)
            if isinstance(verify, ssl.SSLCertVerificationError) and verify.verify_message:
                return f"TLS certificate verification failed: {_one_line(verify.verify_message)}"
            return "TLS handshake failed"
        if isinstance(
            exc,
            requests.exceptions.InvalidURL
            | requests.exceptions.MissingSchema
            | requests.exceptions.InvalidSchema,
        ):
            return "invalid URL"
        if _first(exc, http.client.RemoteDisconnected) or _first(exc, ConnectionResetError):
            return "the server closed the connection without answering"
        if isinstance(exc, requests.exceptions.ChunkedEncodingError):
            return "the response body was cut off or malformed"
        if isinstance(exc, requests.exceptions.ContentDecodingError):
            return "the response body cannot be decoded"
        if _first(exc, http.client.HTTPException) or isinstance(
            exc, requests.exceptions.InvalidHeader
        ):
            return "the answer is not valid HTTP (status line or headers malformed or too large)"
        if isinstance(exc, requests.exceptions.RetryError):
            return "the service kept failing after retries"
        os_error = _first(exc, OSError)
        if isinstance(os_error, OSError) and os_error.strerror:
            return f"connection failed: {_one_line(os_error.strerror)}"
        return f"request failed ({type(exc).__name__})"

    @staticmethod
    def _scrub(text: str, bearer: str | None) -> str:
        text = _one_line(text, 300)
        return text.replace(bearer, "***") if bearer else text
