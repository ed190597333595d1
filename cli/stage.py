"""``gpucc stage``: decrypt and verify a dataset into memory, report throughput, scrub."""

from __future__ import annotations

import contextlib
import enum
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from gpucc.core.errors import UsageError

from .options import DeadlineOption, FormatOption, OutputFormat
from .output import emit, format_rate, note
from .seal import byte_progress, check_chunk_size, chunk_summary, format_size, parse_size

if TYPE_CHECKING:
    from gpucc.staging.model.manifest import Manifest

__all__ = ["Device", "stage"]


class Device(enum.StrEnum):
    """--device values."""

    CPU = "cpu"
    GPU = "gpu"
    AUTO = "auto"


_DEVICE_NAMES: dict[Device, Literal["cpu", "gpu", "auto"]] = {
    Device.CPU: "cpu",
    Device.GPU: "gpu",
    Device.AUTO: "auto",
}


def _session_key(answer_path: Path, host_key_path: Path, header_digest: bytes) -> bytes:
    from gpucc.core.files import read_capped
    from gpucc.keyrelease.protocol import MAX_ANSWER_BYTES, Answer, HostKey, open_answer

    answer = Answer.from_json(read_capped(answer_path, MAX_ANSWER_BYTES))
    session = open_answer(answer, HostKey.read(host_key_path))
    return session.dataset_key(header_digest)


def _trusted_manifest(
    manifest: Path | None, signature: Path | None, public_key: Path | None, resource: str | None
) -> Manifest | None:
    """The manifest to check the staged bytes against: read, or taken from a bundle whose
    signature verified first. Read before anything is staged, so a bad one stages nothing."""
    from gpucc.core.files import read_capped
    from gpucc.staging.model.api import load_manifest, staged_resource
    from gpucc.staging.model.signing import MAX_BUNDLE_SIZE, load_public_key, verify_bundle

    if manifest is not None and signature is not None:
        raise UsageError("give --manifest or --signature, not both")
    if (signature is None) != (public_key is None):
        raise UsageError("--signature and --signer-pub go together")
    if signature is not None and public_key is not None:
        trusted = verify_bundle(
            read_capped(signature, MAX_BUNDLE_SIZE), load_public_key(public_key)
        )
    elif manifest is not None:
        trusted = load_manifest(manifest)
    else:
        if resource is not None:
            raise UsageError("--resource goes with --manifest or --signature")
        return None
    staged_resource(trusted, resource)
    return trusted


def _inputs(names: list[str]) -> list[Path]:
    """The files DATASET names: a directory stands for the sealed files (``*.gcc``) in it,
    in name order (the order ``seal --shards`` names them in). Key files are refused: a
    secret is never staged as if it were data.

    Raises:
        UsageError: an empty directory, or a key file among the inputs.
        FileAccessError: a name that does not exist (exit 8).
    """
    from gpucc.core.files import read_capped

    from .command import PathRule

    given = [Path(name) for name in names]
    for path in given:
        PathRule("DATASET...", True, True, True).check(path)
    files: list[Path] = []
    for path in given:
        if path.is_dir():
            found = sorted(path.glob("*.gcc"))
            if not found:
                raise UsageError(f"{path} holds no sealed dataset (*.gcc)")
            files += found
        else:
            files.append(path)
    for path in files:
        head = read_capped(path, 64, what="dataset")
        if head.startswith((b"gpucc-key v1\n", b"gpucc-session-host-key v1")):
            raise UsageError(f"{path} is a key file, not data: refusing to stage a secret")
    return files


