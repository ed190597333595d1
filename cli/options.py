"""Option parsing shared by commands: times, nonces, output formats."""

from __future__ import annotations

import datetime as dt
import enum

from gpuattest.errors import UsageError


class OutputFormat(enum.StrEnum):
    """--format values."""

    TEXT = "text"
    JSON = "json"


def parse_time(text: str | None) -> dt.datetime:
    """``--at``: ISO 8601 (``Z`` or offset; naive means UTC) or Unix seconds; None is now.

    Raises:
        UsageError: unparseable.
    """
    if text is None or text == "":
        return dt.datetime.now(dt.UTC)
    value = text.strip()
    if value.isdigit():
        return dt.datetime.fromtimestamp(int(value), dt.UTC)
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"--at {text!r} is not an ISO 8601 time or Unix seconds") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.astimezone(dt.UTC)
