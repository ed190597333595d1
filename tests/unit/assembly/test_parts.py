"""Platform parts as values: a kind of part is one class and one registration.

A toy device kind, written here and nowhere in the library, goes through the platform
verifier, key release and the ``gpucc.attest/v1`` document; CVM evidence is classified
once per verification, by its part kind alone.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from typing import Any

import pytest

from gpucc.assembly import PlatformEvidence, PlatformVerifier, Settings
from gpucc.assembly.parts import (
    Channel,
    Checked,
    CheckedDevices,
    CvmPartKind,
    DevicePartKind,
    PartContext,
    PartRegistry,
    VtpmPart,
    default_parts,
)
from gpucc.assembly.result import DEFAULT_SLOTS
from gpucc.core.errors import MalformedEvidenceError, UsageError
from gpucc.gpuattest.evidence import EvidenceSet, GpuEvidence
from gpucc.gpuattest.netconfig import NetworkSettings
from gpucc.gpuattest.result import Check, CheckStatus, Decision, Verdict
from gpucc.keyrelease.protocol import (
    CollectedCvmEvidence,
    CollectedEvidence,
    accept_offer,
    create_offer,
    new_challenge,
)
from gpucc.staging.errors import ProtocolError
from tests.support.paths import DATA

NONCE = bytes(range(32))


# --- the toy kind: what a maintainer adding a device writes ----------------------------


class ToyPart(DevicePartKind):
    """A device whose report is ``TOY1`` followed by the nonce it was asked for."""

    name = "toy"
    slot = "toys"
    label = "Toy"
    plural = "Toys"

    def recognises(self, evidence: Any) -> bool:
        return bool(evidence.arch == "TOY")

    def verify(self, evidence: Any, context: PartContext) -> CheckedDevices:
        toys = []
        for index, entry in enumerate(evidence.gpus):
            fresh = entry.report == b"TOY1" + (context.nonce or b"")
            check = Check(
                "toy-nonce",
                "Nonce",
                CheckStatus.PASS if fresh else CheckStatus.FAIL,
                "" if fresh else "the report does not carry the nonce",
                decision=Decision.ACCEPT if fresh else Decision.REFUSE,
            )
            toys.append(Checked.of([check], index=index, report=entry.report))
        return CheckedDevices.of(self.label, toys)


def toy_evidence(nonce: bytes) -> EvidenceSet:
    return EvidenceSet(gpus=(GpuEvidence(report=b"TOY1" + nonce, cert_chain_pem=b"", arch="TOY"),))


def toy_verifier(**settings: Any) -> PlatformVerifier:
    return PlatformVerifier(Settings(parts=default_parts().register(ToyPart()), **settings))


AT = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


# --- the toy through the verifier, the document and key release --------------------------


def test_a_toy_part_is_verified_reported_and_rendered() -> None:
    result = toy_verifier(at=AT).verify(PlatformEvidence(gpus=toy_evidence(NONCE)), nonce=NONCE)
    assert result.trusted and result.reasons == ()
    assert [p.kind.name for p in result.parts] == ["toy"] and result.gpu is None
    document = json.loads(json.dumps(result.to_dict()))
    slots = ["gpus", "cvm", "switches", "topology", "toys"]
    assert [k for k in document if k in slots] == slots
    (toy,) = document["toys"]
    assert toy["verdict"] == "trusted" and [c["id"] for c in toy["checks"]] == ["toy-nonce"]
    assert toy["evidence_sha256"] == hashlib.sha256(b"TOY1" + NONCE).hexdigest()
    assert document["gpus"] == [] and document["cvm"] is None
    assert document["nonce"] == NONCE.hex()  # a device part asks for the nonce

    from rich.console import Console

    from gpucc.cli.render import attest_document, render_text

    assert attest_document(result)["exit_code"] == 0
    console = Console(record=True, width=120)
    render_text(result, console)
    text = console.export_text()
    assert "Toy 0" in text and "| Nonce | pass" in text and "TRUSTED: 1 Toy verified" in text


def test_a_stale_toy_report_is_refused_with_its_reasons_and_failed_checks() -> None:
    stale = toy_evidence(bytes(32))
    result = toy_verifier(at=AT).verify(PlatformEvidence(gpus=stale), nonce=NONCE)
    assert result.verdict is Verdict.NOT_TRUSTED
    assert result.reasons == ("Toy 0: Nonce: the report does not carry the nonce",)
    assert [(f["part"], f["check"]) for f in result.failed_checks()] == [("Toy 0", "toy-nonce")]


def _offer(nonce_of: Any) -> tuple[Any, bytes]:
    challenge = new_challenge()
    offer, _ = create_offer(
        challenge, lambda nonce: CollectedEvidence.from_evidence_set(toy_evidence(nonce_of(nonce)))
    )
    return offer, challenge


def test_a_toy_part_gets_a_key_released() -> None:
    verifier = toy_verifier()
    seen: list[Any] = []
    offer, challenge = _offer(lambda nonce: nonce)
    session = accept_offer(
        offer, challenge=challenge, attest=verifier.gpu_attester(seen.append), allow_gpu_only=True
    )
    report = b"TOY1" + session.nonce
    assert session.report_digests == (hashlib.sha256(report).digest(),)
    assert [p.kind.name for p in seen[0].parts] == ["toy"] and seen[0].trusted


def test_a_stale_toy_part_gets_no_key() -> None:
    offer, challenge = _offer(lambda nonce: bytes(32))
    with pytest.raises(ProtocolError, match="Toy 0: Nonce"):
        accept_offer(
            offer, challenge=challenge, attest=toy_verifier().gpu_attester(), allow_gpu_only=True
        )


# --- a toy CVM kind: its own report-data rule, through key release version 2 -----------------


class ToyTee(CvmPartKind):
    """A confidential VM whose evidence is ``TOYQ`` and SHA-256 of the report data."""

    name = "toytee"

    def recognises(self, evidence: Any) -> bool:
        return bool(evidence[:4] == b"TOYQ")

    def bind_report_data(self, report_data: bytes) -> bytes:
        return hashlib.sha256(report_data).digest()

    def verify(self, evidence: Any, context: PartContext) -> Checked:
        bound = context.report_data is not None and evidence[4:] == context.report_data
        check = Check(
            "toy-report-data",
            "Report data",
            CheckStatus.PASS if bound else CheckStatus.FAIL,
            "" if bound else "another session's evidence",
            decision=Decision.ACCEPT if bound else Decision.REFUSE,
        )
        return Checked.of([check], report=evidence)


def toy_platform() -> PlatformVerifier:
    return PlatformVerifier(Settings(parts=default_parts().register(ToyPart()).register(ToyTee())))


def _v2_offer(bind: Any) -> tuple[Any, bytes]:
    challenge = new_challenge()
    offer, _ = create_offer(
        challenge,
        lambda nonce: CollectedEvidence.from_evidence_set(toy_evidence(nonce)),
        collect_cvm=lambda report_data: CollectedCvmEvidence(b"TOYQ" + bind(report_data)),
    )
    return offer, challenge


def test_a_toy_cvm_kind_binds_its_report_data_and_gets_a_key_released() -> None:
    verifier = toy_platform()
    seen: list[Any] = []
    offer, challenge = _v2_offer(ToyTee().bind_report_data)
    session = accept_offer(
        offer,
        challenge=challenge,
        attest=verifier.gpu_attester(),
        attest_cvm=verifier.cvm_attester(seen.append),
    )
    assert session.version == 2
    (result,) = seen
    assert [p.kind.name for p in result.parts] == ["toytee"] and result.trusted
    document = result.to_dict()
    assert document["cvm"]["checks"][0]["id"] == "toy-report-data"
    assert document["cvm"]["evidence_sha256"] == hashlib.sha256(offer.cvm_evidence).hexdigest()

    from rich.console import Console

    from gpucc.cli.render import render_text

    console = Console(record=True, width=120)
    render_text(result, console)
    assert "TRUSTED: the CVM (toytee) verified" in console.export_text()


def test_a_toy_cvm_bound_another_way_gets_no_key() -> None:
    verifier = toy_platform()
    offer, challenge = _v2_offer(lambda report_data: report_data[:32])  # not the kind's rule
    with pytest.raises(
        ProtocolError, match="CVM attestation is not trusted: Report data: another session"
    ):
        accept_offer(
            offer,
            challenge=challenge,
            attest=verifier.gpu_attester(),
            attest_cvm=verifier.cvm_attester(),
        )


# --- the registry is a value ---------------------------------------------------------------


def test_registering_makes_a_new_registry_and_leaves_the_default_alone() -> None:
    registry = default_parts().register(ToyPart())
    assert "toy" in [k.name for k in registry.kinds]
    assert "toy" not in [k.name for k in default_parts().kinds]
    assert default_parts().slots == DEFAULT_SLOTS
    with pytest.raises(UsageError, match="registered already"):
        registry.register(ToyPart())


def test_without_the_toy_kind_its_evidence_is_the_gpus_and_fails_closed() -> None:
    pieces = default_parts().pieces(toy_evidence(NONCE), None)
    assert [p.kind.name for p in pieces] == ["gpu"]
    with_toy = default_parts().register(ToyPart()).pieces(toy_evidence(NONCE), None)
    assert [p.kind.name for p in with_toy] == ["toy"]


def test_cvm_evidence_of_no_kind_is_refused_where_it_enters() -> None:
    with pytest.raises(MalformedEvidenceError, match="neither a TDX quote nor an SEV-SNP"):
        PartRegistry(default_parts().kinds).pieces(None, b"\x00" * 64)


def test_the_vtpm_kind_binds_report_data_as_its_qualifying_data() -> None:
    binding = hashlib.sha512(b"session").digest()
    assert VtpmPart().bind_report_data(binding) == binding[:32]
    tdx = default_parts().kind("tdx")
    assert tdx.bind_report_data(binding) == binding
    assert VtpmPart.channel is Channel.CVM


# --- one classification per verification ---------------------------------------------------


@pytest.fixture
def recognisers(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts every look at CVM evidence bytes for its kind, and every classification."""
    from gpucc.gpuattest.cvm import snp_report, tdx, vtpm_evidence

    counts = {"vtpm": 0, "tdx": 0, "snp": 0, "classify": 0}

    def counting(module: Any, name: str, key: str) -> None:
        real = getattr(module, name)

        def count(data: bytes) -> bool:
            counts[key] += 1
            return bool(real(data))

        monkeypatch.setattr(module, name, count)

    counting(vtpm_evidence, "looks_like_vtpm_evidence", "vtpm")
    counting(tdx, "looks_like_tdx_quote", "tdx")
    counting(snp_report, "looks_like_snp_report", "snp")
    real_classify = PartRegistry.classify

    def classify(self: PartRegistry, channel: Channel, evidence: Any) -> Any:
        counts["classify"] += channel is Channel.CVM
        return real_classify(self, channel, evidence)

    monkeypatch.setattr(PartRegistry, "classify", classify)
    return counts


