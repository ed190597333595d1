"""Chain validation on NVIDIA's real device and RIM chains, at explicit times."""

from __future__ import annotations

import datetime as dt

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from gpucc.core.errors import MalformedCertificateError
from gpucc.gpuattest.chain import (
    MAX_PEM_CHAIN_BYTES,
    ChainStatus,
    load_pem_chain,
    validate_chain,
)
from gpucc.gpuattest.rim import ReferenceManifest
from gpucc.gpuattest.trust import TrustRoots
from tests.support.samples import HEAD_CHAIN, IN_WINDOW, SET_A_CHAIN, SET_A_DRIVER_RIM

ROOTS = TrustRoots.nvidia()
DEVICE = load_pem_chain(SET_A_CHAIN.read_bytes())
RIM = ReferenceManifest.parse(SET_A_DRIVER_RIM.read_bytes()).certificates
# The set-A driver RIM's signer ("HCC RIM L4 Signer") is valid 2023-06-27 .. 2025-06-26.
SIGNER_NOT_AFTER = dt.datetime(2025, 6, 26, 6, 10, 12, tzinfo=dt.UTC)


def pem(certs: tuple[x509.Certificate, ...] | list[x509.Certificate]) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)


# --- loading ---------------------------------------------------------------------------


def test_the_sample_chain_loads_leaf_first() -> None:
    assert len(DEVICE) == 5
    assert DEVICE[0].subject.rfc4514_string().startswith("CN=GH100 A01 GSP FMC LF")
    assert DEVICE[-1] == ROOTS.device_root
    assert load_pem_chain(pem(DEVICE)) == DEVICE


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"", "cannot be parsed"),
        (b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", "cannot be parsed"),
        (b"x" * (MAX_PEM_CHAIN_BYTES + 1), "more than"),
        (pem(list(DEVICE) * 3), "has 15 certificates"),  # more than the cap of 10
    ],
)
def test_bad_pem_is_malformed_input(data: bytes, words: str) -> None:
    with pytest.raises(MalformedCertificateError, match=words):
        load_pem_chain(data)


# --- the device chain -----------------------------------------------------------------------


def test_the_device_chain_is_valid_to_the_pinned_root() -> None:
    result = validate_chain(DEVICE, ROOTS.device_root, IN_WINDOW, expected_length=5)
    assert result.status is ChainStatus.VALID and result.ok
    assert result.reason == ""
    assert result.certificates == DEVICE
    # NVIDIA's device certificates do not expire.
    assert result.earliest_expiry == dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.UTC)


def test_another_gpus_chain_is_valid_to_the_same_root() -> None:
    head = load_pem_chain(HEAD_CHAIN.read_bytes())
    assert head[0] != DEVICE[0]
    assert validate_chain(head, ROOTS.device_root, IN_WINDOW).ok


def test_the_device_chain_does_not_end_in_the_rim_root() -> None:
    result = validate_chain(DEVICE, ROOTS.rim_root, IN_WINDOW)
    assert result.status is ChainStatus.INVALID and not result.ok
    assert "'NVIDIA Device Identity CA', which is not the pinned root" in result.reason


def test_a_wrong_length_is_invalid() -> None:
    result = validate_chain(DEVICE, ROOTS.device_root, IN_WINDOW, expected_length=4)
    assert result.status is ChainStatus.INVALID
    assert result.reason == "expected 4 certificates, found 5"


def test_a_gap_or_wrong_order_is_invalid() -> None:
    gap = [DEVICE[0], *DEVICE[2:]]
    result = validate_chain(gap, ROOTS.device_root, IN_WINDOW)
    assert result.status is ChainStatus.INVALID
    assert "'GH100 A01 GSP FMC LF' is not issued by 'NVIDIA GH100 Provisioner ICA 1'" in (
        result.reason
    )
    swapped = [DEVICE[1], DEVICE[0], *DEVICE[2:]]
    assert validate_chain(swapped, ROOTS.device_root, IN_WINDOW).status is ChainStatus.INVALID


def test_an_empty_chain_is_invalid() -> None:
    result = validate_chain([], ROOTS.device_root, IN_WINDOW)
    assert result.status is ChainStatus.INVALID and result.reason == "the chain is empty"


def test_before_the_intermediates_existed_the_chain_is_expired_not_invalid() -> None:
    # The Provisioner ICA is valid from 2022-03-01; the links themselves are sound.
    result = validate_chain(DEVICE, ROOTS.device_root, dt.datetime(2021, 6, 1, tzinfo=dt.UTC))
    assert result.status is ChainStatus.EXPIRED and not result.ok
    assert "is not valid before" in result.reason


def test_an_expired_chain_with_a_broken_link_is_invalid() -> None:
    """Expiry is reported only when nothing else is wrong."""
    gap = [DEVICE[0], *DEVICE[2:]]
    early = dt.datetime(2021, 6, 1, tzinfo=dt.UTC)
    assert validate_chain(gap, ROOTS.device_root, early).status is ChainStatus.INVALID


def test_the_verification_time_must_be_timezone_aware() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        validate_chain(DEVICE, ROOTS.device_root, dt.datetime(2024, 1, 1))


# --- the RIM chain ------------------------------------------------------------------------------


def test_the_rim_chain_is_valid_while_its_signer_is() -> None:
    result = validate_chain(RIM, ROOTS.rim_root, IN_WINDOW)
    assert result.status is ChainStatus.VALID
    assert result.earliest_expiry == SIGNER_NOT_AFTER


def test_the_rim_chain_expires_with_its_signer() -> None:
    at_expiry = validate_chain(RIM, ROOTS.rim_root, SIGNER_NOT_AFTER)
    assert at_expiry.status is ChainStatus.VALID
    later = validate_chain(RIM, ROOTS.rim_root, SIGNER_NOT_AFTER + dt.timedelta(seconds=1))
    assert later.status is ChainStatus.EXPIRED
    assert later.reason.startswith("'HCC RIM L4 Signer' expired on 2025-06-26T06:10:12")


def test_the_rim_chain_does_not_validate_to_the_device_root() -> None:
    result = validate_chain(RIM, ROOTS.device_root, IN_WINDOW)
    assert result.status is ChainStatus.INVALID
    assert "not the pinned root" in result.reason


def test_a_certificate_listed_twice_is_a_broken_link() -> None:
    result = validate_chain([DEVICE[0], *DEVICE], ROOTS.device_root, IN_WINDOW)
    assert result.status is ChainStatus.INVALID
    assert "'GH100 A01 GSP FMC LF' is not issued by 'GH100 A01 GSP FMC LF'" in result.reason
