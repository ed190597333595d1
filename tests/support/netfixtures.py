"""Real HTTP servers on 127.0.0.1 and a throw-away PKI for the network tests.

Nothing here mocks ``requests``: the RIM service and the OCSP responder are
``http.server`` instances in daemon threads on ephemeral ports, and the OCSP
answers are built with cryptography's ``OCSPResponseBuilder``.

The PKI has NVIDIA's shapes, all ECDSA P-384:

* device chain, leaf first: leaf -> BROM -> Provisioner ICA -> Identity -> root
* RIM chain, leaf first:    L4 signer -> L3 -> CA -> RIM root
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import hashlib
import json
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509 import ocsp
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpucc.gpuattest.collateral import ChainKind, OcspTarget
from gpucc.gpuattest.trust import TrustRoots
from tests.support.paths import DATA

UTC = dt.UTC
# The verification time of every test: inside all validity periods below.
NOW = dt.datetime(2026, 1, 15, 12, 0, 0, tzinfo=UTC)
SAMPLES = DATA / "nvidia-samples"
DRIVER_RIM_ID = "NV_GPU_DRIVER_GH100_545.00"
VBIOS_RIM_ID = "NV_GPU_VBIOS_1010_0200_882_96005E0001"
DRIVER_RIM = SAMPLES / "set-a-h100-545.00" / "driver-rim-545.00.swidtag"
VBIOS_RIM = SAMPLES / "set-a-h100-545.00" / "vbios-rim-1010_0200_882_96005E0001-test.swidtag"


# --- PKI ------------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    """A certificate and its private key."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cn(self) -> str:
        return str(self.cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


def ocsp_target(
    cert: x509.Certificate,
    issuer: x509.Certificate,
    *,
    kind: ChainKind,
    anchor: x509.Certificate,
    now: dt.datetime,
    issuer_chain: Sequence[x509.Certificate] = (),
) -> OcspTarget:
    """One OCSP question, spelled out by its parts."""
    return OcspTarget(cert, issuer, tuple(issuer_chain), kind, anchor, now)


def make_node(
    cn: str,
    issuer: Node | None,
    *,
    ca: bool,
    path_length: int | None = None,
    eku: list[x509.ObjectIdentifier] | None = None,
    not_before: dt.datetime = dt.datetime(2021, 1, 1, tzinfo=UTC),
    not_after: dt.datetime = dt.datetime(2099, 12, 31, tzinfo=UTC),
) -> Node:
    """A P-384 certificate signed by ``issuer`` (self-signed when None)."""
    key = ec.generate_private_key(ec.SECP384R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, cn),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gpucc test PKI"),
        ]
    )
    issuer_name = issuer.cert.subject if issuer else name
    signing_key = issuer.key if issuer else key
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=path_length), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=not ca,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=ca,
                crl_sign=ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )
    if eku is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage(eku), critical=False)
    cert = builder.sign(signing_key, hashes.SHA384())
    return Node(cert, key)


@dataclass(frozen=True)
class NetPki:
    """The device and RIM chains, plus responder certificates."""

    device_root: Node
    identity: Node
    ica: Node
    brom: Node
    leaf: Node
    rim_root: Node
    rim_ca: Node
    rim_l3: Node
    rim_l4: Node
    # A self-signed "responder" with the OCSP-signing EKU: not authorised for anything.
    rogue: Node
    # A second CA under the device root, unrelated to the device chain.
    stranger_ca: Node

    @property
    def device_chain(self) -> list[x509.Certificate]:
        """Leaf first, root last (what a GPU supplies)."""
        return [n.cert for n in (self.leaf, self.brom, self.ica, self.identity, self.device_root)]

    @property
    def rim_chain(self) -> list[x509.Certificate]:
        """L4 first, root last (what a RIM embeds)."""
        return [n.cert for n in (self.rim_l4, self.rim_l3, self.rim_ca, self.rim_root)]

    @property
    def roots(self) -> TrustRoots:
        return TrustRoots(device_root=self.device_root.cert, rim_root=self.rim_root.cert)

    def nodes(self) -> list[Node]:
        return [
            self.device_root,
            self.identity,
            self.ica,
            self.brom,
            self.leaf,
            self.rim_root,
            self.rim_ca,
            self.rim_l3,
            self.rim_l4,
        ]

    def issuer_of(self, node: Node) -> Node:
        for candidate in self.nodes():
            if candidate.cert.subject == node.cert.issuer:
                return candidate
        raise KeyError(node.cn)


