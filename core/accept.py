"""Accepting connections for the holder's HTTP server: every cap applies at accept, before TLS.

asyncio's own accept loop (``start_server``) hands a connection to the application only
after its TLS handshake, so caps counted there do not see connections that never send a
ClientHello; when descriptors run out it logs a traceback per attempt. This loop instead:

* counts each accepted socket against the per-client and total caps **before** any TLS, and
  answers (plain HTTP: a JSON 503) or closes those over them;
* caps TLS handshakes in progress (``max_handshakes``), each with the head's deadline;
* raises the soft ``RLIMIT_NOFILE`` (up to the hard limit) so that the total cap and the
  refusals in flight fit in the descriptor budget (the limit less those open at start less
  ``fd_reserve`` kept for the holder's own files), and lowers the cap to fit when it cannot
  (logged as ``connections-capped``): a client over the cap is then always told or reset;
* stops accepting while the sockets it holds reach the descriptor budget anyway (the
  holder's own files past the reserve), and resumes as they close; the kernel's backlog
  holds the rest meanwhile, unanswered;
* reports errors (its own and asyncio's) as JSON log lines, at most a few per interval, with
  the number suppressed since the last one.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import resource
import socket
import ssl
import struct
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["Acceptor", "ErrorLog", "open_descriptors"]

_server_log = logging.getLogger("gpucc.holder")
#: refusals answered at once (each holds its socket for up to ~1.3 s); the rest are closed
_MAX_REFUSING = 32
_RESOURCE_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


def open_descriptors() -> int:
    """How many file descriptors this process holds (from ``/proc/self/fd``; 0 elsewhere)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


class ErrorLog:
    """Server errors as JSON lines, at most ``burst`` per ``interval`` seconds; the lines
    after a quiet spell say how many were suppressed."""

    def __init__(self, burst: int = 10, interval: float = 10.0) -> None:
        self.burst, self.interval = burst, interval
        self._window = 0.0
        self._sent = 0
        self.suppressed = 0

    def __call__(self, event: str, **fields: Any) -> None:
        now = time.monotonic()
        if now - self._window >= self.interval:
            self._window, self._sent = now, 0
        if self._sent >= self.burst:
            self.suppressed += 1
            return
        self._sent += 1
        doc = {"event": event, **fields}
        if self.suppressed:
            doc["suppressed"], self.suppressed = self.suppressed, 0
        _server_log.warning(json.dumps(doc, sort_keys=True, default=str))

    def asyncio_handler(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """For ``loop.set_exception_handler``: one line, never a traceback."""
        exc = context.get("exception")
        self(
            "server-error",
            message=" ".join(str(context.get("message", "")).split())[:200],
            error=type(exc).__name__ if exc is not None else None,
            detail=" ".join(str(exc).split())[:200] if exc is not None else None,
        )


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, str], Awaitable[None]]
Refuser = Callable[[asyncio.StreamReader, asyncio.StreamWriter, str], Awaitable[None]]


