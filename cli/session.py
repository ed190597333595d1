"""``gpucc session``: release dataset keys to an attested GPU session (docs/PROTOCOL.md).

Two machines::

    holder$ gpucc session challenge > challenge.hex
    host$   gpucc session offer --challenge $(cat challenge.hex) -o offer.json --host-key host.key
    holder$ gpucc session answer offer.json --challenge $(cat challenge.hex) \\
                --dataset train.gcc --data-key train.key -o answer.json
    host$   gpucc stage train.gcc --session answer.json --host-key host.key

One machine: ``gpucc session local train.gcc --data-key train.key -o answer.json
--host-key host.key`` runs all three steps against the local GPU.

Without a GPU, ``--simulate DIR`` on ``offer``, ``answer`` and ``local`` runs the same
protocol against a simulated GPU whose test trust anchors live in DIR: for trying the
workflow only; it attests nothing real and must never be trusted in production.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpucc.core.errors import NotTrustedError, UsageError
from gpucc.core.files import refuse_existing

from .command import App
from .invocation import current
from .options import (
    AtOption,
    CollateralOption,
    FormatOption,
    OfflineOption,
    OutputFormat,
    PolicyOption,
    RimDirOption,
    parse_time,
)
from .output import emit, note, out, warn
from .render import counted
from .safety_options import ForceOption, check_output, force_hint
from .session_cvm import CvmCollateralOption, GpuOnlyOption

if TYPE_CHECKING:
    from gpucc.assembly import PlatformResult, PlatformVerifier, Settings
    from gpucc.assembly.record import TrustRecord
    from gpucc.keyrelease.protocol import DatasetKey, Offer

__all__ = ["session_app"]

session_app = App(
    group="session",
    help="Release dataset keys only to a GPU session whose attestation verified.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)

_SIMULATION_WARNING = (
    "SIMULATED GPU: for trying the protocol only; it attests nothing real and must never be "
    "trusted in production"
)
#: How many refusal reasons the one-line error shows, and how much of each (all of them,
#: whole, in JSON and with -v).
_SHOWN_REASONS = 1
_SHOWN_CHARS = 160

ChallengeOption = Annotated[
    str,
    typer.Option(
        "--challenge",
        envvar="GPUCC_SESSION_CHALLENGE",
        help="The data holder's challenge, 64 hex characters.",
    ),
]
SimulateOption = Annotated[
    Path | None,
    typer.Option(
        "--simulate",
        file_okay=False,
        metavar="DIR",
        rich_help_panel="Simulation (no GPU; never for production)",
        help="Try the protocol without a GPU: a SIMULATED GPU whose test trust anchors and "
        "RIMs are written to DIR (offer, local) and read from DIR (answer). It attests "
        "nothing real; never trust it in production.",
    ),
]


def _challenge(text: str) -> bytes:
    cleaned = text.strip().lower()
    try:
        value = bytes.fromhex(cleaned)
    except ValueError:
        value = b""
    if len(value) != 32:
        raise UsageError("--challenge must be 64 hex characters (32 bytes)")
    return value


def _write(path: Path, data: bytes, *, force: bool) -> None:
    from gpucc.core.files import write_atomic

    with force_hint():
        write_atomic(path, data, force=force)


def _fresh_host_key(path: Path) -> None:
    """Refuse a host key file that exists (exit 8): each session's key is new."""
    from gpucc.core.files import OutputExistsError

    if os.path.lexists(path):
        raise OutputExistsError(
            f"{path} exists; every session needs a fresh host key file", replaceable=False
        )


def _state_dir(given: Path | None) -> Path:
    if given is not None:
        return given
    import platformdirs

    return Path(platformdirs.user_state_dir("gpucc"))


# --- settings for the platform verifier ----------------------------------------------


def _warn_if_simulated(simulate: Path | None) -> None:
    if simulate is not None:
        warn(_SIMULATION_WARNING)


def _read_collateral(path: Path | None) -> bytes | None:
    from gpucc.core.files import read_capped
    from gpucc.gpuattest.cvm.tdx import MAX_COLLATERAL_BYTES

    if path is None:
        return None
    return read_capped(path, MAX_COLLATERAL_BYTES, what="CVM collateral")


