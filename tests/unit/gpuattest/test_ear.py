"""EAR results: the outcome mapping, a joserfc round trip with one submodule per part, and
the checks verify_ear makes."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from joserfc import jwt as jose_jwt
from joserfc.jwk import ECKey

from gpucc.gpuattest.corim import RELAXATION_UNSIGNED
from gpucc.gpuattest.ear import (
    EAR_PROFILE,
    EarStatus,
    EarSubmodule,
    Outcome,
    part_of,
    sign_ear,
    verify_ear,
)
from gpucc.gpuattest.eat import key_id
from gpucc.gpuattest.jws import MalformedTokenError, TokenCheckError, sign_es384

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
NONCE = bytes.fromhex("0497d7698d84fbd3d06741ae70aa329337501f44d4c227421eb6454aefc654a8")


@pytest.fixture(scope="module")
def key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP384R1())


def parts(*outcomes: Outcome) -> list[EarSubmodule]:
    out = [
        EarSubmodule(
            f"GPU-{i}",
            o,
            {"hwmodel": "GR100 A01 GSP", "x-gpucc-purpose": "CC MPT"},
            reasons=() if o is Outcome.TRUSTED else ("measurement mismatch",),
            relaxations=(RELAXATION_UNSIGNED,) if i == 0 else (),
        )
        for i, o in enumerate(outcomes)
    ]
    return [*out, EarSubmodule("CVM", Outcome.TRUSTED, {"tee": "sev-snp"})]


def test_ear_round_trips_through_joserfc_with_one_submodule_per_part(
    key: ec.EllipticCurvePrivateKey,
) -> None:
    token = sign_ear(parts(Outcome.TRUSTED, Outcome.TRUSTED), private_key=key, nonce=NONCE, now=NOW)
    decoded = jose_jwt.decode(token, ECKey.import_key(key.public_key()), algorithms=["ES384"])
    assert decoded.header == {"alg": "ES384", "kid": key_id(key.public_key()), "typ": "JWT"}
    claims = decoded.claims
    assert claims["eat_profile"] == EAR_PROFILE
    assert claims["ear.status"] == "affirming"
    assert claims["eat_nonce"] == NONCE.hex()
    assert claims["iat"] == claims["nbf"] == int(NOW.timestamp())
    assert sorted(claims["submods"]) == ["CVM", "GPU-0", "GPU-1"]
    gpu0 = claims["submods"]["GPU-0"]
    assert gpu0["ear.status"] == "affirming" and gpu0["ear.gpucc.outcome"] == "trusted"
    assert gpu0["ear.gpucc.claims"]["x-gpucc-purpose"] == "CC MPT"
    assert gpu0["ear.gpucc.relaxations"] == [RELAXATION_UNSIGNED]
    assert claims["submods"]["CVM"]["ear.gpucc.claims"] == {"tee": "sev-snp"}
    verified = verify_ear(token, key.public_key(), now=NOW, nonce=NONCE)
    assert verified.affirming and verified.status is EarStatus.AFFIRMING
    assert sorted(verified.submods) == ["CVM", "GPU-0", "GPU-1"]


@pytest.mark.parametrize(
    ("outcomes", "status"),
    [
        ((Outcome.TRUSTED, Outcome.NOT_TRUSTED), "contraindicated"),
        ((Outcome.TRUSTED, Outcome.UNDECIDED), "none"),
        ((Outcome.UNDECIDED, Outcome.NOT_TRUSTED), "contraindicated"),
    ],
)
def test_the_worst_part_decides_and_undecided_is_none(
    key: ec.EllipticCurvePrivateKey, outcomes: tuple[Outcome, ...], status: str
) -> None:
    token = sign_ear(parts(*outcomes), private_key=key, nonce=NONCE, now=NOW)
    verified = verify_ear(token, key.public_key(), now=NOW)
    assert verified.status == status and not verified.affirming
    expected = {"trusted": "affirming", "not-trusted": "contraindicated", "undecided": "none"}
    for i, o in enumerate(outcomes):
        assert verified.submods[f"GPU-{i}"] == expected[o]


def _claims(key: ec.EllipticCurvePrivateKey) -> dict[str, Any]:
    token = sign_ear(
        parts(Outcome.TRUSTED, Outcome.NOT_TRUSTED), private_key=key, nonce=NONCE, now=NOW
    )
    return dict(
        jose_jwt.decode(token, ECKey.import_key(key.public_key()), algorithms=["ES384"]).claims
    )


def test_an_ear_that_affirms_over_a_contraindicated_part_is_refused(
    key: ec.EllipticCurvePrivateKey,
) -> None:
    claims = _claims(key)
    claims["ear.status"] = "affirming"
    forged = sign_es384({"typ": "JWT"}, claims, key)
    with pytest.raises(TokenCheckError, match="worst of its submodules") as caught:
        verify_ear(forged, key.public_key(), now=NOW)
    assert caught.value.check == "ear.status"


@pytest.mark.parametrize(
    ("change", "check"),
    [
        ({"eat_profile": "tag:example.com,2020:other"}, "eat_profile"),
        ({"iss": "someone"}, "iss"),
        ({"exp": int(NOW.timestamp()) - 3600}, "exp"),
        ({"eat_nonce": "00" * 32}, "eat_nonce"),
        ({"submods": {}}, "submods"),
        ({"submods": {"GPU-0": {"ear.status": "fine"}}}, "ear.status"),
    ],
)
def test_verify_ear_checks(
    key: ec.EllipticCurvePrivateKey, change: dict[str, Any], check: str
) -> None:
    claims = {**_claims(key), **change}
    token = sign_es384({"typ": "JWT"}, claims, key)
    with pytest.raises(TokenCheckError) as caught:
        verify_ear(token, key.public_key(), now=NOW, nonce=NONCE)
    assert caught.value.check == check


def test_wrong_key_alg_none_and_garbage(key: ec.EllipticCurvePrivateKey) -> None:
    token = sign_ear(parts(Outcome.TRUSTED), private_key=key, nonce=NONCE, now=NOW)
    other = ec.generate_private_key(ec.SECP384R1())
    with pytest.raises(TokenCheckError, match="signature"):
        verify_ear(token, other.public_key(), now=NOW)
    header, payload, _ = token.split(".")
    with pytest.raises(TokenCheckError, match="alg"):
        verify_ear("eyJhbGciOiJub25lIn0." + payload + ".", key.public_key(), now=NOW)
    with pytest.raises(MalformedTokenError):
        verify_ear(b"\x00\x01not a token", key.public_key(), now=NOW)
    assert header


def test_sign_ear_refuses_what_it_cannot_sign(key: ec.EllipticCurvePrivateKey) -> None:
    with pytest.raises(ValueError, match="parts"):
        sign_ear([], private_key=key, nonce=NONCE, now=NOW)
    twice = [EarSubmodule("GPU-0", Outcome.TRUSTED)] * 2
    with pytest.raises(ValueError, match="distinct"):
        sign_ear(twice, private_key=key, nonce=NONCE, now=NOW)
    with pytest.raises(ValueError, match="P-384"):
        p256 = ec.generate_private_key(ec.SECP256R1())
        sign_ear(parts(Outcome.TRUSTED), private_key=p256, nonce=NONCE, now=NOW)


def test_part_of_a_gpu_result(key: ec.EllipticCurvePrivateKey) -> None:
    from gpucc.gpuattest.result import Check, CheckStatus, Decision, GpuResult, Verdict

    checks = (
        Check("signature", "report signature", CheckStatus.PASS, decision=Decision.ACCEPT),
        Check(
            "ocsp",
            "OCSP",
            CheckStatus.NOT_CHECKED,
            reason="offline",
            decision=Decision.ACCEPT,
            relaxation="ocsp.require: false",
        ),
        Check("measurements", "CoRIM", CheckStatus.NOT_CHECKED, reason="no CoRIM",
              collateral_missing=True, decision=Decision.UNDECIDED),
    )  # fmt: skip
    gpu = GpuResult(
        index=0,
        uuid=None,
        arch="RUBIN",
        checks=checks,
        claims={"hwmodel": "GR100 A01 GSP"},
        measurements=None,
        report_digest=b"\0" * 32,
        driver_rim_id="",
        vbios_rim_id="",
        verdict=Verdict.UNDECIDED,
    )
    part = part_of("GPU-0", gpu, relaxations=[RELAXATION_UNSIGNED, "ocsp.require: false"])
    assert part.status is EarStatus.NONE and part.outcome is Outcome.UNDECIDED
    assert part.relaxations == ("ocsp.require: false", RELAXATION_UNSIGNED)
    assert part.reasons == gpu.reasons and part.reasons
    token = sign_ear([part], private_key=key, nonce=NONCE, now=NOW)
    sub = jose_jwt.decode(token, ECKey.import_key(key.public_key()), algorithms=["ES384"])
    assert sub.claims["submods"]["GPU-0"]["ear.gpucc.claims"] == {"hwmodel": "GR100 A01 GSP"}
    assert sub.claims["ear.status"] == "none"
