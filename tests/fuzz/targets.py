"""One fuzz target per parser, each seeded from the project's real samples (harness.py says
what a target is and how to add one)."""

from __future__ import annotations

import atexit
import base64
import datetime as dt
import functools
import json
import os
import shutil
import tempfile
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tests.fuzz.harness import target
from tests.support.paths import DATA, SAMPLES

AT = dt.datetime(2025, 6, 19, 11, 16, 3, tzinfo=dt.UTC)
NOW = dt.datetime(2026, 1, 15, 12, tzinfo=dt.UTC)
TDX, SNP, CLOUD = DATA / "cpu-tee" / "tdx", DATA / "cpu-tee" / "snp", DATA / "cloud-cvm"
VTPM = (
    CLOUD / "azure-snp-vtpm" / "evidence-v1.json",
    CLOUD / "azure-tdx-vtpm" / "evidence-v1.json",
)


@functools.cache
def _work() -> Path:
    """A scratch directory for targets that read files (removed at exit)."""
    path = Path(tempfile.mkdtemp(prefix="gpucc-fuzz-"))
    atexit.register(shutil.rmtree, path, True)
    return path


def _file(name: str, data: bytes) -> Path:
    path = _work() / name
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    return path


def _hex(path: Path) -> bytes:
    return bytes.fromhex(path.read_text().strip())


def _read(*paths: Path) -> list[bytes]:
    return [p.read_bytes() for p in paths]


# --- GPU and NVSwitch -------------------------------------------------------------------


def _reports() -> list[bytes]:
    return [_hex(SAMPLES / d / "attestation-report.hex") for d in
            ("set-a-h100-545.00", "h100-550.90.07", "b200-575.32")]  # fmt: skip


@target("gpu-report", _reports)
def gpu_report(data: bytes) -> object:
    from gpucc.gpuattest.report import AttestationReport

    return AttestationReport.parse(data)


@target(
    "switch-report",
    lambda: [_hex(SAMPLES / "ls10-switch-96.10.55.00.01" / "attestation-report.hex")],
)
def switch_report(data: bytes) -> object:
    from gpucc.gpuattest.switch_report import SwitchReport

    return SwitchReport.parse(data)


@functools.cache
def _simulated_gpu() -> object:
    from gpucc.gpuattest.simulate import SimulatedGpu

    return SimulatedGpu.create(now=NOW)


def _evidence_json() -> list[bytes]:
    from gpucc.gpuattest.evidence import dump_evidence_json

    gpu = _simulated_gpu()
    return [
        (SAMPLES / "ls10-switch-96.10.55.00.01" / "switch_evidence_ls10.json").read_bytes(),
        dump_evidence_json(gpu.evidence(b"\x01" * 32)),  # type: ignore[attr-defined]
    ]


@target("evidence-json", _evidence_json)
def evidence_json(data: bytes) -> object:
    from gpucc.gpuattest.evidence import load_evidence_json

    return load_evidence_json(data)


def _rims() -> list[bytes]:
    return _read(*sorted(SAMPLES.glob("set-a-h100-545.00/*.swidtag")),
                 sorted((SAMPLES / "vbios-rims-prod").glob("*.swidtag"))[0])  # fmt: skip


@target("rim-xml", _rims)
def rim_xml(data: bytes) -> object:
    from gpucc.gpuattest.rim import ReferenceManifest, validate_schema

    manifest = ReferenceManifest.parse(data)
    return validate_schema(manifest)


# --- certificates -----------------------------------------------------------------------


def _certificates() -> list[bytes]:
    return [(SAMPLES / "set-a-h100-545.00" / "cert-chain.pem").read_bytes(),
            (SNP / "vcek.der").read_bytes(), (CLOUD / "snp-vlek" / "vlek.der").read_bytes()]  # fmt: skip


@target("certificates", _certificates, corpus=("cert-chain--",))
def certificates(data: bytes) -> object:
    from gpucc.gpuattest.chain import load_pem_chain, validate_chain
    from gpucc.gpuattest.trust import TrustRoots
    from gpucc.gpuattest.x509chain import load_certificate

    if data.lstrip().startswith(b"-----BEGIN"):
        chain = load_pem_chain(data)
        return validate_chain(chain, TrustRoots.nvidia().device_root, NOW)
    return load_certificate(data, what="a certificate")