def _settings(
    *,
    simulate: Path | None,
    rim_dir: Path | None = None,
    policy: Path | None = None,
    collateral: Path | None = None,
    offline: bool = False,
    at: str | None = None,
    cvm_collateral: Path | None = None,
) -> Settings:
    """The options as the platform verifier's settings (the simulation's default policy
    when simulating without a policy file)."""
    from gpucc.assembly import Settings, select_policy
    from gpucc.gpuattest.netconfig import NetworkSettings

    return Settings(
        policy=select_policy(policy, simulation=simulate is not None),
        network=NetworkSettings(bundle=collateral, offline=offline),
        rim_dir=rim_dir,
        simulation=simulate,
        cvm_collateral=_read_collateral(cvm_collateral),
        at=parse_time(at) if at else None,
        at_origin="--at or GPUCC_AT" if at else "",
    )


def _announce_relaxations(verifier: PlatformVerifier) -> None:
    if verifier.allow_gpu_only:
        note("policy relaxation cvm.allow_gpu_only: GPU-only (version 1) offers are accepted")


class RefusedError(NotTrustedError):
    """The offer's attestation was refused; ``reasons`` lists every failed check as data
    (part, check, title, decision, detail): JSON's ``error.reasons``, and ``-v``."""

    def __init__(self, message: str, reasons: tuple[dict[str, str], ...]) -> None:
        super().__init__(message)
        self.reasons = reasons


def _refused(exc: NotTrustedError, verdicts: list[PlatformResult]) -> NotTrustedError:
    """The refusal with every failed check as data; for the GPUs, a short one-line message
    (count and first reasons)."""
    refused = [v for v in verdicts if not v.trusted]
    if not refused:
        return exc
    last = refused[-1]
    checks = tuple(last.failed_checks())
    if current().verbosity >= 1 and not current().json:
        for c in checks:
            note(f"  refused: {c['part']}: {c['title']}: {c['detail']}")
    if last.gpu is None:  # the CVM's evidence: the protocol's own message says it
        return RefusedError(str(exc), checks)
    reasons = tuple(last.reasons) or ("no reason given",)
    joined = "; ".join(last.reasons) or "no reason given"
    diagnosis = str(exc).partition(joined)[2]  # what the protocol adds (nonce diagnosis)
    shown = "; ".join(
        r if len(r) <= _SHOWN_CHARS else r[: _SHOWN_CHARS - 1] + "…"
        for r in reasons[:_SHOWN_REASONS]
    )
    more = len(reasons) - _SHOWN_REASONS
    tail = f"; and {more} more (all with -v or --format json)" if more > 0 else ""
    count = f"{len(reasons)} reason{'s' if len(reasons) != 1 else ''}"
    return RefusedError(
        f"the offer's attestation is not trusted ({count}): {shown}{tail}{diagnosis}", checks
    )


def _release_record(verdicts: list[PlatformResult], *, gpu_only: bool) -> TrustRecord:
    """What this release trusted; shown on stderr (even with -q unless strict)."""
    from gpucc.assembly.record import release_record

    record = release_record([v.record for v in verdicts], gpu_only=gpu_only)
    (note if record.strict else warn)(f"key release trusted with: {record.summary()}")
    return record


def _audit(
    state: object,
    offer: Offer,
    datasets: list[Path],
    *,
    verdicts: list[PlatformResult] | None = None,
    refusal: Exception | None = None,
    trusted_with: dict[str, Any] | None = None,
    transcript: bytes | None = None,
) -> None:
    """The decision's audit record in a holder state (``--state``), as the service keeps one
    (client ``session answer``), then one housekeeping batch; what cannot be done is a
    warning."""
    from gpucc.core.errors import GpuccError
    from gpucc.holder.audit import audit_document
    from gpucc.holder.state import PostgresState, SqliteState
    from gpucc.keyrelease.requester import RequesterSignatureError, requester_key_id

    if not isinstance(state, SqliteState | PostgresState):
        return
    try:
        requester = requester_key_id(offer)
    except RequesterSignatureError:
        requester = None
    names = [p.stem for p in datasets]
    refused: list[dict[str, str]] = []
    if refusal is not None:
        failed = [c for v in verdicts or [] if not v.trusted for c in v.failed_checks()]
        unmet = failed or [{"check": "offer", "detail": " ".join(str(refusal).split())[:500]}]
        refused = [{"dataset": n, "policy": "default", **c} for n in names for c in unmet]
    doc = audit_document(
        client="session answer",
        requester=requester,
        challenge=offer.challenge,
        released=[] if refusal is not None else [(n, "default") for n in names],
        refused=refused,
        trusted_with=trusted_with,
        transcript_hash=None if transcript is None else transcript.hex(),
    )
    try:
        state.put_audit(doc)
    except GpuccError as exc:
        warn(f"the decision's audit record was not kept: {exc}")
    try:  # one batch of expired replay rows, as the service deletes them in the background
        state.housekeep()
    except GpuccError as exc:
        warn(f"expired answered challenges were not deleted: {exc}")


