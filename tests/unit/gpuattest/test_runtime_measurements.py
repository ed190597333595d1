"""Every runtime measurement of a report reaches the result and its JSON in full, marked
unverified when the report does not authenticate (signature or device chain)."""

from __future__ import annotations

from gpucc.gpuattest.collateral import FileRimSource, NoOcsp
from gpucc.gpuattest.policy import parse_policy
from gpucc.gpuattest.result import (
    Check,
    CheckStatus,
    RuntimeMeasurement,
    runtime_measurements_of,
)
from gpucc.gpuattest.simulate import SimulatedGpu
from gpucc.gpuattest.switch_result import SwitchResult
from gpucc.gpuattest.trust import TrustRoots
from gpucc.gpuattest.verifier import verify
from tests.support.samples import (
    HEAD_CHAIN,
    IN_WINDOW,
    SET_A_DRIVER_RIM,
    SET_A_NONCE,
    SET_A_REPORT,
    SET_A_VBIOS_RIM,
    SWITCH_REPORT,
    report_bytes,
)
from tests.support.spdm import spdm_measurement_blocks
from tests.unit.gpuattest.test_switch import _evidence, _verify
from tests.unit.gpuattest.test_verifier import run_set_a, set_a


def _as_dicts(blocks: dict[int, bytes]) -> list[dict[str, object]]:
    return [{"index": i, "value": blocks[i].hex()} for i in sorted(blocks)]


def _flipped_signature(report: bytes) -> bytes:
    data = bytearray(report)
    data[-5] ^= 0x10  # inside the signature: the blocks themselves stay as they were
    return bytes(data)


def test_a_verified_gpu_report_carries_every_block_in_index_order() -> None:
    blocks = spdm_measurement_blocks(report_bytes(SET_A_REPORT))
    gpu = run_set_a().gpus[0]
    assert gpu.check("report-signature").status is CheckStatus.PASS
    assert len(blocks) == 64
    assert gpu.runtime_measurements == tuple(
        RuntimeMeasurement(i, blocks[i], authenticated=True) for i in sorted(blocks)
    )
    doc = gpu.to_dict()
    assert doc["runtime_measurements"] == _as_dicts(blocks)
    assert all(len(m["value"]) == 96 for m in doc["runtime_measurements"])
    assert doc["unverified_runtime_measurements"] == []


def test_a_bad_signature_moves_every_value_to_the_unverified_list() -> None:
    report = _flipped_signature(report_bytes(SET_A_REPORT))
    gpu = run_set_a(evidence=set_a(report)).gpus[0]
    assert gpu.check("report-signature").status is CheckStatus.FAIL
    blocks = spdm_measurement_blocks(report)
    assert [(m.index, m.value) for m in gpu.runtime_measurements] == sorted(blocks.items())
    assert not any(m.authenticated for m in gpu.runtime_measurements)
    doc = gpu.to_dict()
    assert doc["runtime_measurements"] == []
    assert doc["unverified_runtime_measurements"] == _as_dicts(blocks)


def test_another_gpus_chain_leaves_the_values_unverified() -> None:
    # A valid chain of another GPU: the signature does not verify with its leaf key.
    gpu = run_set_a(evidence=set_a(chain=HEAD_CHAIN.read_bytes())).gpus[0]
    assert gpu.check("device-chain").status is CheckStatus.PASS
    assert gpu.runtime_measurements and not any(m.authenticated for m in gpu.runtime_measurements)
    assert gpu.to_dict()["runtime_measurements"] == []


def test_a_chain_that_does_not_reach_the_roots_leaves_the_values_unverified() -> None:
    # Set A under another device root: the signature still verifies with the leaf key,
    # but nothing ties that key to the roots the verification trusts.
    nvidia = TrustRoots.nvidia()
    other = SimulatedGpu.create(now=IN_WINDOW).roots
    roots = TrustRoots(device_root=other.device_root, rim_root=nvidia.rim_root)
    gpu = verify(
        set_a(),
        expected_nonce=bytes.fromhex(SET_A_NONCE),
        roots=roots,
        now=IN_WINDOW,
        rims=FileRimSource(SET_A_DRIVER_RIM, SET_A_VBIOS_RIM),
        ocsp=NoOcsp(),
        policy=parse_policy({"ocsp": {"require": False}}),
    ).gpus[0]
    assert gpu.check("report-signature").status is CheckStatus.PASS
    assert gpu.check("device-chain").status is CheckStatus.FAIL
    assert not any(m.authenticated for m in gpu.runtime_measurements)
    assert len(gpu.to_dict()["unverified_runtime_measurements"]) == 64


def _switch(result_report: bytes | None = None) -> SwitchResult:
    return _verify(_evidence(result_report)).switches[0]


def test_a_switch_report_carries_its_31_blocks() -> None:
    blocks = spdm_measurement_blocks(report_bytes(SWITCH_REPORT))
    switch = _switch()
    assert switch.check("report-signature").status is CheckStatus.PASS
    assert len(blocks) == 31
    doc = switch.to_dict()
    assert doc["runtime_measurements"] == _as_dicts(blocks)
    assert doc["unverified_runtime_measurements"] == []


def test_a_switch_report_with_a_bad_signature_is_unverified() -> None:
    report = _flipped_signature(report_bytes(SWITCH_REPORT))
    switch = _switch(report)
    assert switch.check("report-signature").status is CheckStatus.FAIL
    doc = switch.to_dict()
    assert doc["runtime_measurements"] == []
    assert doc["unverified_runtime_measurements"] == _as_dicts(spdm_measurement_blocks(report))


def test_a_revoked_device_chain_leaves_the_values_unverified() -> None:
    # The GPU of set A as verified, with its device-chain OCSP check failed in its place
    # (revoked): the signature and chain still pass, but a revoked key vouches for nothing.
    gpu = run_set_a().gpus[0]
    revoked = Check("device-ocsp", "Device certificate OCSP", CheckStatus.FAIL, "revoked")
    checks = tuple(revoked if c.id == "device-ocsp" else c for c in gpu.checks)
    blocks = spdm_measurement_blocks(report_bytes(SET_A_REPORT))
    found = runtime_measurements_of(blocks, checks)
    assert [(m.index, m.value) for m in found] == sorted(blocks.items())
    assert not any(m.authenticated for m in found)
    not_checked = gpu.check("device-ocsp")
    assert not_checked.status is CheckStatus.NOT_CHECKED  # offline: its own reported check
    assert all(m.authenticated for m in runtime_measurements_of(blocks, gpu.checks))