def stage(
    datasets: Annotated[
        list[str],
        typer.Argument(
            metavar="DATASET...",
            help="A sealed dataset, the shards of a set (or their directory), or a plaintext "
            "file (sealed in transit with a fresh key); or one sealed dataset at an s3:// or "
            "https:// URL, or - for standard input.",
            show_default=False,
        ),
    ],
    key_file: Annotated[
        Path | None,
        typer.Option(
            "--data-key",
            envvar=["GPUCC_DATA_KEY", "GPUCC_KEY_FILE"],
            exists=True,
            dir_okay=False,
            help="Key file the dataset was sealed for.",
        ),
    ] = None,
    session: Annotated[
        Path | None,
        typer.Option(
            "--session",
            exists=True,
            dir_okay=False,
            help="Session answer from the data holder (with --host-key).",
        ),
    ] = None,
    host_key: Annotated[
        Path | None,
        typer.Option(
            "--host-key",
            exists=True,
            dir_okay=False,
            help="This host's session key file from 'gpucc session offer'.",
        ),
    ] = None,
    device: Annotated[
        Device,
        typer.Option(
            "--backend",
            help="What decrypts and holds the staged data: cpu, gpu, or auto (gpu if usable).",
        ),
    ] = Device.CPU,
    gpus: Annotated[
        int,
        typer.Option(
            "--gpus",
            min=1,
            help="With --backend gpu/auto: split the dataset over N local GPUs (chunk ranges).",
        ),
    ] = 1,
    threads: Annotated[
        int | None,
        typer.Option("--threads", min=1, help="Worker threads (default: all CPUs)."),
    ] = None,
    chunk_size: Annotated[
        str,
        typer.Option("--chunk-size", help="Chunk size for a plaintext input (4KiB-256MiB)."),
    ] = "4MiB",
    manifest: Annotated[
        Path | None,
        typer.Option(
            "--manifest",
            exists=True,
            dir_okay=False,
            help="Model manifest: verify the staged bytes against it before they are used.",
        ),
    ] = None,
    signature: Annotated[
        Path | None,
        typer.Option(
            "--signature",
            exists=True,
            dir_okay=False,
            help="Signed model manifest (with --signer-pub), checked before its digests are used.",
        ),
    ] = None,
    public_key: Annotated[
        Path | None,
        typer.Option(
            "--signer-pub", exists=True, dir_okay=False, help="PEM EC key for --signature."
        ),
    ] = None,
    resource: Annotated[
        str | None,
        typer.Option(
            "--resource",
            help="The manifest file the dataset holds (default: the manifest's only file).",
        ),
    ] = None,
    parallelism: Annotated[
        int,
        typer.Option(
            "--parallelism",
            min=1,
            max=64,
            rich_help_panel="Remote data",
            help="Requests in flight at once for an s3:// or https:// dataset.",
        ),
    ] = 4,
    part_size: Annotated[
        str,
        typer.Option(
            "--part-size",
            rich_help_panel="Remote data",
            help="Bytes one request reads (whole chunks, at least one).",
        ),
    ] = "16MiB",
    prefetch: Annotated[
        int | None,
        typer.Option(
            "--prefetch",
            min=1,
            rich_help_panel="Remote data",
            help="Chunks read ahead of verification (default: parallelism x chunks per part, "
            "at most 64 MiB).",
        ),
    ] = None,
    deadline: DeadlineOption = 60.0,
    retries: Annotated[
        int,
        typer.Option(
            "--retries",
            min=0,
            max=20,
            rich_help_panel="Remote data",
            help="Retries of a failed request (connection, 5xx, a body ending early), "
            "resuming where it stopped.",
        ),
    ] = 4,
    ca_file: Annotated[
        Path | None,
        typer.Option(
            "--ca-file",
            exists=True,
            dir_okay=False,
            rich_help_panel="Remote data",
            help="CA certificates for https:// (default: the system's, SSL_CERT_FILE or "
            "REQUESTS_CA_BUNDLE).",
        ),
    ] = None,
    output: FormatOption = OutputFormat.TEXT,
) -> None:
    """Decrypt and verify DATASET chunk by chunk, then scrub what held its plaintext.

    Every chunk is authenticated before staging reports success; a failed chunk is exit 6.
    On the CPU each chunk is read into its thread's buffer and verified into a second one,
    so memory stays at threads x 2 chunks whatever the dataset's size; with --manifest (the
    staged bytes are hashed) or on a GPU the dataset is staged into one buffer. Everything that held
    plaintext is zeroed before the command ends. A shard set (its files, or their
    directory) is checked as a set first (a lone, missing, foreign or misplaced shard is
    refused, exit 6), then each shard is verified and scrubbed in turn. Exit codes: 0
    staged, 2 usage, 4 malformed dataset or key file, 5 GPU staging not available, 6 data
    authentication failed (a chunk, the header or a missing chunk or shard), 7 wrong key,
    8 file access (also a missing object, or access refused by the store). From a store
    or a URL, also: 3 the store is unreachable or too slow (retries and --deadline spent),
    4 it answers outside the range protocol (200 for a range, other bytes' Content-Range,
    a redirect to another origin), 6 the object changed during the read.
    """
    from gpucc import staging
    from gpucc.staging.api import reads_back_zero
    from gpucc.staging.errors import StageKeyArgumentsError
    from gpucc.staging.model.api import require_verified, verify_staged

    if device is Device.CPU and gpus > 1:
        raise UsageError("--gpus needs --backend gpu or auto")
    size = parse_size(chunk_size)
    check_chunk_size(size, chunk_size)
    if (session is None) != (host_key is None):
        raise UsageError("--session and --host-key go together")
    trusted = _trusted_manifest(manifest, signature, public_key, resource)
    if trusted is not None and gpus > 1:
        raise UsageError("--manifest checks one buffer: stage a model on one GPU (--gpus 1)")

    released = None
    if session is not None and host_key is not None:
        released = partial(_session_key, session, host_key)
    from gpucc.staging.sources import SourceSettings, is_prefix, is_remote

    settings = SourceSettings(
        parallelism=parallelism,
        part_size=parse_size(part_size),
        window=prefetch,
        deadline=deadline,
        retries=retries,
        ca_file=ca_file,
    )
    remote = [name for name in datasets if is_remote(name)]
    if remote and len(remote) != len(datasets):
        raise UsageError("stage a set from one place: local files, or URLs")
    if "-" in remote and len(datasets) > 1:
        raise UsageError("standard input holds one dataset, not a part of a shard set")
    inputs: list[Any] = list(remote) or _inputs(datasets)
    dataset = inputs[0]
    if len(inputs) > 1 or is_prefix(dataset):
        from gpucc.staging.shards import open_shard_set

        if key_file is None and released is None:
            raise UsageError("a sealed dataset needs --data-key, or --session with --host-key")
        if trusted is not None:
            raise UsageError("--manifest checks one buffer: stage one dataset, not a set")
        shard_set = open_shard_set(inputs, key_file=key_file, key_for=released, settings=settings)
        _stage_set(shard_set, device, gpus, threads, output, session is not None)
        return
    try:
        plan = staging.plan_stage(
            dataset,
            key_file=key_file,
            key_for=released,
            device=_DEVICE_NAMES[device],
            gpus=gpus,
            chunk_size=size,
            source_settings=settings,
        )
    except StageKeyArgumentsError as exc:
        if exc.sealed:
            raise UsageError(
                "a sealed dataset needs --data-key, or --session with --host-key"
            ) from None
        raise UsageError(
            f"{dataset} is not a sealed dataset: a plaintext input is sealed in transit "
            "under a fresh key, so it takes no --data-key or --session"
        ) from None
    if plan.sealed:
        from gpucc.staging.shards import ShardId, open_shard_set

        shard = ShardId.parse(plan.header.dataset_id)
        if shard is not None:  # its header authenticated; a lone shard of a larger set is
            # refused by plan_stage, so this is a set of one shard
            shard_set = open_shard_set([dataset], key=plan.dataset_key, settings=settings)
            if trusted is not None:
                raise UsageError("--manifest checks one buffer: stage one dataset, not a set")
            _stage_set(shard_set, device, gpus, threads, output, session is not None)
            return
    if device is Device.AUTO:
        note(f"--backend auto: staging on {plan.device}")
    if not plan.sealed:
        note(f"{dataset} is not sealed: staging it sealed in transit under a fresh one-time key")
    from gpucc.staging.report import StageReport, source_summary

    header = plan.header
    source: dict[str, Any] | None = None

    total = header.plaintext_length
    staged = header.plaintext_length
    checked = None
    # The host memory that holds plaintext is this command's, lent by one arena that is
    # closed (every page it lent zeroed) before the command reports.
    with (
        staging.HostArena() as arena,
        byte_progress("staging", total) as progress,
        _naming(dataset),
    ):
        started = time.perf_counter()
        if trusted is None:
            # Nothing needs the plaintext afterwards: authenticate every chunk without
            # holding the dataset (bounded memory, no fresh pages; staging/verify.py).
            verified = plan.verify(threads=threads, progress=progress, arena=arena)
            seconds = time.perf_counter() - started
            held, scrubbed = verified.held_bytes, verified.scrubbed
            if remote:
                source = source_summary(verified)
        else:
            with plan.run(threads=threads, progress=progress, arena=arena) as buf:
                seconds = time.perf_counter() - started
                # Hash the staged buffer itself, while it is still held: the bytes that
                # verify are the bytes the caller would use. On any failure the buffer is
                # zeroed by run() on the way out.
                checked = verify_staged(buf, trusted, resource, threads=threads)
            # The API zeroes the buffer on exit; check it where that is cheap to see.
            scrubbed = reads_back_zero(buf)
            held = staged
    report = StageReport(
        dataset=str(dataset),
        device=plan.device,
        gpus=gpus if plan.device == "gpu" else 0,
        input="sealed" if plan.sealed else "plaintext",
        key_source=plan.key_source,
        dataset_id=header.dataset_id.hex() if plan.sealed else None,
        source=source,
        model=checked.to_json() if checked is not None else None,
        nbytes=staged,
        chunks=header.chunk_count,
        chunk_size=header.chunk_size,
        threads=threads or staging.default_threads(),
        verified=checked is None or checked.ok,
        scrubbed=scrubbed,
        held_bytes=held,
        seconds=seconds,
    )
    if output is OutputFormat.JSON:
        emit(report.to_dict())
    if checked is not None and not checked.ok:
        for problem in checked.problems:
            note(f"model {problem.kind}: {problem.name}")
        note(f"buffer {'scrubbed' if scrubbed else 'released'}; nothing staged is kept")
        require_verified(checked)
    what = "sealed dataset" if plan.sealed else "plaintext (sealed in transit)"
    shown = "standard input" if str(dataset) == "-" else dataset
    from .output import detail

    detail(
        f"{dataset}: key from {report.key_source}, dataset id "
        f"{report.dataset_id or 'none (sealed in transit)'}, "
        f"{report.threads} thread(s), backend {plan.device}"
    )
    note(
        f"staged {format_size(staged)} of {what} {shown} on {plan.device}: "
        f"{chunk_summary(header.chunk_count, staged, header.chunk_size)} verified "
        f"in {seconds:.3f} s ({format_rate(staged, seconds)}); {_held(held, staged)}"
    )
    if checked is not None:
        note(
            f"verified in the staged buffer: {checked.summary()} "
            f"({checked.serialization.resource_algorithm}, "
            f"subject sha256 {checked.subject_digest})"
        )


