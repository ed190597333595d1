"""A whole-call deadline for the HTTP layer: connect, TLS, request, headers and body together.

A read timeout restarts with every byte, so a server that drips one byte just before each
timeout (in its TLS handshake, its headers or its body) holds a reader for ever. A
:class:`Deadline` bounds the whole call instead:

* every connection the call opens or reuses is watched: its socket is duplicated, and
  when the deadline passes a timer shuts the connection down, which ends whatever read
  or write is blocked on it at once (the caller then asks :meth:`Deadline.expired` why
  its read failed, and must refuse anything read, since a shut-down connection can look
  like a body that ended);
* a new connection's connect timeout is cut to the time left, and none is opened once
  the deadline has passed (:class:`DeadlineExceeded`, which urllib3 does not retry);
* the backoff between retries is cut to the time left (:class:`DeadlineRetry`).

Connections are watched through connection classes given to urllib3's pools
(:class:`WatchedAdapter`, for direct connections and HTTP(S) proxies). The deadline in
force belongs to the calling thread, so one session can serve several threads.

This module imports requests and urllib3; the HTTP layer imports it only when it first
makes a request.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from types import TracebackType
from typing import Any

import requests.adapters
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.poolmanager import ProxyManager
from urllib3.util.retry import Retry

__all__ = ["Deadline", "DeadlineExceeded", "DeadlineRetry", "WatchedAdapter", "current"]

_local = threading.local()


class DeadlineExceeded(Exception):
    """The call's deadline passed before a connection could be opened (not an OSError:
    urllib3 lets it through instead of retrying)."""


def current() -> Deadline | None:
    """The deadline of the call running in this thread, if any."""
    deadline: Deadline | None = getattr(_local, "deadline", None)
    return deadline


class Deadline:
    """``seconds`` for one whole call, from ``with`` on; see the module docstring."""

    def __init__(self, seconds: float) -> None:
        if not seconds > 0:
            raise ValueError("a deadline must be positive")
        self.seconds = seconds
        self._expires = time.monotonic() + seconds
        self._lock = threading.Lock()
        # (the socket urllib3 uses, a duplicate of its descriptor that the timer shuts down)
        self._watched: list[tuple[socket.socket, socket.socket]] = []
        self._fired = False
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True

    def __enter__(self) -> Deadline:
        if current() is not None:
            raise RuntimeError("one deadline per thread at a time")
        _local.deadline = self
        self._timer.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _local.deadline = None
        self._timer.cancel()
        with self._lock:
            watched, self._watched = self._watched, []
        for _, dup in watched:
            dup.close()

    def remaining(self) -> float:
        """Seconds left (negative once passed)."""
        return self._expires - time.monotonic()

    def expired(self) -> bool:
        """Whether the deadline has passed (or its timer has shut the connections)."""
        return self._fired or self.remaining() <= 0

    def watch(self, sock: socket.socket) -> None:
        """Shut ``sock``'s connection down when the deadline passes (at once if it has)."""
        fd = sock.fileno()
        if fd < 0:
            return
        with self._lock:
            if any(seen is sock for seen, _ in self._watched):
                return
            try:
                dup = socket.socket(fileno=os.dup(fd))
            except OSError:
                return  # out of descriptors: the body loop's own check remains
            self._watched.append((sock, dup))
            if self._fired:
                _shut(dup)

    def _fire(self) -> None:
        with self._lock:
            self._fired = True
            for _, dup in self._watched:
                _shut(dup)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _before_connect(conn: HTTPConnection) -> Deadline | None:
    deadline = current()
    if deadline is None:
        return None
    left = deadline.remaining()
    if left <= 0:
        raise DeadlineExceeded
    timeout = conn.timeout
    conn.timeout = min(timeout, left) if isinstance(timeout, int | float) else left
    return deadline


def _before_request(conn: HTTPConnection) -> None:
    deadline = current()
    if deadline is not None and conn.sock is not None:
        deadline.watch(conn.sock)


class _WatchedHTTPConnection(HTTPConnection):
    def _new_conn(self) -> socket.socket:
        deadline = _before_connect(self)
        sock = super()._new_conn()
        if deadline is not None:
            deadline.watch(sock)
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:
        _before_request(self)
        super().request(*args, **kwargs)


class _WatchedHTTPSConnection(HTTPSConnection):
    def _new_conn(self) -> socket.socket:
        deadline = _before_connect(self)
        sock = super()._new_conn()
        if deadline is not None:
            deadline.watch(sock)  # before the TLS handshake, which a server can drip too
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:
        _before_request(self)
        super().request(*args, **kwargs)


class _WatchedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection


class _WatchedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


_POOLS: dict[str, type[HTTPConnectionPool]] = {
    "http": _WatchedHTTPPool,
    "https": _WatchedHTTPSPool,
}


class WatchedAdapter(requests.adapters.HTTPAdapter):
    """requests' adapter with watched connections (direct, and through HTTP(S) proxies)."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = _POOLS

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if isinstance(manager, ProxyManager):  # SOCKS managers keep their own connections
            manager.pool_classes_by_scheme = _POOLS
        return manager


class DeadlineRetry(Retry):
    """urllib3's Retry whose backoff never sleeps past the call's deadline."""

    def get_backoff_time(self) -> float:
        wait = super().get_backoff_time()
        deadline = current()
        return wait if deadline is None else max(0.0, min(wait, deadline.remaining()))
