"""``gpucc collateral serve|export|import|check``: the fleet's collateral mirror and pre-flight.

``serve`` runs the read-through mirror (:mod:`gpucc.gpuattest.mirror`) on the holder's HTTP
server; ``export`` and ``import`` move its store across an air gap (``import`` also takes
``gpucc collateral fetch`` bundles); ``check`` asks, before a rollout, whether the collateral
a verification will need is published, valid and current (exit 0 ready, 1 refused, 3 not
published or not obtainable). docs/NETWORK.md, "A mirror for a fleet".
"""

from __future__ import annotations

import datetime as dt
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpucc.core.errors import MalformedInputError, UsageError

from .attest_cvm import CvmKdsOption, CvmPccsOption
from .exitcodes import COLLATERAL, NOT_TRUSTED
from .options import (
    AtOption,
    DeadlineOption,
    FormatOption,
    NoOcspNonceOption,
    OcspUrlOption,
    OutputFormat,
    RimUrlOption,
    ServiceKeyOption,
    TimeoutOption,
    parse_time,
)
from .output import emit, note, out
from .serving import is_loopback, parse_listen, parse_proxy

if TYPE_CHECKING:
    from gpucc.gpuattest.mirror import Mirror

__all__ = ["check_cmd", "export_cmd", "import_cmd", "serve_cmd"]

_DEFAULT_STORE = "collateral-mirror"
_CONFIG_KEYS = {
    "listen",
    "store",
    "rim_upstream",
    "ocsp_upstream",
    "pcs_upstream",
    "kds_upstream",
    "tls_cert",
    "tls_key",
    "allow_plain_http",
    "grace_hours",
    "max_age_days",
    "offline",
    "timeout",
    "deadline",
    "retries",
    "service_key_file",
    "refresh_s",
    "outage_hold_s",
    "trusted_proxy",
    "forget_days",
    "max_connections",
    "max_connections_per_client",
    "address_file",
}


def _clock(at: str | None) -> Callable[[], dt.datetime]:
    """The mirror's clock: now, or ``--at`` moving forward from the moment the service starts."""
    if at is None:
        return lambda: dt.datetime.now(dt.UTC)
    start, began = parse_time(at), time.monotonic()
    return lambda: start + dt.timedelta(seconds=time.monotonic() - began)


def _config(ctx: typer.Context, path: Path) -> None:
    """Fill options left at their defaults from the YAML file ``path`` (keys: option names
    with ``-`` or ``_``); the command line wins."""
    from gpucc.core.files import read_capped
    from gpucc.core.jsonio import load_yaml_untrusted

    doc = load_yaml_untrusted(
        read_capped(path, 1024 * 1024, what="mirror configuration"),
        what=f"mirror configuration {path}",
        error=MalformedInputError,
    )
    if not isinstance(doc, dict):
        raise MalformedInputError(f"mirror configuration {path} is not a mapping")
    params = {p.name: p for p in ctx.command.params if p.name}
    for raw_key, value in doc.items():
        key = str(raw_key).replace("-", "_")
        if key not in _CONFIG_KEYS or key not in params:
            raise MalformedInputError(f"mirror configuration {path}: unknown key {raw_key!r}")
        source = ctx.get_parameter_source(key)
        if source is not None and source.name != "DEFAULT":
            continue
        param = params[key]
        if type(param.type).__name__.endswith("Path") and isinstance(value, str):
            value = str(path.parent / value)
        try:
            ctx.params[key] = param.type_cast_value(ctx, value)
        except (typer.BadParameter, ValueError, TypeError) as exc:
            raise MalformedInputError(f"mirror configuration {path}: {raw_key}: {exc}") from None


