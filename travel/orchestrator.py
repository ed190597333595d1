"""The orchestrator: visit each holder in turn, stage, train, scrub, rotate, log.

Before any holder is contacted, this CVM is checked against every image policy the plan
names (``cvm_policy``, :mod:`gpucc.travel.selfcheck`): a CVM one holder would refuse never
starts the journey.

Per holder, in order, failing closed at every step:

1. a fresh challenge from that holder, and an offer with a fresh session key and GPU
   evidence collected for the nonce bound to both, signed with the orchestrator's key when
   it has one (:mod:`gpucc.keyrelease.requester`: a holder may release a dataset only to
   offers of named requesters);
2. the holder's signed answer, checked against the key the plan pins, then against the
   host's own offer (``keyrelease.protocol.open_answer``);
3. the model digest, which must equal the one taken when the GPU left the previous holder;
4. each dataset's header digest checked against the plan, then staged (verified chunk by
   chunk) with the key released by this session only;
5. the training step, with the staged buffers and the model;
6. every staged buffer zeroed and read back (on the device) as zeros, also when a step
   above failed;
7. the session dropped, the model digest taken, and a signed entry appended to the log;
8. the holder given a signed receipt of that entry (its index and hash), to keep.

When the journey ends, completed or not, a signed closing entry (visits planned, visits
done, the head it closes) ends the log.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import importlib
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from cryptography.hazmat.primitives.asymmetric import ec

from gpucc.core.errors import FileAccessError, UsageError
from gpucc.core.files import OutputExistsError, read_capped, write_atomic
from gpucc.keyrelease.protocol import (
    Answer,
    CollectedCvmEvidence,
    CollectedEvidence,
    create_offer,
    open_answer,
)

from .client import HolderClient
from .errors import DatasetDigestMismatchError, DatasetsWithheldError, ModelDigestMismatchError
from .log import GENESIS, LOG_SCHEMA, closing_entry, entry_hash, sign_entry
from .plan import HolderSpec, Plan
from .receipt import make_receipt
from .selfcheck import VerifierFor, check_cvm_policies
from .signing import key_id, load_signing_key
from .state import ScrubReceipt, model_digest, scrub_and_check

__all__ = ["TrainingStep", "TravelResult", "Visit", "load_training_step", "run_plan"]

_MAX_TLS_CA = 1024 * 1024

#: ``step(buffers, model, holder_id)``: buffers maps dataset names to staged buffers.
TrainingStep = Callable[[Mapping[str, Any], MutableMapping[str, Any], str], None]


@dataclass(frozen=True)
class Visit:
    """One completed visit (what its log entry records)."""

    holder_id: str
    transcript_hash: str
    evidence_digest: str
    bytes_staged: int
    receipts: tuple[ScrubReceipt, ...]
    model_digest_in: str
    model_digest_out: str
    entry: bytes = field(repr=False)
    receipt_kept: bool = False
    #: the holder's signed record of what its release relied on (relaxations, time, roots)
    trusted_with: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TravelResult:
    """The visits in order, the log written, its head, and the final model digest."""

    visits: tuple[Visit, ...]
    log_path: Path | None
    model_digest: str
    head: str | None = None
    #: holder id -> SHA-256 of the image policy this CVM was checked against before leaving
    cvm_policies: dict[str, str] = field(default_factory=dict)

    SCHEMA: ClassVar[str] = "gpucc.travel.run/v2"

    def to_dict(self) -> dict[str, Any]:
        """The ``gpucc.travel.run/v2`` document (``gpucc travel run -f json``)."""
        return {
            "schema": self.SCHEMA,
            "visits": [
                {
                    "holder_id": v.holder_id,
                    "bytes_staged": v.bytes_staged,
                    "transcript_hash": v.transcript_hash,
                    "evidence_digest": v.evidence_digest,
                    "receipt_kept": v.receipt_kept,
                    "trusted_with": v.trusted_with,
                }
                for v in self.visits
            ],
            "model_digest": self.model_digest,
            "log": None if self.log_path is None else str(self.log_path),
            "head": self.head,
        }


def load_training_step(spec: str) -> TrainingStep:
    """Import ``module:function``.

    Raises:
        UsageError: not importable or not callable.
    """
    module_name, _, attr = spec.partition(":")
    try:
        step = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"training step {spec} cannot be loaded: {type(exc).__name__}") from None
    if not callable(step):
        raise UsageError(f"training step {spec} is not callable")
    return step  # type: ignore[no-any-return]


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _check_datasets(holder: HolderSpec) -> None:
    """Each of ``holder``'s datasets is readable and has the header digest the plan names."""
    from gpucc.staging import open_sealed

    for spec in holder.datasets:
        actual = open_sealed(spec.path).header_digest
        if actual != spec.header_digest:
            raise DatasetDigestMismatchError(
                f"dataset {spec.name} of {holder.id}: header digest {actual.hex()[:16]}… is not "
                f"the plan's {spec.header_digest.hex()[:16]}…"
            )