@target("snp-vcek", lambda: _read(SNP / "vcek.der"), corpus=("snp-vcek--",))
def snp_vcek(data: bytes) -> object:
    return _cvm(_read(SNP / "report.bin")[0], data)


# --- CVM evidence -----------------------------------------------------------------------


def _cvm(evidence: bytes, collateral: bytes | None) -> object:
    from gpucc.gpuattest.cvm.appraise import verify_cvm_evidence
    from gpucc.gpuattest.policy import Policy

    return verify_cvm_evidence(
        evidence, collateral, now=AT, policy=Policy().cvm, expected_report_data=bytes(64)
    )


@target("tdx-quote", lambda: _read(TDX / "quote.bin", CLOUD / "tdx-ccel" / "tdx_quote_4.dat"),
        corpus=("tdx-quote--", "holder-http--"))  # fmt: skip
def tdx_quote(data: bytes) -> object:
    return _cvm(data, (TDX / "collateral.json").read_bytes())


@target("tdx-quote-nocoll", lambda: _read(TDX / "quote.bin", CLOUD / "tdx-ccel" / "tdx_quote_4.dat"),
        corpus=("tdx-quote-nocoll--", "holder-http--"))  # fmt: skip
def tdx_quote_nocoll(data: bytes) -> object:
    return _cvm(data, None)


@target("tdx-collateral", lambda: _read(TDX / "collateral.json"), corpus=("tdx-collateral--",))
def tdx_collateral(data: bytes) -> object:
    return _cvm((TDX / "quote.bin").read_bytes(), data)


@target("snp-report", lambda: _read(SNP / "report.bin", CLOUD / "snp-vlek" / "report.bin"))
def snp_report(data: bytes) -> object:
    from gpucc.gpuattest.cvm.snp_report import parse_snp_report

    parse_snp_report(data)
    return _cvm(data, (SNP / "vcek.der").read_bytes())


@target("vtpm-evidence", lambda: _read(*VTPM), corpus=("vtpm-json--",))
def vtpm_evidence(data: bytes) -> object:
    return _cvm(data, None)


def _vtpm_part(key: str) -> list[bytes]:
    out = []
    for path in VTPM:
        doc = json.loads(path.read_bytes())
        value = doc[key]
        out.append(
            base64.urlsafe_b64decode(value)
            if key == "hcl_report"
            else bytes.fromhex(value["message"])
        )
    return out


@target("hcl-report", lambda: _vtpm_part("hcl_report"))
def hcl_report(data: bytes) -> object:
    from gpucc.gpuattest.cvm.hcl import parse_hcl_report, parse_runtime_claims

    return parse_runtime_claims(parse_hcl_report(data).runtime_claims)


@target("tpm-quote", lambda: _vtpm_part("tpm_quote"))
def tpm_quote(data: bytes) -> object:
    from gpucc.gpuattest.cvm.tpm_quote import parse_tpm_quote

    return parse_tpm_quote(data)


@target("cc-eventlog", lambda: _read(CLOUD / "tdx-ccel" / "CCEL_data"))
def cc_eventlog(data: bytes) -> object:
    from gpucc.gpuattest.cvm.eventlog import parse_event_log, replay

    return replay(parse_event_log(data).events)


@target("tpm-eventlog", lambda: _read(CLOUD / "tdx-ccel" / "CCEL_data"))
def tpm_eventlog(data: bytes) -> object:
    from gpucc.gpuattest.cvm.eventlog import parse_event_log
    from gpucc.gpuattest.cvm.tpmlog import replay_pcrs

    return replay_pcrs(parse_event_log(data, require_sha384=False, pcrs=True).events)


# --- gpucc's own documents --------------------------------------------------------------