def _grants(datasets: list[Path], key_file: Path) -> list[DatasetKey]:
    from gpucc.keyrelease.protocol import DatasetKey
    from gpucc.staging import open_sealed, read_key_file

    kek = read_key_file(key_file)
    grants = []
    for path in datasets:
        sealed = open_sealed(path, kek=kek)
        grants.append(DatasetKey(sealed.dataset_id, sealed.header_digest, sealed.unwrap(kek)))
    return grants


DatasetsOption = Annotated[
    list[Path],
    typer.Option(
        "--dataset",
        exists=True,
        dir_okay=False,
        help="Sealed dataset whose key to release (repeatable).",
    ),
]
KeyFileOption = Annotated[
    Path,
    typer.Option(
        "--data-key",
        envvar=["GPUCC_DATA_KEY", "GPUCC_KEY_FILE"],
        exists=True,
        dir_okay=False,
        help="Key file the datasets were sealed for.",
    ),
]
HostKeyOutOption = Annotated[
    Path,
    typer.Option(
        "--host-key",
        dir_okay=False,
        help="Where to keep this session's private key (created with mode 0600).",
    ),
]


# --- commands -------------------------------------------------------------------------


@session_app.command("challenge")
def challenge(fmt: FormatOption = OutputFormat.TEXT) -> None:
    """Data holder: print a fresh 32-byte challenge (hex) for one host."""
    from gpucc.keyrelease.protocol import new_challenge
    from gpucc.keyrelease.reports import ChallengeIssued

    issued = ChallengeIssued(new_challenge())
    if fmt is OutputFormat.JSON:
        emit(issued.to_dict())
        return
    out(issued.challenge.hex())


@session_app.command("offer")
def offer(
    challenge: ChallengeOption,
    output: Annotated[
        Path, typer.Option("-o", "--output", dir_okay=False, help="Offer file to write.")
    ],
    host_key: HostKeyOutOption,
    simulate: SimulateOption = None,
    force: ForceOption = False,
    fmt: FormatOption = OutputFormat.TEXT,
    gpu_only: GpuOnlyOption = False,
    cvm_collateral: CvmCollateralOption = None,
    requester_key: Annotated[
        Path | None,
        typer.Option(
            "--requester-key",
            exists=True,
            dir_okay=False,
            help="Sign the offer with this P-384 key (0600, e.g. from 'travel keygen'), for "
            "holders that reserve datasets to named requesters.",
        ),
    ] = None,
) -> None:
    """Host: make a session key, collect GPU and CVM evidence bound to it, write the offer.

    The CVM's TDX quote or SNP report comes from configfs-tsm, over report data that commits
    to the session (protocol version 2); --gpu-only offers GPU evidence alone (version 1).

    The offer replaces an existing file only with --force; the host key file is always new.
    """
    from gpucc.keyrelease.protocol import create_offer

    signer = None
    if requester_key is not None:  # read before any evidence is collected: fail early
        from gpucc.travel.signing import load_signing_key

        signer = load_signing_key(requester_key)
    value = _challenge(challenge)
    _fresh_host_key(host_key)
    check_output(output, also=(host_key,))
    with force_hint():
        refuse_existing(output, force=force)
    _warn_if_simulated(simulate)
    from gpucc.assembly import Settings, assemble

    platform = assemble(
        Settings(simulation=simulate),
        gpu_only=gpu_only,
        cvm_collateral=_read_collateral(cvm_collateral),
    )
    made, secret = create_offer(value, platform.collect(), collect_cvm=platform.collect_cvm())
    requester = None
    if signer is not None:
        from gpucc.keyrelease.requester import sign_offer
        from gpucc.travel.signing import key_id

        made, requester = sign_offer(made, signer), key_id(signer)
    secret.write(host_key)
    check_output(output, also=(host_key,))
    _write(output, made.to_json(), force=force)
    cvm = "and the CVM's evidence" if made.version == 2 else "only (GPU-only, version 1)"
    note(
        f"wrote offer {output} for {counted(len(secret.report_digests), 'GPU', 'GPUs')} {cvm}; "
        f"session key in "
        f"{host_key} (mode 0600)"
    )
    note(f"session nonce {made.nonce.hex()}")
    if requester is not None:
        note(f"signed by requester key sha256:{requester}")
    if fmt is OutputFormat.JSON:
        from gpucc.keyrelease.reports import OfferWritten

        emit(
            OfferWritten(
                offer=output,
                host_key=host_key,
                gpus=len(secret.report_digests),
                nonce=made.nonce,
                simulated=simulate is not None,
                protocol_version=made.version,
                requester_key_id=requester,
            ).to_dict()
        )


