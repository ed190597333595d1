"""GPU Travelling without processes: the documented vectors, the log chain, the challenge
store, the rate limiter, plan parsing and scrub receipts."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from gpucc.core.errors import KeyFileError, MalformedPolicyError
from gpucc.core.files import OutputExistsError
from gpucc.gpuattest.policy import load_policy
from gpucc.holder.service import ChallengeRefused, ChallengeStore, RateLimiter
from gpucc.travel.errors import (
    HolderAuthenticationError,
    LogTamperedError,
    MalformedEnvelopeError,
    MalformedLogError,
    MalformedReceiptError,
    PlanError,
    ScrubError,
)
from gpucc.travel.log import (
    GENESIS,
    LOG_SCHEMA,
    closing_entry,
    entry_hash,
    entry_signing_input,
    sign_entry,
    verify_log,
    verify_log_lines,
)
from gpucc.travel.plan import load_plan, parse_plan
from gpucc.travel.receipt import Receipt, make_receipt
from gpucc.travel.signing import (
    Envelope,
    KeyPin,
    canonical_json,
    envelope_signing_input,
    generate_signing_key,
    key_id,
    load_public_key,
    load_signing_key,
    public_pem,
    sign_answer,
    write_signing_key,
)
from gpucc.travel.state import model_digest, scrub_and_check
from tests.support.paths import ROOT

DOCS = (ROOT / "docs" / "TRAVEL.md").read_text()

# --- vectors (docs/TRAVEL.md, "Test vectors") ------------------------------------------

HOLDER_SCALAR = b"\x33" * 48
HOLDER_KEY_ID = "4072712ca47af65a9baef4352f0f1f74cbc7c5e281f12412b7ee40256bde3bee"
TRANSCRIPT_HASH = bytes.fromhex(
    "96ac37295595283c299cf2376495e683b93528e96d264c8757ef8eb232d56749"
    "c7de24a5a938b9a562499cee90600fb6"
)
ANSWER = b'{"schema":"gpucc.session-answer/v1"}'
TRUSTED_WITH = {
    "relaxations": [],
    "roots": "vendor",
    "simulated": False,
    "time_origin": None,
    "time_source": "clock",
    "verified_at": "2026-01-01T00:00:00Z",
}
SIGNING_INPUT = (
    "67707563632f686f6c6465722d616e737765722f7632"
    "96ac37295595283c299cf2376495e683b93528e96d264c8757ef8eb232d56749"
    "c7de24a5a938b9a562499cee90600fb6"
    "8799497cad6db6f4ad205ec8cf4d726f35dccdcc2a5666c6c21bc3bf3ef704fa"
    "e47ec6cf54a74e2ed826e31fdbeb7800fb23b4fd0506b876aab25a145eb01445"
)
ENVELOPE = (
    '{"answer":"eyJzY2hlbWEiOiJncHVjYy5zZXNzaW9uLWFuc3dlci92MSJ9",'
    '"holder_key_id":"4072712ca47af65a9baef4352f0f1f74cbc7c5e281f12412b7ee40256bde3bee",'
    '"holder_public_key":"MHYwEAYHKoZIzj0CAQYFK4EEACIDYgAEs0uMBjFVcCHdXaeWSw9kVEOpaaGvng4zwevR6RI9'
    'Mp7X8HueN9aySZc1HaNlbeUyvh0yjnAAXA51n5MyDbvMC2TAxtXXwhIvo2SfIO7wV5XAcCR7yH2BrtumsDzyRN3T",'
    '"schema":"gpucc.holder-envelope/v2",'
    '"signature":"MGQCMHXFPKiSCEs9GQMWaWfbUSt3QsyeJ4JdL3Btr0b3/yJmPpEW+L3jhCG+Z2EjSM9IJwIwNb1asX5C'
    'KzKGCfbWRunIamTxL3rS98j63swVvFsQM31naEGKCrWrPxuWeveoL4Tu",'
    '"trusted_with":{"relaxations":[],"roots":"vendor","simulated":false,"time_origin":null,'
    '"time_source":"clock","verified_at":"2026-01-01T00:00:00Z"}}'
)
ORCH_SCALAR = b"\x44" * 48
ORCH_KEY_ID = "27307e132ac9018293a1c31513e8098ac63a144fb4fe60fa1c33967d5a919e7d"
LOG_LINE_1 = (
    '{"holder_id":"a","prev":"' + "0" * 64 + '","schema":"gpucc.travel-log/v1","seq":0,'
    '"signature":"MGUCMQDdkJtcuQT/PJiS9Rc4jD29ckRVvCDXrcx1lzwRq/RjrV4OpvtH+2CDUmQBzvIYVpoCMGdfWSAuv'
    'XtxdopgKfEjGNdkE+YwYj+FCm9qzUtTG9CiifEsFEefdBqnWeS+cAapOw==","transcript_hash":"'
    + "11" * 48
    + '"}'
)
LOG_HASH_1 = "0fa36cbd0609af9cdf0997ba9c5f317cc27ef00c81328dbceee7e378fc9cf2bd"
LOG_LINE_2 = (
    '{"holder_id":"b","prev":"0fa36cbd0609af9cdf0997ba9c5f317cc27ef00c81328dbceee7e378fc9cf2bd",'
    '"schema":"gpucc.travel-log/v1","seq":1,'
    '"signature":"MGUCMHDiRy4dgFyRxn+jcp/4cPRcORDiRb97ko66JXenMsxM66Ts2BDM+OIX9YUjzUszVQIxAP24/UtLG'
    'XcaDrg1mtjRlGGcRTZ1Q4QHHfPiIlr4A47IdNtZ2TAt18JY2/1KF7g/8A==","transcript_hash":"'
    + "22" * 48
    + '"}'
)
LOG_HASH_2 = "b4af249c0d19b28997299882d14a1a22ccdad6ff8c08275fb569f49ad7f7c8d7"


def _key(scalar: bytes) -> ec.EllipticCurvePrivateKey:
    return ec.derive_private_key(int.from_bytes(scalar, "big"), ec.SECP384R1())


def test_envelope_vector() -> None:
    holder = _key(HOLDER_SCALAR)
    record = canonical_json(TRUSTED_WITH)
    assert key_id(holder) == HOLDER_KEY_ID
    assert envelope_signing_input(TRANSCRIPT_HASH, ANSWER, record).hex() == SIGNING_INPUT
    assert SIGNING_INPUT[:44] == b"gpucc/holder-answer/v2".hex()
    assert SIGNING_INPUT[-128:-64] == hashlib.sha256(ANSWER).hexdigest()
    assert SIGNING_INPUT[-64:] == hashlib.sha256(record).hexdigest()
    env = Envelope.from_json(ENVELOPE.encode())
    assert env.answer == ANSWER and env.holder_key_id == HOLDER_KEY_ID
    assert env.trusted_with == TRUSTED_WITH
    env.verify(KeyPin(HOLDER_KEY_ID), TRANSCRIPT_HASH)
    env.verify(KeyPin.parse(public_pem(holder).decode(), "pin"), TRANSCRIPT_HASH)
    with pytest.raises(HolderAuthenticationError):
        env.verify(KeyPin(HOLDER_KEY_ID), bytes(48))  # another session's transcript
    # the signed record cannot be changed on the way: a relaxation hidden or added breaks it
    relaxed = dict(TRUSTED_WITH, relaxations=[{"item": "ocsp.require: false"}])
    with pytest.raises(HolderAuthenticationError):
        Envelope(env.answer, env.holder_public_key, env.signature, relaxed).verify(
            KeyPin(HOLDER_KEY_ID), TRANSCRIPT_HASH
        )
    # a fresh signature over the same input verifies too (ECDSA signatures are randomised)
    fresh = sign_answer(holder, ANSWER, TRANSCRIPT_HASH, TRUSTED_WITH)
    fresh.verify(KeyPin(HOLDER_KEY_ID), TRANSCRIPT_HASH)
    for value in (HOLDER_KEY_ID, SIGNING_INPUT[:64], ENVELOPE[:80]):
        assert value in DOCS.replace("\n", "")


def test_log_vector() -> None:
    orch = _key(ORCH_SCALAR)
    assert key_id(orch) == ORCH_KEY_ID
    lines = [LOG_LINE_1.encode(), LOG_LINE_2.encode()]
    assert entry_hash(lines[0]) == LOG_HASH_1 and entry_hash(lines[1]) == LOG_HASH_2
    summary = verify_log_lines(lines, orch.public_key(), require_closed=False)
    assert summary.entries == 2 and summary.head == LOG_HASH_2 and summary.holders == ("a", "b")
    body = {k: v for k, v in json.loads(LOG_LINE_1).items() if k != "signature"}
    assert entry_signing_input(body) == b"gpucc/travel-log/v1\x00" + canonical_json(body)
    for value in (ORCH_KEY_ID, LOG_HASH_1, LOG_HASH_2, LOG_LINE_1[:60]):
        assert value in DOCS


def _log(key: ec.EllipticCurvePrivateKey, n: int) -> list[bytes]:
    lines: list[bytes] = []
    prev = GENESIS
    for i in range(n):
        line = sign_entry(key, {"schema": LOG_SCHEMA, "seq": i, "prev": prev, "holder_id": f"h{i}"})
        prev = entry_hash(line)
        lines.append(line)
    return lines


def _resign(key: ec.EllipticCurvePrivateKey, line: bytes, **change: Any) -> bytes:
    doc = json.loads(line)
    doc.pop("signature")
    doc.update(change)
    return sign_entry(key, doc)


def test_log_tampering(tmp_path: Path) -> None:
    key = generate_signing_key()
    lines = _log(key, 3)
    pub = key.public_key()
    assert verify_log_lines(lines, pub, require_closed=False).entries == 3
    edited = json.loads(lines[1])
    edited["holder_id"] = "mallory"
    cases = {
        "edited": [lines[0], canonical_json(edited), lines[2]],
        "removed": [lines[0], lines[2]],
        "reordered": [lines[1], lines[0], lines[2]],
        "re-signed by another key": [lines[0], _resign(generate_signing_key(), lines[1]), lines[2]],
        "re-signed, chain broken": [lines[0], _resign(key, lines[1], prev=GENESIS), lines[2]],
        "not canonical": [lines[0], json.dumps(json.loads(lines[1])).encode(), lines[2]],
    }
    for name, case in cases.items():
        with pytest.raises(LogTamperedError):
            verify_log_lines(case, pub, require_closed=False)
            pytest.fail(name)
    path = tmp_path / "log.jsonl"
    path.write_bytes(b"\n".join(lines))  # the last line cut off
    with pytest.raises(MalformedLogError):
        verify_log(path, pub)
    path.write_bytes(b'{"schema":"other"}\n')
    with pytest.raises(MalformedLogError):
        verify_log(path, pub)


def _closed(key: ec.EllipticCurvePrivateKey, lines: list[bytes], planned: int) -> list[bytes]:
    body = closing_entry(
        seq=len(lines),
        prev=entry_hash(lines[-1]) if lines else GENESIS,
        orchestrator_key_id=key_id(key),
        planned=planned,
        done=len(lines),
        finished="2026-01-01T00:00:00.000+00:00",
    )
    return [*lines, sign_entry(key, body)]


def _receipt(key: ec.EllipticCurvePrivateKey, lines: list[bytes], seq: int) -> Receipt:
    return make_receipt(
        key,
        holder_id=f"h{seq}",
        seq=seq,
        entry_hash=entry_hash(lines[seq]),
        transcript_hash="ab" * 48,
    )


def test_closing_entry_head_and_receipts_catch_a_log_cut_back() -> None:
    key = generate_signing_key()
    pub = key.public_key()
    visits = _log(key, 3)
    full = _closed(key, visits, 3)
    summary = verify_log_lines(full, pub)
    assert (summary.entries, summary.planned, summary.complete) == (3, 3, True)
    assert summary.head == entry_hash(full[-1])
    receipts = [Receipt.from_json(_receipt(key, visits, i).to_json()) for i in range(3)]
    assert verify_log_lines(full, pub, expect_head=summary.head, receipts=receipts) == summary

    # cut at its end: no closing entry
    with pytest.raises(LogTamperedError, match="no closing entry"):
        verify_log_lines(visits[:2], pub)
    # cut back and re-closed by the orchestrator: the chain is valid, but not the head...
    recut = _closed(key, visits[:2], 2)
    assert verify_log_lines(recut, pub).complete
    with pytest.raises(LogTamperedError, match="expected head"):
        verify_log_lines(recut, pub, expect_head=summary.head)
    # ...nor the last holder's receipt
    with pytest.raises(LogTamperedError, match="only 2 visit entries"):
        verify_log_lines(recut, pub, receipts=[receipts[2]])
    # a closing entry that lies about the count, or is not last
    lying = dict(json.loads(_closed(key, visits[:2], 3)[-1]))
    lying.pop("signature")
    lying["visits_done"] = 3
    with pytest.raises(LogTamperedError, match="does not match"):
        verify_log_lines([*visits[:2], sign_entry(key, lying)], pub)
    with pytest.raises(LogTamperedError, match="follows the closing"):
        verify_log_lines([*_closed(key, visits[:1], 1), visits[1]], pub, require_closed=False)
    # a replaced entry: the receipt names another hash
    other = _log(key, 2)
    replaced = _closed(key, [visits[0], _resign(key, other[1], prev=entry_hash(visits[0]))], 2)
    with pytest.raises(LogTamperedError, match="another entry"):
        verify_log_lines(replaced, pub, receipts=[receipts[1]])
    # receipts by another orchestrator, or edited after signing
    with pytest.raises(LogTamperedError, match="not signed by this orchestrator"):
        verify_log_lines(full, pub, receipts=[_receipt(generate_signing_key(), visits, 0)])
    edited = json.loads(receipts[0].to_json())
    edited["seq"] = 1
    with pytest.raises(LogTamperedError, match="does not verify"):
        Receipt.from_json(canonical_json(edited)).verify()
    for bad in (b"{}", b"[]", canonical_json({**edited, "seq": True}), b"\xff"):
        with pytest.raises(MalformedReceiptError):
            Receipt.from_json(bad)


def test_envelope_parsing_is_strict() -> None:
    doc = json.loads(ENVELOPE)
    for bad in (
        b"[]",
        b"not json",
        json.dumps({**doc, "extra": 1}).encode(),
        json.dumps({**doc, "signature": "***"}).encode(),
        json.dumps({**doc, "holder_key_id": "00" * 32}).encode(),
    ):
        with pytest.raises(MalformedEnvelopeError):
            Envelope.from_json(bad)


def test_signing_key_files(tmp_path: Path) -> None:
    key = generate_signing_key()
    path = tmp_path / "k.pem"
    write_signing_key(path, key)
    assert path.stat().st_mode & 0o777 == 0o600
    assert key_id(load_signing_key(path)) == key_id(key)
    with pytest.raises(OutputExistsError):
        write_signing_key(path, key)  # never replaced
    path.chmod(0o640)
    with pytest.raises(KeyFileError):
        load_signing_key(path)
    p256 = tmp_path / "p256.pem"
    from cryptography.hazmat.primitives import serialization

    p256.write_bytes(
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    p256.chmod(0o600)
    with pytest.raises(KeyFileError, match="P-384"):
        load_signing_key(p256)
    with pytest.raises(KeyFileError):
        load_public_key(b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
    with pytest.raises(KeyFileError):
        KeyPin.parse("sha256:xyz", "pin")


def test_challenge_store_one_time_and_expiry() -> None:
    now = [0.0]
    store = ChallengeStore(ttl=10, limit=3, clock=lambda: now[0])
    c, ttl = store.issue()
    assert len(c) == 32 and ttl == 10
    store.consume(c)
    with pytest.raises(ChallengeRefused, match="already used"):
        store.consume(c)
    with pytest.raises(ChallengeRefused, match="unknown"):
        store.consume(bytes(32))
    late, _ = store.issue()
    now[0] = 11.0
    with pytest.raises(ChallengeRefused, match="expired"):
        store.consume(late)
    issued = [store.issue()[0] for _ in range(5)]  # bounded: the oldest are dropped
    with pytest.raises(ChallengeRefused):
        store.consume(issued[0])
    store.consume(issued[-1])


def test_challenge_store_caps_each_client() -> None:
    now = [0.0]
    store = ChallengeStore(ttl=10, limit=100, clock=lambda: now[0], per_client=2)
    held = [store.issue("10.0.0.1")[0] for _ in range(2)]
    with pytest.raises(ChallengeRefused, match="outstanding"):
        store.issue("10.0.0.1")
    store.issue("10.0.0.2")  # another client is not affected
    store.consume(held[0])  # a consumed challenge frees its place
    store.issue("10.0.0.1")
    now[0] = 11.0  # and so does an expired one
    store.issue("10.0.0.1")
    store.issue("10.0.0.1")


def test_rate_limiter() -> None:
    limiter = RateLimiter(rate=0.001, burst=2)
    assert [limiter.allow("x") for _ in range(3)] == [True, True, False]
    assert limiter.allow("y")


def _plan_doc(**change: Any) -> dict[str, Any]:
    holder = {
        "id": "a",
        "url": "https://a.example:8443",
        "public_key": "sha256:" + "ab" * 32,
        "datasets": [{"name": "d", "path": "d.gcc", "header_digest": "cd" * 32}],
    }
    doc: dict[str, Any] = {"version": 1, "holders": [holder]}
    doc.update(change)
    return doc


def test_plan_parsing(tmp_path: Path) -> None:
    plan = parse_plan(_plan_doc(orchestrator={"key": "o.key", "log": "l.jsonl"}), tmp_path)
    assert plan.holders[0].datasets[0].path == tmp_path / "d.gcc"
    assert plan.log_path == tmp_path / "l.jsonl" and plan.device == "cpu"
    holder = _plan_doc()["holders"][0]
    bad: list[dict[str, Any]] = [
        _plan_doc(version=2),
        _plan_doc(extra=1),
        _plan_doc(holders=[]),
        _plan_doc(holders=[holder, holder]),
        _plan_doc(holders=[{**holder, "url": "ftp://x"}]),
        # checked at load, not when the journey reaches the holder
        _plan_doc(holders=[{**holder, "url": "http://"}]),
        _plan_doc(holders=[{**holder, "url": "https://a.example:70000"}]),
        _plan_doc(holders=[{**holder, "url": "https://u:p@a.example"}]),
        _plan_doc(holders=[{**holder, "url": "https://a.example/#x"}]),
        _plan_doc(holders=[{**holder, "url": "http://a.example", "tls_ca": "ca.pem"}]),
        _plan_doc(holders=[{**holder, "public_key": "nonsense"}]),
        _plan_doc(holders=[{**holder, "id": "../x"}]),
        _plan_doc(
            holders=[{**holder, "datasets": [{"name": "d", "path": "p", "header_digest": "00"}]}]
        ),
        _plan_doc(device="tpu"),
        _plan_doc(timeout_s=0),
        _plan_doc(training_step="no-colon"),
    ]
    for doc in bad:
        with pytest.raises(PlanError):
            parse_plan(doc)


def test_plan_names_a_holders_image_policy(tmp_path: Path) -> None:
    holder = _plan_doc()["holders"][0]
    plan = parse_plan(_plan_doc(holders=[{**holder, "cvm_policy": "a.policy.yaml"}]), tmp_path)
    assert plan.holders[0].cvm_policy == tmp_path / "a.policy.yaml"
    assert parse_plan(_plan_doc(), tmp_path).holders[0].cvm_policy is None
    for value in ("", 3, None, ["a.yaml"], {"path": "a.yaml"}):
        with pytest.raises(PlanError, match="cvm_policy"):
            parse_plan(_plan_doc(holders=[{**holder, "cvm_policy": value}]))


def test_plan_files_are_read_strictly(tmp_path: Path) -> None:
    pin = "sha256:" + "ab" * 32
    other = "sha256:" + "cd" * 32
    good = (
        "version: 1\nholders:\n  - id: a\n    url: http://127.0.0.1:1\n"
        f"    public_key: {pin}\n"
        "    datasets:\n      - {name: d, path: d.gcc, header_digest: '" + "00" * 32 + "'}\n"
    )
    path = tmp_path / "plan.yaml"
    path.write_text(good)
    assert load_plan(path).holders[0].pin.key_id == "ab" * 32
    hostile = {
        "version: true": good.replace("version: 1", "version: true"),
        "version: 1.0": good.replace("version: 1", "version: 1.0"),
        # a reviewer reads the first pin; a lenient parser would use the second
        "two pins": good.replace(
            f"public_key: {pin}", f"public_key: {pin}\n    public_key: {other}"
        ),
        "deep": "[" * 50_000 + "]" * 50_000,
        "tag": good.replace("id: a", "id: !!python/object:os.system a"),
        "alias": good.replace("id: a", "id: &x a\n    tls_ca: *x"),
    }
    for name, text in hostile.items():
        path.write_text(text)
        with pytest.raises(PlanError):
            load_plan(path)
            pytest.fail(name)


def test_policy_version_must_be_the_integer_one(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    for text in ("version: true\n", "version: 1.0\n", "version: 1\nversion: 1\n"):
        path.write_text(text)
        with pytest.raises(MalformedPolicyError):
            load_policy(path)
    path.write_text("version: 1\n")
    assert load_policy(path).require_nonce


def test_model_digest_covers_names_shapes_dtypes_and_bytes() -> None:
    base = {"w": np.zeros((2, 3), dtype=np.float32), "b": np.ones(3, dtype=np.float32)}
    d = model_digest(base)
    assert d == model_digest({"b": base["b"].copy(), "w": base["w"].copy()})
    assert d != model_digest({**base, "w": base["w"].reshape(3, 2)})
    assert d != model_digest({**base, "w": base["w"].astype(np.float64)})
    assert d != model_digest({"w2": base["w"], "b": base["b"]})
    changed = {k: v.copy() for k, v in base.items()}
    changed["b"][1] = 2.0
    assert d != model_digest(changed)


def test_scrub_receipt_and_a_scrub_that_does_not_zero() -> None:
    buf = np.frombuffer(b"secret data", dtype=np.uint8).copy()
    receipt = scrub_and_check("d", "cpu", buf, lambda b: b.fill(0))
    assert receipt.to_dict() == {"name": "d", "device": "cpu", "bytes": 11, "nonzero": 0}
    with pytest.raises(ScrubError, match="11 bytes read back non-zero"):
        scrub_and_check("d", "cpu", np.full(11, 7, dtype=np.uint8), lambda b: None)


def test_canonical_json_is_stable() -> None:
    assert canonical_json({"b": 1, "a": "é"}) == b'{"a":"\\u00e9","b":1}'
    assert base64.b64decode(json.loads(ENVELOPE)["answer"]) == ANSWER


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")
def test_signing_key_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "k.pem"
    write_signing_key(path, generate_signing_key())
    os.chown(path, 54321, -1)
    with pytest.raises(KeyFileError, match="owned by uid"):
        load_signing_key(path)