@functools.cache
def _sealed() -> tuple[bytes, list[Path]]:
    """A key-file key, and a sealed file and a two-shard set under it."""
    from gpucc.staging.format import write_key_file
    from gpucc.staging.seal import seal_file
    from gpucc.staging.shards import seal_shards

    work = _work() / "sealed"
    (work / "shards").mkdir(parents=True)
    kek = write_key_file(work / "data.key")
    (work / "plain").write_bytes(os.urandom(40_000))
    seal_file(work / "plain", work / "one.gcc", kek=kek, chunk_size=16384)
    seal_shards(work / "plain", work / "shards", 2, kek=kek, chunk_size=16384)
    return kek, [work / "one.gcc", *sorted((work / "shards").iterdir())]


@target("sealed-file", lambda: [_sealed()[1][0].read_bytes()])
def sealed_file(data: bytes) -> object:
    from gpucc.staging.dataset import open_sealed
    from gpucc.staging.verify import verify_cpu

    kek = _sealed()[0]
    dataset = open_sealed(_file("fuzz.gcc", data), kek=kek)
    return verify_cpu(dataset, dataset.unwrap(kek), threads=1)


@target("shard-set", lambda: [_sealed()[1][1].read_bytes()])
def shard_set(data: bytes) -> object:
    from gpucc.staging.shards import open_shard_set

    kek, paths = _sealed()
    mutated = _file(paths[1].name, data)
    return open_shard_set([mutated, paths[2]], kek=kek)


@target("key-file", lambda: [(_sealed()[1][0].parent / "data.key").read_bytes()])
def key_file(data: bytes) -> object:
    from gpucc.staging.format import read_key_file

    return read_key_file(_file("fuzz.key", data))


_POLICIES = [
    b"version: 1\nocsp:\n  require: false\nversions:\n  allowed_drivers: ['999.99.99']\n",
    b"version: 1\nocsp:\n  require: false\ncvm:\n  allow_gpu_only: true\n  measurements:\n"
    b"    tdx:\n      mrtd: '" + b"ab" * 48 + b"'\n",
]


@target("policy", lambda: list(_POLICIES))
def policy(data: bytes) -> object:
    from gpucc.gpuattest.policy import load_policy

    return load_policy(_file("policy.yaml", data))


_PLAN = (
    "version: 1\norchestrator: {key: orchestrator.key, log: travel-log.jsonl}\nholders:\n"
    "  - id: alice\n    url: http://127.0.0.1:8443\n    public_key: sha256:" + "ab" * 32 + "\n"
    "    datasets:\n      - {name: a-0, digest: '" + "cd" * 32 + "'}\n"
).encode()


@target("plan", lambda: [_PLAN])
def plan(data: bytes) -> object:
    from gpucc.travel.plan import load_plan

    return load_plan(_file("plan.yaml", data))


@functools.cache
def _offers() -> list[bytes]:
    from gpucc.gpuattest.cvm.tdx_sim import simulated_tdx
    from gpucc.keyrelease.protocol import CollectedCvmEvidence, CollectedEvidence, create_offer

    gpu, tdx = _simulated_gpu(), simulated_tdx(NOW)

    def collect(nonce: bytes) -> CollectedEvidence:
        return CollectedEvidence.from_evidence_set(gpu.evidence(nonce))  # type: ignore[attr-defined]

    def collect_cvm(report_data: bytes) -> CollectedCvmEvidence:
        return CollectedCvmEvidence(tdx.quote(report_data), tdx.collateral(issued=NOW).to_json())

    return [
        create_offer(b"\x07" * 32, collect)[0].to_json(),
        create_offer(b"\x08" * 32, collect, collect_cvm=collect_cvm)[0].to_json(),
    ]


@target("offer", _offers)
def offer(data: bytes) -> object:
    from gpucc.keyrelease.protocol import Offer

    return Offer.from_json(data)