@session_app.command("answer")
def answer(
    offer_file: Annotated[
        Path,
        typer.Argument(exists=True, dir_okay=False, metavar="OFFER", help="The host's offer."),
    ],
    challenge: ChallengeOption,
    datasets: DatasetsOption,
    key_file: KeyFileOption,
    output: Annotated[
        Path, typer.Option("-o", "--output", dir_okay=False, help="Answer file to write.")
    ],
    rim_dir: RimDirOption = None,
    policy: PolicyOption = None,
    collateral: CollateralOption = None,
    offline: OfflineOption = False,
    at: AtOption = None,
    simulate: SimulateOption = None,
    force: ForceOption = False,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            "--state-dir",
            envvar="GPUCC_STATE_DIR",
            file_okay=False,
            help="Where answered challenges are recorded (default: the user state directory).",
        ),
    ] = None,
    state: Annotated[
        str | None,
        typer.Option(
            "--state",
            metavar="URL",
            help="Record answered challenges in this holder state instead: a SQLite file or "
            "postgresql://... (the one 'gpucc holder serve --state' uses).",
        ),
    ] = None,
    fmt: FormatOption = OutputFormat.TEXT,
    cvm_collateral: CvmCollateralOption = None,
) -> None:
    """Data holder: verify the offer's attestation, then wrap dataset keys for it.

    The offer must answer CHALLENGE (yours), its GPU evidence must pass full verification and
    policy with the nonce bound to the offered key, and its CVM evidence the cvm: policy with
    report data bound to the same session (GPU-only offers: only with cvm.allow_gpu_only).
    Exit 1 if not.
    Each challenge is answered at most once (docs/PROTOCOL.md, "Replay store").
    """
    from gpucc.core.files import read_capped
    from gpucc.keyrelease.protocol import MAX_OFFER_BYTES, FileReplayStore, Offer, accept_offer
    from gpucc.keyrelease.replay import ReplayStore

    if not datasets:
        raise UsageError("name at least one --dataset whose key to release")
    value = _challenge(challenge)
    check_output(output, offer_file, key_file, policy, collateral, *datasets)
    with force_hint():
        refuse_existing(output, force=force)
    grants = _grants(datasets, key_file)
    received = Offer.from_json(read_capped(offer_file, MAX_OFFER_BYTES, what="session offer"))
    _warn_if_simulated(simulate)
    from gpucc.assembly import PlatformVerifier

    verifier = PlatformVerifier(
        _settings(
            simulate=simulate,
            rim_dir=rim_dir,
            policy=policy,
            collateral=collateral,
            offline=offline,
            at=at,
            cvm_collateral=cvm_collateral,
        )
    )
    _announce_relaxations(verifier)
    verdicts: list[PlatformResult] = []
    replay: ReplayStore
    if state is not None:
        from gpucc.holder.state import open_state

        replay = open_state(state)
    else:
        replay = FileReplayStore(_state_dir(state_dir) / "answered-challenges")
    try:
        holder = accept_offer(
            received,
            challenge=value,
            attest=verifier.gpu_attester(verdicts.append),
            replay=replay,
            attest_cvm=verifier.cvm_attester(verdicts.append),
            allow_gpu_only=verifier.allow_gpu_only,
        )
    except NotTrustedError as exc:
        _audit(replay, received, datasets, verdicts=verdicts, refusal=exc)
        raise _refused(exc, verdicts) from None
    record = _release_record(verdicts, gpu_only=holder.version == 1)
    _write(output, holder.answer([holder.wrap(g) for g in grants]).to_json(), force=force)
    _audit(
        replay, received, datasets, trusted_with=record.to_dict(), transcript=holder.transcript_hash
    )
    note(
        f"attestation trusted for {counted(len(holder.report_digests), 'GPU', 'GPUs')}; wrote "
        f"keys for {counted(len(grants), 'dataset', 'datasets')} to {output} "
        f"(transcript {holder.transcript_hash.hex()[:16]}…)"
    )
    if fmt is OutputFormat.JSON:
        from gpucc.keyrelease.reports import AnswerWritten

        emit(
            AnswerWritten(
                answer=output,
                gpus=len(holder.report_digests),
                dataset_ids=[g.dataset_id for g in grants],
                transcript_hash=holder.transcript_hash,
                simulated=simulate is not None,
                protocol_version=holder.version,
                trusted_with=record.to_dict(),
            ).to_dict()
        )


