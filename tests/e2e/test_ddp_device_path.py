"""The GPU path of encrypted DDP in real multi-process gloo groups, without a GPU.

Ranks that seal on the "device" run :class:`gpucc.ddp.crypt.DeviceCrypt` and the message
kernels' launches against ``tests/support/fake_cupy.py`` (installed in each forked rank),
whose kernels are emulated with ``cryptography`` from the descriptors the keyring uploads: a
wrong offset, key index, nonce or AAD fails authentication on the peer. Groups mix device and
host ranks, so both paths must agree on every message, and plain DDP's parameters must come
out. Tampering must be detected on a device rank through the verdict words it reads at the
step's end. The real kernels on a real GPU: ``tests/gpu/test_gpu_ddp.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpucc.ddp import EncryptedAllReduce
from tests.e2e.test_ddp_group import (
    STEPS,
    establish,
    make_ddp,
    make_model,
    max_diff,
    params,
    run_attack,
    run_group,
    tamperer,
    train_step,
)

# Which ranks seal on the device, per case.
LAYOUTS = {"mixed": {0}, "all": None}


def install_fake_cupy() -> Any:
    from gpucc.staging import _gpu_runtime
    from tests.support import fake_cupy

    fake_cupy.reset(devices=1)
    _gpu_runtime.import_cupy = lambda: fake_cupy
    _gpu_runtime._modules.clear()
    return fake_cupy


def parity(keys: Any, algorithm: str, on_device: bool) -> dict[str, Any]:
    plain, plain_opt = make_ddp(None)
    state = EncryptedAllReduce(
        keys,
        algorithm=algorithm,  # type: ignore[arg-type]
        device_crypto=on_device,
    )
    enc, enc_opt = make_ddp(state)
    for step in range(STEPS):
        train_step(plain, plain_opt, step)
        train_step(enc, enc_opt, step)
    state.close()
    return {
        "diff": max_diff(params(plain), params(enc)),
        "moved": max_diff(params(enc), [p.detach() for p in make_model().parameters()]),
        "steps": state.stats.steps,
    }


def scenario(rank: int, size: int) -> dict[str, Any]:
    fake = install_fake_cupy()
    keys = establish()
    out: dict[str, Any] = {}
    for layout, device_ranks in LAYOUTS.items():
        on_device = device_ranks is None or rank in device_ranks
        for algorithm in ("a2a", "ring"):
            before = len(fake.Config.launches)
            got = parity(keys, algorithm, on_device)
            launches = [name for name, _, _ in fake.Config.launches[before:]]
            got["msgs_launches"] = launches.count("gcm_msgs_finalize")
            out[f"{layout}/{algorithm}"] = got
    # rank 0 seals on the device and is the victim; its peers stay on the host
    dev = {"device_crypto": rank == 0}
    for kind in ("flip", "replay", "drop"):
        out[f"a2a/{kind}"] = run_attack(keys, "a2a", tamperer(kind, victim=0), **dev)
    out["ring/flip"] = run_attack(keys, "ring", tamperer("flip", 0, sender=size - 1), **dev)
    return out


def device_attack(rank: int, size: int) -> dict[str, Any]:
    """Every rank on the device path."""
    install_fake_cupy()
    keys = establish()
    return {
        "a2a/flip": run_attack(keys, "a2a", tamperer("flip", victim=0), device_crypto=True),
        "ring/flip": run_attack(
            keys, "ring", tamperer("flip", 0, sender=size - 1), device_crypto=True
        ),
    }


@pytest.fixture(scope="module", params=[2, 3], ids=["2ranks", "3ranks"])
def group(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    size = int(request.param)
    return size, run_group(size, tmp_path_factory.mktemp(f"ddpdev{size}"), scenario)


@pytest.mark.parametrize("case", ["mixed/a2a", "mixed/ring", "all/a2a", "all/ring"])
def test_the_device_path_gives_plain_ddp_parameters(group: Any, case: str) -> None:
    size, results = group
    layout = case.split("/")[0]
    for rank, r in enumerate(results):
        got = r[case]
        assert got["steps"] == STEPS and got["moved"] > 0.0
        assert got["diff"] == 0.0 if size == 2 else got["diff"] <= 1e-6
        on_device = layout == "all" or rank == 0
        # one open batch per round: a2a 2 per bucket, the ring 2 (N-1); seals add as many
        assert (got["msgs_launches"] > 0) == on_device, (rank, got)


@pytest.mark.parametrize("case", ["a2a/flip", "a2a/replay", "a2a/drop", "ring/flip"])
def test_tampering_is_detected_by_the_device_verdicts(group: Any, case: str) -> None:
    size, results = group
    victim = results[0][case]
    assert victim["error"] == "GradientAuthenticationError", victim
    sender = size - 1 if case.startswith("ring/") else 1
    assert (victim["sender"], victim["receiver"], victim["bucket"]) == (sender, 0, 0)
    assert victim["phase"] == ("ring-scatter" if case.startswith("ring/") else "a2a-scatter")
    assert victim["at"] == 1 and victim["unchanged"]
    for other in results[1:]:
        assert other[case]["error"] == "PeerAuthenticationError"
        assert other[case]["unchanged"]


def test_every_rank_on_the_device(tmp_path: Path) -> None:
    results = run_group(2, tmp_path, device_attack)
    for case in ("a2a/flip", "ring/flip"):
        assert results[0][case]["error"] == "GradientAuthenticationError"
        assert results[1][case]["error"] == "PeerAuthenticationError"
        assert results[0][case]["unchanged"] and results[1][case]["unchanged"]


# --- the same, with the real message kernels (run on the CPU: tests/support/cudacpu) ------------


def install_cpu_kernels() -> Any:
    """The CuPy backend that runs aesgcm.cu itself on the CPU, in this rank's process."""
    from gpucc.staging import _gpu_kat
    from tests.support.cudacpu import backend

    patch = pytest.MonkeyPatch()  # never undone: the rank's process ends with its scenario
    cpu = backend.install(patch, devices=1)
    patch.setattr(_gpu_kat, "_KAT_TILES", 3)  # the dataset start-up checks, kept cheap
    return cpu


