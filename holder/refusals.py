"""How the holder service answers a request it does not serve: one name per refusal.

An error raised while a request is answered takes its answer from the library's outcome
table (:mod:`gpucc.core.outcomes`), the table the command line's exit statuses come from,
extended here by the holder's own families: its state unavailable (503, "state-unavailable":
nothing is answered without its record), a device's report accepted before (409, "replayed")
and the protocol's refusal of an offer (403, "not-trusted"). Each row keeps the exit
outcome of its family, so the command line and the service never tell two stories about one
error. The refusals that no error causes (a client
over its rate, a body too large or too slow, a used challenge, ...) are named below.

Every refusal's body is ``{"error": name, "message": one line}`` (and, for an offer refused
by the release policies, ``reasons``).
"""

from __future__ import annotations

from gpucc.core.outcomes import (
    ENVIRONMENT,
    NOT_TRUSTED,
    FamilyOutcome,
    HttpAnswer,
    OutcomeTable,
)
from gpucc.keyrelease.replay import DeviceReportReplayError
from gpucc.staging.errors import ProtocolError

from .state import StateUnavailableError

__all__ = [
    "BAD_OFFER",
    "BAD_RECEIPT",
    "BODY_TIMEOUT",
    "CHALLENGE_REFUSED",
    "HOLDER_OUTCOMES",
    "INTERNAL",
    "NOT_KEPT",
    "NOT_STORED",
    "RATE_LIMITED",
    "TOO_LARGE",
    "UNKNOWN_SESSION",
    "http_error_for_status",
]

#: The library's table with the holder's families first.
HOLDER_OUTCOMES = OutcomeTable().extended(
    FamilyOutcome(StateUnavailableError, ENVIRONMENT, HttpAnswer(503, "state-unavailable")),
    # a device's report over a nonce accepted before (or twice in one offer)
    FamilyOutcome(DeviceReportReplayError, NOT_TRUSTED, HttpAnswer(409, "replayed")),
    FamilyOutcome(ProtocolError, NOT_TRUSTED, HttpAnswer(403, "not-trusted")),
)

RATE_LIMITED = HttpAnswer(429, "rate-limited")
BODY_TIMEOUT = HttpAnswer(408, "timeout")
TOO_LARGE = HttpAnswer(413, "too-large")
#: an offer that cannot be read (whatever the error: nothing of it was decided yet)
BAD_OFFER = HttpAnswer(400, "malformed")
#: a challenge that is unknown, used or expired
CHALLENGE_REFUSED = HttpAnswer(409, "challenge-refused")
#: a receipt to a holder that keeps none
NOT_KEPT = HttpAnswer(404, "not-kept")
#: a receipt that cannot be read, or whose signature or pinned key does not check
BAD_RECEIPT = HttpAnswer(400, "malformed")
#: a receipt for no session this holder (or another process sharing its state) answered
UNKNOWN_SESSION = HttpAnswer(409, "unknown-session")
#: a receipt that could not be kept
NOT_STORED = HttpAnswer(503, "not-stored")
INTERNAL = HOLDER_OUTCOMES.http_for(Exception())

_BY_STATUS = {404: "not-found", 405: "method-not-allowed"}


def http_error_for_status(status: int) -> HttpAnswer:
    """The answer to a request the router refused with ``status`` (no such path or method)."""
    return HttpAnswer(status, _BY_STATUS.get(status, "refused"))
