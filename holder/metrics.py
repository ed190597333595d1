"""The holder's Prometheus metrics (``holder serve --metrics``; the ``metrics`` extra).

``GET /metrics`` on the service's listener answers the text exposition format with:

* ``gpucc_holder_requests_total{path,status}`` and ``gpucc_holder_request_seconds{path}``
  (a latency histogram), for the service's own paths (others count as ``other``);
* ``gpucc_holder_releases_total`` and ``gpucc_holder_refusals_total{reason}``: the key-release
  decisions on ``/v1/offer`` (reason: the refusal's ``error`` kind, e.g. ``not-trusted``,
  ``challenge-refused``, ``rate-limited``);
* ``gpucc_holder_datasets_withheld_total{policy,check}``: datasets an offer did not get, in
  a partial release or a refusal, once per unmet rule (``check``: the failed check's title,
  ``requester identity``, or ``offer``) and the release policy that set it;
* ``gpucc_holder_connections_open``, ``gpucc_holder_tls_handshakes`` and
  ``gpucc_holder_connections_dropped_total``, read from the server's accept loop.

A proxy in front should not expose ``/metrics`` to the public (deploy/haproxy.cfg denies it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gpucc.core.errors import EnvironmentProblemError

__all__ = ["Metrics"]

_PATHS = {"/v1/challenge", "/v1/offer", "/v1/receipt", "/healthz", "/metrics"}


class Metrics:
    """A registry of the holder's metrics and the ASGI middleware that fills it."""

    def __init__(self) -> None:
        try:
            import prometheus_client as prom
        except ImportError:
            raise EnvironmentProblemError(
                "--metrics needs prometheus-client: pip install 'gpucc[metrics]'"
            ) from None
        self._prom = prom
        self.registry = prom.CollectorRegistry()
        r = self.registry
        self.requests = prom.Counter(
            "gpucc_holder_requests", "Requests answered", ["path", "status"], registry=r
        )
        self.latency = prom.Histogram(
            "gpucc_holder_request_seconds",
            "Time to answer a request",
            ["path"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.releases = prom.Counter(
            "gpucc_holder_releases", "Offers answered with dataset keys", registry=r
        )
        self.refusals = prom.Counter(
            "gpucc_holder_refusals", "Offers refused, by reason", ["reason"], registry=r
        )
        self.withheld = prom.Counter(
            "gpucc_holder_datasets_withheld",
            "Datasets withheld from an offer, once per unmet rule, by release policy and rule",
            ["policy", "check"],
            registry=r,
        )
        self._server: dict[str, Callable[[], float]] = {}
        for name, doc in (
            ("connections_open", "Connections being served"),
            ("tls_handshakes", "TLS handshakes in progress"),
        ):
            gauge = prom.Gauge(f"gpucc_holder_{name}", doc, registry=r)
            gauge.set_function(self._reader(name))
        dropped = prom.Counter(
            "gpucc_holder_connections_dropped",
            "Connections over a cap closed without an answer",
            registry=r,
        )
        self._dropped = dropped
        self._dropped_seen = 0

    def _reader(self, name: str) -> Callable[[], float]:
        def read() -> float:
            return self._server.get(name, lambda: 0.0)()

        return read

    def watch(self, acceptor: Any) -> None:
        """Read the server's connection counts from its accept loop."""
        self._server["connections_open"] = lambda: float(acceptor.open)
        self._server["tls_handshakes"] = lambda: float(acceptor.handshaking)
        self._server["dropped"] = lambda: float(acceptor.dropped)

    def wrap(self, app: Any) -> Any:
        """``app`` with ``GET /metrics`` and every request counted."""

        async def middleware(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            path = scope["path"] if scope["path"] in _PATHS else "other"
            started = time.perf_counter()
            status = [500]

            async def sending(message: dict[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    status[0] = message["status"]
                await send(message)

            if path == "/metrics" and scope["method"] in ("GET", "HEAD"):
                await self._expose(scope, sending)
            else:
                await app(scope, receive, sending)
            self.requests.labels(path, str(status[0])).inc()
            self.latency.labels(path).observe(time.perf_counter() - started)
            if path == "/v1/offer":
                outcome = scope.get("state", {}).get("outcome", "")
                if status[0] == 200:
                    self.releases.inc()
                else:
                    self.refusals.labels(outcome or f"http-{status[0]}").inc()
                for rule in scope.get("state", {}).get("withheld") or ():
                    policy, check = rule.get("policy") or "-", rule.get("check") or "-"
                    self.withheld.labels(str(policy), str(check)).inc()

        return middleware

    async def _expose(self, scope: dict[str, Any], send: Any) -> None:
        dropped = self._server.get("dropped", lambda: 0.0)()
        if dropped > self._dropped_seen:
            self._dropped.inc(dropped - self._dropped_seen)
            self._dropped_seen = int(dropped)
        body = self._prom.generate_latest(self.registry)
        scope.setdefault("state", {})["outcome"] = "metrics"
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", self._prom.CONTENT_TYPE_LATEST.encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})