def _mirror(p: dict[str, Any], *, service_key: str | None) -> Mirror:
    from gpucc.core.transport import RequestsFetcher
    from gpucc.gpuattest.mirror import Mirror, MirrorStore, Upstreams

    store = MirrorStore(p["store"], max_age=dt.timedelta(days=p["max_age_days"]))
    fetcher = None
    if not p["offline"]:
        fetcher = RequestsFetcher(
            timeout=(min(5.0, p["timeout"]), p["timeout"]),
            retries=p["retries"],
            total_timeout=p["deadline"],
        )
    defaults = Upstreams()
    if service_key:
        from gpucc.core.transport import plain_http_to_remote

        for option in ("rim_upstream", "ocsp_upstream"):
            if p[option] and plain_http_to_remote(p[option]):
                raise UsageError(
                    f"--{option.replace('_', '-')}: refusing to send the service key over "
                    "plain http to a remote host; use an https URL"
                )
    return Mirror(
        store=store,
        upstreams=Upstreams(
            rim_url=p["rim_upstream"] or defaults.rim_url,
            ocsp_url=p["ocsp_upstream"] or defaults.ocsp_url,
            pcs_url=p["pcs_upstream"] or defaults.pcs_url,
            kds_url=p["kds_upstream"] or defaults.kds_url,
        ),
        fetcher=fetcher,
        clock=_clock(p["at"]),
        grace=dt.timedelta(hours=p["grace_hours"]),
        offline=p["offline"],
        outage_hold=p["outage_hold_s"],
        wait_s=p["deadline"] + 5.0,
        service_key=service_key,
        forget_s=p["forget_days"] * 86400.0,
    )


StoreOption = Annotated[
    Path,
    typer.Option("--store", file_okay=False, help="Directory of the mirror's entries (0700)."),
]
MaxAgeOption = Annotated[
    float,
    typer.Option(
        "--max-age-days",
        min=0.01,
        max=365,
        help="The longest a RIM, certificate, CRL or TCB info is held before it is fetched "
        "again, whatever its own lifetime (OCSP: 24 h at most).",
    ),
]


