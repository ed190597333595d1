"""``gpucc holder``: a data holder's key-release service (docs/TRAVEL.md).

::

    holder$ gpucc holder keygen --holder-key holder.key --holder-pub holder.pub.pem
    holder$ gpucc holder serve --datasets data/ --data-key data.key --holder-key holder.key \\
                --policy policy.yaml --listen 0.0.0.0:8443 --tls-cert c.pem --tls-key k.pem
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import signal
import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpucc.core.errors import UsageError

from .command import App
from .options import (
    CollateralOption,
    FormatOption,
    OfflineOption,
    OutputFormat,
    PolicyOption,
    RimDirOption,
)
from .output import emit, note, out, warn, write_stdout
from .terminal import safe_text

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric import ec

    from gpucc.assembly import PlatformVerifier
    from gpucc.staging.statedb import PostgresState, SqliteState
    from gpucc.travel.holder import HolderConfig, ReleasePolicy

    HolderState = SqliteState | PostgresState

__all__ = ["holder_app", "keygen", "write_key_pair"]

holder_app = App(
    group="holder",
    help="Run a data holder's key-release service for travelling GPUs.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


def _listen(text: str) -> tuple[str, int]:
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


def _proxy(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise UsageError(f"--trusted-proxy {text!r} must be an IP address") from None


def _is_loopback(host: str) -> bool:
    return host == "localhost" or ipaddress.ip_address(host).is_loopback


def _verifier(p: dict[str, Any], policy: Path | None) -> PlatformVerifier:
    """A platform verifier for ``policy`` (the simulation's default when trusting a
    simulation without one) with the service's roots, network settings and collateral; the
    clock at each offer."""
    import os

    from gpucc.assembly import PlatformVerifier, Settings, simulation_policy
    from gpucc.gpuattest.netconfig import NetworkSettings
    from gpucc.gpuattest.policy import Policy, load_policy
    from gpucc.staging.format import read_secret_file

    simulate_roots = p["simulate_roots"]
    if policy is not None:
        pol = load_policy(policy)
    elif simulate_roots is not None:
        pol = simulation_policy()
    else:
        pol = Policy()
    service_key = os.environ.get("NV_ATTESTATION_SERVICE_KEY")
    if p["service_key_file"] is not None:
        raw = read_secret_file(p["service_key_file"], 4096, what="service key")
        service_key = raw.decode("ascii", "replace").strip()
    verifier = PlatformVerifier(
        Settings(
            policy=pol,
            network=NetworkSettings(
                bundle=p["collateral"],
                offline=p["offline"],
                rim_url=p["rim_url"],
                ocsp_url=p["ocsp_url"],
                service_key=service_key,
                cache_dir=p["cache_dir"],
            ),
            rim_dir=p["rim_dir"],
            simulation=simulate_roots,
            pccs_url=p["pccs_url"],
        )
    )
    if verifier.allow_gpu_only:
        note("policy relaxation cvm.allow_gpu_only: GPU-only (version 1) offers are accepted")
    return verifier


def _default_state_file(signing_key: ec.EllipticCurvePrivateKey) -> Path:
    import platformdirs

    from gpucc.travel.signing import key_id

    directory = Path(platformdirs.user_state_dir("gpucc"))
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    return directory / f"holder-{key_id(signing_key)[:16]}.sqlite3"


def _state(url: str | None, signing_key: ec.EllipticCurvePrivateKey) -> HolderState | None:
    """The holder's durable state (``None``: memory only, for ``--state memory``)."""
    from gpucc.staging.statedb import open_state

    if url == "memory":
        return None
    return open_state(url or str(_default_state_file(signing_key)))