@contextlib.contextmanager
def _naming(dataset: Path) -> Iterator[None]:
    """A chunk or header that fails authentication is reported with the file it is in."""
    from gpucc.core.errors import IntegrityError

    try:
        yield
    except IntegrityError as exc:
        if getattr(exc, "path", False) is None:
            exc.path = dataset  # type: ignore[attr-defined]
        raise


def _held(held: int, staged: int, *, each: bool = False) -> str:
    """How much plaintext was in memory, for the closing line (``each``: per shard)."""
    if held >= staged:
        return "each buffer scrubbed" if each else "buffer scrubbed"
    return f"at most {format_size(held)} of plaintext held at once, scrubbed"


def _stage_set(
    shard_set: Any, device: Device, gpus: int, threads: int | None, output: OutputFormat,
    by_session: bool,
) -> None:  # fmt: skip
    """Stage each shard of a verified set in turn (every chunk authenticated), scrub each."""
    from gpucc import staging

    staged = chunks = held = 0
    scrubbed = True
    started = time.perf_counter()
    where = "cpu"
    arena = staging.HostArena()  # one for the set: the shards reuse its chunk buffers
    with arena, byte_progress("staging", shard_set.plaintext_length) as progress:
        for index in range(len(shard_set.parts)):
            plan = staging.plan_part(shard_set, index, device=_DEVICE_NAMES[device], gpus=gpus)
            where = plan.device
            verified = plan.verify(threads=threads, progress=progress, arena=arena)
            staged += verified.plaintext_length
            chunks += verified.chunk_count
            held = max(held, verified.held_bytes)
            scrubbed = scrubbed and verified.scrubbed
    seconds = time.perf_counter() - started
    first = shard_set.parts[0]
    if output is OutputFormat.JSON:
        from gpucc.staging.report import StageReport

        report = StageReport(
            dataset=first.name,
            shards=len(shard_set.parts),
            device=where,
            gpus=gpus if where == "gpu" else 0,
            input="sealed",
            key_source="session" if by_session else "key-file",
            dataset_id=first.dataset_id.hex(),
            nbytes=staged,
            chunks=chunks,
            chunk_size=shard_set.chunk_size,
            threads=threads or staging.default_threads(),
            verified=True,
            scrubbed=scrubbed,
            held_bytes=held,
            seconds=seconds,
        )
        emit(report.to_dict())
    from .output import detail

    for part in shard_set.parts:
        detail(f"{part.path}: verified and scrubbed")
    detail(
        f"key from {'session' if by_session else 'key-file'}, "
        f"{threads or staging.default_threads()} thread(s), on {where}"
    )
    note(
        f"staged {format_size(staged)} of a set of {len(shard_set.parts)} bound shards "
        f"(set {shard_set.set_id.hex()}) on {where}: {chunks} chunks verified in "
        f"{seconds:.3f} s ({format_rate(staged, seconds)}); "
        f"{_held(held, staged, each=True)}"
    )
