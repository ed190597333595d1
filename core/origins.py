"""Origins (scheme, host, port) and the rule for where a request may be redirected.

Some answers are trusted for where they come from: without a pinned root, NRAS's key set
is trusted because it came over TLS from the configured NRAS host. A redirect must not
move that anchor silently, so such a request carries an :class:`OriginGuard`: redirects
that stay on the request's own origin are followed (within the HTTP layer's limit), a
redirect to any other scheme, host or port is refused with :class:`RedirectRefusedError`
(exit 3) before it is followed, unless the caller named that origin. The guard records
where the answer finally came from, so the result can say which origin anchored it.

An origin is written ``scheme://host`` or ``scheme://host:port``: lower case, IPv6 hosts
in brackets, the port left out when it is the scheme's default (80, 443).
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from .errors import NetworkError, UsageError

__all__ = ["OriginGuard", "RedirectRefusedError", "origin_of", "parse_origin"]

_DEFAULT_PORTS = {"http": 80, "https": 443}


class RedirectRefusedError(NetworkError):
    """A redirect led to an origin the request may not leave for (collateral unavailable)."""

    hint = "if that origin is genuine, name it (gpucc attest --nras-allow-origin) to follow it"


def origin_of(url: str) -> str:
    """The origin of an absolute http(s) URL.

    Raises:
        ValueError: not an absolute http(s) URL with a host, or a bad port.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    host = parts.hostname or ""
    if scheme not in _DEFAULT_PORTS or not host:
        raise ValueError("not an absolute http(s) URL")
    port = parts.port  # ValueError when out of range or not a number
    shown = f"[{host}]" if ":" in host else host
    if port is None or port == _DEFAULT_PORTS[scheme]:
        return f"{scheme}://{shown}"
    return f"{scheme}://{shown}:{port}"


def parse_origin(text: str) -> str:
    """An origin the user named (``https://host[:port]``), normalised.

    Raises:
        UsageError: anything else (a path, query, fragment or credentials included).
    """
    value = text.strip()
    try:
        parts = urlsplit(value)
        origin = origin_of(value)
    except ValueError:
        raise UsageError(
            f"{value!r} is not an origin (https://host or https://host:port)"
        ) from None
    if parts.path not in ("", "/") or parts.query or parts.fragment or "@" in parts.netloc:
        raise UsageError(
            f"{value!r} is not an origin: give only scheme, host and port (e.g. {origin})"
        )
    return origin


class OriginGuard:
    """Where one request may be redirected, and where it ended.

    Args:
        url: the URL asked for; its origin is always allowed.
        allowed: further origins (already normalised, see :func:`parse_origin`).

    Raises:
        NetworkError: ``url`` is not an absolute http(s) URL (as the HTTP layer says).
    """

    def __init__(self, url: str, allowed: Iterable[str] = ()) -> None:
        try:
            self.origin = origin_of(url)
        except ValueError:
            raise NetworkError(
                "invalid URL: only http and https URLs with a host and a valid port are supported"
            ) from None
        self.allowed = frozenset({self.origin, *allowed})
        self.url = url

    def __repr__(self) -> str:
        return f"OriginGuard({self.origin!r}, allowed={sorted(self.allowed)!r})"

    @property
    def final_origin(self) -> str:
        """The origin of the last URL followed (the one that answered)."""
        return origin_of(self.url)

    def follow(self, target: str, shown: str) -> None:
        """Allow the redirect to ``target`` or refuse it.

        Args:
            target: the absolute URL the service redirected to.
            shown: the original URL as it may appear in messages.

        Raises:
            RedirectRefusedError: ``target``'s origin is not allowed.
        """
        try:
            origin = origin_of(target)
        except ValueError:
            raise RedirectRefusedError(f"{shown} redirected to an unusable URL") from None
        if origin not in self.allowed:
            raise RedirectRefusedError(
                f"{shown} redirected to another origin, {origin}; refused "
                f"(only {', '.join(sorted(self.allowed))} may answer)"
            )
        self.url = target