def test_a_tdx_quote_is_classified_once_though_its_collateral_is_fetched(
    recognisers: dict[str, int], tmp_path: Any
) -> None:
    quote = (DATA / "cpu-tee" / "tdx" / "quote.bin").read_bytes()
    network = NetworkSettings(offline=True, cache_dir=tmp_path)  # fetched: not in the cache
    verifier = PlatformVerifier(Settings(network=network, at=AT))
    result = verifier.verify(PlatformEvidence(cvm=quote), cvm_report_data=bytes(64))
    assert result.cvm is not None and str(result.cvm.kind) == "tdx"
    assert result.verdict is Verdict.NOT_TRUSTED  # other report data, whatever the collateral
    assert recognisers == {"vtpm": 1, "tdx": 1, "snp": 0, "classify": 1}


def test_vtpm_evidence_is_classified_once(recognisers: dict[str, int]) -> None:
    evidence = (DATA / "cloud-cvm" / "azure-snp-vtpm" / "evidence-v1.json").read_bytes()
    settings = Settings(at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC), fetch_cvm_collateral=False)
    result = PlatformVerifier(settings).verify(
        PlatformEvidence(cvm=evidence), cvm_report_data=b"challenge"
    )
    assert result.trusted, result.reasons
    assert recognisers == {"vtpm": 1, "tdx": 0, "snp": 0, "classify": 1}


def test_a_verdict_over_nothing_is_never_made() -> None:
    with pytest.raises(ValueError, match="at least one check"):
        Checked.of([])
    with pytest.raises(ValueError, match="at least one device"):
        CheckedDevices.of("Toy", [])
    with pytest.raises(MalformedEvidenceError, match="holds no GPU"):
        default_parts().pieces(EvidenceSet(gpus=()), b"")


def test_report_data_to_bind_is_64_bytes() -> None:
    evidence = (DATA / "cloud-cvm" / "azure-snp-vtpm" / "evidence-v1.json").read_bytes()
    with pytest.raises(UsageError, match="64 bytes"):
        PlatformVerifier(Settings(at=AT)).verify(
            PlatformEvidence(cvm=evidence), bind_report_data=b"challenge"
        )