@functools.cache
def build_pki() -> NetPki:
    """The test PKI (built once per process)."""
    root = make_node("Test Device Identity CA", None, ca=True)
    identity = make_node("Test GH100 Identity", root, ca=True)
    ica = make_node("Test GH100 Provisioner ICA 1", identity, ca=True)
    brom = make_node("Test GH100 A01 GSP BROM", ica, ca=True)
    leaf = make_node("Test GH100 A01 GSP FMC LF", brom, ca=False)
    rim_root = make_node("Test CoRIM signing Root CA", None, ca=True)
    rim_ca = make_node("Test Reference Value GH100 CA", rim_root, ca=True)
    rim_l3 = make_node("Test Reference Value L3 GH100 001", rim_ca, ca=True, path_length=0)
    rim_l4 = make_node(
        "Test HCC RIM L4 Signer",
        rim_l3,
        ca=False,
        not_before=dt.datetime(2024, 1, 1, tzinfo=UTC),
        not_after=dt.datetime(2028, 1, 1, tzinfo=UTC),
    )
    rogue = make_node(
        "Rogue OCSP Responder", None, ca=False, eku=[ExtendedKeyUsageOID.OCSP_SIGNING]
    )
    stranger = make_node("Test Stranger CA", root, ca=True)
    return NetPki(
        root, identity, ica, brom, leaf, rim_root, rim_ca, rim_l3, rim_l4, rogue, stranger
    )


def make_rim_document(chain: list[x509.Certificate], base: Path = DRIVER_RIM) -> bytes:
    """NVIDIA's sample RIM ``base`` with its embedded certificates replaced by ``chain``.

    The document still parses as a RIM (only ``ds:X509Certificate`` elements change);
    its XML signature no longer verifies, which collateral collection does not need.
    """
    from lxml import etree

    root = etree.fromstring(base.read_bytes())
    ns = "{http://www.w3.org/2000/09/xmldsig#}"
    x509_data = next(root.iter(f"{ns}X509Data"))
    for old in list(x509_data):
        x509_data.remove(old)
    for cert in chain:
        el = etree.SubElement(x509_data, f"{ns}X509Certificate")
        el.text = base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()
    return bytes(etree.tostring(root))


# --- a generic threaded server ---------------------------------------------------------


@dataclass
class Reply:
    """What a handler sends back."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    # Omit Content-Length and close the connection after the body.
    no_length: bool = False
    # Send the body one byte every ``drip`` seconds (the headers too with ``drip_headers``),
    # until it is sent or the client goes away.
    drip: float = 0.0
    drip_headers: bool = False


@dataclass(frozen=True)
class Seen:
    """A request the server received."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes


Handler = Callable[[Seen], Reply]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, handler: Handler) -> None:
        self.handle_request_fn = handler
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _RequestHandler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients that hang up mid-request are part of the tests (deadlines, resets): no
        traceback for those; anything else is reported as usual."""
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        return

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        seen = Seen(self.command, self.path, dict(self.headers.items()), body)
        with self.server.lock:
            self.server.seen.append(seen)
        try:
            reply = self.server.handle_request_fn(seen)
        except Exception as exc:  # a fixture bug: make it visible, not a hang
            reply = Reply(500, f"fixture error: {exc!r}".encode())
        try:
            if reply.delay:
                time.sleep(reply.delay)
            if reply.drip:
                self._drip(reply)
                return
            self.send_response(reply.status)
            for name, value in reply.headers.items():
                self.send_header(name, value)
            if reply.no_length:
                self.send_header("Connection", "close")
                self.close_connection = True
            else:
                self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _drip(self, reply: Reply) -> None:
        self.close_connection = True
        head = [f"HTTP/1.1 {reply.status} Dripping"]
        head += [f"{name}: {value}" for name, value in reply.headers.items()]
        head += [f"Content-Length: {len(reply.body)}", "Connection: close", "", ""]
        head_bytes = "\r\n".join(head).encode("latin-1")
        if not reply.drip_headers:
            self.wfile.write(head_bytes)
            head_bytes = b""
        data = head_bytes + reply.body
        for i in range(len(data)):
            self.wfile.write(data[i : i + 1])
            self.wfile.flush()
            time.sleep(reply.drip)

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()


class LocalServer:
    """A running server; ``url`` is its base, ``seen`` what it received."""

    def __init__(self, server: _Server, scheme: str = "http") -> None:
        self._server = server
        host, port = server.server_address[:2]
        self.url = f"{scheme}://{host!s}:{port}"

    @property
    def seen(self) -> list[Seen]:
        with self._server.lock:
            return list(self._server.seen)

    @property
    def count(self) -> int:
        return len(self.seen)

    def reset(self) -> None:
        with self._server.lock:
            self._server.seen.clear()


@contextmanager
def serve(handler: Handler, *, tls: ssl.SSLContext | None = None) -> Iterator[LocalServer]:
    """Run ``handler`` on 127.0.0.1 (an ephemeral port) until the block ends."""
    server = _Server(handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield LocalServer(server, "https" if tls else "http")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextmanager
def serve_raw(handler: Callable[[socket.socket], None]) -> Iterator[str]:
    """Give every connection to 127.0.0.1 (an ephemeral port) to ``handler``, which speaks
    whatever bytes it likes (for answers ``http.server`` cannot send); yields the base URL."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)

    def run(conn: socket.socket) -> None:
        with conn:
            try:
                handler(conn)
            except OSError:
                pass  # the client went away

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=run, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()  # (a blocked accept() may need a moment to notice)


def read_request_head(conn: socket.socket) -> bytes:
    """Read a request up to the end of its headers (the body, if any, is left unread)."""
    data = b""
    while b"\r\n\r\n" not in data:
        more = conn.recv(4096)
        if not more:
            break
        data += more
    return data


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def self_signed_tls(tmp: Path) -> ssl.SSLContext:
    """A server TLS context with a self-signed certificate for 127.0.0.1."""
    import ipaddress

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(dt.datetime(2020, 1, 1, tzinfo=UTC))
        .not_valid_after(dt.datetime(2099, 1, 1, tzinfo=UTC))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "tls.pem", tmp / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert_path, key_path)
    return ctx


# --- the RIM service -------------------------------------------------------------------


