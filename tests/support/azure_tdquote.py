"""A loopback stand-in for Azure's paravisor quote endpoint (``POST /acc/tdquote``).

:func:`td_quote_service` runs a real HTTP server on 127.0.0.1 in a thread. It reads the
request as Azure's endpoint does (a JSON object whose only key ``report`` is the TDREPORT in
base64url, without padding) and answers ``{"quote": BASE64URL}`` with what ``quote_for``
gives for that TDREPORT, or 400 when it gives None. Every request body is recorded; a test
may replace the answer with raw bytes (``service.raw``) to play a broken endpoint.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PATH = "/acc/tdquote"


@dataclass
class TdQuoteService:
    """The running stand-in: its URL, the requests it got, an optional raw answer."""

    url: str
    requests: list[bytes] = field(default_factory=list)
    raw: tuple[int, bytes] | None = None
    padded: bool = False


@contextmanager
def td_quote_service(quote_for: Callable[[bytes], bytes | None]) -> Iterator[TdQuoteService]:
    """Serve ``quote_for(TDREPORT)`` at ``http://127.0.0.1:PORT/acc/tdquote``."""
    state: TdQuoteService

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

        def _answer(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            state.requests.append(body)
            if self.path != PATH:
                return self._answer(404, b'{"error": "not found"}')
            if state.raw is not None:
                return self._answer(*state.raw)
            try:
                doc = json.loads(body)
                encoded = doc["report"]
                assert set(doc) == {"report"} and "=" not in encoded
                report = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
            except (ValueError, KeyError, TypeError, AssertionError):
                return self._answer(400, b'{"error": "bad request"}')
            quote = quote_for(report)
            if quote is None:
                return self._answer(400, b'{"error": "not a TDREPORT of this TD"}')
            text = base64.urlsafe_b64encode(quote).decode()
            text = text if state.padded else text.rstrip("=")
            return self._answer(200, json.dumps({"quote": text}).encode())

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state = TdQuoteService(url=f"http://127.0.0.1:{server.server_address[1]}{PATH}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
