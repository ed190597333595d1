"""Objects read over HTTP(S) with ranges: ``https://`` URLs, and S3's GETs (presigned).

urllib3 carries the bytes (``readinto`` straight into the caller's buffer; a watchdog shuts a
request's connection down when its deadline passes, so a dripping body cannot hold a read).
What the store answers is checked, never trusted:

* a range is asked with ``Range`` and the pin (``If-Match`` with a strong ETag, else
  ``If-Unmodified-Since``); the answer must be ``206`` with a ``Content-Range`` for exactly
  those bytes of an object of the pinned length and a ``Content-Length`` to match; ``200``
  (the server ignored ``Range``) is refused without reading its body;
* ``412``, another ETag, or another total length: the object changed (never a mix);
* redirects are followed only within the origin (scheme, host and port) asked;
* connection failures, ``5xx``, ``429`` and bodies that end early are retried with
  backoff, resuming where the failed request stopped, within the span's one deadline.
"""

from __future__ import annotations

import os
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from email.utils import parsedate_to_datetime
from urllib.parse import urljoin, urlsplit

import urllib3
from urllib3.exceptions import HTTPError, SSLError

from .base import ObjectSource, SourceSettings, Span, backoff
from .errors import (
    ObjectChangedError,
    ObjectNotFoundError,
    StoreAccessDeniedError,
    StoreProtocolError,
    StoreUnavailableError,
    TransientStoreError,
)

__all__ = ["HttpsSource", "HttpObject", "public_name", "pool_for"]

_READ = 1 << 20
_REDIRECTS = 5
_TRANSIENT = frozenset({408, 429, 500, 502, 503, 504})


