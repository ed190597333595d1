"""An HTTPS origin that misbehaves on purpose: ``python -m tests.support.hostile_origin PORT
ROOT CERT KEY`` serves ``ROOT/NAME`` at ``/MODE/NAME``.

``HEAD`` answers honestly (length, ETag ``"v1"``) except in mode ``truncated``; ranged GETs
of the first bytes (the sealed header) are honest, and every later range misbehaves:

ok            a correct 206
flaky         the first request for each range's end drops the connection halfway, later ones work
ignore-range  200 with the whole object
endless       200 with a body that never ends
short         every answer ends halfway through its body
wrong-range   a Content-Range for bytes one further on
other-bytes   the right headers, one byte of the body changed
changed       412: the object no longer matches If-Match
changed-etag  206 under another ETag
truncated     the object lacks its last 100 bytes (HEAD says so too)
redirect      302 to the same path on another host name (localhost)
drip          the right headers, then the body one byte every 50 ms
"""

from __future__ import annotations

import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ETAG = '"v1"'
_seen: set[tuple[str, int]] = set()
_lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    root = Path(".")
    port = 0

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass

    def _target(self) -> tuple[str, bytes] | None:
        parts = self.path.split("/", 2)
        if len(parts) != 3 or not (self.root / parts[2]).is_file():
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        data = (self.root / parts[2]).read_bytes()
        if parts[1] == "truncated":
            data = data[:-100]
        return parts[1], data

    def do_HEAD(self) -> None:  # noqa: N802
        target = self._target()
        if target is None:
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(target[1])))
        self.send_header("ETag", ETAG)
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()

    def do_GET(self) -> None:  # noqa: N802
        target = self._target()
        if target is None:
            return
        mode, data = target
        first_s, _, last_s = (
            self.headers.get("Range", "bytes=0-").removeprefix("bytes=").partition("-")
        )
        first = int(first_s)
        last = int(last_s) if last_s else len(data) - 1
        body = data[first : last + 1]
        honest = first == 0 or mode in ("ok", "truncated")
        if not honest and mode == "flaky":
            with _lock:
                honest = (self.path, last) in _seen  # a retry resumes: same last byte
                _seen.add((self.path, last))
            if not honest:
                self._range_headers(first, last, len(data))
                self.wfile.write(body[: len(body) // 2])
                self.close_connection = True
                return
        if honest:
            if self.headers.get("If-Match") not in (None, ETAG):
                self._status(412)
                return
            self._range_headers(first, last, len(data))
            self.wfile.write(body)
            return
        if mode == "ignore-range":
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        elif mode == "endless":
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            try:
                while True:
                    self.wfile.write(b"\0" * 65536)
            except OSError:
                return
        elif mode == "short":
            self._range_headers(first, last, len(data))
            self.wfile.write(body[: len(body) // 2])
            self.close_connection = True
        elif mode == "wrong-range":
            self._range_headers(first + 1, last + 1, len(data))
            self.wfile.write(data[first + 1 : last + 2])
        elif mode == "other-bytes":
            self._range_headers(first, last, len(data))
            self.wfile.write(body[:-1] + bytes([body[-1] ^ 1]))
        elif mode == "changed":
            self._status(412)
        elif mode == "changed-etag":
            self._range_headers(first, last, len(data), etag='"v2"')
            self.wfile.write(body)
        elif mode == "redirect":
            self.send_response(302)
            self.send_header(
                "Location", f"https://localhost:{self.port}/ok/{self.path.split('/', 2)[2]}"
            )
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif mode == "drip":
            self._range_headers(first, last, len(data))
            try:
                for i in range(len(body)):
                    self.wfile.write(body[i : i + 1])
                    self.wfile.flush()
                    time.sleep(0.05)
            except OSError:
                return

    def _status(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _range_headers(self, first: int, last: int, total: int, etag: str = ETAG) -> None:
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {first}-{last}/{total}")
        self.send_header("Content-Length", str(last - first + 1))
        self.send_header("ETag", etag)
        self.end_headers()


def main() -> None:
    port, root, cert, key = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    Handler.root, Handler.port = root, port
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