class RimService:
    """Serves ``/v1/rim/<id>`` from ``rims``; ``modes`` make an ID misbehave.

    Modes: ``404``, ``403``, ``401``, ``500`` (always), ``flaky`` (500 twice, then
    the RIM), ``slow`` (answers after ``slow_delay`` seconds), ``wrong-id``,
    ``wrong-sha``, ``no-sha``, ``oversized``, ``oversized-nolength``, ``non-json``,
    ``json-list``, ``bad-base64``, ``loop`` (redirects to itself).
    """

    def __init__(self, rims: Mapping[str, bytes] | None = None) -> None:
        self.rims: dict[str, bytes] = dict(rims or {})
        self.modes: dict[str, str] = {}
        self.slow_delay = 1.0
        self.oversized_bytes = 2 * 1024 * 1024
        self._attempts: dict[str, int] = {}

    @classmethod
    def with_samples(cls) -> RimService:
        return cls({DRIVER_RIM_ID: DRIVER_RIM.read_bytes(), VBIOS_RIM_ID: VBIOS_RIM.read_bytes()})

    def __call__(self, seen: Seen) -> Reply:
        prefix = "/v1/rim/"
        if not seen.path.startswith(prefix):
            return Reply(404, b'{"message":"NOT_FOUND"}')
        rim_id = seen.path[len(prefix) :]
        mode = self.modes.get(rim_id, "")
        attempts = self._attempts[rim_id] = self._attempts.get(rim_id, 0) + 1
        if mode in ("404", "403", "401", "500"):
            return Reply(int(mode), b'{"message":"nope"}')
        if mode == "flaky" and attempts <= 2:
            return Reply(500, b"busy")
        if mode == "loop":
            return Reply(302, headers={"Location": seen.path})
        if mode == "non-json":
            return Reply(200, b"<html>captive portal</html>")
        if mode == "json-list":
            return Reply(200, b"[1, 2, 3]")
        if mode in ("oversized", "oversized-nolength"):
            return Reply(200, b"x" * self.oversized_bytes, no_length=mode == "oversized-nolength")
        rim = self.rims.get(rim_id)
        if rim is None:
            return Reply(404, b'{"message":"RIM_NOT_FOUND"}')
        doc: dict[str, object] = {
            "id": rim_id,
            "rim": base64.b64encode(rim).decode(),
            "sha256": hashlib.sha256(rim).hexdigest(),
            "request_id": "test",
            "rim_format": "SWID",
        }
        if mode == "wrong-id":
            doc["id"] = rim_id + "X"
        if mode == "wrong-sha":
            doc["sha256"] = hashlib.sha256(b"other").hexdigest()
        if mode == "no-sha":
            del doc["sha256"]
        if mode == "bad-base64":
            doc["rim"] = "!!!not base64!!!"
        return Reply(
            200,
            json.dumps(doc).encode(),
            {"Content-Type": "application/json"},
            delay=self.slow_delay if mode == "slow" else 0.0,
        )


# --- the OCSP responder ------------------------------------------------------------------


@dataclass(frozen=True)
class OcspBehaviour:
    """How the responder answers.

    Attributes:
        status: "good", "revoked" or "unknown".
        reason: the revocation reason (None: the response carries none).
        nonce: "echo", "omit" or "wrong".
        signer: "issuer", "delegated", "delegated-no-eku", "rogue" (a self-signed key),
            "stranger" (a delegated responder issued by an unrelated CA), or "forged"
            (names the issuer but signs with another key).
        this_update / next_update: offsets from :data:`NOW` (next_update None: omitted).
        answer_for: "same", or "other" (answers about another serial: CertID mismatch).
        extra_before: put an answer about another certificate first (status "good").
        http_status: the HTTP status to answer with.
        body: "ocsp", "garbage", or "unauthorized" (an unsuccessful responseStatus).
        include_chain: add the issuer's own issuers to the response's certificates.
        responder_id: "hash" (byKey) or "name" (byName).
    """

    status: str = "good"
    reason: x509.ReasonFlags | None = None
    nonce: str = "echo"
    signer: str = "issuer"
    this_update: dt.timedelta = dt.timedelta(hours=-1)
    next_update: dt.timedelta | None = dt.timedelta(days=1)
    answer_for: str = "same"
    extra_before: bool = False
    http_status: int = 200
    body: str = "ocsp"
    include_chain: bool = False
    responder_id: str = "hash"


