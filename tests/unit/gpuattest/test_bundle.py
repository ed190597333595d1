"""Collateral bundles: collected online, verified offline, strict on load; netconfig composition."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import json
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpucc.cli.exitcodes import exit_code_for
from gpucc.core.errors import FileAccessError, OfflineError, RimNotFoundError, UsageError
from gpucc.core.transport import RequestsFetcher
from gpucc.gpuattest.bundle import (
    BUNDLE_FORMAT,
    Bundle,
    BundleOcspChecker,
    BundleOcspEntry,
    BundleRimSource,
    CollectionResult,
    MalformedBundleError,
    collect_collateral,
    load_bundle,
    rim_kind,
    write_bundle,
)
from gpucc.gpuattest.collateral import ChainKind, OcspStatus, OcspTarget, RimSource, ocsp_targets
from gpucc.gpuattest.netconfig import FallbackOcspChecker, NetworkSettings, build_collateral
from gpucc.gpuattest.ocsp import OcspClient
from gpucc.gpuattest.ocsp_response import CertId
from gpucc.gpuattest.rim_service import RimServiceSource
from tests.support.netfixtures import (
    DRIVER_RIM_ID,
    NOW,
    VBIOS_RIM,
    VBIOS_RIM_ID,
    LocalServer,
    NetPki,
    OcspBehaviour,
    OcspResponder,
    RimService,
    build_pki,
    make_rim_document,
    ocsp_target,
    resign,
    serve,
)
from tests.support.paths import DATA


@pytest.fixture(autouse=True)
def _no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


@dataclass
class Tripwire:
    """A fetcher that records and refuses every request: proves nothing went to the network."""

    calls: list[str] = field(default_factory=list)

    def get(
        self,
        url: str,
        *,
        max_bytes: int,
        accept: Collection[int] = (200,),
        headers: Mapping[str, str] | None = None,
        bearer: str | None = None,
        guard: object = None,
    ) -> bytes:
        self.calls.append(url)
        raise OfflineError(f"tripwire: GET {url}")

    def post(
        self,
        url: str,
        body: bytes,
        *,
        content_type: str,
        max_bytes: int,
        accept: Collection[int] = (200,),
        headers: Mapping[str, str] | None = None,
        bearer: str | None = None,
        guard: object = None,
    ) -> bytes:
        self.calls.append(url)
        raise OfflineError(f"tripwire: POST {url}")


@pytest.fixture(scope="module")
def pki() -> NetPki:
    return build_pki()


@pytest.fixture
def rims(pki: NetPki) -> dict[str, bytes]:
    return {
        DRIVER_RIM_ID: make_rim_document(pki.rim_chain),
        VBIOS_RIM_ID: make_rim_document(pki.rim_chain, VBIOS_RIM),
    }


@pytest.fixture
def rim_service(rims: dict[str, bytes]) -> RimService:
    return RimService(rims)


@pytest.fixture
def responder(pki: NetPki) -> OcspResponder:
    return OcspResponder(pki)


@pytest.fixture
def servers(
    rim_service: RimService, responder: OcspResponder
) -> Iterator[tuple[LocalServer, LocalServer]]:
    with serve(rim_service) as rim_srv, serve(responder) as ocsp_srv:
        yield rim_srv, ocsp_srv


@pytest.fixture
def fetcher() -> Iterator[RequestsFetcher]:
    with RequestsFetcher(timeout=(0.5, 0.5), retries=0) as f:
        yield f


def collect(
    pki: NetPki, servers: tuple[LocalServer, LocalServer], fetcher: RequestsFetcher
) -> CollectionResult:
    rim_srv, ocsp_srv = servers
    return collect_collateral(
        device_chains=[pki.device_chain, pki.device_chain],  # two GPUs, same intermediates
        rim_ids=[DRIVER_RIM_ID, VBIOS_RIM_ID, DRIVER_RIM_ID],
        rim_source=RimServiceSource(fetcher=fetcher, base_url=rim_srv.url),
        ocsp=OcspClient(fetcher=fetcher, url=ocsp_srv.url),
        roots=pki.roots,
        now=NOW,
    )


@pytest.fixture(scope="module")
def collected(pki: NetPki) -> bytes:
    """One online collection (shared: building it costs a few hundred milliseconds)."""
    rims = {
        DRIVER_RIM_ID: make_rim_document(pki.rim_chain),
        VBIOS_RIM_ID: make_rim_document(pki.rim_chain, VBIOS_RIM),
    }
    with (
        serve(RimService(rims)) as rim_srv,
        serve(OcspResponder(pki)) as ocsp_srv,
        RequestsFetcher(timeout=(0.5, 0.5), retries=0) as fetcher,
    ):
        result = collect(pki, (rim_srv, ocsp_srv), fetcher)
    assert result.complete, result.problems
    return result.bundle.to_json()


@pytest.fixture
def bundle_file(tmp_path: Path, collected: bytes) -> Path:
    path = tmp_path / "collateral.json"
    write_bundle(Bundle.from_json(collected), path)
    return path


def all_targets(pki: NetPki) -> list[OcspTarget]:
    device = ocsp_targets(
        pki.device_chain, kind=ChainKind.DEVICE, anchor=pki.device_root.cert, now=NOW
    )
    rim = ocsp_targets(pki.rim_chain, kind=ChainKind.DRIVER_RIM, anchor=pki.rim_root.cert, now=NOW)
    return [*device, *rim]


# --- which certificates ------------------------------------------------------------------


def test_ocsp_targets_follow_nvidia(pki: NetPki) -> None:
    device = ocsp_targets(
        pki.device_chain, kind=ChainKind.DEVICE, anchor=pki.device_root.cert, now=NOW
    )
    assert [t.cert for t in device] == pki.device_chain[1:4]
    assert [t.issuer for t in device] == pki.device_chain[2:5]
    assert device[0].issuer_chain == tuple(pki.device_chain[3:])
    assert {t.now for t in device} == {NOW}
    rim = ocsp_targets(pki.rim_chain, kind=ChainKind.VBIOS_RIM, anchor=pki.rim_root.cert, now=NOW)
    assert [t.cert for t in rim] == pki.rim_chain[0:3]
    # The chain's own root is replaced by the pinned anchor.
    other = ocsp_targets(
        [*pki.device_chain[:-1], pki.rim_root.cert],
        kind=ChainKind.DEVICE,
        anchor=pki.device_root.cert,
        now=NOW,
    )
    assert other[-1].issuer == pki.device_root.cert
    assert (
        ocsp_targets(
            pki.device_chain[:1], kind=ChainKind.DEVICE, anchor=pki.device_root.cert, now=NOW
        )
        == ()
    )
    assert rim_kind(DRIVER_RIM_ID) is ChainKind.DRIVER_RIM
    assert rim_kind(VBIOS_RIM_ID) is ChainKind.VBIOS_RIM


# --- collected online --------------------------------------------------------------------


def test_collect_gathers_everything_once(
    pki: NetPki,
    servers: tuple[LocalServer, LocalServer],
    fetcher: RequestsFetcher,
    rims: dict[str, bytes],
) -> None:
    result = collect(pki, servers, fetcher)
    assert result.complete, result.problems
    assert dict(result.bundle.rims) == rims
    assert len(result.bundle.ocsp) == 6  # device 1..3 and RIM 0..2, shared ones asked once
    rim_srv, ocsp_srv = servers
    assert rim_srv.count == 2
    assert ocsp_srv.count == 6
    assert all(out.status is OcspStatus.GOOD for _, _, out in result.outcomes)
    assert result.bundle.created == NOW


def test_round_trip_through_a_file(bundle_file: Path, pki: NetPki, rims: dict[str, bytes]) -> None:
    doc = json.loads(bundle_file.read_text())
    assert doc["format"] == BUNDLE_FORMAT and doc["version"] == 1
    assert set(doc) == {"format", "version", "created", "rims", "ocsp"}
    bundle = load_bundle(bundle_file)
    assert dict(bundle.rims) == rims
    assert load_bundle(bundle_file) == bundle
    assert Bundle.from_json(bundle.to_json()) == bundle
    assert not list(bundle_file.parent.glob(".*.tmp"))


def test_collect_reports_what_it_could_not_get(
    pki: NetPki,
    servers: tuple[LocalServer, LocalServer],
    fetcher: RequestsFetcher,
    rim_service: RimService,
    responder: OcspResponder,
) -> None:
    rim_service.modes[VBIOS_RIM_ID] = "404"
    responder.by_serial[pki.ica.cert.serial_number] = OcspBehaviour(http_status=500)
    responder.by_serial[pki.brom.cert.serial_number] = OcspBehaviour(nonce="wrong")
    result = collect(pki, servers, fetcher)
    assert not result.complete
    text = "\n".join(result.problems)
    assert "NV_GPU_VBIOS" in text and "not published" in text
    assert "Provisioner ICA" in text and "HTTP 500" in text
    assert "BROM" in text and "nonce" in text  # a replayed-looking answer is not stored
    assert list(result.bundle.rims) == [DRIVER_RIM_ID]
    assert len(result.bundle.ocsp) == 4  # identity + the RIM chain's three


def test_collect_without_ocsp_and_with_a_broken_rim(
    pki: NetPki, rim_service: RimService, servers: tuple[LocalServer, LocalServer]
) -> None:
    rim_service.rims[DRIVER_RIM_ID] = b"<not-a-rim/>"
    rim_srv, _ = servers
    with RequestsFetcher(timeout=(0.5, 0.5), retries=0) as fetcher:
        source = RimServiceSource(fetcher=fetcher, base_url=rim_srv.url)
        rims_only = collect_collateral(
            device_chains=[pki.device_chain],
            rim_ids=[DRIVER_RIM_ID],
            rim_source=source,
            ocsp=None,
            roots=pki.roots,
            now=NOW,
        )
        assert rims_only.complete and not rims_only.bundle.ocsp
        _, ocsp_srv = servers
        with_ocsp = collect_collateral(
            device_chains=[],
            rim_ids=[DRIVER_RIM_ID],
            rim_source=source,
            ocsp=OcspClient(fetcher=fetcher, url=ocsp_srv.url),
            roots=pki.roots,
            now=NOW,
        )
    assert any("RIM NV_GPU_DRIVER" in p for p in with_ocsp.problems)


# --- verified offline -----------------------------------------------------------------------


def test_bundle_verifies_offline_without_any_network(bundle_file: Path, pki: NetPki) -> None:
    tripwire = Tripwire()
    settings = NetworkSettings(bundle=bundle_file, offline=True, use_cache=False)
    rim_source, checker = build_collateral(settings, roots=pki.roots, fetcher=tripwire)
    assert rim_source.get_rim(DRIVER_RIM_ID) == make_rim_document_from(bundle_file, DRIVER_RIM_ID)
    assert isinstance(checker, FallbackOcspChecker)
    for t in all_targets(pki):
        out = checker.check(t)
        assert out.status is OcspStatus.GOOD, out.reason
        assert out.response_valid is True
        assert out.nonce_match is None  # no nonce for this use; freshness from nextUpdate
        assert "collateral bundle" in out.reason
    assert tripwire.calls == []


def make_rim_document_from(path: Path, rim_id: str) -> bytes:
    return base64.b64decode(json.loads(path.read_text())["rims"][rim_id])


def test_bundle_after_next_update_is_stale_with_its_age(bundle_file: Path, pki: NetPki) -> None:
    checker = BundleOcspChecker(load_bundle(bundle_file))
    later = NOW + dt.timedelta(days=4)  # nextUpdate was NOW + 1 day
    for t in all_targets(pki):
        out = checker.check(dataclasses.replace(t, now=later))
        assert out.status is OcspStatus.NOT_CHECKED
        assert out.collateral_missing is True
        assert out.reason.startswith("stale: response expired 3 days ago")


def test_offline_stale_bundle_stays_not_checked(bundle_file: Path, pki: NetPki) -> None:
    tripwire = Tripwire()
    settings = NetworkSettings(bundle=bundle_file, offline=True, use_cache=False)
    _, checker = build_collateral(settings, fetcher=tripwire)
    assert isinstance(checker, FallbackOcspChecker)
    t = all_targets(pki)[0]
    out = checker.check(
        ocsp_target(
            t.cert,
            t.issuer,
            kind=t.kind,
            anchor=t.anchor,
            now=NOW + dt.timedelta(days=4),
            issuer_chain=t.issuer_chain,
        )
    )
    assert out.status is OcspStatus.NOT_CHECKED and out.collateral_missing
    assert "stale" in out.reason and "tripwire" in out.reason
    assert len(tripwire.calls) == 1  # the OCSP client tried, and the tripwire refused


def test_online_fallback_when_the_bundle_is_stale(
    bundle_file: Path,
    pki: NetPki,
    servers: tuple[LocalServer, LocalServer],
    fetcher: RequestsFetcher,
    responder: OcspResponder,
) -> None:
    _, ocsp_srv = servers
    later = NOW + dt.timedelta(days=4)
    responder.now = later
    settings = NetworkSettings(bundle=bundle_file, ocsp_url=ocsp_srv.url, use_cache=False)
    _, checker = build_collateral(settings, fetcher=fetcher)
    assert isinstance(checker, FallbackOcspChecker)
    before = ocsp_srv.count
    t = all_targets(pki)[0]
    out = checker.check(dataclasses.replace(t, now=later))
    assert out.status is OcspStatus.GOOD and out.nonce_match is True
    assert ocsp_srv.count == before + 1


def test_tampered_bundle_response_is_invalid_and_not_papered_over(
    bundle_file: Path, pki: NetPki, servers: tuple[LocalServer, LocalServer]
) -> None:
    bundle = load_bundle(bundle_file)
    forged = [BundleOcspEntry(e.cert_id, resign(e.response, pki.rogue.key)) for e in bundle.ocsp]
    tampered = Bundle(created=bundle.created, rims=bundle.rims, ocsp=tuple(forged))
    path = bundle_file.with_name("tampered.json")
    write_bundle(tampered, path)
    _, ocsp_srv = servers
    settings = NetworkSettings(bundle=path, ocsp_url=ocsp_srv.url, use_cache=False)
    _, checker = build_collateral(settings)
    assert isinstance(checker, FallbackOcspChecker)
    t = all_targets(pki)[0]
    out = checker.check(t)
    assert out.response_valid is False and out.status is OcspStatus.UNKNOWN
    assert "signature" in out.reason


def test_bundle_entry_for_the_wrong_certificate(bundle_file: Path, pki: NetPki) -> None:
    bundle = load_bundle(bundle_file)
    t_brom, t_ica = all_targets(pki)[0], all_targets(pki)[1]
    ica_entry = bundle.ocsp_entry(CertId.for_certificate(t_ica.cert, t_ica.issuer))
    assert ica_entry is not None
    # The BROM's CertID, carrying the ICA's response.
    swapped = BundleOcspEntry(
        CertId.for_certificate(t_brom.cert, t_brom.issuer), ica_entry.response
    )
    checker = BundleOcspChecker(Bundle(created=NOW, ocsp=(swapped,)))
    out = checker.check(t_brom)
    assert out.response_valid is False


def test_missing_entries(pki: NetPki) -> None:
    empty = Bundle(created=NOW)
    t = all_targets(pki)[0]
    out = BundleOcspChecker(empty).check(
        ocsp_target(t.cert, t.issuer, kind=t.kind, anchor=t.anchor, now=NOW)
    )
    assert out.status is OcspStatus.NOT_CHECKED and out.collateral_missing
    assert "no OCSP response" in out.reason
    with pytest.raises(RimNotFoundError):
        BundleRimSource(empty).get_rim(DRIVER_RIM_ID)


# --- strict loading --------------------------------------------------------------------------


def mutations(doc: dict[str, object]) -> list[object]:
    entry = dict(doc["ocsp"][0])  # type: ignore[index]
    first_rim = next(iter(doc["rims"]))  # type: ignore[call-overload]

    def with_entry(**changes: object) -> dict[str, object]:
        return dict(doc, ocsp=[dict(entry, **changes)])

    return [
        [doc],
        dict(doc, format="something-else"),
        dict(doc, version=2),
        dict(doc, version="1"),
        dict(doc, version=True),
        {k: v for k, v in doc.items() if k != "ocsp"},
        dict(doc, extra=1),
        dict(doc, created="yesterday"),
        dict(doc, created="2026-01-15T12:00:00"),
        dict(doc, rims=[]),
        dict(doc, rims={"../../etc/passwd": "PA=="}),
        dict(doc, rims={first_rim: "***"}),
        dict(doc, rims={first_rim: ""}),
        dict(doc, ocsp={}),
        dict(doc, ocsp=[{k: v for k, v in entry.items() if k != "subject"}]),
        with_entry(cert_id="0" * 64),
        with_entry(hash_algorithm="md5"),
        with_entry(issuer_key_hash="XYZ"),
        with_entry(issuer_name_hash="00"),
        with_entry(response=base64.b64encode(b"not DER").decode()),
        with_entry(subject=7),
        dict(doc, ocsp=[entry, entry]),
    ]


@pytest.mark.parametrize("index", range(22))
def test_malformed_bundles_are_refused(bundle_file: Path, index: int) -> None:
    doc = json.loads(bundle_file.read_text())
    bad = mutations(doc)[index]
    bundle_file.write_text(json.dumps(bad))
    with pytest.raises(MalformedBundleError) as info:
        load_bundle(bundle_file)
    assert exit_code_for(info.value) == 4
    assert "\n" not in info.value.diagnostics()


@pytest.mark.parametrize("content", [b"", b"{", b"\xff\xfe", b"null"])
def test_non_json_bundles_are_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "b.json"
    path.write_bytes(content)
    with pytest.raises(MalformedBundleError):
        load_bundle(path)


def test_unreadable_and_oversized_bundles(
    tmp_path: Path, bundle_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(FileAccessError):
        load_bundle(tmp_path / "absent.json")
    from gpucc.gpuattest import bundle as bundle_module

    monkeypatch.setattr(bundle_module, "MAX_BUNDLE_BYTES", 1000)
    with pytest.raises(MalformedBundleError, match="larger than"):
        load_bundle(bundle_file)


# --- netconfig ------------------------------------------------------------------------------


def test_settings_repr_hides_the_key() -> None:
    settings = NetworkSettings(service_key="nvapi-VERY-SECRET")
    assert "nvapi-VERY-SECRET" not in repr(settings)


def test_offline_without_bundle_or_cache(pki: NetPki) -> None:
    tripwire = Tripwire()
    rim_source, checker = build_collateral(
        NetworkSettings(offline=True, use_cache=False),
        fetcher=tripwire,
    )
    with pytest.raises(OfflineError):
        rim_source.get_rim(DRIVER_RIM_ID)
    t = all_targets(pki)[0]
    out = checker.check(ocsp_target(t.cert, t.issuer, kind=t.kind, anchor=t.anchor, now=NOW))
    assert out.status is OcspStatus.NOT_CHECKED and out.collateral_missing


def test_ocsp_disabled_is_not_collateral_missing(pki: NetPki) -> None:
    _, checker = build_collateral(NetworkSettings(check_ocsp=False, use_cache=False))
    t = all_targets(pki)[0]
    out = checker.check(ocsp_target(t.cert, t.issuer, kind=t.kind, anchor=t.anchor, now=NOW))
    assert out.status is OcspStatus.NOT_CHECKED and out.collateral_missing is False


def test_cache_directory_from_settings(
    tmp_path: Path,
    pki: NetPki,
    servers: tuple[LocalServer, LocalServer],
    fetcher: RequestsFetcher,
) -> None:
    rim_srv, ocsp_srv = servers
    settings = NetworkSettings(
        rim_url=rim_srv.url, ocsp_url=ocsp_srv.url, cache_dir=tmp_path / "c", timeout=0.5
    )
    rim_source: RimSource
    rim_source, checker = build_collateral(settings, fetcher=fetcher)
    assert isinstance(checker, FallbackOcspChecker)
    rim_source.get_rim(DRIVER_RIM_ID)
    rim_source.get_rim(DRIVER_RIM_ID)
    assert rim_srv.count == 1
    t = all_targets(pki)[1]
    for _ in range(2):
        out = checker.check(t)
        assert out.status is OcspStatus.GOOD
    assert ocsp_srv.count == 1
    assert (tmp_path / "c" / "rim").is_dir() and (tmp_path / "c" / "ocsp").is_dir()
    with pytest.raises(UsageError):
        build_collateral(NetworkSettings(timeout=0))


# --- the CLI --------------------------------------------------------------------------------

SET_A = DATA / "nvidia-samples" / "set-a-h100-545.00"


def test_cli_fetch_writes_what_it_got_and_exits_3_for_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from gpucc.cli.collateral import collateral_app

    secret = "nvapi-CLI-SECRET-KEY"
    monkeypatch.setenv("NV_ATTESTATION_SERVICE_KEY", secret)
    out = tmp_path / "bundle.json"
    with serve(RimService.with_samples()) as rim_srv, serve(OcspResponder(build_pki())) as ocsp_srv:
        result = CliRunner().invoke(
            collateral_app,
            [
                "fetch",
                "--evidence",
                str(SET_A / "attestation-report.hex"),
                "--cert-chain",
                str(SET_A / "cert-chain.pem"),
                "-o",
                str(out),
                "--rim-url",
                rim_srv.url,
                "--ocsp-url",
                ocsp_srv.url,
                "--cache-dir",
                str(tmp_path / "cache"),
                "--timeout",
                "0.5",
            ],
        )
        assert rim_srv.seen[0].headers["Authorization"] == f"Bearer {secret}"
    # NVIDIA's real chains cannot be answered by the test responder: RIMs in, OCSP missing.
    # the command reported its outcome (line and exit status 3, collateral unavailable);
    # run_app turns that into the process's status
    assert getattr(result.exception, "code", None) == 3, result.output
    assert "collateral incomplete" in result.output
    assert secret not in result.output
    assert "RIM  NV_GPU_DRIVER_GH100_545.00" in result.output
    assert "missing: OCSP for 'GH100 A01 GSP BROM'" in result.output
    bundle = load_bundle(out)
    assert sorted(bundle.rims) == [DRIVER_RIM_ID, VBIOS_RIM_ID]
    assert bundle.ocsp == ()

    shown = CliRunner().invoke(collateral_app, ["show", str(out)])
    assert shown.exit_code == 0
    assert f"RIM  {DRIVER_RIM_ID}" in shown.output


def test_cli_show_lists_ocsp_windows(bundle_file: Path) -> None:
    from typer.testing import CliRunner

    from gpucc.cli.collateral import collateral_app

    shown = CliRunner().invoke(collateral_app, ["show", str(bundle_file)])
    assert shown.exit_code == 0, shown.output
    assert shown.output.count("OCSP ") == 6
    assert "nextUpdate 2026-01-16T12:00:00+00:00" in shown.output