@holder_app.command("serve")
def serve(
    ctx: typer.Context,
    config_file: Annotated[
        Path | None,
        typer.Option(
            "--config",
            exists=True,
            dir_okay=False,
            help="Holder configuration (YAML): every option below as a key, plus 'releases' "
            "(per-dataset policies); options given here override it. SIGHUP re-reads it.",
        ),
    ] = None,
    datasets: Annotated[
        Path | None,
        typer.Option(
            "--datasets", exists=True, file_okay=False, help="Directory of sealed datasets (*.gcc)."
        ),
    ] = None,
    dataset_keys: Annotated[
        Path | None,
        typer.Option(
            "--data-key",
            exists=True,
            dir_okay=False,
            help="Key file the datasets were sealed for (mode 0600).",
        ),
    ] = None,
    key: Annotated[
        Path | None,
        typer.Option(
            "--holder-key",
            exists=True,
            dir_okay=False,
            help="The holder's P-384 signing key (0600).",
        ),
    ] = None,
    policy: PolicyOption = None,
    listen: Annotated[
        str,
        typer.Option(
            "--listen",
            help="HOST:PORT to listen on; port 0: one the system chooses, named in the "
            "start record of the log.",
        ),
    ] = "127.0.0.1:8443",
    tls_cert: Annotated[
        Path | None, typer.Option("--tls-cert", exists=True, dir_okay=False)
    ] = None,
    tls_key: Annotated[Path | None, typer.Option("--tls-key", exists=True, dir_okay=False)] = None,
    allow_plain_http: Annotated[
        bool,
        typer.Option("--allow-plain-http", help="Serve without TLS on a non-loopback address."),
    ] = False,
    rim_dir: RimDirOption = None,
    collateral: CollateralOption = None,
    offline: OfflineOption = False,
    rim_url: Annotated[
        str | None, typer.Option("--rim-url", help="RIM service base URL (default NVIDIA's).")
    ] = None,
    ocsp_url: Annotated[
        str | None, typer.Option("--ocsp-url", help="OCSP responder URL (default NVIDIA's).")
    ] = None,
    pccs_url: Annotated[
        str | None,
        typer.Option("--pccs-url", help="Where TDX collateral is fetched (default Intel's PCS)."),
    ] = None,
    service_key_file: Annotated[
        Path | None,
        typer.Option(
            "--service-key-file",
            exists=True,
            dir_okay=False,
            help="NVIDIA service key (mode 0600; default: $NV_ATTESTATION_SERVICE_KEY).",
        ),
    ] = None,
    cache_dir: Annotated[
        Path | None,
        typer.Option("--cache-dir", file_okay=False, help="Collateral cache directory."),
    ] = None,
    metrics: Annotated[
        bool, typer.Option("--metrics", help="Answer GET /metrics (Prometheus; 'metrics' extra).")
    ] = False,
    address_file: Annotated[
        Path | None,
        typer.Option(
            "--address-file",
            dir_okay=False,
            help="Write HOST:PORT listened on to this new file once serving (with port 0).",
        ),
    ] = None,
    challenge_ttl: Annotated[
        float, typer.Option("--challenge-ttl", min=1, max=3600, help="Challenge lifetime, s.")
    ] = 120.0,
    max_request_kib: Annotated[
        int, typer.Option("--max-request-kib", min=4, max=8192, help="Largest request body.")
    ] = 256,
    rate: Annotated[
        float, typer.Option("--rate", min=0.1, help="Requests per second per client.")
    ] = 20.0,
    burst: Annotated[int, typer.Option("--burst", min=1, help="Burst per client.")] = 40,
    body_timeout: Annotated[
        float,
        typer.Option(
            "--body-timeout-s", min=0.1, max=600, help="Whole request (head and body) deadline, s."
        ),
    ] = 30.0,
    idle_timeout: Annotated[
        float,
        typer.Option(
            "--idle-timeout-s",
            min=0.1,
            max=600,
            help="Deadline for a connection's next request, s.",
        ),
    ] = 10.0,
    header_timeout: Annotated[
        float,
        typer.Option("--header-timeout-s", min=0.1, max=600, help="Request head deadline, s."),
    ] = 10.0,
    max_connections: Annotated[
        int, typer.Option("--max-connections", min=1, max=65536, help="Open connections, total.")
    ] = 512,
    max_per_client: Annotated[
        int,
        typer.Option(
            "--max-connections-per-client", min=1, max=65536, help="Open connections per client."
        ),
    ] = 16,
    max_challenges: Annotated[
        int,
        typer.Option(
            "--max-challenges-per-client",
            min=1,
            max=10000,
            help="Outstanding challenges per client.",
        ),
    ] = 64,
    trusted_proxy: Annotated[
        list[str] | None,
        typer.Option(
            "--trusted-proxy",
            help="Believe X-Forwarded-For only from this proxy address (repeatable).",
        ),
    ] = None,
    receipt_dir: Annotated[
        Path | None,
        typer.Option(
            "--receipt-dir",
            exists=True,
            file_okay=False,
            help="Keep the orchestrator's signed receipts of visits here.",
        ),
    ] = None,
    orchestrator_key: Annotated[
        Path | None,
        typer.Option(
            "--orchestrator-pub",
            exists=True,
            dir_okay=False,
            help="Accept receipts signed by this orchestrator public key only.",
        ),
    ] = None,
    state: Annotated[
        str | None,
        typer.Option(
            "--state",
            metavar="URL",
            help="Durable state: a SQLite file (default: holder-<key id>.sqlite3 in the "
            "per-user state directory), postgresql://... shared by several holder processes, "
            "or 'memory'.",
        ),
    ] = None,
    drain_s: Annotated[
        float, typer.Option("--drain-s", min=0, max=600, help="Graceful shutdown limit, s.")
    ] = 20.0,
    simulate_roots: Annotated[
        Path | None,
        typer.Option(
            "--simulate",
            file_okay=False,
            metavar="DIR",
            rich_help_panel="Simulation (no GPU; never for production)",
            help="Trust a simulation's self-made GPU and TDX roots and RIMs in DIR (written by "
            "'travel run --simulate DIR' or 'session offer --simulate DIR'). It attests "
            'nothing real: every log line then says "simulated": true.',
        ),
    ] = None,
    fmt: FormatOption = OutputFormat.TEXT,
) -> None:
    """Serve challenges and answer verified offers with signed, session-wrapped dataset keys.

    A request body over --max-request-kib is refused before parsing; each challenge is
    single-use and expires; connections are closed when their next request does not start
    within --idle-timeout-s, its head does not arrive within --header-timeout-s or the whole
    request within --body-timeout-s; SIGTERM stops accepting and drains requests in flight.
    """
    from gpucc.core.files import refuse_existing
    from gpucc.staging.format import read_secret_file
    from gpucc.travel.holder import serve as run_service
    from gpucc.travel.httpserver import ServerLimits
    from gpucc.travel.signing import load_signing_key

    def settings() -> dict[str, Any]:
        paths = {
            o.name for o in ctx.command.params if type(o.type).__name__.endswith("Path")
        }  # Typer makes pathlib paths of these for the function; ctx.params has the text
        given = {
            k: Path(v) if k in paths and isinstance(v, str) else v for k, v in ctx.params.items()
        }
        return given if config_file is None else _apply_config(ctx, config_file, given)

    p = settings()
    host, port = _listen(p["listen"])
    tls_cert, tls_key = p["tls_cert"], p["tls_key"]
    if (tls_cert is None) != (tls_key is None):
        raise UsageError("--tls-cert and --tls-key go together")
    if tls_cert is None and not _is_loopback(host) and not p["allow_plain_http"]:
        raise UsageError(
            f"{host} is not a loopback address: give --tls-cert/--tls-key "
            "(or --allow-plain-http behind a TLS proxy)"
        )
    if tls_key is not None:  # the TLS key is a secret like the others: owner only, 0600
        read_secret_file(tls_key, 1024 * 1024, what="TLS key")
    required = {"datasets": "--datasets", "dataset_keys": "--data-key", "key": "--holder-key"}
    for name, option in required.items():
        if p[name] is None:
            raise UsageError(f"{option} is required (as an option or a key)")
    if p["address_file"] is not None:
        refuse_existing(p["address_file"])  # before listening: the service would fail later
    if p["simulate_roots"] is not None:
        warn("SIMULATED GPU roots: for tests and demos only, this attests nothing real")
    holder_state = _state(p["state"], load_signing_key(p["key"]))
    config = _holder_config(p, holder_state)
    limits = ServerLimits(
        idle_s=p["idle_timeout"],
        header_s=p["header_timeout"],
        request_s=p["body_timeout"],
        max_connections=p["max_connections"],
        max_per_client=p["max_per_client"],
        max_body=config.max_request_bytes,
        trusted_proxies=frozenset(_proxy(x) for x in p["trusted_proxy"] or ()),
    )
    stopped_by = run_service(
        config,
        host=host,
        port=port,
        tls_cert=tls_cert,
        tls_key=tls_key,
        drain_s=p["drain_s"],
        limits=limits,
        reload=lambda: _holder_config(settings(), holder_state),
        metrics=p["metrics"],
        address_file=p["address_file"],
    )
    if stopped_by is not None:  # the exit status of the signal that stopped the service
        signal.raise_signal(stopped_by)


