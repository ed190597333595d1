"""A small HTTP/1.1 server for the holder's ASGI application, built to outlast hostile clients.

Why not Uvicorn (or Hypercorn, Granian): none of them has every deadline a key-release
service needs. Uvicorn closes idle keep-alive connections but never one that has not sent
its first byte, has no deadline for a request head trickled one line at a time, leaves the
connection open after a timed-out body, caps connections only globally (answering 503 in
plain text to everyone once an attacker holds them all), and trusts ``X-Forwarded-For``
from loopback by default. Hypercorn's ``read_timeout`` restarts with every byte; Granian
has a header-read timeout but no per-client caps. The parsing itself is h11's (the
HTTP/1.1 state machine Uvicorn and httpx use); this module adds the connection policy:

* **idle deadline**: a connection must send the first byte of a request within
  ``idle_s`` (a kept-alive one, of its next request), or it is closed;
* **head deadline**: the request line and headers must be complete within ``header_s`` of
  their first byte, and no larger than ``max_header_bytes``;
* **request deadline**: head and body within ``request_s`` of the first byte;
* **caps**: at most ``max_connections`` open connections, at most ``max_per_client`` from
  one client address, at most ``max_handshakes`` TLS handshakes in progress, all counted
  when the connection is accepted, before TLS (:mod:`gpucc.core.accept`); accepting
  pauses while the descriptors held reach the process's limit less ``fd_reserve``; one
  request at a time per connection;
* **head size**: a request line over ``max_request_line`` bytes is refused with 414, a
  head over ``max_header_bytes`` with 431, whether it arrives in pieces or in one write;
* refusals (400, 408, 413, 414, 431, 503) are the documented JSON error body and one access-log
  line each, and the connection is closed after them; a request with both
  ``Content-Length`` and ``Transfer-Encoding`` is refused (RFC 9112 section 6.3);
* ``X-Forwarded-For`` is believed only from the addresses in ``trusted_proxies``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import ipaddress
import json
import logging
import signal
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .accept import Acceptor, ErrorLog

__all__ = ["ServerLimits", "run_server"]

_access = logging.getLogger("gpucc.holder.access")


@dataclass(frozen=True)
class ServerLimits:
    """Connection policy (seconds, bytes, counts); see the module docstring."""

    idle_s: float = 10.0
    header_s: float = 10.0
    request_s: float = 30.0
    max_connections: int = 512
    max_per_client: int = 16
    max_body: int = 256 * 1024
    max_header_bytes: int = 16 * 1024
    max_request_line: int = 8 * 1024
    max_handshakes: int = 64
    fd_reserve: int = 64
    trusted_proxies: frozenset[str] = field(default_factory=frozenset)


class _Refusal(Exception):  # noqa: N818 - an outcome, answered and the connection closed
    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


class _Idle(Exception):  # noqa: N818 - the peer went away or never started a request
    pass


def _error_body(kind: str, message: str) -> bytes:
    return json.dumps({"error": kind, "message": message}, sort_keys=True).encode()


def _log(
    client: str,
    method: str | None,
    path: str | None,
    status: int,
    outcome: str,
    bytes_out: int,
    started: float,
) -> None:
    _access.info(
        json.dumps(
            {
                "event": "access",
                "time": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
                "client": client,
                "method": method,
                "path": path,
                "status": status,
                "outcome": outcome,
                "bytes_out": bytes_out,
                "ms": round((time.perf_counter() - started) * 1000, 2),
            },
            sort_keys=True,
        )
    )


def _forwarded_client(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The nearest address in ``X-Forwarded-For`` (the one the trusted proxy added)."""
    values = [v for k, v in headers if k == b"x-forwarded-for"]
    if not values:
        return None
    last = values[-1].decode("latin-1").split(",")[-1].strip()
    try:
        return str(ipaddress.ip_address(last))
    except ValueError:
        return None


