"""``gpucc token verify``: check a signed attestation result (docs/EAT.md).

Exit codes: 0 valid and trusted; 1 a check failed, a valid result that says the GPUs
are not trusted, or one that vouches for no GPU; 2 usage (neither ``--nonce`` nor
``--no-nonce``); 4 not a token, or a malformed key file; 8 a file problem.

Freshness is never assumed: ``--nonce`` checks the result answers the nonce the caller
chose; without it the caller must say ``--no-nonce``, and the result then reads
"freshness not checked" (a replayed result would pass).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .command import App
from .options import AtOption, FormatOption, OutputFormat
from .output import emit, out

token_app = App(
    group="token",
    help="Check signed attestation results (EAT, ES384).",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


@token_app.command("verify")
def verify(
    result: Annotated[
        Path,
        typer.Argument(
            metavar="RESULT",
            exists=True,
            dir_okay=False,
            help="The result (detached EAT JSON or JWT).",
        ),
    ],
    key: Annotated[
        Path,
        typer.Option(
            "--signer-pub",
            exists=True,
            dir_okay=False,
            help="The signer's P-384 public key or certificate (PEM).",
        ),
    ],
    nonce: Annotated[
        str | None,
        typer.Option("--nonce", help="Require this nonce (64 hex characters) in eat_nonce."),
    ] = None,
    no_nonce: Annotated[
        bool,
        typer.Option(
            "--no-nonce",
            help="Accept a result without checking its nonce: freshness not checked (a "
            "replayed result passes); said in the output.",
        ),
    ] = False,
    issuer: Annotated[
        str, typer.Option("--issuer", help="The issuer every token must name.")
    ] = "gpucc",
    output_format: FormatOption = OutputFormat.TEXT,
    at: AtOption = None,
) -> None:
    """Verify a signed result: signatures, issuer, times, nonce and per-GPU digests."""
    from gpucc.core.errors import (
        NotTrustedError,
        UsageError,
    )
    from gpucc.core.files import read_capped
    from gpucc.gpuattest.eat import MAX_EAT_BYTES, load_public_key_pem, verify_eat
    from gpucc.gpuattest.jws import MalformedTokenError

    from .options import parse_nonce, parse_time

    now = parse_time(at)
    if (nonce is None) == (not no_nonce):
        raise UsageError(
            "give --nonce HEX (the nonce you chose for the attestation), or --no-nonce to "
            "accept a result whose freshness is not checked"
            if nonce is None
            else "--nonce and --no-nonce exclude each other"
        )
    expected: bytes | None = None
    if nonce is not None:
        expected = parse_nonce(nonce)
    as_json = output_format is OutputFormat.JSON
    public = load_public_key_pem(key)
    data = read_capped(result, MAX_EAT_BYTES)
    if len(data) > MAX_EAT_BYTES:
        raise MalformedTokenError(f"{result} is larger than {MAX_EAT_BYTES} bytes")
    verified = verify_eat(data, public, nonce=expected, now=now, issuer=issuer)
    trusted = verified.overall_result
    if as_json:
        emit(verified.verify_document(nonce_checked=expected is not None))
    else:
        n = len(verified.devices)
        from .render import VERDICT_TOKENS

        state = VERDICT_TOKENS["trusted" if trusted else "not-trusted"]
        fresh = (
            f"nonce {verified.overall.get('eat_nonce')} checked"
            if expected is not None
            else f"FRESHNESS NOT CHECKED (--no-nonce; nonce {verified.overall.get('eat_nonce')} "
            "not compared: a replayed result passes)"
        )
        out(
            f"valid signed result ({n} GPU token(s), key {verified.kid or 'without kid'}): "
            f"{state}, {fresh}"
        )
    if not verified.devices:
        raise NotTrustedError("the signed result holds no GPU token: it vouches for no GPU")
    if not trusted:
        raise NotTrustedError("the signed result says the GPUs are not trusted")


@token_app.command("verify-ear")
def verify_ear_command(
    ear: Annotated[
        Path,
        typer.Argument(metavar="EAR", exists=True, dir_okay=False, help="The EAR (a JWT)."),
    ],
    key: Annotated[
        Path,
        typer.Option(
            "--signer-pub",
            exists=True,
            dir_okay=False,
            help="The signer's P-384 public key or certificate (PEM).",
        ),
    ],
    nonce: Annotated[
        str | None,
        typer.Option("--nonce", help="Require this nonce (64 hex characters) in eat_nonce."),
    ] = None,
    no_nonce: Annotated[
        bool,
        typer.Option(
            "--no-nonce",
            help="Accept an EAR without checking its nonce: freshness not checked (a "
            "replayed result passes); said in the output.",
        ),
    ] = False,
    issuer: Annotated[str, typer.Option("--issuer", help="The issuer the EAR must name.")] = (
        "gpucc"
    ),
    output_format: FormatOption = OutputFormat.TEXT,
    at: AtOption = None,
) -> None:
    """Verify an EAR: signature, profile, issuer, times, nonce and every part's status.

    Exit 0 only when the EAR and every part are affirming; 1 when a check fails or a part
    is not affirming.
    """
    from gpucc.core.errors import NotTrustedError, UsageError
    from gpucc.core.files import read_capped
    from gpucc.gpuattest.ear import MAX_EAR_BYTES, verify_ear
    from gpucc.gpuattest.eat import load_public_key_pem
    from gpucc.gpuattest.jws import MalformedTokenError

    from .options import parse_nonce, parse_time

    now = parse_time(at)
    if (nonce is None) == (not no_nonce):
        raise UsageError(
            "give --nonce HEX (the nonce you chose for the attestation), or --no-nonce to "
            "accept an EAR whose freshness is not checked"
            if nonce is None
            else "--nonce and --no-nonce exclude each other"
        )
    expected = parse_nonce(nonce) if nonce is not None else None
    public = load_public_key_pem(key)
    data = read_capped(ear, MAX_EAR_BYTES)
    if len(data) > MAX_EAR_BYTES:
        raise MalformedTokenError(f"{ear} is larger than {MAX_EAR_BYTES} bytes")
    verified = verify_ear(data, public, now=now, nonce=expected, issuer=issuer)
    if output_format is OutputFormat.JSON:
        emit(verified.verify_document(nonce_checked=expected is not None))
    else:
        parts = ", ".join(f"{k} {v}" for k, v in verified.submods.items())
        fresh = "nonce checked" if expected is not None else "FRESHNESS NOT CHECKED (--no-nonce)"
        out(
            f"valid EAR (key {verified.kid or 'without kid'}): {verified.status} ({parts}), {fresh}"
        )
    if not verified.affirming:
        raise NotTrustedError(f"the EAR is {verified.status}, not affirming")
