"""What the two services' command lines share (``holder serve``, ``collateral serve``): the
address to listen on, the proxies to trust, and whether an address is this machine's own."""

from __future__ import annotations

import ipaddress

from gpucc.core.errors import UsageError

__all__ = ["is_loopback", "parse_listen", "parse_proxy"]


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) as (host, port); HOST an IP address or localhost.

    Raises:
        UsageError: anything else.
    """
    host, sep, port_text = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) < 65536:
        raise UsageError(f"--listen {text!r} must be HOST:PORT")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if host != "localhost":
            raise UsageError(f"--listen {text!r}: HOST must be an IP address") from None
    return host, int(port_text)


def parse_proxy(text: str) -> str:
    """A trusted proxy's address, normalised.

    Raises:
        UsageError: not an IP address.
    """
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise UsageError(f"--trusted-proxy {text!r} must be an IP address") from None


def is_loopback(host: str) -> bool:
    """Whether ``host`` (as :func:`parse_listen` returns it) is this machine's own."""
    return host == "localhost" or ipaddress.ip_address(host).is_loopback