@session_app.command("accept")
def accept(
    answer_file: Annotated[
        Path,
        typer.Argument(exists=True, dir_okay=False, metavar="ANSWER", help="The holder's answer."),
    ],
    host_key: Annotated[
        Path,
        typer.Option(
            "--host-key", exists=True, dir_okay=False, help="This session's host key file."
        ),
    ],
    datasets: Annotated[
        list[Path] | None,
        typer.Option(
            "--dataset", exists=True, dir_okay=False, help="Also check this dataset opens."
        ),
    ] = None,
    holder_pub: Annotated[
        str | None,
        typer.Option(
            "--holder-pub",
            metavar="FILE|sha256:HEX",
            help="The holder's public key (a PEM file) or its pin (sha256: and 64 hex "
            "characters). ANSWER may then be the holder's signed envelope (the body of its "
            "reply to POST /v1/offer): its signature is checked under this key before the "
            "answer inside is opened.",
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "-o",
            "--output",
            dir_okay=False,
            help="Write the session answer (the one inside a checked envelope) to this file, "
            "for 'gpucc stage --session FILE'.",
        ),
    ] = None,
    force: ForceOption = False,
    fmt: FormatOption = OutputFormat.TEXT,
) -> None:
    """Host: check an answer against this session and list the datasets it opens.

    ANSWER is the answer 'gpucc session answer' wrote, or a holder service's signed
    envelope (gpucc.holder-envelope/v2) with --holder-pub. Staging does the same checks
    (``gpucc stage D --session ANSWER --host-key F``); this command only verifies, without
    reading the chunks.
    """
    from gpucc.keyrelease.protocol import Answer, HostKey, open_answer
    from gpucc.staging import open_sealed

    secret = HostKey.read(host_key)  # the secret's own checks (owner, mode) come first
    answer_bytes, signer = _opened_envelope(answer_file, holder_pub)
    session = open_answer(Answer.from_json(answer_bytes), secret)
    if signer is not None:
        note(f"{answer_file}: signed by the pinned holder key sha256:{signer}")
    if output is not None:
        _write(output, answer_bytes, force=force)
        note(f"wrote the session answer to {output}")
    for path in datasets or []:
        sealed = open_sealed(path)
        sealed.check_key(session.dataset_key(sealed.header_digest))
        note(f"{path}: key released by this session, header verified")
    # The header digest is what each wrap authenticates (it is in the wrap's associated
    # data): unwrapping checks it. The answer's dataset ids are unauthenticated labels, so
    # they are not printed as if verified.
    for wrap in session.wraps:
        session.dataset_key(wrap.header_digest)
    digests = [w.header_digest.hex() for w in session.wraps]
    if fmt is OutputFormat.JSON:
        from gpucc.keyrelease.reports import AnswerAccepted

        emit(
            AnswerAccepted(
                answer=answer_file,
                header_digests=[w.header_digest for w in session.wraps],
                checked=list(datasets or []),
                holder_key_id=signer,
            ).to_dict()
        )
        return
    out(
        "answer verified for this session; keys for "
        f"{counted(len(session.wraps), 'dataset', 'datasets')}, "
        f"by header digest (SHA-256 of the sealed header, authenticated by the wrap): "
        f"{', '.join(digests) or 'none'}"
    )