class _Server:
    def __init__(self, app: Any, limits: ServerLimits, tls: ssl.SSLContext | None) -> None:
        self.app = app
        self.limits = limits
        self.tls = tls
        self.busy: set[asyncio.Task[Any]] = set()
        self.idle: set[asyncio.Task[Any]] = set()
        self.stopping = False
        self.acceptor: Acceptor | None = None

    # --- one connection ------------------------------------------------------------------

    async def connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str
    ) -> None:
        """Serve one accepted connection (already counted against the caps)."""
        import h11

        task = asyncio.current_task()
        assert task is not None
        self.idle.add(task)
        try:
            conn = h11.Connection(
                h11.SERVER, max_incomplete_event_size=self.limits.max_header_bytes
            )
            first = True
            while not self.stopping:
                if not await self._one_request(conn, reader, writer, peer, first):
                    break
                first = False
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    break
                conn.start_next_cycle()
        except (_Idle, OSError, TimeoutError, ssl.SSLError, h11.LocalProtocolError):
            pass
        except asyncio.CancelledError:  # shutting down: the connection just closes
            pass
        finally:
            self.idle.discard(task)
            self.busy.discard(task)
            writer.close()

    async def refuse_busy(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str
    ) -> None:
        """Answer a connection over a cap with the JSON 503."""
        await self._refuse_raw(reader, writer, peer, "busy")

    async def _refuse_raw(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str, kind: str
    ) -> None:
        started = time.perf_counter()
        body = _error_body(kind, "the service is at its connection limit; try again")
        head = (
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\nretry-after: 1\r\n\r\n"
        ).encode()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            writer.write(head + body)
            await asyncio.wait_for(writer.drain(), 1.0)
            await self._linger(reader, writer, 0.25)
        writer.close()
        _log(peer, None, None, 503, kind, len(body), started)

    async def _read(self, reader: asyncio.StreamReader, deadline: float) -> bytes:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        return await asyncio.wait_for(reader.read(65536), left)

    async def _one_request(
        self,
        conn: Any,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        peer: str,
        first: bool,
    ) -> bool:
        """Serve one request; False when the connection is to be closed without one."""
        import h11

        limits = self.limits
        # idle: wait for the first byte (h11 may already hold a pipelined request)
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError:  # pipelined garbage: refused below, like any other
            event = None
        started = time.perf_counter()
        data = b""
        if event is h11.NEED_DATA:
            try:
                data = await self._read(reader, time.monotonic() + limits.idle_s)
            except TimeoutError:
                if first:  # a connection that never asked anything is told why it goes
                    await self._answer(
                        conn,
                        reader,
                        writer,
                        peer,
                        None,
                        None,
                        started,
                        _Refusal(408, "timeout", "no request arrived in time"),
                    )
                raise _Idle from None
            if not data:
                raise _Idle
            conn.receive_data(data)
            started = time.perf_counter()
        task = asyncio.current_task()
        assert task is not None
        self.idle.discard(task)
        self.busy.add(task)
        begun = time.monotonic()
        head_deadline = begun + min(limits.header_s, limits.request_s)
        request_deadline = begun + limits.request_s
        method = path = None
        client = peer
        seen = bytearray(data)  # this head's bytes so far
        try:
            while True:
                if event is h11.NEED_DATA or event is None:
                    try:
                        event = conn.next_event()
                    except h11.RemoteProtocolError as exc:
                        if exc.error_status_hint == 431:  # h11's cap on an incomplete head
                            raise self._too_large(bytes(seen)) from None
                        raise
                if isinstance(event, h11.Request):
                    break
                if isinstance(event, h11.ConnectionClosed):
                    raise _Idle
                if event is h11.NEED_DATA:
                    try:
                        data = await self._read(reader, head_deadline)
                    except TimeoutError:
                        raise _Refusal(
                            408, "timeout", "the request head did not arrive in time"
                        ) from None
                    if len(seen) + len(data) > limits.max_header_bytes + 65536:
                        raise self._too_large(bytes(seen) + data)
                    seen += data
                    conn.receive_data(data)
                    event = h11.NEED_DATA
            self._check_head(event)
            method = event.method.decode("ascii", "replace")
            path = event.target.decode("ascii", "replace").split("?", 1)[0][:200]
            headers = [(k.lower(), v) for k, v in event.headers]
            if peer in limits.trusted_proxies:
                client = _forwarded_client(headers) or peer
            names = {k for k, _ in headers}
            if b"content-length" in names and b"transfer-encoding" in names:
                raise _Refusal(400, "malformed", "both Content-Length and Transfer-Encoding")
            declared = next((v for k, v in headers if k == b"content-length"), None)
            if declared is not None and (len(declared) > 18 or int(declared) > limits.max_body):
                raise _Refusal(413, "too-large", "the request body is too large")
            if conn.they_are_waiting_for_100_continue:  # curl waits a second otherwise
                writer.write(conn.send(h11.InformationalResponse(status_code=100, headers=[])))
            body = await self._body(conn, reader, request_deadline)
            status, out_headers, payload, outcome = await self._call_app(
                event, headers, body, peer, client
            )
            close = self.stopping
            if close:
                out_headers.append((b"connection", b"close"))
            writer.write(conn.send(h11.Response(status_code=status, headers=out_headers)))
            if payload and method != "HEAD":  # a HEAD answer has the headers only
                writer.write(conn.send(h11.Data(data=payload)))
            writer.write(conn.send(h11.EndOfMessage()))
            await asyncio.wait_for(writer.drain(), limits.request_s)
            _log(client, method, path, status, outcome, len(payload), started)
            return not close
        except h11.RemoteProtocolError as exc:
            refusal = _Refusal(exc.error_status_hint, "malformed", f"not HTTP/1.1: {exc}"[:200])
            if exc.error_status_hint == 431:
                refusal.kind = "too-large"
            await self._answer(conn, reader, writer, client, method, path, started, refusal)
            return False
        except _Refusal as refusal:
            await self._answer(conn, reader, writer, client, method, path, started, refusal)
            return False
        finally:
            self.busy.discard(task)
            self.idle.add(task)

    def _too_large(self, head: bytes) -> _Refusal:
        """414 when the request line alone is over its limit, else 431."""
        if len(head.split(b"\n", 1)[0]) > self.limits.max_request_line:
            return _Refusal(414, "too-large", "the request target is too long")
        return _Refusal(431, "too-large", "the request head is too large")

    def _check_head(self, request: Any) -> None:
        """The limits on a head h11 parsed whole (it caps only heads still incomplete)."""
        line = len(request.method) + len(request.target) + len(request.http_version) + 8
        if line > self.limits.max_request_line:
            raise _Refusal(414, "too-large", "the request target is too long")
        size = line + sum(len(k) + len(v) + 4 for k, v in request.headers.raw_items()) + 2
        if size > self.limits.max_header_bytes:
            raise _Refusal(431, "too-large", "the request head is too large")

    async def _body(self, conn: Any, reader: asyncio.StreamReader, deadline: float) -> bytes:
        import h11

        parts: list[bytes] = []
        size = 0
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                try:
                    data = await self._read(reader, deadline)
                except TimeoutError:
                    raise _Refusal(
                        408, "timeout", "the request body did not arrive in time"
                    ) from None
                conn.receive_data(data)
                continue
            if isinstance(event, h11.Data):
                size += len(event.data)
                if size > self.limits.max_body:
                    raise _Refusal(413, "too-large", "the request body is too large")
                parts.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return b"".join(parts)
            else:
                raise _Idle

    async def _call_app(
        self, request: Any, headers: list[tuple[bytes, bytes]], body: bytes, peer: str, client: str
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes, str]:
        target = request.target
        path, _, query = target.partition(b"?")
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": request.http_version.decode(),
            "method": request.method.decode("ascii"),
            "scheme": "https" if self.tls else "http",
            "path": path.decode("latin-1"),
            "raw_path": path,
            "query_string": query,
            "root_path": "",
            "headers": headers,
            "client": (client, 0),
            "server": None,
            "state": {},
        }
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.Event().wait()  # nothing more: the request is complete
            return {"type": "http.disconnect"}  # pragma: no cover

        reply: dict[str, Any] = {"status": 500, "headers": [], "body": []}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                reply["status"] = message["status"]
                reply["headers"] = [
                    (k, v) for k, v in message.get("headers", []) if k.lower() != b"content-length"
                ]
            elif message["type"] == "http.response.body":
                reply["body"].append(message.get("body", b""))

        try:
            await self.app(scope, receive, send)
        except Exception:  # the application answered 500 already (or is made to here)
            if not reply["body"]:
                reply["status"], reply["headers"] = 500, [(b"content-type", b"application/json")]
                reply["body"] = [_error_body("internal", "internal error")]
                scope["state"]["outcome"] = "internal"
        payload = b"".join(reply["body"])
        out = [*reply["headers"], (b"content-length", str(len(payload)).encode())]
        return reply["status"], out, payload, scope["state"].get("outcome", "")

    async def _answer(
        self,
        conn: Any,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        client: str,
        method: str | None,
        path: str | None,
        started: float,
        refusal: _Refusal,
    ) -> None:
        import h11

        body = _error_body(refusal.kind, refusal.message)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        with contextlib.suppress(Exception):
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                writer.write(conn.send(h11.Response(status_code=refusal.status, headers=headers)))
                writer.write(conn.send(h11.Data(data=body)))
                writer.write(conn.send(h11.EndOfMessage()))
            else:  # h11 refuses to answer a request it could not parse: write it ourselves
                reason = {
                    400: "Bad Request",
                    408: "Request Timeout",
                    413: "Content Too Large",
                    414: "URI Too Long",
                    431: "Request Header Fields Too Large",
                }.get(refusal.status, "Error")
                head = f"HTTP/1.1 {refusal.status} {reason}\r\n" + "".join(
                    f"{k.decode()}: {v.decode()}\r\n" for k, v in headers
                )
                writer.write(head.encode() + b"\r\n" + body)
            await asyncio.wait_for(writer.drain(), 1.0)
            await self._linger(reader, writer)
        _log(client, method, path, refusal.status, refusal.kind, len(body), started)

    @staticmethod
    async def _linger(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seconds: float = 0.5
    ) -> None:
        """Half-close, then discard what the client is still sending for a moment (at most
        half a second and 256 KiB), so that closing does not reset the connection before
        the client has read the refusal."""
        if writer.can_write_eof():
            writer.write_eof()
        deadline = time.monotonic() + seconds
        left = 256 * 1024
        while left > 0 and (wait := deadline - time.monotonic()) > 0:
            chunk = await asyncio.wait_for(reader.read(min(left, 65536)), wait)
            if not chunk:
                return
            left -= len(chunk)

    # --- the listener --------------------------------------------------------------------

    async def serve(
        self,
        host: str,
        port: int,
        drain_s: float,
        on_start: Callable[[int], None],
        on_reload: Callable[[], None],
        on_listen: Callable[[Any], None],
    ) -> int | None:
        """Serve until SIGTERM or SIGINT (SIGHUP calls ``on_reload``); the signal's number
        (after draining), or None."""
        loop = asyncio.get_running_loop()
        errors = ErrorLog()
        loop.set_exception_handler(errors.asyncio_handler)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, port), family=family, backlog=1024)
        limits = self.limits
        self.acceptor = Acceptor(
            handle=self.connection,
            refuse=self.refuse_busy,
            tls=self.tls,
            max_connections=limits.max_connections,
            max_per_client=limits.max_per_client,
            max_handshakes=limits.max_handshakes,
            handshake_s=limits.header_s,
            fd_reserve=limits.fd_reserve,
            trusted=limits.trusted_proxies,
            errors=errors,
        )
        on_listen(self.acceptor)
        accepting = asyncio.ensure_future(self.acceptor.run(sock))
        stop = asyncio.Event()
        received: list[int] = []

        def on_signal(signum: int) -> None:
            received.append(signum)
            stop.set()

        def on_hangup() -> None:
            try:
                on_reload()
            except Exception as exc:  # the service keeps its configuration
                errors("reload-failed", error=type(exc).__name__, detail=str(exc)[:300])

        signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        previous = {signum: signal.getsignal(signum) for signum in signals}
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, on_signal, signum)
        loop.add_signal_handler(signal.SIGHUP, on_hangup)
        on_start(sock.getsockname()[1])  # the port itself when ``port`` was 0
        try:
            await stop.wait()
        finally:
            self.stopping = self.acceptor.stopping = True
            accepting.cancel()
            sock.close()
            for task in list(self.idle):
                task.cancel()
            if self.busy:
                await asyncio.wait(list(self.busy), timeout=drain_s)
            for task in list(self.acceptor.tasks):
                task.cancel()
            for signum in signals:
                loop.remove_signal_handler(signum)
                signal.signal(signum, previous[signum])  # the caller's handlers, not SIG_DFL
        return received[0] if received else None


def run_server(
    app: Any,
    *,
    host: str,
    port: int,
    limits: ServerLimits,
    tls: ssl.SSLContext | None = None,
    drain_s: float = 20.0,
    on_start: Callable[[int], None] = lambda port: None,
    on_reload: Callable[[], None] = lambda: None,
    on_listen: Callable[[Any], None] = lambda acceptor: None,
) -> int | None:
    """Serve ``app`` until SIGTERM or SIGINT; requests in flight get ``drain_s``. SIGHUP
    calls ``on_reload`` (an exception from it is logged; the service goes on).
    ``on_start`` is given the port listened on once the service accepts connections (the
    one the system chose when ``port`` is 0).
    ``on_listen`` is given the accept loop (:class:`gpucc.core.accept.Acceptor`) once it
    listens, e.g. for its connection counts.

    Returns:
        The signal that stopped the service (the caller re-raises it), or None.
    """
    return asyncio.run(
        _Server(app, limits, tls).serve(host, port, drain_s, on_start, on_reload, on_listen)
    )