class Acceptor:
    """The accept loop of one listening socket (see the module docstring)."""

    def __init__(
        self,
        *,
        handle: Handler,
        refuse: Refuser,
        tls: ssl.SSLContext | None,
        max_connections: int,
        max_per_client: int,
        max_handshakes: int,
        handshake_s: float,
        fd_reserve: int,
        trusted: frozenset[str],
        errors: ErrorLog,
    ) -> None:
        self.handle, self.refuse, self.tls = handle, refuse, tls
        self.max_connections, self.max_per_client = max_connections, max_per_client
        self.max_handshakes, self.handshake_s = max_handshakes, handshake_s
        self.trusted, self.errors = trusted, errors
        held_at_start = open_descriptors()
        soft = _descriptor_limit(max_connections + _MAX_REFUSING + held_at_start + fd_reserve)
        budget = soft - held_at_start - fd_reserve
        self.fd_budget = max(8, budget) if soft != resource.RLIM_INFINITY else 1 << 20
        # The total cap must be reached before the descriptors run out: accepting pauses at
        # the budget, and a client left in the kernel's backlog meanwhile gets no answer at
        # all, where one over the cap is told (503) or reset. When the limit cannot be raised
        # far enough, the cap is lowered to what the descriptors allow, and the log says so.
        fits = max(1, self.fd_budget - _MAX_REFUSING)
        if max_connections > fits:
            errors(
                "connections-capped",
                max_connections=fits,
                asked=max_connections,
                fd_limit=soft,
                reason="the descriptor limit (RLIMIT_NOFILE) holds no more",
            )
            self.max_connections = fits
        self.open = 0  # connections being served (handshaking included)
        self.refusing = 0  # sockets held while a refusal is answered
        self.handshaking = 0
        self.per_client: Counter[str] = Counter()
        self.tasks: set[asyncio.Task[None]] = set()
        self.dropped = 0  # over a cap and not answered: closed at once
        self._room = asyncio.Event()
        self.stopping = False

    @property
    def held(self) -> int:
        """Accepted sockets still open."""
        return self.open + self.refusing

    async def run(self, sock: socket.socket) -> None:
        """Accept until cancelled."""
        loop = asyncio.get_running_loop()
        sock.setblocking(False)
        paused = False
        while not self.stopping:
            if self.held >= self.fd_budget:
                if not paused:
                    paused = True
                    self.errors("accept-paused", held=self.held, fd_budget=self.fd_budget)
                self._room.clear()
                await self._room.wait()
                continue
            if paused:
                paused = False
                self.errors("accept-resumed", held=self.held, fd_budget=self.fd_budget)
            try:
                conn, addr = await loop.sock_accept(sock)
            except OSError as exc:
                if exc.errno in _RESOURCE_ERRNOS:
                    self.errors("accept-error", error=errno.errorcode.get(exc.errno or 0, "?"))
                    await asyncio.sleep(0.1)  # let connections close before trying again
                continue
            self._admit(conn, addr)
            # take what else is waiting in the backlog without another trip through the loop
            for _ in range(64):
                if self.held >= self.fd_budget:
                    break
                try:
                    conn, addr = sock.accept()
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    break
                self._admit(conn, addr)

    def _admit(self, conn: socket.socket, addr: Any) -> None:
        conn.setblocking(False)
        peer = str(addr[0]) if isinstance(addr, tuple) else "?"
        capped = peer not in self.trusted
        over = (
            self.open >= self.max_connections
            or (capped and self.per_client[peer] >= self.max_per_client)
            or (self.tls is not None and self.handshaking >= self.max_handshakes)
        )
        if over:
            if self.tls is None and self.refusing < _MAX_REFUSING:
                self.refusing += 1
                self._spawn(self._refused(conn, peer))
            else:  # a TLS client cannot be told in HTTP before its handshake: reset it
                self.dropped += 1
                _reset(conn)
                self.errors("connection-dropped", client=peer, dropped=self.dropped)
            return
        self.open += 1
        self.per_client[peer] += 1
        self._spawn(self._served(conn, peer))

    def _spawn(self, work: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _closed(self) -> None:
        self._room.set()

    async def _streams(
        self, conn: socket.socket, tls: ssl.SSLContext | None
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        loop = asyncio.get_running_loop()
        # asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP, which an
        # accepted socket's is not: without it, an answer's body (written after its head)
        # waits for the client's delayed ACK, some 40 ms per request.
        with contextlib.suppress(OSError):
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = asyncio.StreamReader(limit=64 * 1024)
        protocol = asyncio.StreamReaderProtocol(reader)
        transport, _ = await loop.connect_accepted_socket(
            lambda: protocol,
            conn,
            ssl=tls,
            ssl_handshake_timeout=self.handshake_s if tls else None,
        )
        return reader, asyncio.StreamWriter(transport, protocol, reader, loop)

    async def _served(self, conn: socket.socket, peer: str) -> None:
        writer: asyncio.StreamWriter | None = None
        try:
            if self.tls is not None:
                self.handshaking += 1
                try:
                    reader, stream = await asyncio.wait_for(
                        self._streams(conn, self.tls), self.handshake_s + 1.0
                    )
                finally:
                    self.handshaking -= 1
            else:
                reader, stream = await self._streams(conn, None)
            writer = stream
            await self.handle(reader, stream, peer)
        except (OSError, TimeoutError, ssl.SSLError, ConnectionError, asyncio.CancelledError):
            pass
        except Exception as exc:  # one bad connection never stops the service
            self.errors("connection-error", client=peer, error=type(exc).__name__)
        finally:
            if writer is not None:
                writer.close()
            else:
                conn.close()
            self.open -= 1
            self.per_client[peer] -= 1
            if self.per_client[peer] <= 0:
                del self.per_client[peer]
            self._closed()

    async def _refused(self, conn: socket.socket, peer: str) -> None:
        try:
            reader, writer = await self._streams(conn, None)
            await self.refuse(reader, writer, peer)
        except (OSError, asyncio.CancelledError):
            conn.close()
        finally:
            self.refusing -= 1
            self._closed()


def _descriptor_limit(wanted: int) -> int:
    """The soft descriptor limit, first raised towards ``wanted`` (at most to the hard limit,
    which an unprivileged process may not pass)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return soft
    raised = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
    if raised > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            return raised
    return soft


def _reset(conn: socket.socket) -> None:
    """Close with a reset: the descriptor is freed at once, no TIME_WAIT is left."""
    with contextlib.suppress(OSError):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()