def _opened_envelope(path: Path, holder_pub: str | None) -> tuple[bytes, str | None]:
    """The session answer in ``path``, and the holder key id that signed it: a holder's
    envelope is opened only after its signature checks under ``holder_pub``.

    Raises:
        UsageError: an envelope without --holder-pub, or --holder-pub for a bare answer.
        HolderAuthenticationError: the envelope is not signed by the pinned key.
        FileAccessError: ``path`` or the key file cannot be read.
    """
    from gpucc.core.errors import MalformedInputError, UsageError
    from gpucc.core.files import read_capped
    from gpucc.core.jsonio import loads_untrusted
    from gpucc.keyrelease.protocol import Answer
    from gpucc.travel.signing import ENVELOPE_SCHEMA, MAX_ENVELOPE_BYTES, Envelope, KeyPin

    data = read_capped(path, MAX_ENVELOPE_BYTES, what="session answer")
    try:
        doc = loads_untrusted(data, what=f"session answer {path}", error=MalformedInputError)
    except MalformedInputError:
        doc = None  # the answer's own parser says what is wrong
    if not (isinstance(doc, dict) and doc.get("schema") == ENVELOPE_SCHEMA):
        if holder_pub is not None:
            raise UsageError(
                f"{path} is not a holder's signed envelope: --holder-pub checks one "
                f"({ENVELOPE_SCHEMA}); drop it for an answer from 'gpucc session answer'"
            )
        return data, None
    if holder_pub is None:
        raise UsageError(
            f"{path} is a holder's signed envelope: give --holder-pub FILE|sha256:HEX to "
            "check its signature and open it"
        )
    if holder_pub.strip().startswith("sha256:"):
        pin = KeyPin.parse(holder_pub, "--holder-pub")
    else:
        key = Path(holder_pub)
        pin = KeyPin.parse(
            read_capped(key, 64 * 1024, what="holder public key").decode("utf-8", "replace"),
            f"--holder-pub {key}",
        )
    envelope = Envelope.from_json(data)
    envelope.verify(pin, Answer.from_json(envelope.answer).transcript_hash)
    return envelope.answer, envelope.holder_key_id


@session_app.command("local")
def local(
    datasets: Annotated[
        list[Path],
        typer.Argument(
            metavar="DATASET...", exists=True, dir_okay=False, help="Sealed datasets to release."
        ),
    ],
    key_file: KeyFileOption,
    output: Annotated[
        Path, typer.Option("-o", "--output", dir_okay=False, help="Answer file to write.")
    ],
    host_key: HostKeyOutOption,
    rim_dir: RimDirOption = None,
    policy: PolicyOption = None,
    collateral: CollateralOption = None,
    offline: OfflineOption = False,
    at: AtOption = None,
    simulate: SimulateOption = None,
    force: ForceOption = False,
    fmt: FormatOption = OutputFormat.TEXT,
    gpu_only: GpuOnlyOption = False,
    cvm_collateral: CvmCollateralOption = None,
) -> None:
    """One machine: attest the local GPU and CVM under a fresh session, release dataset keys.

    Then stage with ``gpucc stage DATASET --session ANSWER --host-key HOST_KEY``. The answer
    replaces an existing file only with --force; the host key file is always new.
    """
    from gpucc.keyrelease.protocol import local_session

    _fresh_host_key(host_key)
    check_output(output, key_file, policy, collateral, *datasets, also=(host_key,))
    check_output(host_key, key_file, policy, collateral, *datasets)
    with force_hint():
        refuse_existing(output, force=force)
    grants = _grants(datasets, key_file)
    _warn_if_simulated(simulate)
    from gpucc.assembly import assemble

    platform = assemble(
        _settings(
            simulate=simulate,
            rim_dir=rim_dir,
            policy=policy,
            collateral=collateral,
            offline=offline,
            at=at,
        ),
        gpu_only=gpu_only,
        cvm_collateral=_read_collateral(cvm_collateral),
    )
    verifier = platform.verifier
    _announce_relaxations(verifier)
    verdicts: list[PlatformResult] = []
    try:
        result = local_session(
            collect=platform.collect(),
            attest=verifier.gpu_attester(verdicts.append),
            datasets=grants,
            collect_cvm=platform.collect_cvm(),
            attest_cvm=verifier.cvm_attester(verdicts.append),
            allow_gpu_only=verifier.allow_gpu_only,
        )
    except NotTrustedError as exc:
        raise _refused(exc, verdicts) from None
    record = _release_record(verdicts, gpu_only=result.answer.version == 1)
    result.host_key.write(host_key)
    check_output(output, also=(host_key,))
    _write(output, result.answer.to_json(), force=force)
    note(
        "attestation trusted; released keys for "
        f"{counted(len(grants), 'dataset', 'datasets')}: answer {output}, "
        f"host key {host_key} (mode 0600)"
    )
    if fmt is OutputFormat.JSON:
        from gpucc.keyrelease.reports import LocalRelease

        emit(
            LocalRelease(
                answer=output,
                host_key=host_key,
                dataset_ids=[g.dataset_id for g in grants],
                simulated=simulate is not None,
                protocol_version=result.answer.version,
                trusted_with=record.to_dict(),
            ).to_dict()
        )