#: keys of a configuration file that are not options
_FILE_ONLY = {"releases"}
#: options that have no key (the file itself; a secret that belongs in a 0600 file)
_NO_KEY = {"config", "service-key", "format"}


def _apply_config(ctx: typer.Context, path: Path, given: dict[str, Any]) -> dict[str, Any]:
    """``given`` with each option left at its default taken from the configuration file
    (relative paths there are relative to the file); ``releases`` added."""
    from gpucc.core.errors import MalformedInputError
    from gpucc.core.files import read_capped
    from gpucc.core.jsonio import load_yaml_untrusted

    doc = load_yaml_untrusted(
        read_capped(path, 1024 * 1024, what="holder configuration"),
        what=f"holder configuration {path}",
        error=MalformedInputError,
    )
    if not isinstance(doc, dict):
        raise MalformedInputError(f"holder configuration {path} is not a mapping")
    options = {
        o.opts[0].removeprefix("--"): o
        for o in ctx.command.params
        if o.param_type_name == "option" and o.opts[0].startswith("--")
    }
    doc = _renamed_keys(doc)
    unknown = [k for k in doc if k not in _FILE_ONLY and (k not in options or k in _NO_KEY)]
    if unknown:
        raise MalformedInputError(f"holder configuration {path}: unknown key {unknown[0]!r}")
    merged = dict(given)
    merged["releases"] = None
    for name, value in _renamed_keys(doc).items():
        if name in _FILE_ONLY:
            merged[name] = value
            continue
        option = options.get(name)
        if option is None or name in _NO_KEY:
            raise MalformedInputError(f"holder configuration {path}: unknown key {name!r}")
        source = ctx.get_parameter_source(option.name or "")
        if source is not None and source.name != "DEFAULT":
            continue  # the command line's value wins
        if type(option.type).__name__.endswith("Path"):
            values = value if isinstance(value, list) else [value]
            values = [str(path.parent / v) if isinstance(v, str) else v for v in values]
            value = values if isinstance(value, list) else values[0]
        try:
            cast = option.type_cast_value(ctx, value)
        except typer.BadParameter as exc:
            raise MalformedInputError(
                f"holder configuration {path}: {name}: {exc.format_message()}"
            ) from None
        if type(option.type).__name__.endswith("Path") and isinstance(cast, str):
            cast = Path(cast)  # what Typer makes of the option's value
        merged[option.name or name] = cast
    return merged


