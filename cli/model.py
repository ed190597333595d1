"""``gpucc model digest|verify|sign``: model integrity with OpenSSF model-signing manifests.

Exit codes: 0 verified (or written), 2 usage, 4 malformed manifest/bundle/key or a model tree
gpucc refuses, 5 environment (no GPU for ``--backend gpu``, no blake3 package), 6 not verified
(a signature that does not verify, a resource that differs, is missing or extra, or a file
that changed while hashed). See docs/MODEL.md.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpucc.core.errors import UsageError

from .command import App
from .options import FormatOption, OutputFormat
from .output import emit, format_rate, note, out, write_stdout
from .seal import format_size, parse_size

if TYPE_CHECKING:
    from gpucc.staging.model import Manifest, Serialization

__all__ = ["model_app"]

model_app = App(
    group="model",
    help="Digest, sign and verify ML models (OpenSSF model-signing v1.0 compatible).",
    no_args_is_help=True,
)


class HashName(enum.StrEnum):
    SHA256 = "sha256"
    BLAKE3 = "blake3"


class Device(enum.StrEnum):
    CPU = "cpu"
    GPU = "gpu"
    AUTO = "auto"


ModelArg = Annotated[
    Path,
    typer.Argument(
        metavar="MODEL",
        exists=True,
        help="Model directory (or a single model file).",
        show_default=False,
    ),
]
HashOption = Annotated[
    HashName, typer.Option("--hash", help="sha256 (sharded by default) or blake3 (per file).")
]
ShardOption = Annotated[
    str | None,
    typer.Option(
        "--shard-size",
        help="Digest SHA-256 shards of this size (4MiB suits GPUs) instead of whole files.",
        show_default=False,
    ),
]
DeviceOption = Annotated[
    Device,
    typer.Option("--backend", help="What hashes: cpu, gpu, or auto (gpu if usable)."),
]
SymlinkOption = Annotated[
    bool,
    typer.Option(
        "--allow-symlinks", help="Hash links to files inside the model (never links out of it)."
    ),
]
IgnoreOption = Annotated[
    list[Path] | None,
    typer.Option(
        "--ignore",
        help="Path to leave out, relative to the model (repeatable); one outside it is an error.",
    ),
]
NoGitOption = Annotated[
    bool, typer.Option("--no-ignore-git", help="Also hash .git, .github, .gitignore, ...")
]
ThreadsOption = Annotated[
    int | None, typer.Option("--threads", min=1, help="CPU worker threads (default: all CPUs).")
]
ForceOption = Annotated[bool, typer.Option("--force", help="Replace an existing output file.")]
ChainOption = Annotated[
    list[Path] | None,
    typer.Option("--cert-chain", exists=True, dir_okay=False, help="PEM certificates."),
]


def _refuse_existing(path: Path, force: bool, option: str) -> None:
    from gpucc.core.files import OutputExistsError, SpecialFileError

    if path.is_dir():
        raise SpecialFileError(f"{option} {path} is a directory")
    if os.path.lexists(path) and not force:
        raise OutputExistsError(f"{option} {path} already exists; pass --force to replace it")


def write_output(path: Path, data: bytes, *, force: bool) -> None:
    """Write ``data`` to a temporary name beside ``path``, flush it, then move it into place:
    by an exclusive link (an existing file is never replaced) or, with ``force``, a rename.

    Raises:
        OutputExistsError: ``path`` exists and ``force`` is not set.
        StagingIOError: the file cannot be written.
    """
    from gpucc.core.files import OutputExistsError
    from gpucc.staging.dataset import io_error

    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise io_error("create", tmp, exc) from None
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        if force:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise OutputExistsError(
                    f"{path} already exists; pass --force to replace it"
                ) from None
    except OSError as exc:
        raise io_error("write", path, exc) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _serialization(
    model: Path,
    hash_name: HashName,
    shard_size: str | None,
    allow_symlinks: bool,
    ignore: list[Path] | None,
    no_ignore_git: bool,
    extra_ignores: list[Path],
) -> Serialization:
    from gpucc.staging.model import make_serialization

    if hash_name is HashName.BLAKE3:
        if shard_size is not None:
            raise UsageError("BLAKE3 always digests whole files: drop --shard-size")
        size = None
    elif shard_size is None:
        size = None  # one digest per file: model_signing's default
    else:
        size = parse_size(shard_size, "--shard-size")
        if size <= 0:
            raise UsageError(f"--shard-size {shard_size}: must be positive")
    return make_serialization(
        model,
        hash_type=hash_name.value,
        shard_size=size,
        allow_symlinks=allow_symlinks,
        ignore=ignore or [],
        ignore_git=not no_ignore_git,
        exclude=extra_ignores,
    )


def _digest(
    model: Path, ser: Serialization, device: Device, threads: int | None
) -> tuple[Manifest, float, int]:
    import threading

    from gpucc.staging.model import digest_model

    total = 0
    lock = threading.Lock()

    def count(n: int) -> None:  # called from the hashing threads
        nonlocal total
        with lock:
            total += n

    started = time.perf_counter()
    manifest = digest_model(model, ser, device=device.value, threads=threads, progress=count)
    return manifest, time.perf_counter() - started, total


def _summary(manifest: Manifest, seconds: float, nbytes: int) -> str:
    return (
        f"{len(manifest.resources)} resource(s), {format_size(nbytes)} hashed in {seconds:.2f} s "
        f"({format_rate(nbytes, seconds)}), {manifest.serialization.resource_algorithm}, "
        f"subject sha256 {manifest.subject_digest.hex()}"
    )


@model_app.command("digest")
def digest(
    model: ModelArg,
    output: Annotated[
        Path | None,
        typer.Option("-o", "--output", dir_okay=False, help="Manifest to write (default stdout)."),
    ] = None,
    force: ForceOption = False,
    hash_name: HashOption = HashName.SHA256,
    shard_size: ShardOption = None,
    device: DeviceOption = Device.CPU,
    allow_symlinks: SymlinkOption = False,
    ignore: IgnoreOption = None,
    no_ignore_git: NoGitOption = False,
    threads: ThreadsOption = None,
    output_format: FormatOption = OutputFormat.TEXT,
) -> None:
    """Write MODEL's manifest: the in-toto statement model_signing signs (unsigned).

    Without -o the manifest goes to stdout; with --format json the result document does
    (holding the manifest when there is no -o).
    """
    if output is not None:
        _refuse_existing(output, force, "-o")
    extra = [output] if output is not None else []
    ser = _serialization(model, hash_name, shard_size, allow_symlinks, ignore, no_ignore_git, extra)
    manifest, seconds, nbytes = _digest(model, ser, device, threads)
    data = manifest.to_bytes()
    if output is not None:
        write_output(output, data, force=force)
    if output_format is OutputFormat.JSON:
        inline = json.loads(data) if output is None else None
        from gpucc.staging.model.manifest import DigestReport

        emit(
            DigestReport(
                model, manifest, seconds, nbytes, output=output, statement=inline
            ).to_dict()
        )
    elif output is None:
        from .terminal import json_for_terminal

        write_stdout(json_for_terminal(data.decode()) + "\n")
    note(f"digested {model}: {_summary(manifest, seconds, nbytes)}")


@model_app.command("sign")
def sign(
    model: ModelArg,
    private_key: Annotated[
        Path,
        typer.Option("--signer-key", dir_okay=False, help="PEM EC private key (mode 0600)."),
    ],
    signature: Annotated[
        Path, typer.Option("--signature", dir_okay=False, help="Signature bundle to write.")
    ],
    signing_certificate: Annotated[
        Path | None,
        typer.Option(
            "--signer-cert",
            exists=True,
            dir_okay=False,
            help="PEM certificate of the key: the certificate method instead of a bare key.",
        ),
    ] = None,
    certificate_chain: ChainOption = None,
    force: ForceOption = False,
    hash_name: HashOption = HashName.SHA256,
    shard_size: ShardOption = None,
    device: DeviceOption = Device.CPU,
    allow_symlinks: SymlinkOption = False,
    ignore: IgnoreOption = None,
    no_ignore_git: NoGitOption = False,
    threads: ThreadsOption = None,
    output_format: FormatOption = OutputFormat.TEXT,
) -> None:
    """Sign MODEL into a model_signing signature bundle (elliptic-key or certificate method).

    --cert-chain adds the issuers of --signer-cert to the bundle.
    """
    from gpucc.staging.model.signing import load_certificates, load_private_key, sign_manifest

    _refuse_existing(signature, force, "--signature")
    if certificate_chain and signing_certificate is None:
        raise UsageError("--cert-chain goes with --signer-cert")
    key = load_private_key(private_key)  # refuse an exposed key before hashing anything
    certificate = None
    if signing_certificate is not None:
        certificate = load_certificates([signing_certificate])[0]
        if certificate.public_key() != key.public_key():
            raise UsageError("--signer-cert is not the certificate of --signer-key")
    chain = load_certificates(certificate_chain or [])
    ser = _serialization(
        model, hash_name, shard_size, allow_symlinks, ignore, no_ignore_git, [signature]
    )
    manifest, seconds, nbytes = _digest(model, ser, device, threads)
    bundle = sign_manifest(manifest, key, certificate=certificate, chain=chain)
    write_output(signature, bundle, force=force)
    if output_format is OutputFormat.JSON:
        from gpucc.staging.model.manifest import DigestReport

        emit(DigestReport(model, manifest, seconds, nbytes, signature=signature).to_dict())
    note(f"signed {model} into {signature}: {_summary(manifest, seconds, nbytes)}")


@model_app.command("verify")
def verify(
    model: ModelArg,
    manifest_path: Annotated[
        Path | None,
        typer.Option("--manifest", exists=True, dir_okay=False, help="Unsigned manifest."),
    ] = None,
    signature: Annotated[
        Path | None,
        typer.Option("--signature", exists=True, dir_okay=False, help="Signature bundle."),
    ] = None,
    public_key: Annotated[
        Path | None,
        typer.Option("--signer-pub", exists=True, dir_okay=False, help="PEM EC public key."),
    ] = None,
    certificate_chain: Annotated[
        list[Path] | None,
        typer.Option(
            "--cert-chain",
            exists=True,
            dir_okay=False,
            help="Trusted PEM certificates (roots) for a certificate-signed bundle.",
        ),
    ] = None,
    output_format: FormatOption = OutputFormat.TEXT,
    device: DeviceOption = Device.CPU,
    threads: ThreadsOption = None,
) -> None:
    """Verify MODEL against a manifest, or a signature bundle checked first: with a public key,
    or with trusted certificates for a certificate-signed bundle.

    Exit 0 when every resource matches; 6 otherwise, listing each mismatching, missing or
    extra resource.
    """
    from gpucc.core.files import read_capped
    from gpucc.staging.model import load_manifest, require_verified, verify_model
    from gpucc.staging.model.signing import (
        MAX_BUNDLE_SIZE,
        load_certificates,
        load_public_key,
        verify_bundle,
    )

    if (manifest_path is None) == (signature is None):
        raise UsageError("give either --manifest or --signature (with --signer-pub)")
    if signature is not None:
        if (public_key is None) == (not certificate_chain):
            raise UsageError("--signature needs --signer-pub or --cert-chain (not both)")
        data = read_capped(signature, MAX_BUNDLE_SIZE)
        if public_key is not None:
            trusted = verify_bundle(data, load_public_key(public_key))
        else:
            trusted = verify_bundle(data, anchors=load_certificates(certificate_chain or []))
    else:
        if public_key is not None or certificate_chain:
            raise UsageError("--signer-pub and --cert-chain go with --signature")
        assert manifest_path is not None
        trusted = load_manifest(manifest_path)
    started = time.perf_counter()
    own = signature if signature is not None else manifest_path
    assert own is not None
    result = verify_model(model, trusted, device=device.value, threads=threads, ignore=[own])
    seconds = time.perf_counter() - started
    if output_format is OutputFormat.JSON:
        emit(result.to_dict())
    elif result.ok:
        out(
            f"verified: {result.summary()} ({result.serialization.resource_algorithm}, "
            f"subject sha256 {result.subject_digest}, {seconds:.2f} s)"
        )
    else:
        out(*(f"{problem.kind}: {problem.name}" for problem in result.problems))
    require_verified(result)