def _answers() -> list[bytes]:
    from tests.unit.keyrelease.test_protocol import DATASET_ID, HEADER_DIGEST, PINNED

    wrap = {"dataset_id": DATASET_ID.hex(), "header_digest": HEADER_DIGEST.hex(),
            "record": base64.b64encode(bytes.fromhex(PINNED["wrap_record"])).decode()}  # fmt: skip
    doc = {"schema": "gpucc.session-answer/v1", "version": 1,
           "holder_public_key": PINNED["q_holder"], "transcript_hash": PINNED["transcript_hash"],
           "wraps": [wrap]}  # fmt: skip
    return [json.dumps(doc).encode()]


@target("answer", _answers)
def answer(data: bytes) -> object:
    from gpucc.keyrelease.protocol import Answer

    return Answer.from_json(data)


@functools.cache
def _eat_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP384R1())


def _eats() -> list[bytes]:
    from gpucc.gpuattest.eat import evidence_digest, sign_result_claims

    signed = sign_result_claims(
        [{"measres": "success", "ueid": str(i)} for i in range(2)],
        private_key=_eat_key(), nonce=b"\x05" * 32, now=NOW, overall_result=True,
        evidence_digests=[evidence_digest(f"r-{i}".encode()) for i in range(2)],
        policy_digest="ab" * 32,
    )  # fmt: skip
    return [signed.to_json().encode(), signed.overall_token.encode()]


@target("eat", _eats)
def eat(data: bytes) -> object:
    from gpucc.gpuattest.eat import verify_eat

    return verify_eat(data, _eat_key().public_key(), now=NOW)


def _jwks() -> list[bytes]:
    from gpucc.gpuattest.eat import key_id, public_jwk

    public = _eat_key().public_key()
    chain = (SAMPLES / "set-a-h100-545.00" / "cert-chain.pem").read_bytes()
    from cryptography import x509

    x5c = [base64.b64encode(c.public_bytes(serialization.Encoding.DER)).decode()
           for c in x509.load_pem_x509_certificates(chain)]  # fmt: skip
    plain = {**public_jwk(public), "kid": key_id(public), "alg": "ES384", "use": "sig"}
    return [json.dumps({"keys": [plain]}).encode(),
            json.dumps({"keys": [{**plain, "kid": "x", "x5c": x5c}]}).encode()]  # fmt: skip


@target("jwks", _jwks)
def jwks(data: bytes) -> object:
    from gpucc.gpuattest.jwks import parse_jwks

    return parse_jwks(data)


_BUNDLE = (
    b'{"format":"gpucc-collateral","version":1,"created":"2024-01-01T00:00:00+00:00",'
    b'"rims":{},"ocsp":[]}'
)


@target("collateral-bundle", lambda: [_BUNDLE], corpus=("bundle-json--",))
def collateral_bundle(data: bytes) -> object:
    from gpucc.gpuattest.bundle import Bundle

    return Bundle.from_json(data)


_HOLDER_CONFIG = (
    b"datasets: cfg/data\ndata-key: cfg/data.key\nholder-key: cfg/holder.key\n"
    b"listen: '127.0.0.1:8443'\nsimulate: roots\nstate: memory\nmetrics: true\n"
    b"rate: 500\nburst: 500\nchallenge-ttl-s: 60\ntrusted-proxy: ['10.0.0.1']\n"
    b"releases:\n  - {name: strict, datasets: [cfg-1], requesters: ['sha256:"
    + b"ab" * 32
    + b"']}\n"
)


@functools.cache
def _serve_context() -> object:
    import typer.main

    from gpucc.cli.holder import holder_app

    command = typer.main.get_command(holder_app).commands["serve"]  # type: ignore[attr-defined]
    return command.make_context("serve", [], resilient_parsing=True)


@target("holder-config", lambda: [_HOLDER_CONFIG], corpus=("holder-config--",))
def holder_config(data: bytes) -> object:
    from gpucc.cli.holder_config import _releases, apply_config
    from gpucc.cli.serving import parse_listen, parse_proxy

    ctx = _serve_context()
    p = apply_config(ctx, _file("holder.yaml", data), dict(ctx.params))  # type: ignore[arg-type, attr-defined]
    parse_listen(p["listen"])
    for proxy in p["trusted_proxy"] or ():
        parse_proxy(proxy)
    p["config_file"] = _work() / "holder.yaml"
    return _releases(p)