def _renamed_keys(doc: dict[str, Any]) -> dict[str, Any]:
    """A configuration's keys with the old option spellings (``cli.aliases``) read as the
    new ones, one note for each; a file that names both spellings keeps the new one."""
    from .aliases import RENAMED

    renamed: dict[str, Any] = {}
    for key, value in doc.items():
        new = RENAMED["holder serve"].get(f"--{key}")
        if new is None:
            renamed[key] = value
            continue
        warn(f"holder configuration: {key} is deprecated; use {new.removeprefix('--')}")
        renamed.setdefault(new.removeprefix("--"), value)
    return renamed


def _releases(p: dict[str, Any]) -> tuple[ReleasePolicy, ...]:
    """The configuration's per-dataset release policies (one verifier each, built once):
    ``name``, ``datasets``, and ``policy`` (an attestation policy file; default --policy)
    and/or ``requesters`` (public key files or ``sha256:`` key ids, one of which must have
    signed the offer)."""
    from gpucc.core.errors import MalformedInputError
    from gpucc.travel.holder import ReleasePolicy

    doc = p.get("releases")
    if doc is None:
        return ()
    if not isinstance(doc, list):
        raise MalformedInputError("releases: a list of {name, datasets, policy, requesters}")
    found = []
    base = Path(p["config_file"]).parent if p.get("config_file") else Path()
    for i, entry in enumerate(doc):
        if (
            not isinstance(entry, dict)
            or not {"name", "datasets"}
            <= set(entry)
            <= {"name", "datasets", "policy", "requesters"}
            or not isinstance(entry["name"], str)
            or not isinstance(entry.get("policy", ""), str)
            or not isinstance(entry["datasets"], list)
            or not all(isinstance(d, str) for d in entry["datasets"])
            or not isinstance(entry.get("requesters", []), list)
            or not all(isinstance(r, str) for r in entry.get("requesters", []))
        ):
            raise MalformedInputError(
                f"releases[{i}]: name (text), datasets (names), policy (a policy file), "
                "requesters (public key files or sha256: key ids)"
            )
        verifier = _verifier(p, base / entry["policy"]) if "policy" in entry else None
        requesters = frozenset(_requester(base, r, i) for r in entry.get("requesters", []))
        found.append(ReleasePolicy(entry["name"], tuple(entry["datasets"]), verifier, requesters))
    return tuple(found)