class OcspResponder:
    """An OCSP responder for the test PKI; ``behaviour`` (or per-serial overrides) say how."""

    def __init__(self, pki: NetPki, now: dt.datetime = NOW) -> None:
        self.pki = pki
        self.now = now
        self.behaviour = OcspBehaviour()
        self.by_serial: dict[int, OcspBehaviour] = {}
        self._by_serial: dict[int, Node] = {n.cert.serial_number: n for n in pki.nodes()}
        self._delegates: dict[tuple[str, bool], Node] = {}
        self.requests: list[ocsp.OCSPRequest] = []

    def set(self, **changes: object) -> None:
        """Change the default behaviour (keyword arguments of :class:`OcspBehaviour`)."""
        self.behaviour = replace(self.behaviour, **changes)  # type: ignore[arg-type]

    def delegate(self, issuer: Node, *, eku: bool) -> Node:
        """A delegated responder certificate issued by ``issuer``."""
        key = (issuer.cn, eku)
        if key not in self._delegates:
            self._delegates[key] = make_node(
                f"OCSP Responder for {issuer.cn}" + ("" if eku else " (no EKU)"),
                issuer,
                ca=False,
                eku=[ExtendedKeyUsageOID.OCSP_SIGNING]
                if eku
                else [ExtendedKeyUsageOID.CLIENT_AUTH],
            )
        return self._delegates[key]

    def __call__(self, seen: Seen) -> Reply:
        try:
            request = ocsp.load_der_ocsp_request(seen.body)
        except ValueError:
            return Reply(400, b"bad request")
        self.requests.append(request)
        behaviour = self.by_serial.get(request.serial_number, self.behaviour)
        if behaviour.http_status != 200:
            return Reply(behaviour.http_status, b"error")
        if behaviour.body == "garbage":
            return Reply(200, b"\x00\x01 this is not DER", {"Content-Type": "text/plain"})
        if behaviour.body == "unauthorized":
            der = ocsp.OCSPResponseBuilder.build_unsuccessful(
                ocsp.OCSPResponseStatus.UNAUTHORIZED
            ).public_bytes(serialization.Encoding.DER)
            return Reply(200, der, {"Content-Type": "application/ocsp-response"})
        subject = self._by_serial.get(request.serial_number)
        if subject is None:
            return Reply(
                200, self._unknown_serial(request), {"Content-Type": "application/ocsp-response"}
            )
        der = self.respond(subject, request, behaviour)
        return Reply(200, der, {"Content-Type": "application/ocsp-response"})

    def _unknown_serial(self, request: ocsp.OCSPRequest) -> bytes:
        return ocsp.OCSPResponseBuilder.build_unsuccessful(
            ocsp.OCSPResponseStatus.UNAUTHORIZED
        ).public_bytes(serialization.Encoding.DER)

    def respond(self, subject: Node, request: ocsp.OCSPRequest, b: OcspBehaviour) -> bytes:
        """Build the DER answer about ``subject`` for ``request``."""
        issuer = self.pki.issuer_of(subject)
        signer, certs = self._signer(issuer, b)
        statuses = {
            "good": ocsp.OCSPCertStatus.GOOD,
            "revoked": ocsp.OCSPCertStatus.REVOKED,
            "unknown": ocsp.OCSPCertStatus.UNKNOWN,
        }
        serial = request.serial_number + (1 if b.answer_for == "other" else 0)

        def single(
            builder: ocsp.OCSPResponseBuilder, serial_number: int, status: str
        ) -> ocsp.OCSPResponseBuilder:
            is_revoked = status == "revoked"
            return builder.add_response_by_hash(
                issuer_name_hash=request.issuer_name_hash,
                issuer_key_hash=request.issuer_key_hash,
                serial_number=serial_number,
                algorithm=request.hash_algorithm,
                cert_status=statuses[status],
                this_update=self.now + b.this_update,
                next_update=self.now + b.next_update if b.next_update is not None else None,
                revocation_time=self.now - dt.timedelta(days=2) if is_revoked else None,
                revocation_reason=b.reason if is_revoked else None,
            )

        def finish(builder: ocsp.OCSPResponseBuilder) -> ocsp.OCSPResponseBuilder:
            encoding = (
                ocsp.OCSPResponderEncoding.NAME
                if b.responder_id == "name"
                else ocsp.OCSPResponderEncoding.HASH
            )
            builder = builder.responder_id(encoding, signer.cert)
            if certs:
                builder = builder.certificates(certs)
            nonce = self._nonce(request, b)
            if nonce is not None:
                builder = builder.add_extension(x509.OCSPNonce(nonce), critical=False)
            return builder

        status = b.status if b.status in statuses else "good"
        main = finish(single(ocsp.OCSPResponseBuilder(), serial, status)).sign(
            signer.key, hashes.SHA384()
        )
        der = main.public_bytes(serialization.Encoding.DER)
        if b.extra_before:
            other = finish(single(ocsp.OCSPResponseBuilder(), serial + 7, "good")).sign(
                signer.key, hashes.SHA384()
            )
            der = combine_single_responses(
                other.public_bytes(serialization.Encoding.DER), der, signer.key
            )
        if b.signer == "forged":
            der = resign(der, self.pki.rogue.key)
        return der

    def _signer(self, issuer: Node, b: OcspBehaviour) -> tuple[Node, list[x509.Certificate]]:
        chain: list[x509.Certificate] = []
        if b.include_chain:
            node = issuer
            while node.cert.issuer != node.cert.subject:
                node = self.pki.issuer_of(node)
                chain.append(node.cert)
        if b.signer == "delegated":
            d = self.delegate(issuer, eku=True)
            return d, [d.cert, *chain]
        if b.signer == "delegated-no-eku":
            d = self.delegate(issuer, eku=False)
            return d, [d.cert, *chain]
        if b.signer == "rogue":
            return self.pki.rogue, [self.pki.rogue.cert]
        if b.signer == "stranger":
            d = self.delegate(self.pki.stranger_ca, eku=True)
            return d, [d.cert, self.pki.stranger_ca.cert]
        return issuer, chain

    @staticmethod
    def _nonce(request: ocsp.OCSPRequest, b: OcspBehaviour) -> bytes | None:
        try:
            sent = request.extensions.get_extension_for_class(x509.OCSPNonce).value.nonce
        except x509.ExtensionNotFound:
            sent = None
        if b.nonce == "omit" or sent is None:
            return None
        if b.nonce == "wrong":
            return bytes(32)
        return sent


