"""The one outcome table: error family -> kind -> exit status -> HTTP status.

Every front end meets the same errors and tells the same story about them. The command
line exits with a row's ``code`` and names its ``kind`` (``gpucc.cli.exitcodes`` adds
hints that name its options); the holder service answers a request it refuses for an error
with the row's HTTP status and error name (``gpucc.holder.refusals``). README's exit-code
table is checked against :data:`TABLE`.

A layer whose errors need an answer of their own (the holder's unavailable state, the
protocol's refusals) extends the table with rows for its more specific families
(:meth:`OutcomeTable.extended`); an error takes the first row whose family it belongs to,
so the exit status of a more specific family never changes unless its row says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from . import errors

__all__ = [
    "AUTHENTICATION",
    "BROKEN_PIPE",
    "COLLATERAL",
    "CONNECTION",
    "ENVIRONMENT",
    "FAMILIES",
    "FILE_ACCESS",
    "INTERNAL",
    "INTERRUPTED",
    "MALFORMED",
    "NOT_TRUSTED",
    "OK",
    "TABLE",
    "USAGE",
    "WRONG_KEY",
    "Failure",
    "FamilyOutcome",
    "HttpAnswer",
    "Outcome",
    "OutcomeTable",
]


# The table's rows are named tuples, not frozen dataclasses: every command builds them at
# start-up, and a named tuple is made about six times faster (docs/BENCHMARKS.md, start-up).
class Outcome(NamedTuple):
    """One row of the exit-status table: the status, its machine-readable kind, its meaning."""

    code: int
    kind: str
    meaning: str


class HttpAnswer(NamedTuple):
    """How a service answers a refused request: the HTTP status and the error's name in the
    body (``{"error": error, "message": ...}``)."""

    status: int
    error: str

    @property
    def decided(self) -> bool:
        """A refusal the service decided (403): not a request it could not read (400) or a
        question it could not decide now (503)."""
        return self.status == 403


class FamilyOutcome(NamedTuple):
    """What an error of ``family`` comes to: its exit outcome and its HTTP answer."""

    family: type[BaseException]
    outcome: Outcome
    http: HttpAnswer


OK = Outcome(0, "ok", "trusted (attest), or the command succeeded")
NOT_TRUSTED = Outcome(1, "not-trusted", "evaluated and not trusted: a check or the policy failed")
USAGE = Outcome(2, "usage", "usage error: unknown or conflicting options, bad values")
COLLATERAL = Outcome(
    3,
    "collateral-unavailable",
    "could not decide: collateral (a RIM, an OCSP answer, a service) is missing or "
    "unreachable, or a dataset's store is unreachable or too slow (retries and deadline spent)",
)
CONNECTION = Outcome(
    3,
    "connection-failed",
    "could not decide: a service (a holder) could not be reached: connection refused, name "
    "not known, TLS failed; the message names the cause",
)
MALFORMED = Outcome(
    4,
    "malformed-input",
    "malformed input: evidence, certificate, RIM, policy, bundle, message, sealed dataset or "
    "key, or a store's answer outside the range protocol",
)
ENVIRONMENT = Outcome(
    5,
    "environment",
    "environment: no GPU, driver, NVML or CuPy; CC mode off; an extra not installed",
)
AUTHENTICATION = Outcome(
    6,
    "authentication-failed",
    "data authentication failed: a sealed chunk, header or wrap record was altered, "
    "or chunks are missing, or a stored object changed while it was read",
)
WRONG_KEY = Outcome(
    7, "wrong-key", "wrong key: the key given is not the one the data was sealed for"
)
FILE_ACCESS = Outcome(
    8,
    "file-access",
    "a file or stored object cannot be read or written (missing, exists, special, permissions)",
)
INTERNAL = Outcome(70, "internal", "internal error (a bug), reported in one line; -v shows more")
INTERRUPTED = Outcome(130, "interrupted", "interrupted (SIGINT); 143 for SIGTERM, 129 for SIGHUP")
BROKEN_PIPE = Outcome(
    141, "broken-pipe", "the reader of stdout went away (SIGPIPE); nothing printed"
)

#: Every exit status the command line uses, in README's order.
TABLE: tuple[Outcome, ...] = (
    OK,
    NOT_TRUSTED,
    USAGE,
    COLLATERAL,
    CONNECTION,
    MALFORMED,
    ENVIRONMENT,
    AUTHENTICATION,
    WRONG_KEY,
    FILE_ACCESS,
    INTERNAL,
    INTERRUPTED,
    BROKEN_PIPE,
)


@dataclass(frozen=True)
class Failure:
    """A command that failed: its outcome, one line saying why, a hint, and (for a refused
    release) the reasons; the ``gpucc.error/v1`` document."""

    SCHEMA: ClassVar[str] = "gpucc.error/v1"

    outcome: Outcome
    message: str
    hint: str = ""
    reasons: tuple[dict[str, str], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        error: dict[str, Any] = {
            "code": self.outcome.code,
            "kind": self.outcome.kind,
            "message": self.message,
            "hint": self.hint,
        }
        if self.reasons:
            error["reasons"] = list(self.reasons)
        return {"schema": self.SCHEMA, "error": error}


_REFUSED = HttpAnswer(403, "refused")

#: The families, most specific first: an error takes the first row it belongs to. A refusal
#: for a bad request is 400 and one for what could not be decided now is 503 (the client may
#: try again); every other error is the service's decision, 403.
FAMILIES: tuple[FamilyOutcome, ...] = (
    FamilyOutcome(errors.WrongKeyError, WRONG_KEY, _REFUSED),
    FamilyOutcome(errors.FileAccessError, FILE_ACCESS, _REFUSED),
    FamilyOutcome(errors.IntegrityError, AUTHENTICATION, _REFUSED),
    FamilyOutcome(errors.UsageError, USAGE, _REFUSED),
    FamilyOutcome(
        errors.ConnectionFailedError, CONNECTION, HttpAnswer(503, "collateral-unavailable")
    ),
    FamilyOutcome(
        errors.CollateralUnavailableError, COLLATERAL, HttpAnswer(503, "collateral-unavailable")
    ),
    FamilyOutcome(errors.MalformedInputError, MALFORMED, HttpAnswer(400, "malformed")),
    FamilyOutcome(errors.EnvironmentProblemError, ENVIRONMENT, _REFUSED),
    FamilyOutcome(errors.NotTrustedError, NOT_TRUSTED, _REFUSED),
    FamilyOutcome(errors.GpuccError, NOT_TRUSTED, _REFUSED),
)

#: Anything that is not a gpucc error: a bug.
_OTHER = FamilyOutcome(BaseException, INTERNAL, HttpAnswer(500, "internal"))


@dataclass(frozen=True)
class OutcomeTable:
    """Rows of :class:`FamilyOutcome`, most specific family first."""

    rows: tuple[FamilyOutcome, ...] = FAMILIES

    def row_for(self, exc: BaseException) -> FamilyOutcome:
        """The first row whose family ``exc`` belongs to (the internal row for a bug)."""
        for row in self.rows:
            if isinstance(exc, row.family):
                return row
        return _OTHER

    def outcome_for(self, exc: BaseException) -> Outcome:
        """The exit outcome of ``exc``."""
        return self.row_for(exc).outcome

    def http_for(self, exc: BaseException) -> HttpAnswer:
        """The HTTP answer to a request refused for ``exc``."""
        return self.row_for(exc).http

    def extended(self, *rows: FamilyOutcome) -> OutcomeTable:
        """This table with ``rows`` (more specific families) consulted first."""
        return OutcomeTable((*rows, *self.rows))