def _requester(base: Path, text: str, i: int) -> str:
    """A requester's key id from a public key file (relative to the configuration) or a
    ``sha256:<hex>`` key id."""
    from gpucc.core.files import read_capped
    from gpucc.travel.signing import KeyPin, key_id, load_public_key

    if text.startswith("sha256:"):
        return KeyPin.parse(text, f"releases[{i}].requesters").key_id
    path = base / text
    return key_id(load_public_key(read_capped(path, 16 * 1024, what="requester key"), str(path)))


def _holder_config(p: dict[str, Any], state: HolderState | None) -> HolderConfig:
    """The service's configuration from the merged options (at start, and on SIGHUP)."""
    from gpucc.core.files import read_capped
    from gpucc.travel.holder import HolderConfig, load_named_datasets
    from gpucc.travel.signing import load_public_key, load_signing_key

    if p["simulate_roots"] is not None:
        from gpucc.assembly.sources import missing_simulation_files

        missing = missing_simulation_files(p["simulate_roots"])
        if missing:
            raise UsageError(f"--simulate {p['simulate_roots']} lacks {', '.join(missing)}")
    names, keys = load_named_datasets(p["datasets"], p["dataset_keys"])
    orchestrator = p["orchestrator_key"]
    return HolderConfig(
        datasets=keys,
        dataset_names=names,
        releases=_releases(p),
        signing_key=load_signing_key(p["key"]),
        verifier=_verifier(p, p["policy"]),
        challenge_ttl=p["challenge_ttl"],
        max_request_bytes=p["max_request_kib"] * 1024,
        rate_per_s=p["rate"],
        burst=p["burst"],
        body_timeout_s=p["body_timeout"],
        max_challenges_per_client=p["max_challenges"],
        receipt_dir=p["receipt_dir"],
        orchestrator_key=None
        if orchestrator is None
        else load_public_key(read_capped(orchestrator, 16 * 1024), str(orchestrator)),
        state=state,
    )


def keygen(
    key: Annotated[
        Path,
        typer.Option(
            "--holder-key", dir_okay=False, help="The holder's private key to create (0600)."
        ),
    ],
    pub: Annotated[
        Path, typer.Option("--holder-pub", dir_okay=False, help="Its public key PEM to write.")
    ],
    fmt: FormatOption = OutputFormat.TEXT,
) -> None:
    """Make the holder's P-384 signing key (never replaces a file); print its pin for the plan."""
    write_key_pair(key, pub, fmt)


def write_key_pair(key: Path, pub: Path, fmt: OutputFormat) -> None:
    """Make a P-384 signing key at ``key`` (0600) and its public key at ``pub``; print its pin."""
    from gpucc.core.errors import FileAccessError
    from gpucc.travel.signing import generate_signing_key, key_id, public_pem, write_signing_key

    if pub.exists():
        raise FileAccessError(f"{pub} exists; it is never replaced")
    signing = generate_signing_key()
    write_signing_key(key, signing)
    try:
        with pub.open("xb") as fh:
            fh.write(public_pem(signing))
    except OSError as exc:
        raise FileAccessError(f"cannot write {pub}: {exc.strerror or exc}") from None
    pin = f"sha256:{key_id(signing)}"
    if fmt is OutputFormat.JSON:
        emit({"schema": "gpucc.keygen/v1", "key": str(key), "pub": str(pub), "pin": pin})
    else:
        out(pin)
    note(f"wrote {key} (mode 0600) and {pub}; its pin for plan.yaml is {pin}")


holder_app.command("keygen")(keygen)


