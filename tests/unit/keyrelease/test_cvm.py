"""Session protocol version 2: keys released only to an attested CVM holding an attested GPU.

Known answers are recomputed with hashlib and pinned (PROTOCOL.md lists the same values); the
protocol runs end to end on a simulated H100 and a simulated TDX platform through the real
GPU and CVM verifiers.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import struct
from collections.abc import Callable
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from gpucc.gpuattest.collateral import NoOcsp, rim_sources_from_mapping
from gpucc.gpuattest.cvm.appraise import CvmResult, verify_cvm_evidence
from gpucc.gpuattest.cvm.policy import parse_cvm_policy
from gpucc.gpuattest.cvm.tdx_sim import SimulatedTdx, simulated_tdx
from gpucc.gpuattest.evidence import EvidenceSet
from gpucc.gpuattest.policy import parse_policy
from gpucc.gpuattest.simulate import SimulatedGpu
from gpucc.gpuattest.verifier import AttestationResult, verify
from gpucc.keyrelease import protocol as s
from gpucc.staging.errors import MalformedSessionMessageError, ProtocolError

# --- known answers (the version-1 vector's keys, challenge and digests) ----------------

D_HOST = int("11" * 48, 16)
D_HOLDER = int("22" * 48, 16)
CHALLENGE = bytes(range(32))
DIGESTS = (
    hashlib.sha256(b"gpucc test report 0").digest(),
    hashlib.sha256(b"gpucc test report 1").digest(),
)
CVM_EVIDENCE = b"gpucc test cvm evidence"
PINNED = {
    "nonce": "1592ad7e7d67646e4af68896c51c285c92963b52a65817c621c4f58f124ddf0d",
    "report_data": "12b6a6cc814285cf63945a5530a827ba3ca0b028ddee7ebcd576f7772125dfe1"
    "732bc1ef9b27cdd3a8852ce204518564e26b6a9fd851d67392ddb241e8a4ae78",
    "cvm_digest": "7ad2fbc535b7ce8a30d673f3907c37f425303edba06691920e1d456ccc0c81fd",
    "transcript_hash": "e0c93caec04906e6f8c4a1dccf0227f1f28f1322dbbe06c105a497ab498490cc"
    "f6a51e773461ebbf52468af4668882e0",
    "session_key": "3c519316fe879c08ca33feebf30414f0604e0dbd8e4107d729bb8b70cf9bcf3b",
}


def _point(d: int) -> bytes:
    return s.encode_public_key(ec.derive_private_key(d, ec.SECP384R1()).public_key())


def _field(value: bytes) -> bytes:
    return struct.pack(">I", len(value)) + value


def test_report_data_and_transcript_match_an_independent_computation() -> None:
    q_h, q_d = _point(D_HOST), _point(D_HOLDER)
    nonce = hashlib.sha256(
        b"gpucc/session/v1/nonce" + CHALLENGE + hashlib.sha256(q_h).digest()
    ).digest()
    assert nonce.hex() == PINNED["nonce"]
    report_data = hashlib.sha512(
        b"gpucc/session/v2/cvm-report-data" + nonce + hashlib.sha256(q_h).digest()
    ).digest()
    assert report_data.hex() == PINNED["report_data"] == s.cvm_report_data(nonce, q_h).hex()
    cvm_digest = hashlib.sha256(CVM_EVIDENCE).digest()
    assert cvm_digest.hex() == PINNED["cvm_digest"]
    expected = b"".join(
        _field(v)
        for v in (
            b"gpucc/session/v2/transcript",
            b"\x00\x02",
            nonce,
            b"".join(DIGESTS),
            q_h,
            q_d,
            cvm_digest,
        )
    )
    transcript = s.encode_transcript(
        nonce=nonce,
        report_digests=DIGESTS,
        host_public_key=q_h,
        holder_public_key=q_d,
        version=2,
        cvm_evidence_digest=cvm_digest,
    )
    assert transcript == expected and len(transcript) == 379
    assert hashlib.sha384(transcript).hexdigest() == PINNED["transcript_hash"]
    with pytest.raises(ValueError, match="CVM evidence digest"):
        s.encode_transcript(
            nonce=nonce, report_digests=DIGESTS, host_public_key=q_h, holder_public_key=q_d,
            version=2,
        )  # fmt: skip


class _Gpu:
    def __init__(self, digest: bytes) -> None:
        self.report_digest = digest


class _Verdict:
    def __init__(self, trusted: bool, reasons: tuple[str, ...] = ()) -> None:
        self.trusted = trusted
        self.reasons = reasons
        self.gpus = tuple(_Gpu(d) for d in DIGESTS)


def test_full_flow_reproduces_the_vector() -> None:
    seen: list[bytes] = []

    def collect_cvm(report_data: bytes) -> s.CollectedCvmEvidence:
        seen.append(report_data)
        return s.CollectedCvmEvidence(CVM_EVIDENCE)

    def attest_cvm(
        evidence: bytes, collateral: bytes | None, expected: bytes, log: bytes | None
    ) -> _Verdict:
        assert evidence == CVM_EVIDENCE and collateral is None
        return _Verdict(expected.hex() == PINNED["report_data"])

    offer, host_key = s.create_offer(
        CHALLENGE,
        lambda nonce: s.CollectedEvidence(evidence_json=b"[]", reports=(b"r0", b"r1")),
        private_key=ec.derive_private_key(D_HOST, ec.SECP384R1()),
        collect_cvm=collect_cvm,
    )
    host_key = s.HostKey(host_key.private_key, CHALLENGE, DIGESTS, host_key.cvm_evidence_digest)
    assert offer.version == 2 and seen[0].hex() == PINNED["report_data"]
    offer = s.Offer.from_json(offer.to_json())
    assert offer.cvm_evidence == CVM_EVIDENCE and offer.cvm_report_data == seen[0]
    holder = s.accept_offer(
        offer,
        challenge=CHALLENGE,
        attest=lambda evidence, nonce: _Verdict(True),
        attest_cvm=attest_cvm,
        load_evidence=lambda data: data,
        private_key=ec.derive_private_key(D_HOLDER, ec.SECP384R1()),
    )
    assert holder.transcript_hash.hex() == PINNED["transcript_hash"]
    assert holder.session_key.hex() == PINNED["session_key"]
    answer = s.Answer.from_json(holder.answer([]).to_json())
    assert answer.version == 2
    assert s.open_answer(answer, host_key).session_key.hex() == PINNED["session_key"]


# --- end to end: simulated H100 and simulated TDX, real verifiers ---------------------

NOW = dt.datetime.now(dt.UTC)
POLICY = parse_policy({"ocsp": {"require": False}})
MRTD = b"\x5a" * 48


@pytest.fixture(scope="module")
def gpu() -> SimulatedGpu:
    return SimulatedGpu.create(now=NOW)


@pytest.fixture(scope="module")
def tdx() -> SimulatedTdx:
    return simulated_tdx(NOW)


def _attester(gpu: SimulatedGpu) -> Callable[[EvidenceSet, bytes], AttestationResult]:
    def attest(evidence: EvidenceSet, nonce: bytes) -> AttestationResult:
        return verify(
            evidence,
            expected_nonce=nonce,
            roots=gpu.roots,
            now=NOW,
            rims=rim_sources_from_mapping(gpu.rims),
            ocsp=NoOcsp(),
            policy=POLICY,
        )

    return attest


def _cvm_attester(
    tdx: SimulatedTdx, pins: dict[str, str] | None = None
) -> Callable[[bytes, bytes | None, bytes, bytes | None], CvmResult]:
    policy = parse_cvm_policy({"measurements": {"tdx": pins or {"mrtd": MRTD.hex()}}})

    def attest(
        evidence: bytes, collateral: bytes | None, expected: bytes, log: bytes | None
    ) -> CvmResult:
        return verify_cvm_evidence(
            evidence,
            collateral,
            now=NOW,
            policy=policy,
            expected_report_data=expected,
            tdx_root=tdx.root,
            require_pins=True,
        )

    return attest


def _collect(gpu: SimulatedGpu) -> Callable[[bytes], s.CollectedEvidence]:
    return lambda nonce: s.CollectedEvidence.from_evidence_set(gpu.evidence(nonce))


def _collect_cvm(
    tdx: SimulatedTdx, *, override: bytes | None = None
) -> Callable[[bytes], s.CollectedCvmEvidence]:
    collateral = tdx.collateral(issued=NOW - dt.timedelta(hours=1)).to_json()

    def collect(report_data: bytes) -> s.CollectedCvmEvidence:
        quote = tdx.quote(override if override is not None else report_data, mrtd=MRTD)
        return s.CollectedCvmEvidence(quote, collateral)

    return collect


def _accept(
    offer: s.Offer, challenge: bytes, gpu: SimulatedGpu, tdx: SimulatedTdx, **kw: Any
) -> s.HolderSession:
    kw.setdefault("attest_cvm", _cvm_attester(tdx))
    return s.accept_offer(offer, challenge=challenge, attest=_attester(gpu), **kw)


def test_keys_are_released_to_an_attested_cvm_with_an_attested_gpu(
    gpu: SimulatedGpu, tdx: SimulatedTdx, tmp_path: Any
) -> None:
    challenge = s.new_challenge()
    offer, host_key = s.create_offer(challenge, _collect(gpu), collect_cvm=_collect_cvm(tdx))
    host_key.write(tmp_path / "host.key")
    received = s.Offer.from_json(offer.to_json())
    holder = _accept(received, challenge, gpu, tdx)
    grant = s.DatasetKey(bytes(16), bytes(32), bytes(range(32)))
    answer = s.Answer.from_json(holder.answer([holder.wrap(grant)]).to_json())
    host = s.open_answer(answer, s.HostKey.read(tmp_path / "host.key"))
    assert host.dataset_key(bytes(32)) == bytes(range(32))


def test_gpu_only_offers_need_the_named_relaxation(gpu: SimulatedGpu, tdx: SimulatedTdx) -> None:
    challenge = s.new_challenge()
    offer, host_key = s.create_offer(challenge, _collect(gpu))
    assert offer.version == 1 and json.loads(offer.to_json())["version"] == 1
    with pytest.raises(ProtocolError, match="GPU-only.*allow_gpu_only"):
        _accept(offer, challenge, gpu, tdx)
    holder = _accept(offer, challenge, gpu, tdx, allow_gpu_only=True)
    assert s.open_answer(holder.answer([]), host_key).wraps == ()


def test_a_downgraded_offer_is_refused(gpu: SimulatedGpu, tdx: SimulatedTdx) -> None:
    challenge = s.new_challenge()
    offer, _ = s.create_offer(challenge, _collect(gpu), collect_cvm=_collect_cvm(tdx))
    doc = json.loads(offer.to_json())
    del doc["cvm_evidence"], doc["cvm_collateral"]
    doc["version"] = 1
    with pytest.raises(ProtocolError, match="GPU-only"):
        _accept(s.Offer.from_json(json.dumps(doc).encode()), challenge, gpu, tdx)


def test_relayed_evidence_of_another_cvm_is_refused(gpu: SimulatedGpu, tdx: SimulatedTdx) -> None:
    """A host that relays a genuine quote made for other report data (another VM's session)."""
    challenge = s.new_challenge()
    collect = _collect_cvm(tdx, override=hashlib.sha512(b"another session").digest())
    offer, _ = s.create_offer(challenge, _collect(gpu), collect_cvm=collect)
    with pytest.raises(ProtocolError, match="CVM attestation is not trusted.*does not commit"):
        _accept(offer, challenge, gpu, tdx)


def test_cvm_evidence_is_checked_against_the_holders_pins_and_root(
    gpu: SimulatedGpu, tdx: SimulatedTdx
) -> None:
    challenge = s.new_challenge()
    offer, _ = s.create_offer(challenge, _collect(gpu), collect_cvm=_collect_cvm(tdx))
    with pytest.raises(ProtocolError, match="differs from the policy: mrtd"):
        _accept(offer, challenge, gpu, tdx, attest_cvm=_cvm_attester(tdx, {"mrtd": "00" * 48}))
    with pytest.raises(ProtocolError, match="pinned"):
        _accept(offer, challenge, gpu, tdx, attest_cvm=_cvm_attester(simulated_tdx(NOW)))
    with pytest.raises(ProtocolError, match="no CVM verifier"):
        _accept(offer, challenge, gpu, tdx, attest_cvm=None)


def test_tampered_cvm_evidence_is_refused(gpu: SimulatedGpu, tdx: SimulatedTdx) -> None:
    challenge = s.new_challenge()
    offer, _ = s.create_offer(challenge, _collect(gpu), collect_cvm=_collect_cvm(tdx))
    assert offer.cvm_evidence is not None
    quote = bytearray(offer.cvm_evidence)
    quote[200] ^= 1
    doc = json.loads(offer.to_json())
    doc["cvm_evidence"] = base64.b64encode(bytes(quote)).decode()
    with pytest.raises(ProtocolError, match="signature is invalid"):
        _accept(s.Offer.from_json(json.dumps(doc).encode()), challenge, gpu, tdx)


def test_an_answer_of_the_wrong_version_is_refused(gpu: SimulatedGpu, tdx: SimulatedTdx) -> None:
    challenge = s.new_challenge()
    offer, host_key = s.create_offer(challenge, _collect(gpu), collect_cvm=_collect_cvm(tdx))
    holder = _accept(offer, challenge, gpu, tdx)
    answer = holder.answer([])
    downgraded = s.Answer(answer.holder_public_key, answer.transcript_hash, (), version=1)
    with pytest.raises(ProtocolError, match="does not match the offer"):
        s.open_answer(downgraded, host_key)


@pytest.mark.parametrize(
    ("mutate", "error", "message"),
    [
        (lambda d: d.pop("cvm_evidence"), MalformedSessionMessageError, "missing keys"),
        (lambda d: d.update(cvm_evidence="!!"), MalformedSessionMessageError, "not base64"),
        (lambda d: d.update(cvm_evidence=""), MalformedSessionMessageError, "empty"),
        (lambda d: d.update(cvm_evidence=5), MalformedSessionMessageError, "base64"),
        (
            lambda d: d.update(cvm_collateral="A" * 6_000_000),
            MalformedSessionMessageError,
            "at most",
        ),
        (lambda d: d.update(version=1), MalformedSessionMessageError, "unknown keys"),
    ],
)
def test_version_2_offer_parsing_is_strict(
    gpu: SimulatedGpu,
    tdx: SimulatedTdx,
    mutate: Callable[[dict[str, Any]], object],
    error: type[Exception],
    message: str,
) -> None:
    offer, _ = s.create_offer(s.new_challenge(), _collect(gpu), collect_cvm=_collect_cvm(tdx))
    doc = json.loads(offer.to_json())
    mutate(doc)
    with pytest.raises(error, match=message):
        s.Offer.from_json(json.dumps(doc).encode())


def test_the_host_key_file_keeps_the_cvm_evidence_digest(
    gpu: SimulatedGpu, tdx: SimulatedTdx, tmp_path: Any
) -> None:
    offer, host_key = s.create_offer(
        s.new_challenge(), _collect(gpu), collect_cvm=_collect_cvm(tdx)
    )
    assert offer.cvm_evidence is not None
    host_key.write(tmp_path / "k")
    again = s.HostKey.read(tmp_path / "k")
    assert again.version == 2
    assert again.cvm_evidence_digest == hashlib.sha256(offer.cvm_evidence).digest()


def test_stale_cvm_collateral_is_undecided_not_refused(
    gpu: SimulatedGpu, tdx: SimulatedTdx
) -> None:
    from gpucc.core.errors import CollateralUnavailableError

    challenge = s.new_challenge()
    stale = tdx.collateral(issued=NOW - dt.timedelta(days=40)).to_json()

    def collect(report_data: bytes) -> s.CollectedCvmEvidence:
        return s.CollectedCvmEvidence(tdx.quote(report_data, mrtd=MRTD), stale)

    offer, _ = s.create_offer(challenge, _collect(gpu), collect_cvm=collect)
    with pytest.raises(CollateralUnavailableError, match="undecided.*expired"):
        _accept(offer, challenge, gpu, tdx)
