"""The attestation-bound session protocol v1 (docs/PROTOCOL.md).

Known answers are recomputed step by step (hashlib, hmac, raw ECDH and AES-GCM from
``cryptography``) and also pinned as hex; PROTOCOL.md lists the same values. The protocol
tests run end to end on a simulated H100 through the real verifier.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import json
import os
import stat
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from gpucc.cli.exitcodes import exit_code_for
from gpucc.core.errors import FileAccessError
from gpucc.gpuattest.collateral import NoOcsp, rim_sources_from_mapping
from gpucc.gpuattest.evidence import EvidenceSet
from gpucc.gpuattest.policy import parse_policy
from gpucc.gpuattest.simulate import SimulatedGpu
from gpucc.gpuattest.verifier import AttestationResult, verify
from gpucc.keyrelease import protocol as s
from gpucc.staging import format as fmt
from gpucc.staging.cpu import stage_cpu
from gpucc.staging.dataset import SealedDataset, open_sealed
from gpucc.staging.errors import (
    DatasetKeyMismatchError,
    KeyFileError,
    KeyUnwrapError,
    ProtocolError,
)
from gpucc.staging.seal import seal_bytes

# --- known answers -----------------------------------------------------------------

D_HOST = int("11" * 48, 16)
D_HOLDER = int("22" * 48, 16)
CHALLENGE = bytes(range(32))
DIGESTS = (
    hashlib.sha256(b"gpucc test report 0").digest(),
    hashlib.sha256(b"gpucc test report 1").digest(),
)
DATASET_KEY = bytes(range(32))
DATASET_ID = bytes(range(0xA0, 0xB0))
HEADER_DIGEST = bytes.fromhex("af91117f045697057dda680907d11fe1215c79867d0e471111dfbc0dce1d2efb")
WRAP_NONCE = bytes(range(0x80, 0x8C))

PINNED = {
    "q_host": "04386e767ea5cb716c9cd620ff7342129c892a6fccefe612140c80bff59e943468019dda16e5"
    "079b0c1d9001d23a624b6dd088d0c3826394194787403e8a7d07e5e22f7e9c0b8e80fa1faff5d28b4bb5"
    "97b267f0b87023ca61fc8454bddefd2e0e",
    "q_holder": "044f2bda7fd2105f8467e21f45223ad58863ffa4c084832d9f6c64ffc47fdd519727ab53cb"
    "71f9c40de24b64acde61f02fc7dce130b612fa5dbcac94573a2354fd005d8e9caefdc5fde48304474708"
    "bbd82f77e1fd2c630bea236f6f8dccc1678e",
    "nonce": "1592ad7e7d67646e4af68896c51c285c92963b52a65817c621c4f58f124ddf0d",
    "transcript_hash": "96ac37295595283c299cf2376495e683b93528e96d264c8757ef8eb232d56749"
    "c7de24a5a938b9a562499cee90600fb6",
    "shared_secret": "2ac3da23c114b5b1f3aa200cf3c57bebd1b3b880a0e68066ab5d00dda50dcfe6"
    "cd03410292346187a84b1f12d53569c0",
    "session_key": "bd1ecb787d28d664fb578a7a60c06fe146c1b0c8d5321633974e90b7b7ff355a",
    "wrap_record": "0200300096ac37295595283c299cf2376495e683b93528e96d264c8757ef8eb232d56749"
    "c7de24a5a938b9a562499cee90600fb6808182838485868788898a8be462afbca3b7a86bba7dd40a2230"
    "cc15c8264475df1c19406f7d52b8b0ea892d2bef94711f408984d1fecd8de317860e",
}


def _point(d: int) -> bytes:
    key = ec.derive_private_key(d, ec.SECP384R1())
    return key.public_key().public_bytes(Encoding.X962, PublicFormat.UncompressedPoint)


def _hkdf_sha384(ikm: bytes, salt: bytes, info: bytes, length: int) -> bytes:
    prk = hmac.new(salt, ikm, hashlib.sha384).digest()
    okm, block, counter = b"", b"", 1
    while len(okm) < length:
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha384).digest()
        okm += block
        counter += 1
    return okm[:length]


def _lp(value: bytes) -> bytes:
    return struct.pack(">I", len(value)) + value


def _independent_kat() -> dict[str, bytes]:
    """Every value of the vector, computed without gpuattest.session."""
    q_host, q_holder = _point(D_HOST), _point(D_HOLDER)
    nonce = hashlib.sha256(
        b"gpucc/session/v1/nonce" + CHALLENGE + hashlib.sha256(q_host).digest()
    ).digest()
    transcript = (
        _lp(b"gpucc/session/v1/transcript")
        + _lp(b"\x00\x01")
        + _lp(nonce)
        + _lp(b"".join(DIGESTS))
        + _lp(q_host)
        + _lp(q_holder)
    )
    th = hashlib.sha384(transcript).digest()
    shared = ec.derive_private_key(D_HOLDER, ec.SECP384R1()).exchange(
        ec.ECDH(), ec.derive_private_key(D_HOST, ec.SECP384R1()).public_key()
    )
    key = _hkdf_sha384(shared, nonce, transcript, 32)
    wrapped = AESGCM(key).encrypt(
        WRAP_NONCE, DATASET_KEY, b"gpucc/wrap/v1" + HEADER_DIGEST + b"\x02" + th
    )
    record = struct.pack("<BBH", 2, 0, 48) + th + WRAP_NONCE + wrapped
    return {
        "q_host": q_host,
        "q_holder": q_holder,
        "nonce": nonce,
        "transcript": transcript,
        "transcript_hash": th,
        "shared_secret": shared,
        "session_key": key,
        "wrap_record": record,
    }


def test_known_answer_values_match_the_pinned_vector() -> None:
    kat = _independent_kat()
    for name, value in PINNED.items():
        assert kat[name].hex() == value, name
    assert len(kat["transcript"]) == 343


def test_derivations_match_the_independent_computation() -> None:
    kat = _independent_kat()
    assert s.session_nonce(CHALLENGE, kat["q_host"]) == kat["nonce"]
    transcript = s.encode_transcript(
        nonce=kat["nonce"],
        report_digests=DIGESTS,
        host_public_key=kat["q_host"],
        holder_public_key=kat["q_holder"],
    )
    assert transcript == kat["transcript"]
    assert s.transcript_hash(transcript) == kat["transcript_hash"]
    key = s.derive_session_key(kat["shared_secret"], nonce=kat["nonce"], transcript=transcript)
    assert key == kat["session_key"]


class _Gpu:
    def __init__(self, digest: bytes) -> None:
        self.report_digest = digest


class _Verdict:
    """A stand-in verdict for the known-answer flow (the real verifier is used below)."""

    def __init__(self, trusted: bool, digests: tuple[bytes, ...], reasons: tuple[str, ...]):
        self.trusted = trusted
        self.reasons = reasons
        self.gpus = tuple(_Gpu(d) for d in digests)


def test_full_flow_reproduces_the_vector() -> None:
    kat = _independent_kat()
    reports = (b"gpucc test report 0", b"gpucc test report 1")
    seen: list[bytes] = []

    def collect(nonce: bytes) -> s.CollectedEvidence:
        seen.append(nonce)
        return s.CollectedEvidence(evidence_json=b"[]", reports=reports)

    def attest(evidence: Any, nonce: bytes) -> _Verdict:
        assert nonce == kat["nonce"]
        return _Verdict(True, DIGESTS, ())

    offer, host_key = s.create_offer(
        CHALLENGE, collect, private_key=ec.derive_private_key(D_HOST, ec.SECP384R1())
    )
    assert seen == [kat["nonce"]] and offer.host_public_key == kat["q_host"]
    holder = s.accept_offer(
        offer,
        challenge=CHALLENGE,
        attest=attest,
        load_evidence=lambda data: data,
        allow_gpu_only=True,
        private_key=ec.derive_private_key(D_HOLDER, ec.SECP384R1()),
    )
    assert holder.transcript == kat["transcript"]
    assert holder.session_key == kat["session_key"]
    wrap = holder.wrap(s.DatasetKey(DATASET_ID, HEADER_DIGEST, DATASET_KEY), wrap_nonce=WRAP_NONCE)
    assert wrap.record.to_bytes() == kat["wrap_record"]
    answer = s.Answer.from_json(holder.answer([wrap]).to_json())
    host = s.open_answer(answer, host_key)
    assert host.session_key == kat["session_key"]
    assert host.dataset_key(HEADER_DIGEST) == DATASET_KEY


# --- end to end on a simulated H100 through the real verifier -------------------------

NOW = dt.datetime.now(dt.UTC)
POLICY = parse_policy({"ocsp": {"require": False}})


@pytest.fixture(scope="module")
def gpu() -> SimulatedGpu:
    return SimulatedGpu.create(now=NOW)


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


def _collector(gpu: SimulatedGpu) -> Callable[[bytes], s.CollectedEvidence]:
    return lambda nonce: s.CollectedEvidence.from_evidence_set(gpu.evidence(nonce))


@pytest.fixture
def dataset(tmp_path: Path) -> tuple[SealedDataset, bytes, bytes]:
    """A sealed dataset on disk, its plaintext, and its key-file key."""
    data = np.random.default_rng(5).integers(0, 256, 50_000, dtype=np.uint8).tobytes()
    kek = fmt.new_dataset_key()
    (tmp_path / "d.gcc").write_bytes(seal_bytes(data, kek=kek, chunk_size=4096))
    return open_sealed(tmp_path / "d.gcc"), data, kek


def _grant(sealed: SealedDataset, kek: bytes) -> s.DatasetKey:
    return s.DatasetKey(sealed.dataset_id, sealed.header_digest, sealed.unwrap(kek))


def test_end_to_end_release_and_stage(
    gpu: SimulatedGpu, dataset: tuple[SealedDataset, bytes, bytes], tmp_path: Path
) -> None:
    sealed, data, kek = dataset
    challenge = s.new_challenge()
    # Host: offer, host key kept in a 0600 file.
    offer, host_key = s.create_offer(challenge, _collector(gpu))
    host_key.write(tmp_path / "host.key")
    assert stat.S_IMODE(os.stat(tmp_path / "host.key").st_mode) == 0o600
    offer_json = offer.to_json()
    assert host_key.private_key.hex() not in offer_json.decode()
    # Data holder: verify with the real verifier, wrap the dataset key, answer.
    holder = s.accept_offer(
        s.Offer.from_json(offer_json),
        challenge=challenge,
        attest=_attester(gpu),
        allow_gpu_only=True,
    )
    assert holder.report_digests == host_key.report_digests
    answer_json = holder.answer([holder.wrap(_grant(sealed, kek))]).to_json()
    doc = json.loads(answer_json)
    assert doc["schema"] == "gpucc.session-answer/v1" and doc["version"] == 1
    assert doc["wraps"][0]["dataset_id"] == sealed.dataset_id.hex()
    # Host: check the transcript, unwrap, stage.
    host = s.open_answer(s.Answer.from_json(answer_json), s.HostKey.read(tmp_path / "host.key"))
    assert host.transcript_hash == holder.transcript_hash
    dataset_key = host.dataset_key(sealed.header_digest)
    assert stage_cpu(sealed, dataset_key).tobytes() == data


def test_every_session_gets_fresh_keys(gpu: SimulatedGpu) -> None:
    challenge = s.new_challenge()
    first, _ = s.create_offer(challenge, _collector(gpu))
    second, _ = s.create_offer(challenge, _collector(gpu))
    assert first.host_public_key != second.host_public_key
    a = s.accept_offer(first, challenge=challenge, attest=_attester(gpu), allow_gpu_only=True)
    b = s.accept_offer(first, challenge=challenge, attest=_attester(gpu), allow_gpu_only=True)
    assert a.holder_public_key != b.holder_public_key and a.session_key != b.session_key


def test_replayed_offer_with_another_challenge_is_refused(gpu: SimulatedGpu) -> None:
    offer, _ = s.create_offer(s.new_challenge(), _collector(gpu))
    mine = s.new_challenge()
    with pytest.raises(ProtocolError, match="another challenge"):
        s.accept_offer(offer, challenge=mine, attest=_attester(gpu), allow_gpu_only=True)
    # Rewriting the challenge field does not help: the evidence carries the old nonce.
    forged = s.Offer(
        challenge=mine, host_public_key=offer.host_public_key, evidence_json=offer.evidence_json
    )
    with pytest.raises(ProtocolError, match="not trusted.*nonce") as info:
        s.accept_offer(forged, challenge=mine, attest=_attester(gpu), allow_gpu_only=True)
    assert "replayed" in str(info.value) and exit_code_for(info.value) == 1


def test_offer_with_a_swapped_key_is_refused(gpu: SimulatedGpu) -> None:
    challenge = s.new_challenge()
    offer, _ = s.create_offer(challenge, _collector(gpu))
    attacker = s.encode_public_key(ec.generate_private_key(ec.SECP384R1()).public_key())
    swapped = s.Offer(
        challenge=challenge, host_public_key=attacker, evidence_json=offer.evidence_json
    )
    with pytest.raises(ProtocolError, match="report nonce") as info:
        s.accept_offer(swapped, challenge=challenge, attest=_attester(gpu), allow_gpu_only=True)
    assert "public key" in str(info.value)


def test_offer_whose_evidence_fails_attestation_is_refused(gpu: SimulatedGpu) -> None:
    challenge = s.new_challenge()

    def tampered(nonce: bytes) -> s.CollectedEvidence:
        bad = gpu.gpu_evidence(nonce, measurements={2: os.urandom(48)})
        return s.CollectedEvidence.from_evidence_set(EvidenceSet(gpus=(bad,), source="file"))

    offer, _ = s.create_offer(challenge, tampered)
    with pytest.raises(ProtocolError, match="not trusted: GPU 0") as info:
        s.accept_offer(offer, challenge=challenge, attest=_attester(gpu), allow_gpu_only=True)
    assert "replayed" not in str(info.value)  # the nonce was right; the measurement was not
    # Evidence from a GPU the holder's roots do not cover.
    other = SimulatedGpu.create(now=NOW)
    offer, _ = s.create_offer(challenge, _collector(other))
    with pytest.raises(ProtocolError, match="not trusted"):
        s.accept_offer(offer, challenge=challenge, attest=_attester(gpu), allow_gpu_only=True)


def test_transcript_mismatch_is_refused(
    gpu: SimulatedGpu, dataset: tuple[SealedDataset, bytes, bytes]
) -> None:
    sealed, _, kek = dataset
    challenge = s.new_challenge()
    offer, host_key = s.create_offer(challenge, _collector(gpu))
    holder = s.accept_offer(offer, challenge=challenge, attest=_attester(gpu), allow_gpu_only=True)
    answer = holder.answer([holder.wrap(_grant(sealed, kek))])
    altered = s.Answer(
        holder_public_key=answer.holder_public_key,
        transcript_hash=bytes(48),
        wraps=answer.wraps,
    )
    with pytest.raises(ProtocolError, match="transcript mismatch"):
        s.open_answer(altered, host_key)
    # An answer to another offer of the same host (another session).
    _, other_key = s.create_offer(challenge, _collector(gpu))
    with pytest.raises(ProtocolError, match="transcript mismatch"):
        s.open_answer(answer, other_key)
    # The holder's key swapped in transit.
    swapped = s.Answer(
        holder_public_key=s.encode_public_key(ec.generate_private_key(ec.SECP384R1()).public_key()),
        transcript_hash=answer.transcript_hash,
        wraps=answer.wraps,
    )
    with pytest.raises(ProtocolError, match="transcript mismatch"):
        s.open_answer(swapped, host_key)
    # The host key file's report digests are part of the transcript too.
    wrong_digests = s.HostKey(
        private_key=host_key.private_key,
        challenge=host_key.challenge,
        report_digests=(bytes(32),),
    )
    with pytest.raises(ProtocolError, match="transcript mismatch"):
        s.open_answer(answer, wrong_digests)


def test_key_wrapped_for_another_session_is_refused(
    gpu: SimulatedGpu, dataset: tuple[SealedDataset, bytes, bytes]
) -> None:
    sealed, _, kek = dataset
    grant = _grant(sealed, kek)
    challenge = s.new_challenge()
    offer_a, key_a = s.create_offer(challenge, _collector(gpu))
    offer_b, key_b = s.create_offer(challenge, _collector(gpu))
    holder_a = s.accept_offer(
        offer_a, challenge=challenge, attest=_attester(gpu), allow_gpu_only=True
    )
    holder_b = s.accept_offer(
        offer_b, challenge=challenge, attest=_attester(gpu), allow_gpu_only=True
    )
    wrap_a = holder_a.wrap(grant)
    # A's wrap moved into B's answer: not bound to B's transcript.
    with pytest.raises(ProtocolError, match="not bound to this session"):
        s.open_answer(holder_b.answer([wrap_a]), key_b)
    # Relabelled with B's transcript hash: B's session key cannot open it.
    relabelled = s.SessionWrap(
        dataset_id=wrap_a.dataset_id,
        header_digest=wrap_a.header_digest,
        record=fmt.WrapRecord(
            kind=fmt.WrapKind.SESSION,
            context=holder_b.transcript_hash,
            wrap_nonce=wrap_a.record.wrap_nonce,
            wrapped=wrap_a.record.wrapped,
        ),
    )
    host_b = s.open_answer(holder_b.answer([relabelled]), key_b)
    with pytest.raises(KeyUnwrapError):
        host_b.dataset_key(sealed.header_digest)
    # A wrap for another dataset, or none at all.
    host_a = s.open_answer(holder_a.answer([wrap_a]), key_a)
    with pytest.raises(DatasetKeyMismatchError, match="no key for this dataset"):
        host_a.dataset_key(bytes(32))
    assert host_a.dataset_key(sealed.header_digest) == grant.key


def test_local_session(gpu: SimulatedGpu, dataset: tuple[SealedDataset, bytes, bytes]) -> None:
    sealed, data, kek = dataset
    local = s.local_session(
        collect=_collector(gpu),
        attest=_attester(gpu),
        allow_gpu_only=True,
        datasets=[_grant(sealed, kek)],
    )
    key = local.session.dataset_key(sealed.header_digest)
    assert stage_cpu(sealed, key).tobytes() == data
    assert "private_key" not in repr(local) and "session_key" not in repr(local)
    other = SimulatedGpu.create(now=NOW)
    with pytest.raises(ProtocolError, match="not trusted"):
        s.local_session(
            collect=_collector(other),
            attest=_attester(gpu),
            allow_gpu_only=True,
            datasets=[_grant(sealed, kek)],
        )


# --- files and messages --------------------------------------------------------------


def test_host_key_file_round_trip_and_permissions(gpu: SimulatedGpu, tmp_path: Path) -> None:
    _, host_key = s.create_offer(s.new_challenge(), _collector(gpu))
    path = tmp_path / "host.key"
    host_key.write(path)
    assert s.HostKey.read(path) == host_key
    assert host_key.private_key.hex() not in repr(host_key)
    with pytest.raises(FileAccessError, match="already exists"):
        host_key.write(path)
    path.chmod(0o644)
    with pytest.raises(KeyFileError, match="chmod 600"):
        s.HostKey.read(path)
    path.chmod(0o600)
    text = path.read_text()
    path.write_text(text.replace("challenge: ", "challenge: zz"))
    with pytest.raises(KeyFileError, match="malformed"):
        s.HostKey.read(path)
    path.write_text("something else\n")
    with pytest.raises(KeyFileError, match="not a gpucc session host key"):
        s.HostKey.read(path)


def test_secrets_stay_out_of_reprs_and_messages(gpu: SimulatedGpu) -> None:
    challenge = s.new_challenge()
    offer, host_key = s.create_offer(challenge, _collector(gpu))
    holder = s.accept_offer(offer, challenge=challenge, attest=_attester(gpu), allow_gpu_only=True)
    host = s.open_answer(holder.answer([]), host_key)
    for obj, secret in (
        (host_key, host_key.private_key),
        (holder, holder.session_key),
        (host, host.session_key),
    ):
        assert secret.hex() not in repr(obj) and repr(secret) not in repr(obj)
    assert holder.session_key.hex() not in holder.answer([]).to_json().decode()


@pytest.mark.parametrize(
    ("mutate", "error", "message"),
    [
        (lambda d: d.update(version=3), ProtocolError, "version 3"),
        (lambda d: d.update(schema="x"), s.MalformedSessionMessageError, "not a session offer"),
        (lambda d: d.update(extra=1), s.MalformedSessionMessageError, "unknown keys"),
        (lambda d: d.pop("evidence"), s.MalformedSessionMessageError, "missing keys"),
        (lambda d: d.update(challenge="00"), s.MalformedSessionMessageError, "64 hex"),
        (
            lambda d: d.update(host_public_key="04" + "00" * 96),
            s.MalformedSessionMessageError,
            "not a point",
        ),
        (
            lambda d: d.update(host_public_key="02" + "00" * 96),
            s.MalformedSessionMessageError,
            "uncompressed",
        ),
        (lambda d: d.update(evidence="x"), s.MalformedSessionMessageError, "evidence"),
    ],
)
def test_offer_parsing_is_strict(
    gpu: SimulatedGpu,
    mutate: Callable[[dict[str, Any]], object],
    error: type[Exception],
    message: str,
) -> None:
    offer, _ = s.create_offer(s.new_challenge(), _collector(gpu))
    doc = json.loads(offer.to_json())
    mutate(doc)
    with pytest.raises(error, match=message):
        s.Offer.from_json(json.dumps(doc).encode())


def test_answer_parsing_is_strict() -> None:
    wrap = {
        "dataset_id": DATASET_ID.hex(),
        "header_digest": HEADER_DIGEST.hex(),
        "record": base64.b64encode(bytes.fromhex(PINNED["wrap_record"])).decode(),
    }
    good: dict[str, Any] = {
        "schema": "gpucc.session-answer/v1",
        "version": 1,
        "holder_public_key": PINNED["q_holder"],
        "transcript_hash": PINNED["transcript_hash"],
        "wraps": [wrap],
    }
    answer = s.Answer.from_json(json.dumps(good).encode())
    assert answer.wraps[0].record.to_bytes().hex() == PINNED["wrap_record"]
    for key, value in (
        ("wraps", [{"dataset_id": "00"}]),
        ("wraps", [dict(wrap, record="!!")]),
        ("wraps", [dict(wrap, record="AAAA")]),
        ("wraps", "none"),
        ("transcript_hash", "00" * 32),
        ("holder_public_key", "zz"),
    ):
        bad = dict(good, **{key: value})
        with pytest.raises(s.MalformedSessionMessageError):
            s.Answer.from_json(json.dumps(bad).encode())
    with pytest.raises(s.MalformedSessionMessageError, match="not JSON"):
        s.Answer.from_json(b"{")


def test_the_attestation_library_does_not_import_staging() -> None:
    """Imports go one way: staging may use gpuattest, never the reverse."""
    import ast
    from importlib import resources

    root = resources.files("gpucc.gpuattest")
    sources = list(Path(str(root)).rglob("*.py"))
    assert sources
    for source in sources:
        tree = ast.parse(source.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            assert not any("staging" in name for name in names), f"{source} imports {names}"


def test_a_device_report_the_shared_replay_state_holds_is_refused(gpu: SimulatedGpu) -> None:
    """Another holder process sharing this replay state accepted this GPU's report over
    this nonce: the offer is refused naming the device; without that record it is accepted,
    and its report is then recorded."""
    from cryptography import x509

    from gpucc.keyrelease.replay import (
        DeviceReportReplayError,
        MemoryReplayStore,
        claim_device_reports,
    )

    leaf = x509.load_pem_x509_certificates(gpu.evidence(bytes(32)).gpus[0].cert_chain_pem)[0]
    ueid = str(leaf.serial_number)
    for recorded in (True, False):
        store = MemoryReplayStore()
        holder = s.DataHolder(_attester(gpu), replay=store, allow_gpu_only=True)
        challenge = os.urandom(32)
        offer, _ = s.create_offer(challenge, _collector(gpu))
        nonce = s.session_nonce(challenge, offer.host_public_key)
        if recorded:
            claim_device_reports(store, [ueid], nonce)
            with pytest.raises(DeviceReportReplayError, match=f"device {ueid} over nonce"):
                holder.accept(offer, challenge)
        else:
            holder.accept(offer, challenge)
            with pytest.raises(DeviceReportReplayError):
                claim_device_reports(store, [ueid], nonce)