def serve_cmd(
    ctx: typer.Context,
    config_file: Annotated[
        Path | None,
        typer.Option(
            "--config",
            exists=True,
            dir_okay=False,
            help="Mirror configuration (YAML): options below as keys; the command line wins.",
        ),
    ] = None,
    listen: Annotated[
        str, typer.Option("--listen", help="HOST:PORT to listen on (port 0: any free port).")
    ] = "127.0.0.1:8444",
    store: StoreOption = Path(_DEFAULT_STORE),
    rim_upstream: Annotated[
        str | None, typer.Option("--rim-upstream", help="NVIDIA's RIM service (default).")
    ] = None,
    ocsp_upstream: Annotated[
        str | None, typer.Option("--ocsp-upstream", help="NVIDIA's OCSP responder (default).")
    ] = None,
    pcs_upstream: Annotated[
        str | None,
        typer.Option("--pcs-upstream", help="Intel's PCS (default) or a PCCS to read through."),
    ] = None,
    kds_upstream: Annotated[
        str | None, typer.Option("--kds-upstream", help="AMD's KDS (default).")
    ] = None,
    tls_cert: Annotated[
        Path | None, typer.Option("--tls-cert", exists=True, dir_okay=False)
    ] = None,
    tls_key: Annotated[Path | None, typer.Option("--tls-key", exists=True, dir_okay=False)] = None,
    allow_plain_http: Annotated[
        bool,
        typer.Option("--allow-plain-http", help="Serve without TLS on a non-loopback address."),
    ] = False,
    grace_hours: Annotated[
        float,
        typer.Option(
            "--grace-hours",
            min=0,
            max=24 * 30,
            help="Serve an entry past its lifetime, marked stale, for this long while the "
            "vendor cannot be reached.",
        ),
    ] = 6.0,
    max_age_days: MaxAgeOption = 7.0,
    offline: Annotated[
        bool,
        typer.Option("--offline", help="Air gap: never contact a vendor; serve what is held."),
    ] = False,
    timeout: Annotated[
        float,
        typer.Option("--timeout", min=0.1, max=120, help="Upstream read timeout, in seconds."),
    ] = 10.0,
    deadline: Annotated[
        float,
        typer.Option(
            "--deadline",
            min=0.1,
            max=600,
            help="Upstream request limit, retries included, in seconds.",
        ),
    ] = 20.0,
    retries: Annotated[
        int, typer.Option("--retries", min=0, max=10, help="Upstream retries (backoff).")
    ] = 2,
    outage_hold_s: Annotated[
        float,
        typer.Option(
            "--outage-hold-s",
            min=0,
            max=600,
            help="After a vendor could not be reached, answer new items 503 at once for this "
            "long, in seconds.",
        ),
    ] = 10.0,
    refresh_s: Annotated[
        float,
        typer.Option(
            "--refresh-s", min=0.1, max=86400, help="How often due entries are renewed, in seconds."
        ),
    ] = 60.0,
    forget_days: Annotated[
        float,
        typer.Option(
            "--forget-days",
            min=0,
            max=3650,
            help="Stop renewing an entry no client has asked for in this many days.",
        ),
    ] = 30.0,
    service_key_file: Annotated[
        Path | None,
        typer.Option(
            "--service-key-file",
            exists=True,
            dir_okay=False,
            help="NVIDIA service key for the mirror's own requests (0600; default: "
            "$NV_ATTESTATION_SERVICE_KEY).",
        ),
    ] = None,
    trusted_proxy: Annotated[
        list[str] | None,
        typer.Option("--trusted-proxy", help="Believe X-Forwarded-For from this address."),
    ] = None,
    max_connections: Annotated[
        int, typer.Option("--max-connections", min=1, max=65536, help="Open connections.")
    ] = 1024,
    max_connections_per_client: Annotated[
        int,
        typer.Option(
            "--max-connections-per-client", min=1, max=65536, help="Open connections per client."
        ),
    ] = 64,
    address_file: Annotated[
        Path | None,
        typer.Option(
            "--address-file", dir_okay=False, help="Write HOST:PORT here once serving (new file)."
        ),
    ] = None,
    at: AtOption = None,
    fmt: FormatOption = OutputFormat.TEXT,
) -> None:
    """Serve NVIDIA's RIMs and OCSP, Intel's PCS and AMD's KDS from one caching base URL.

    Clients verify every answer as if the vendor had sent it: the mirror can withhold
    collateral, never forge it. GET /metrics and /healthz answer on the same listener.
    """
    import os

    from gpucc.core.files import refuse_existing
    from gpucc.core.httpserver import ServerLimits
    from gpucc.travel.mirror_http import serve_mirror

    if config_file is not None:
        _config(ctx, config_file)
    paths = {o.name for o in ctx.command.params if type(o.type).__name__.endswith("Path")}
    # Typer makes pathlib paths for the function; ctx.params holds the text
    p: dict[str, Any] = {
        k: Path(v) if k in paths and isinstance(v, str) else v for k, v in ctx.params.items()
    }
    host, port = parse_listen(p["listen"])
    if (p["tls_cert"] is None) != (p["tls_key"] is None):
        raise UsageError("--tls-cert and --tls-key go together")
    if p["tls_cert"] is None and not is_loopback(host) and not p["allow_plain_http"]:
        raise UsageError(
            f"{host} is not a loopback address: give --tls-cert/--tls-key "
            "(or --allow-plain-http behind a TLS proxy)"
        )
    service_key = os.environ.get("NV_ATTESTATION_SERVICE_KEY") or None
    if p["service_key_file"] is not None:
        from gpucc.staging.format import read_secret_file

        raw = read_secret_file(p["service_key_file"], 4096, what="service key")
        service_key = raw.decode("ascii", "replace").strip() or None
    if p["tls_key"] is not None:
        from gpucc.staging.format import read_secret_file

        read_secret_file(p["tls_key"], 1024 * 1024, what="TLS key")
    if p["address_file"] is not None:
        refuse_existing(p["address_file"])
    proxies = {parse_proxy(text) for text in p["trusted_proxy"] or ()}
    mirror = _mirror(p, service_key=service_key)
    limits = ServerLimits(
        max_connections=p["max_connections"],
        max_per_client=p["max_connections_per_client"],
        max_body=16 * 1024,
        request_s=p["deadline"] + 10.0,
        trusted_proxies=frozenset(proxies),
    )
    stopped_by = serve_mirror(
        mirror,
        host=host,
        port=port,
        limits=limits,
        tls_cert=p["tls_cert"],
        tls_key=p["tls_key"],
        address_file=p["address_file"],
        refresh_s=p["refresh_s"],
        describe=lambda: {"store": str(p["store"]), "grace_hours": p["grace_hours"]},
    )
    if stopped_by is not None:
        signal.raise_signal(stopped_by)