def _check_released(holder: HolderSpec, wraps: Sequence[Any], withheld: list[str]) -> None:
    """Each of ``holder``'s datasets has a key in its answer; those without are named, with
    the rule the holder said each did not meet.

    Raises:
        DatasetsWithheldError: the holder's release policies withheld a dataset.
    """
    import hmac

    missing = [
        spec.name
        for spec in holder.datasets
        if not any(hmac.compare_digest(w.header_digest, spec.header_digest) for w in wraps)
    ]
    if not missing:
        return
    said = [
        w
        for w in withheld
        if any(
            w.startswith(f"dataset {name} ") or w.startswith(f"dataset {name}:") for name in missing
        )
    ]
    why = "; ".join(said) if said else "the holder named no rule (its decision log has it)"
    raise DatasetsWithheldError(
        f"holder {holder.id} withheld {', '.join(missing)}: its release policies released "
        f"no key for {'them' if len(missing) > 1 else 'it'}; {why}"
    )


def _preflight(plan: Plan, log_path: Path | None) -> None:
    """What can be checked before any holder is contacted: a journey refused here never
    started, and leaves no log. Every check is made again when it matters (the datasets
    at their visit)."""
    if log_path is not None and not log_path.parent.is_dir():
        raise FileAccessError(f"the log's directory {log_path.parent} does not exist")
    for holder in plan.holders:
        if holder.tls_ca is not None:
            read_capped(holder.tls_ca, _MAX_TLS_CA, what=f"TLS CA of {holder.id}")
        _check_datasets(holder)


def _visit(
    holder: HolderSpec,
    *,
    plan: Plan,
    collect: Callable[[bytes], CollectedEvidence],
    collect_cvm: Callable[[bytes], CollectedCvmEvidence] | None,
    step: TrainingStep | None,
    model: MutableMapping[str, Any],
    expected_in: str | None,
    on_staged: Callable[[str, str, Any], None] | None,
    clock: Callable[[], dt.datetime],
    requester: ec.EllipticCurvePrivateKey | None = None,
) -> tuple[dict[str, Any], int, tuple[ScrubReceipt, ...], str, str]:
    from gpucc.keyrelease.requester import sign_offer
    from gpucc.staging import plan_stage

    client = HolderClient(
        holder.url,
        timeout=plan.timeout_s,
        verify_tls=str(holder.tls_ca) if holder.tls_ca is not None else True,
    )
    started = clock()
    challenge = client.challenge()
    offer, host_key = create_offer(challenge, collect, collect_cvm=collect_cvm)
    if requester is not None:  # the orchestrator's key names who asks (release policies)
        offer = sign_offer(offer, requester)
    envelope, withheld = client.offer_reply(offer)
    answer = Answer.from_json(envelope.answer)
    envelope.verify(holder.pin, answer.transcript_hash)
    session = open_answer(answer, host_key)
    _check_released(holder, session.wraps, withheld)
    digest_in = model_digest(model)
    if expected_in is not None and digest_in != expected_in:
        raise ModelDigestMismatchError(
            f"the model arriving at {holder.id} is not the model that left the previous holder"
        )
    _check_datasets(holder)
    staged: list[tuple[str, Any, Any]] = []
    receipts: list[ScrubReceipt] = []
    try:
        for spec in holder.datasets:
            stage_plan = plan_stage(spec.path, key_for=session.dataset_key, device=plan.device)  # type: ignore[arg-type]
            assert stage_plan.dataset is not None and stage_plan.dataset_key is not None
            buf = stage_plan.backend.stage_sealed(
                stage_plan.dataset, stage_plan.dataset_key, threads=None, progress=None
            )
            staged.append((spec.name, stage_plan.backend, buf))
            if on_staged is not None:
                on_staged(holder.id, spec.name, buf)
        if step is not None:
            step({name: buf for name, _, buf in staged}, model, holder.id)
    finally:
        # scrub everything staged, whatever happened; the first failure is reported
        failure: BaseException | None = None
        for name, backend, buf in staged:
            try:
                receipts.append(scrub_and_check(name, backend.name, buf, backend.scrub))
            except BaseException as exc:  # keep scrubbing the others
                failure = failure or exc
        staged.clear()
        if failure is not None:
            raise failure
    # rotate: the session key and the host key leave scope here, a new pair per holder
    del session, host_key
    digest_out = model_digest(model)
    finished = clock()
    entry = {
        "holder_id": holder.id,
        "holder_url": holder.url,
        "holder_key_id": envelope.holder_key_id,
        "holder_trusted_with": envelope.trusted_with,
        "evidence_digest": hashlib.sha256(offer.evidence_json).hexdigest(),
        "transcript_hash": answer.transcript_hash.hex(),
        "datasets": [
            {"name": s.name, "header_digest": s.header_digest.hex(), "bytes": r.nbytes}
            for s, r in zip(holder.datasets, receipts, strict=True)
        ],
        "bytes_staged": sum(r.nbytes for r in receipts),
        "scrub": [r.to_dict() for r in receipts],
        "session_rotated": True,
        "model_digest_in": digest_in,
        "model_digest_out": digest_out,
        "started": started.isoformat(timespec="milliseconds"),
        "finished": finished.isoformat(timespec="milliseconds"),
    }
    return entry, sum(r.nbytes for r in receipts), tuple(receipts), digest_in, digest_out