@holder_app.command("datasets")
def datasets_cmd(
    datasets: Annotated[
        Path,
        typer.Option(
            "--datasets", exists=True, file_okay=False, help="Directory of sealed datasets (*.gcc)."
        ),
    ],
    fmt: FormatOption = OutputFormat.TEXT,
) -> None:
    """Print each sealed dataset's plan entry (name, path, header digest) as YAML."""
    from gpucc.staging import open_sealed

    found = sorted(datasets.glob("*.gcc"))
    if not found:
        raise UsageError(f"{datasets} holds no sealed dataset (*.gcc)")
    entries = [
        {"name": p.stem, "path": str(p), "header_digest": open_sealed(p).header_digest.hex()}
        for p in found
    ]
    if fmt is OutputFormat.JSON:
        emit({"schema": "gpucc.holder.datasets/v1", "datasets": entries})
        return
    lines: list[str] = []
    for e in entries:
        lines += [f"- name: {e['name']}", f"  path: {e['path']}"]
        lines.append(f"  header_digest: {e['header_digest']}")
    out(*lines)


def _trusted(record: dict[str, Any]) -> str:
    """A receipt's record of the release, in a few words."""
    items = sorted({str(r.get("item")) for r in record.get("relaxations") or []})
    text = "; ".join(items) if items else "no policy relaxation"
    return text + ("; SIMULATED roots" if record.get("simulated") else "")


class Decision(StrEnum):
    """``--decision``."""

    RELEASED = "released"
    REFUSED = "refused"


@holder_app.command("receipts")
def receipts_cmd(
    receipt_dir: Annotated[
        Path | None,
        typer.Option(
            "--receipt-dir",
            exists=True,
            file_okay=False,
            help="The service's --receipt-dir: show the orchestrator's receipts kept there.",
        ),
    ] = None,
    state: Annotated[
        str | None,
        typer.Option(
            "--state",
            metavar="URL",
            help="The service's --state (a SQLite file or postgresql://...): show its audit "
            "records, one per release decision.",
        ),
    ] = None,
    dataset: Annotated[
        str | None, typer.Option("--dataset", help="Only decisions about this dataset.")
    ] = None,
    since: Annotated[
        str | None,
        typer.Option("--since", metavar="TIME", help="Only decisions at or after (ISO 8601)."),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option("--until", metavar="TIME", help="Only decisions before (ISO 8601)."),
    ] = None,
    decision: Annotated[
        Decision | None, typer.Option("--decision", help="Only datasets released, or refused.")
    ] = None,
    requester: Annotated[
        str | None,
        typer.Option(
            "--requester",
            help="Only this client address, or the requester key id starting so (8+ hex).",
        ),
    ] = None,
    fmt: FormatOption = OutputFormat.TEXT,
) -> None:
    """Show the receipts this holder kept: for each visit, the log entry index and hash the
    orchestrator signed (give the file to `gpucc travel verify-log --receipt`); with --state,
    its audit records: every release decision, released or refused, with the requester, each
    dataset's outcome, the unmet rule of a refusal and the relaxations a release used."""
    if (receipt_dir is None) == (state is None):
        raise UsageError("give --receipt-dir (receipts) or --state (audit records), one of them")
    filters = (dataset, since, until, decision, requester)
    if state is None:
        if any(f is not None for f in filters):
            raise UsageError("--dataset, --since, --until, --decision, --requester need --state")
        assert receipt_dir is not None
        _receipt_files(receipt_dir, fmt)
        return
    _audit_records(
        state,
        fmt,
        dataset=dataset,
        since=None if since is None else _time("--since", since),
        until=None if until is None else _time("--until", until),
        decision=None if decision is None else decision.value,
        requester=requester,
    )


def _time(option: str, text: str) -> dt.datetime:
    from .options import parse_time

    try:
        return parse_time(text)
    except UsageError:
        raise UsageError(f"{option} {text!r} is not an ISO 8601 time or Unix seconds") from None


def _open_existing_state(url: str) -> HolderState:
    """The state named by ``url``; a SQLite file must exist (a query never creates one)."""
    from gpucc.core.errors import FileAccessError
    from gpucc.staging.statedb import open_state

    if url == "memory":
        raise UsageError("--state memory keeps no audit records: give the service's database")
    if not url.startswith(("postgresql://", "postgres://")):
        path = Path(url.removeprefix("sqlite:"))
        if path.is_dir():
            raise FileAccessError(f"--state {path} is a directory, not a state database")
        if not path.is_file():
            raise FileAccessError(f"--state {path}: no such state database")
    return open_state(url)


