"""``gpucc holder``: a data holder's key-release service (docs/TRAVEL.md).

::

    holder$ gpucc holder keygen --holder-key holder.key --holder-pub holder.pub.pem
    holder$ gpucc holder serve --datasets data/ --data-key data.key --holder-key holder.key \\
                --policy policy.yaml --listen 0.0.0.0:8443 --tls-cert c.pem --tls-key k.pem

This module holds the group (:data:`holder_app`) and ``serve``; the group's other commands
live beside it and are registered here, in the order ``--help`` lists them:
:mod:`~gpucc.cli.holder_setup` (``keygen``, ``datasets``) and
:mod:`~gpucc.cli.holder_records` (``receipts``, ``prune``). ``serve`` reads its configuration
file and builds the service's configuration with :mod:`~gpucc.cli.holder_config`.
``python -m gpucc.cli.holder`` runs the group alone.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpucc.core.errors import UsageError

from .command import App
from .holder_config import apply_config, holder_config
from .holder_records import prune_cmd, receipts_cmd
from .holder_setup import datasets_cmd, keygen, write_key_pair
from .options import (
    CollateralOption,
    FormatOption,
    OfflineOption,
    OutputFormat,
    PolicyOption,
    RimDirOption,
)
from .output import warn
from .serving import is_loopback, parse_listen, parse_proxy

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric import ec

    from gpucc.holder.state import PostgresState, SqliteState

    HolderState = SqliteState | PostgresState

__all__ = ["holder_app", "keygen", "write_key_pair"]


holder_app = App(
    group="holder",
    help="Run a data holder's key-release service for travelling GPUs.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


def _default_state_file(signing_key: ec.EllipticCurvePrivateKey) -> Path:
    import platformdirs

    from gpucc.travel.signing import key_id

    directory = Path(platformdirs.user_state_dir("gpucc"))
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    return directory / f"holder-{key_id(signing_key)[:16]}.sqlite3"


def _state(url: str | None, signing_key: ec.EllipticCurvePrivateKey) -> HolderState | None:
    """The holder's durable state (``None``: memory only, for ``--state memory``)."""
    from gpucc.holder.state import open_state

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
            "start record of the log. The default is the backend of the shipped proxy "
            "configurations (deploy/haproxy.cfg, deploy/nginx.conf), which terminate TLS on "
            "8443.",
        ),
    ] = "127.0.0.1:8080",
    tls_cert: Annotated[
        Path | None,
        typer.Option(
            "--tls-cert",
            exists=True,
            dir_okay=False,
            help="Terminate TLS here (with --tls-key): this PEM certificate, its chain after "
            "it. Behind the shipped proxies, which terminate TLS, give neither.",
        ),
    ] = None,
    tls_key: Annotated[
        Path | None,
        typer.Option(
            "--tls-key",
            exists=True,
            dir_okay=False,
            help="The PEM private key of --tls-cert (owner only, mode 0600).",
        ),
    ] = None,
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
        float,
        typer.Option("--challenge-ttl-s", min=1, max=3600, help="Challenge lifetime, in seconds."),
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
            "--body-timeout-s",
            min=0.1,
            max=600,
            help="Whole request (head and body) deadline, in seconds.",
        ),
    ] = 30.0,
    idle_timeout: Annotated[
        float,
        typer.Option(
            "--idle-timeout-s",
            min=0.1,
            max=600,
            help="Deadline for a connection's next request, in seconds.",
        ),
    ] = 10.0,
    header_timeout: Annotated[
        float,
        typer.Option(
            "--header-timeout-s", min=0.1, max=600, help="Request head deadline, in seconds."
        ),
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
        float,
        typer.Option("--drain-s", min=0, max=600, help="Graceful shutdown limit, in seconds."),
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
    from gpucc.core.httpserver import ServerLimits
    from gpucc.holder.service import serve as run_service
    from gpucc.staging.format import read_secret_file
    from gpucc.travel.signing import load_signing_key

    def settings() -> dict[str, Any]:
        paths = {
            o.name for o in ctx.command.params if type(o.type).__name__.endswith("Path")
        }  # Typer makes pathlib paths of these for the function; ctx.params has the text
        given = {
            k: Path(v) if k in paths and isinstance(v, str) else v for k, v in ctx.params.items()
        }
        return given if config_file is None else apply_config(ctx, config_file, given)

    p = settings()
    host, port = parse_listen(p["listen"])
    tls_cert, tls_key = p["tls_cert"], p["tls_key"]
    if (tls_cert is None) != (tls_key is None):
        raise UsageError("--tls-cert and --tls-key go together")
    if tls_cert is None and not is_loopback(host) and not p["allow_plain_http"]:
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
    config = holder_config(p, holder_state)
    limits = ServerLimits(
        idle_s=p["idle_timeout"],
        header_s=p["header_timeout"],
        request_s=p["body_timeout"],
        max_connections=p["max_connections"],
        max_per_client=p["max_per_client"],
        max_body=config.max_request_bytes,
        trusted_proxies=frozenset(parse_proxy(x) for x in p["trusted_proxy"] or ()),
    )
    stopped_by = run_service(
        config,
        host=host,
        port=port,
        tls_cert=tls_cert,
        tls_key=tls_key,
        drain_s=p["drain_s"],
        limits=limits,
        reload=lambda: holder_config(settings(), holder_state),
        metrics=p["metrics"],
        address_file=p["address_file"],
    )
    if stopped_by is not None:  # the exit status of the signal that stopped the service
        signal.raise_signal(stopped_by)


# the group's other commands (they live beside this module), in the order --help lists them
holder_app.command("keygen")(keygen)
holder_app.command("datasets")(datasets_cmd)
holder_app.command("receipts")(receipts_cmd)
holder_app.command("prune")(prune_cmd)


if __name__ == "__main__":  # pragma: no cover - the tests run the service this way
    from .boundary import run_app

    sys.exit(run_app(holder_app))