def run_plan(
    plan: Plan,
    *,
    collect: Callable[[bytes], CollectedEvidence],
    collect_cvm: Callable[[bytes], CollectedCvmEvidence] | None = None,
    training_step: TrainingStep | None = None,
    model: MutableMapping[str, Any] | None = None,
    signing_key: ec.EllipticCurvePrivateKey | None = None,
    log_path: Path | None = None,
    force: bool = False,
    now: Callable[[], dt.datetime] | None = None,
    on_staged: Callable[[str, str, Any], None] | None = None,
    transit: Callable[[str, str, MutableMapping[str, Any]], None] | None = None,
    cvm_verifier: VerifierFor | None = None,
) -> TravelResult:
    """Visit every holder of ``plan`` in order (see the module docstring).

    Args:
        plan: the parsed plan.
        collect: ``collect(nonce)`` collects GPU evidence for ``nonce`` (NVML, or a
            simulated GPU in tests).
        collect_cvm: ``collect_cvm(report_data)`` gets this CVM's quote or report
            (configfs-tsm, or a simulated TDX platform); None offers GPU evidence alone, which
            holders refuse unless their policy names the relaxation cvm.allow_gpu_only.
        training_step: the step to run per holder (default: the plan's entry point, or none).
        model: the model state, a mapping of names to arrays (CPU or device); empty by default.
        signing_key: the orchestrator's log key (default: the plan's key file).
        log_path: where to write the log (default: the plan's); ``None`` in both: no log.
        force: replace an existing log.
        now: the clock for the log's times.
        on_staged: called with (holder id, dataset name, buffer) after each dataset is staged.
        transit: called with (from, to, model) between two visits (where the model travels).
        cvm_verifier: builds the verifier for a holder's image policy (``cvm_policy`` in
            the plan); required when the plan names one.

    Raises:
        OutputExistsError: the log exists (without ``force``).
        FileAccessError: the log's directory, a TLS CA file or a dataset cannot be read
            (checked, with the datasets' digests, before any holder is contacted: a
            journey that could not start leaves no log).
        UsageError: no key to sign the log with; an image policy named without CVM
            evidence or a verifier to check it.
        MalformedPolicyError, CvmPolicyMismatchError, CvmPolicyUndecidedError: a holder's
            image policy cannot be read, or this CVM does not (or cannot be shown to)
            satisfy it; checked before any holder is contacted, no log is written.
        HolderUnreachableError, HolderRefusedError, HolderProtocolError,
        HolderAuthenticationError, ProtocolError, KeyUnwrapError,
        DatasetDigestMismatchError, ModelDigestMismatchError, ScrubError, and staging's
        errors: the visit failed; nothing it staged is left unscrubbed.
    """
    log_path = log_path or plan.log_path
    _preflight(plan, log_path)
    policies = check_cvm_policies(plan.holders, collect_cvm=collect_cvm, verifier_for=cvm_verifier)
    if log_path is not None and log_path.exists() and not force:
        raise OutputExistsError(f"{log_path} exists; choose another log or replace it with --force")
    if log_path is not None and signing_key is None:
        if plan.key_path is None:
            raise UsageError("the plan names no orchestrator key to sign the log with")
        signing_key = load_signing_key(plan.key_path)
    step = training_step
    if step is None and plan.training_step is not None:
        step = load_training_step(plan.training_step)
    state: MutableMapping[str, Any] = model if model is not None else {}
    clock = now or _now
    lines: list[bytes] = []
    visits: list[Visit] = []
    prev = GENESIS
    expected: str | None = None

    def write_log() -> None:
        if log_path is not None:
            # The first write creates the log exclusively (or replaces one with --force);
            # later writes replace this run's own log, whole, atomically.
            replace = force or len(lines) > 1
            data = b"".join(x + b"\n" for x in lines)
            write_atomic(log_path, data, mode=0o644, force=replace, what="travel log")

    def close_log() -> None:
        nonlocal prev
        if signing_key is None:
            return
        body = closing_entry(
            seq=len(lines),
            prev=prev,
            orchestrator_key_id=key_id(signing_key),
            planned=len(plan.holders),
            done=len(visits),
            finished=clock().isoformat(timespec="milliseconds"),
        )
        lines.append(sign_entry(signing_key, body))
        prev = entry_hash(lines[-1])
        write_log()

    try:
        for i, holder in enumerate(plan.holders):
            if i and transit is not None:
                transit(plan.holders[i - 1].id, holder.id, state)
            body, nbytes, receipts, d_in, d_out = _visit(
                holder,
                plan=plan,
                collect=collect,
                collect_cvm=collect_cvm,
                step=step,
                model=state,
                expected_in=expected,
                on_staged=on_staged,
                clock=clock,
                requester=signing_key,
            )
            expected = d_out
            line = b""
            kept = False
            if signing_key is not None:
                entry = {
                    "schema": LOG_SCHEMA,
                    "seq": i,
                    "prev": prev,
                    "orchestrator_key_id": key_id(signing_key),
                    **body,
                }
                line = sign_entry(signing_key, entry)
                prev = entry_hash(line)
                lines.append(line)
                write_log()
                kept = _give_receipt(
                    holder,
                    plan,
                    signing_key,
                    i,
                    prev,
                    body["transcript_hash"],
                    body["holder_trusted_with"],
                )
            visits.append(
                Visit(
                    holder_id=holder.id,
                    transcript_hash=body["transcript_hash"],
                    evidence_digest=body["evidence_digest"],
                    bytes_staged=nbytes,
                    receipts=receipts,
                    model_digest_in=d_in,
                    model_digest_out=d_out,
                    entry=line,
                    receipt_kept=kept,
                    trusted_with=body["holder_trusted_with"],
                )
            )
    except BaseException:
        # the log says how far the journey got; the failure itself is what is raised
        with contextlib.suppress(Exception):
            close_log()
        raise
    close_log()
    return TravelResult(
        visits=tuple(visits),
        log_path=log_path,
        model_digest=model_digest(state),
        head=prev if signing_key is not None else None,
        cvm_policies=policies,
    )


def _give_receipt(
    holder: HolderSpec,
    plan: Plan,
    key: ec.EllipticCurvePrivateKey,
    seq: int,
    head: str,
    transcript_hash: str,
    trusted_with: dict[str, Any],
) -> bool:
    """Hand the holder its signed receipt (with its own record of what the release
    trusted); whether it kept it (a holder may keep none)."""
    from gpucc.core.errors import GpuccError

    receipt = make_receipt(
        key,
        holder_id=holder.id,
        seq=seq,
        entry_hash=head,
        transcript_hash=transcript_hash,
        trusted_with=trusted_with,
    )
    client = HolderClient(
        holder.url,
        timeout=plan.timeout_s,
        verify_tls=str(holder.tls_ca) if holder.tls_ca is not None else True,
    )
    try:
        return client.receipt(receipt)
    except GpuccError:
        return False