def export_cmd(
    output: Annotated[Path, typer.Option("-o", "--output", dir_okay=False, help="Export file.")],
    store: StoreOption = Path(_DEFAULT_STORE),
    max_age_days: MaxAgeOption = 7.0,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing file.")] = False,
    at: AtOption = None,
    fmt: FormatOption = OutputFormat.TEXT,
) -> None:
    """Write the mirror's store to one file, to carry to a mirror without network."""
    from gpucc.core.files import write_atomic
    from gpucc.gpuattest.mirror import MirrorStore

    if not store.is_dir():
        raise UsageError(f"--store {store} is not a directory")
    held = MirrorStore(store, max_age=dt.timedelta(days=max_age_days))
    write_atomic(output, held.export(parse_time(at)), mode=0o644, force=force, what="export")
    note(f"wrote {output}: {len(held)} entr{'y' if len(held) == 1 else 'ies'}")


def import_cmd(
    sources: Annotated[
        list[Path],
        typer.Argument(
            metavar="FILE...",
            exists=True,
            dir_okay=False,
            help="Files from 'collateral export' or 'collateral fetch' bundles.",
        ),
    ],
    store: StoreOption = Path(_DEFAULT_STORE),
    max_age_days: MaxAgeOption = 7.0,
    at: AtOption = None,
    fmt: FormatOption = OutputFormat.TEXT,
) -> None:
    """Add exported entries (or a bundle's RIMs and OCSP answers) to a mirror's store.

    Every entry is checked (digest, kind, lifetime read from its bytes) before anything is
    written; a malformed file imports nothing (exit 4).
    """
    from gpucc.core.files import read_capped
    from gpucc.core.jsonio import loads_untrusted
    from gpucc.gpuattest.mirror import (
        EXPORT_FORMAT,
        MAX_EXPORT_BYTES,
        MirrorStore,
        entries_from_bundle,
        read_export,
    )

    max_age = dt.timedelta(days=max_age_days)
    now = parse_time(at)
    found = []
    for source in sources:
        data = read_capped(source, MAX_EXPORT_BYTES, what="mirror export")
        doc = loads_untrusted(data, what=str(source), error=MalformedInputError)
        if isinstance(doc, dict) and doc.get("format") == EXPORT_FORMAT:
            found += read_export(data, max_age=max_age)
        else:
            found += entries_from_bundle(data, now=now, max_age=max_age)
    held = MirrorStore(store, max_age=max_age)
    for entry in found:
        held.put(entry)
    note(f"imported {len(found)} entr{'y' if len(found) == 1 else 'ies'} into {store}")