# --- minimal DER surgery (to put two SingleResponses in one signed response) ----------


def _tlv_at(data: bytes, pos: int) -> tuple[int, int, int]:
    """(tag, content start, end) of the TLV at ``pos``."""
    tag = data[pos]
    length = data[pos + 1]
    start = pos + 2
    if length & 0x80:
        count = length & 0x7F
        length = int.from_bytes(data[start : start + count], "big")
        start += count
    return tag, start, start + length


def _children(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        _, _, end = _tlv_at(data, pos)
        out.append(data[pos:end])
        pos = end
    return out


def _content(tlv: bytes) -> bytes:
    _, start, end = _tlv_at(tlv, 0)
    return tlv[start:end]


def _wrap(tag: int, content: bytes) -> bytes:
    n = len(content)
    if n < 0x80:
        return bytes([tag, n]) + content
    size = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(size)]) + size + content


def _basic(der: bytes) -> list[bytes]:
    """The children of the BasicOCSPResponse inside an OCSPResponse."""
    status, response_bytes = _children(_content(der))
    del status
    oid, octets = _children(_content(_content(response_bytes)))
    del oid
    return _children(_content(_content(octets)))


def combine_single_responses(first: bytes, second: bytes, key: ec.EllipticCurvePrivateKey) -> bytes:
    """``second`` with ``first``'s SingleResponse put before its own, re-signed with ``key``."""
    tbs1, tbs2 = _basic(first)[0], _basic(second)[0]
    singles1 = [c for c in _children(_content(tbs1)) if c[0] == 0x30][0]
    parts = _children(_content(tbs2))
    merged = []
    for part in parts:
        if part[0] == 0x30:
            merged.append(_wrap(0x30, _content(singles1) + _content(part)))
        else:
            merged.append(part)
    return _signed(_wrap(0x30, b"".join(merged)), _basic(second), key)


def resign(der: bytes, key: ec.EllipticCurvePrivateKey) -> bytes:
    """``der`` with its signature replaced by one made with ``key`` (a forgery)."""
    parts = _basic(der)
    return _signed(parts[0], parts, key)


def _signed(tbs: bytes, basic_parts: list[bytes], key: ec.EllipticCurvePrivateKey) -> bytes:
    signature = key.sign(tbs, ec.ECDSA(hashes.SHA384()))
    basic = _wrap(
        0x30,
        tbs + basic_parts[1] + _wrap(0x03, b"\x00" + signature) + b"".join(basic_parts[3:]),
    )
    oid = bytes.fromhex("06092b0601050507300101")  # id-pkix-ocsp-basic
    response_bytes = _wrap(0xA0, _wrap(0x30, oid + _wrap(0x04, basic)))
    return _wrap(0x30, bytes.fromhex("0a0100") + response_bytes)