def public_name(url: str) -> str:
    """``url`` without user information, query or fragment: what messages may show."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}"


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port


def pool_for(settings: SourceSettings, *, ca_file: str | None = None) -> urllib3.PoolManager:
    """A connection pool for ``settings.parallelism`` requests, urllib3's retries and
    redirects off (this module does both, checked)."""
    ca = ca_file or (str(settings.ca_file) if settings.ca_file else None)
    ca = ca or os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("SSL_CERT_FILE")
    context = ssl.create_default_context(cafile=ca) if ca else ssl.create_default_context()
    return urllib3.PoolManager(
        num_pools=4,
        maxsize=settings.parallelism + 1,
        retries=False,
        ssl_context=context,
    )


class HttpObject:
    """Requests for one object: ``url()`` gives the address to ask (fresh per request, so
    a presigned URL never expires mid-read); ``name`` is what messages show."""

    def __init__(
        self,
        name: str,
        url: Callable[[], str],
        pool: urllib3.PoolManager,
        settings: SourceSettings,
    ) -> None:
        self.name = name
        self.url = url
        self.pool = pool
        self.settings = settings
        self.size = -1
        self.etag: str | None = None
        self.modified: str | None = None

    # --- pinning -------------------------------------------------------------------

    def pin_to(self, size: int, etag: str | None, modified: str | None) -> None:
        """Bind every later request to this length and ETag / modification time.

        Raises:
            StoreProtocolError: neither a strong ETag nor a modification time to pin to.
        """
        self.size = size
        self.etag = etag if etag and not etag.startswith("W/") else None
        self.modified = modified
        if self.etag is None and self.modified is None:
            raise StoreProtocolError(
                f"{self.name}: the server gives no strong ETag and no Last-Modified, so the "
                "object cannot be pinned for the read"
            )

    @property
    def pin(self) -> str:
        """What requests are bound to, for reports."""
        return f"etag {self.etag}" if self.etag else f"last-modified {self.modified}"

    def _conditions(self) -> dict[str, str]:
        if self.etag:
            return {"If-Match": self.etag}
        assert self.modified is not None
        return {"If-Unmodified-Since": self.modified}

    # --- one request ---------------------------------------------------------------

    def request(
        self, method: str, headers: Mapping[str, str], span: Span | None, where: str
    ) -> urllib3.BaseHTTPResponse:
        """Send a request, following redirects within the origin; errors mapped to the
        families of :mod:`.errors` (transient ones as :class:`TransientStoreError`)."""
        url = self.url()
        origin = _origin(url)
        for _ in range(_REDIRECTS + 1):
            started = time.monotonic()
            left = span.remaining() if span is not None else self.settings.deadline
            timeout = urllib3.Timeout(
                connect=min(5.0, self.settings.timeout, left),
                read=min(self.settings.timeout, left),
            )
            try:
                resp = self.pool.request(
                    method,
                    url,
                    headers=dict(headers),
                    redirect=False,
                    preload_content=False,
                    timeout=timeout,
                )
            except SSLError as exc:
                raise StoreUnavailableError(f"{where}: TLS failed: {_reason(exc)}") from None
            except HTTPError as exc:
                raise TransientStoreError(f"{where}: {_reason(exc)}") from None
            finally:
                if span is not None:
                    span.charge(started)
            if resp.status in (301, 302, 303, 307, 308) and resp.headers.get("Location"):
                target = urljoin(url, resp.headers["Location"])
                _drop(resp)
                if _origin(target) != origin:
                    raise StoreProtocolError(
                        f"{where}: the server redirects to another origin "
                        f"({public_name(target)}): refused"
                    )
                url = target
                continue
            return resp
        raise StoreProtocolError(f"{where}: more than {_REDIRECTS} redirects")

    def check_status(self, resp: urllib3.BaseHTTPResponse, where: str, expected: int) -> None:
        """Map an unexpected status to its error (the body is not read)."""
        status = resp.status
        if status == expected:
            return
        _drop(resp)
        if status == 200 and expected == 206:
            raise StoreProtocolError(
                f"{where}: the server answered 200 with the whole object instead of the "
                "206 range asked for (it ignores Range)"
            )
        if status == 404:
            raise ObjectNotFoundError(f"{self.name} does not exist (HTTP 404)")
        if status in (401, 403):
            raise StoreAccessDeniedError(f"{self.name}: access refused (HTTP {status})")
        if status == 412:
            raise ObjectChangedError(
                f"{self.name} changed while it was read: it no longer matches {self.pin}"
            )
        if status == 416:
            raise ObjectChangedError(f"{self.name} is shorter than when it was opened")
        if status in _TRANSIENT:
            raise TransientStoreError(f"{where}: HTTP {status}")
        raise StoreProtocolError(f"{where}: unexpected HTTP {status}")

    def head(self) -> tuple[int, str | None, str | None]:
        """(length, ETag, Last-Modified) of the object, from a ``HEAD``, retried."""
        attempt = 0
        while True:
            try:
                resp = self.request("HEAD", {}, None, self.name)
                self.check_status(resp, self.name, 200)
                _drop(resp)
                length = resp.headers.get("Content-Length")
                if length is None or not length.isdigit():
                    raise StoreProtocolError(f"{self.name}: the server gives no length")
                return int(length), resp.headers.get("ETag"), resp.headers.get("Last-Modified")
            except TransientStoreError as exc:
                attempt += 1
                if attempt > self.settings.retries:
                    raise StoreUnavailableError(
                        f"{exc} (after {self.settings.retries} retries)"
                    ) from None
                time.sleep(backoff(attempt))

    def check_range(
        self, resp: urllib3.BaseHTTPResponse, first: int, last: int, where: str
    ) -> None:
        """Check a 206 answer describes exactly bytes ``first``-``last`` of the pinned object."""
        got = resp.headers.get("Content-Range", "")
        unit, _, rest = got.partition(" ")
        span, _, total = rest.partition("/")
        if self.etag and resp.headers.get("ETag") not in (None, self.etag):
            _drop(resp)
            raise ObjectChangedError(
                f"{self.name} changed while it was read: ETag {resp.headers.get('ETag')} "
                f"instead of {self.etag}"
            )
        if self.modified and resp.headers.get("Last-Modified") not in (None, self.modified):
            if _later(resp.headers.get("Last-Modified"), self.modified):
                _drop(resp)
                raise ObjectChangedError(
                    f"{self.name} changed while it was read: modified "
                    f"{resp.headers.get('Last-Modified')}, pinned at {self.modified}"
                )
        if unit != "bytes" or span != f"{first}-{last}":
            _drop(resp)
            raise StoreProtocolError(
                f"{where}: the server answered Content-Range {got!r} for the range asked"
            )
        if total != str(self.size):
            _drop(resp)
            raise ObjectChangedError(
                f"{self.name} changed while it was read: {total} bytes long, "
                f"{self.size} when it was opened"
            )
        if resp.headers.get("Content-Length") != str(last - first + 1):
            _drop(resp)
            raise StoreProtocolError(
                f"{where}: the answer's Content-Length does not match the range asked"
            )


def _later(value: str | None, pinned: str) -> bool:
    try:
        return value is None or parsedate_to_datetime(value) != parsedate_to_datetime(pinned)
    except (TypeError, ValueError):
        return True


def _reason(exc: BaseException) -> str:
    """A one-line reason without URLs (a presigned URL's query never reaches a message)."""
    inner = getattr(exc, "reason", None) or exc
    text = type(inner).__name__
    detail = str(inner)
    if "?" in detail or "://" in detail:  # urllib3 messages may quote the URL
        return text
    return f"{text}: {detail}" if detail else text


def _drop(resp: urllib3.BaseHTTPResponse) -> None:
    """Close without reading on: an endless body is never drained."""
    resp.close()
    resp.release_conn()


class HttpSpan(Span):
    """One range of an :class:`HttpObject`, retried from where it stopped."""

    def __init__(self, obj: HttpObject, offset: int, length: int) -> None:
        super().__init__(obj.name, offset, length, obj.settings.deadline)
        self.obj = obj
        self._resp: urllib3.BaseHTTPResponse | None = None

    def _open(self) -> urllib3.BaseHTTPResponse:
        first, last = self.offset + self.done, self.offset + self.length - 1
        headers = {"Range": f"bytes={first}-{last}", **self.obj._conditions()}
        resp = self.obj.request("GET", headers, self, self.where())
        self.obj.check_status(resp, self.where(), 206)
        self.obj.check_range(resp, first, last, self.where())
        return resp

    def read_exact(self, buf: memoryview) -> None:
        start, attempt = self.done, 0
        self.restart_deadline()
        while self.done - start < len(buf):
            try:
                if self._resp is None:
                    self._resp = self._open()
                self._fill(self._resp, buf[self.done - start :])
            except TransientStoreError as exc:
                self.close()
                attempt += 1
                if attempt > self.obj.settings.retries:
                    raise StoreUnavailableError(
                        f"{exc} (after {self.obj.settings.retries} retries)"
                    ) from None
                pause = backoff(attempt)
                self.charge(time.monotonic() - pause)
                time.sleep(pause)

    def _fill(self, resp: urllib3.BaseHTTPResponse, view: memoryview) -> None:
        """Read ``view`` full from ``resp`` (``readinto``, in place), within the deadline:
        a watchdog shuts the connection down when the span's network time runs out, so a
        body that drips cannot hold a read however large the read is."""
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            resp.shutdown()

        watchdog = threading.Timer(self.remaining(), expire)
        watchdog.daemon = True
        started = time.monotonic()
        watchdog.start()
        got = 0
        try:
            while got < len(view):
                try:
                    n = resp.readinto(view[got : got + _READ])
                except (HTTPError, OSError) as exc:
                    if expired.is_set():
                        break
                    raise TransientStoreError(
                        f"{self.where()}: the body ended after {self.done} of {self.length} "
                        f"bytes ({type(getattr(exc, 'reason', None) or exc).__name__})"
                    ) from None
                if not n:
                    if expired.is_set():
                        break
                    raise TransientStoreError(
                        f"{self.where()}: the body ended after {self.done} of {self.length} bytes"
                    )
                got += n
                self.done += n
        finally:
            watchdog.cancel()
            self.charge(started)  # raises StoreDeadlineError once the deadline is spent
        if expired.is_set():
            self.charge(started - self.remaining() - 1)

    def close(self) -> None:
        if self._resp is not None:
            resp, self._resp = self._resp, None
            if self.done == self.length:
                resp.release_conn()
            else:
                _drop(resp)


class HttpsSource(ObjectSource):
    """An ``https://`` URL, pinned by its ETag (or Last-Modified) at open."""

    def __init__(self, url: str, settings: SourceSettings) -> None:
        if urlsplit(url).scheme != "https":
            raise StoreProtocolError(f"{public_name(url)}: only https:// URLs are read")
        self.name = public_name(url)
        self._pool = pool_for(settings)
        self.obj = HttpObject(self.name, lambda: url, self._pool, settings)
        size, etag, modified = self.obj.head()
        self.obj.pin_to(size, etag, modified)
        self.size = size
        self.pin = self.obj.pin
        self.settings = settings

    def open_span(self, offset: int, length: int) -> Span:
        return HttpSpan(self.obj, offset, length)

    def close(self) -> None:
        self._pool.clear()