def _audit_records(url: str, fmt: OutputFormat, **filters: Any) -> None:
    from gpucc.travel.audit import query_audit

    holder_state = _open_existing_state(url)
    try:
        found = query_audit(holder_state, **filters)
    finally:
        holder_state.close()
    if fmt is OutputFormat.JSON:
        emit({"schema": "gpucc.holder.audit/v1", "records": [r.to_dict() for r in found]})
        return
    headers = ("TIME", "DECISION", "DATASET", "RULE", "REQUESTER", "CLIENT", "CHALLENGE")
    rows = [
        (
            r.time.isoformat(timespec="seconds").replace("+00:00", "Z"),
            d.decision,
            d.dataset,
            d.rule or "-",
            (r.requester or "-")[:16],
            r.client,
            (r.challenge_id or "-")[:16],
            "; ".join(r.relaxations) or "-",
        )
        for r in found
        for d in r.datasets
    ]
    cells = [tuple(safe_text(c) for c in row) for row in rows]
    head = (*headers, "RELAXATIONS")
    widths = [max(len(row[i]) for row in [head, *cells]) for i in range(len(head) - 1)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1]
        for row in [head, *cells]
    ]
    write_stdout("".join(line.rstrip() + "\n" for line in lines))
    note(f"{len(found)} decision(s); -f json gives each refusal's detail")


@holder_app.command("prune")
def prune_cmd(
    state: Annotated[
        str,
        typer.Option(
            "--state",
            metavar="URL",
            help="The service's --state (a SQLite file, which must exist, or postgresql://...).",
        ),
    ],
    before: Annotated[
        str,
        typer.Option(
            "--before",
            metavar="TIME",
            help="Delete the audit records and receipts kept before this time (ISO 8601 or "
            "Unix seconds); at least 24 hours ago unless --force, never in the future.",
        ),
    ],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Count what would be deleted; delete nothing.")
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Also prune records of the last 24 hours.")
    ] = False,
    fmt: FormatOption = OutputFormat.TEXT,
) -> None:
    """Delete the audit records (and the receipts the state keeps) older than --before, in one
    transaction, and say how many. Expired answered challenges need no pruning: the service
    deletes them itself, once no challenge they protect can be answered."""
    from gpucc.travel.audit import PruneFloorError, prune_audit

    if not before.strip():
        raise UsageError("--before needs a time (ISO 8601 or Unix seconds)")
    at = _time("--before", before)
    holder_state = _open_existing_state(state)
    try:
        done = prune_audit(
            holder_state, at, now=dt.datetime.now(dt.UTC), force=force, dry_run=dry_run
        )
    except PruneFloorError as exc:
        raise UsageError(f"--before {before!r}: {exc}; --force prunes them") from None
    except UsageError as exc:
        raise UsageError(f"--before {before!r}: {exc}") from None
    finally:
        holder_state.close()
    if fmt is OutputFormat.JSON:
        emit({"schema": "gpucc.holder.prune/v1", **done.to_dict()})
        return
    verb = "would delete" if done.dry_run else "deleted"
    out(
        f"{verb} {done.audit} audit record(s) and {done.receipts} receipt(s) kept before "
        f"{done.to_dict()['before']}"
    )
    if done.dry_run:
        note("dry run: nothing was deleted")


def _receipt_files(receipt_dir: Path, fmt: OutputFormat) -> None:
    from gpucc.core.files import read_capped
    from gpucc.travel.receipt import MAX_RECEIPT_BYTES, Receipt

    found = []
    for path in sorted(receipt_dir.glob("receipt-*.json")):
        r = Receipt.from_json(read_capped(path, MAX_RECEIPT_BYTES, what="receipt"))
        r.verify()
        found.append((path, r))
    if fmt is OutputFormat.JSON:
        emit(
            {
                "schema": "gpucc.holder.receipts/v1",
                "receipts": [
                    {
                        "file": str(p),
                        "holder_id": r.holder_id,
                        "seq": r.seq,
                        "entry_hash": r.entry_hash,
                        "transcript_hash": r.transcript_hash,
                        "orchestrator_key_id": r.orchestrator_key_id,
                        "holder_trusted_with": r.trusted_with,
                    }
                    for p, r in found
                ],
            }
        )
        return
    out(
        *(
            f"{p.name}: entry {r.seq} hash {r.entry_hash} signed by orchestrator "
            f"{r.orchestrator_key_id[:16]}…; released trusting: {_trusted(r.trusted_with)}"
            for p, r in found
        )
    )
    note(f"{len(found)} receipt(s) in {receipt_dir}")


if __name__ == "__main__":  # pragma: no cover - the tests run the service this way
    from .boundary import run_app

    sys.exit(run_app(holder_app))