def check_cmd(
    driver: Annotated[
        str | None, typer.Option("--driver", help="Driver version, e.g. 550.90.07.")
    ] = None,
    gpu: Annotated[
        str, typer.Option("--gpu", help="GPU chip: GH100 (default) or GB100.")
    ] = "GH100",
    vbios: Annotated[
        str | None, typer.Option("--vbios", help="VBIOS version, e.g. 96.00.9F.00.01.")
    ] = None,
    board: Annotated[
        str | None,
        typer.Option(
            "--board", help="PROJECT_SKU_CHIPSKU of the board (with --vbios), e.g. 1010_0200_882."
        ),
    ] = None,
    evidence: Annotated[
        Path | None,
        typer.Option(
            "--evidence",
            exists=True,
            dir_okay=False,
            help="GPU evidence: its RIMs and OCSP for its device chains.",
        ),
    ] = None,
    cvm_evidence: Annotated[
        Path | None,
        typer.Option(
            "--cvm-evidence",
            exists=True,
            dir_okay=False,
            help="CVM evidence: whether its TCB collateral can be had and is current.",
        ),
    ] = None,
    rim_url: RimUrlOption = None,
    ocsp_url: OcspUrlOption = None,
    cvm_pccs_url: CvmPccsOption = None,
    cvm_kds_url: CvmKdsOption = None,
    service_key: ServiceKeyOption = None,
    no_ocsp_nonce: NoOcspNonceOption = False,
    timeout: TimeoutOption = 10.0,
    deadline: DeadlineOption = 60.0,
    at: AtOption = None,
    fmt: FormatOption = OutputFormat.TEXT,
) -> None:
    """Pre-flight: are the RIMs published and valid, OCSP answering, the TCB collateral current?

    Exit 0: ready. Exit 1: something is published but refused (bad signature, revoked).
    Exit 3: not published yet, or not obtainable now: do not roll out yet.
    """
    from gpucc.gpuattest import preflight
    from gpucc.gpuattest.netconfig import NetworkSettings, build_fetcher, network_sources
    from gpucc.gpuattest.trust import TrustRoots

    if vbios is not None and board is None:
        raise UsageError("--vbios needs --board (PROJECT_SKU_CHIPSKU), or give --evidence")
    if not (driver or vbios or evidence or cvm_evidence):
        raise UsageError("give --driver, --vbios with --board, --evidence or --cvm-evidence")
    now = parse_time(at)
    settings = NetworkSettings(
        rim_url=rim_url,
        ocsp_url=ocsp_url,
        service_key=service_key,
        ocsp_nonce=not no_ocsp_nonce,
        use_cache=False,
        timeout=timeout,
        deadline=deadline,
        kds_url=cvm_kds_url,
    )
    roots = TrustRoots.nvidia()
    rim_ids: list[str] = []
    chains: list[Any] = []
    if driver:
        rim_ids.append(preflight.driver_rim_id(driver, gpu))
    if vbios and board:
        rim_ids.append(preflight.vbios_rim_id(vbios, board))
    if evidence is not None:
        from gpucc.gpuattest.bundle import evidence_rim_ids
        from gpucc.gpuattest.chain import load_pem_chain

        from .attest import load_evidence

        ev = load_evidence(evidence, None)
        rim_ids += evidence_rim_ids(ev.gpus)
        chains = [load_pem_chain(g.cert_chain_pem) for g in ev.gpus]
    items: list[preflight.PreflightItem] = []
    with build_fetcher(settings) as fetcher:
        rims, ocsp = network_sources(settings, fetcher)
        items += preflight.check_rims(rim_ids, rims=rims, ocsp=ocsp, roots=roots, now=now)
        items += preflight.check_device_chains(chains, ocsp=ocsp, roots=roots, now=now)
    if cvm_evidence is not None:
        items.append(_cvm_item(cvm_evidence, settings, now, cvm_pccs_url))
    report = preflight.PreflightReport(tuple(items), now)
    if fmt is OutputFormat.JSON:
        emit(report.to_json())
    else:
        for item in report.items:
            out(
                f"{item.status:<13} {item.kind:<4} {item.name}"
                + (f": {item.detail}" if item.detail else "")
            )
        out(f"decision: {report.decision}")
    if report.decision == "refused":
        raise typer.Exit(NOT_TRUSTED.code)
    if report.decision == "undecided":
        raise typer.Exit(COLLATERAL.code)


def _cvm_item(path: Path, settings: Any, now: dt.datetime, pccs_url: str | None) -> Any:
    from gpucc.assembly.parts import PartContext, default_parts
    from gpucc.core.errors import CollateralUnavailableError
    from gpucc.core.files import read_capped
    from gpucc.gpuattest import preflight
    from gpucc.gpuattest.cvm.vtpm_evidence import parse_vtpm_evidence
    from gpucc.gpuattest.policy import Policy

    data = read_capped(path, 64 * 1024 * 1024, what="CVM evidence")
    part = default_parts().classify_cvm(data)  # the kind, decided once
    # what the collateral is for: a paravisor's vTPM evidence wraps a TDX or SEV-SNP report
    tee = parse_vtpm_evidence(data).hcl.tee if part.name == "vtpm" else part.name
    kind = "snp" if tee == "snp" else "tdx"
    context = PartContext(policy=Policy(), now=now, network=settings, pccs_url=pccs_url)
    try:
        collateral = part.fetch_collateral(data, context)
    except CollateralUnavailableError as exc:
        return preflight.PreflightItem("cvm", f"{kind} collateral", "unavailable", str(exc))
    if collateral is None and kind == "tdx":  # a TD quote never carries Intel's collateral
        why = "Intel's TCB collateral for the TD quote could not be fetched"
        return preflight.PreflightItem("cvm", "tdx collateral", "unavailable", why)
    return preflight.check_cvm_collateral(collateral, kind, now)