def kernels_on_cpu(rank: int, size: int) -> dict[str, Any]:
    from tests.support.cudacpu import backend

    install_cpu_kernels()
    keys = establish()
    out: dict[str, Any] = {"parity": parity(keys, "a2a", True)}
    out["a2a/flip"] = run_attack(keys, "a2a", tamperer("flip", victim=0), device_crypto=True)
    out["kernels"] = sorted({name for name, _, _ in backend.launches})
    return out


def test_every_rank_on_the_device_with_the_real_kernels(tmp_path: Path) -> None:
    """Both ranks seal and open their gradients with gcm_msgs and gcm_msgs_finalize
    themselves (executed on the CPU): plain DDP's parameters come out, and a flipped frame is
    caught by the kernels' verdict words."""
    from gpucc.staging import _gpu_runtime
    from tests.support import cudacpu

    if not cudacpu.available():
        pytest.skip("no C++ compiler: the CUDA sources cannot run on the CPU here")
    cudacpu.build(_gpu_runtime._kernel_source(), _gpu_runtime._NVRTC_OPTIONS)  # once, here
    results = run_group(2, tmp_path, kernels_on_cpu)
    for rank, r in enumerate(results):
        assert r["parity"]["steps"] == STEPS and r["parity"]["diff"] == 0.0, rank
        assert {"gcm_msgs", "gcm_msgs_finalize"} <= set(r["kernels"]), rank
    assert results[0]["a2a/flip"]["error"] == "GradientAuthenticationError"
    assert results[1]["a2a/flip"]["error"] == "PeerAuthenticationError"
    assert results[0]["a2a/flip"]["unchanged"] and results[1]["a2a/flip"]["unchanged"]
