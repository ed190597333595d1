"""Encrypted DDP's GPU path on a real GPU: the message kernels and CUDA buckets end to end.

Every test is marked ``gpu`` and skips cleanly without CuPy or a CUDA device (the DDP test
also without a CUDA build of PyTorch). With a device, a kernel that does not build or fails
its known answers is a failure, not a skip. What runs:

* the message kernels' load-time known answers, then random batches (0 bytes to several
  tiles, many keys, 52-byte AADs) sealed on the GPU and compared with ``cryptography``,
  opened back into poisoned outputs, and the tamper matrix (ciphertext, tag, AAD, nonce,
  key): exactly the tampered messages flagged and zeroed;
* two ranks on one GPU (gloo, CUDA buckets, separate processes): the parameters after
  several steps equal plain DDP's, a flipped bit in a received frame stops both ranks with
  the typed errors and no parameter changes.

Inputs are fresh random bytes on every run; the seed is printed (``GPUCC_TEST_SEED`` replays).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from gpucc.staging.gpu_messages import DeviceKeyring, DeviceMessage
from tests.support.gpu import real_cupy
from tests.support.paths import ROOT

pytestmark = pytest.mark.gpu

SENTINEL = 0xA5


@pytest.fixture(scope="module")
def cp() -> Iterator[Any]:
    yield real_cupy()


def _batch(
    rng: np.random.Generator, lengths: list[int], keys: int
) -> tuple[list[DeviceMessage], bytes, int]:
    msgs, src, dst = [], 0, 0
    for i, n in enumerate(lengths):
        msgs.append(
            DeviceMessage(
                key=int(rng.integers(0, keys)),
                nonce=rng.bytes(12),
                aad=rng.bytes(52 if i % 3 else int(rng.integers(0, 40))),
                src=src,
                dst=dst,
                tag=dst + n,
                length=n,
            )
        )
        src += -(-n // 16) * 16 + 16 * int(rng.integers(0, 3))
        dst += -(-(n + 16) // 16) * 16
    return msgs, rng.bytes(src), dst


def test_message_batches_match_cryptography_and_reject_tampering(
    cp: Any, rng: np.random.Generator
) -> None:
    keys = [rng.bytes(32) for _ in range(6)]
    tile = 16384
    lengths = [0, 1, 15, 16, 17, 4095, tile - 1, tile, tile + 1, 3 * tile + 5, 1 << 20, 52]
    lengths += [int(rng.integers(0, 200_000)) for _ in range(20)]
    msgs, plain, frames = _batch(rng, lengths, len(keys))
    with DeviceKeyring(keys) as ring:
        sealed = cp.empty(frames, dtype=cp.uint8)
        sealed.fill(SENTINEL)
        ring.seal(msgs, cp.asarray(np.frombuffer(plain, dtype=np.uint8)), sealed)
        out = bytes(cp.asnumpy(sealed).tobytes())
        for m in msgs:
            want = AESGCM(keys[m.key]).encrypt(m.nonce, plain[m.src : m.src + m.length], m.aad)
            assert out[m.dst : m.dst + m.length + 16] == want, m.length
        back = [DeviceMessage(m.key, m.nonce, m.aad, m.dst, m.src, m.tag, m.length) for m in msgs]
        tampered = bytearray(out)
        tampered[back[7].src + 100] ^= 1  # ciphertext
        tampered[back[8].tag + 3] ^= 0x40  # tag
        bad = list(back)
        bad[9] = DeviceMessage(
            bad[9].key, bad[9].nonce, b"x" + bad[9].aad[1:], *_where(bad[9])
        )  # AAD
        bad[10] = DeviceMessage(bad[10].key, bytes(12), bad[10].aad, *_where(bad[10]))  # nonce
        other = (bad[11].key + 1) % len(keys)
        bad[11] = DeviceMessage(other, bad[11].nonce, bad[11].aad, *_where(bad[11]))  # key
        opened = cp.empty(len(plain), dtype=cp.uint8)
        opened.fill(SENTINEL)
        status = ring.open(bad, cp.asarray(np.frombuffer(bytes(tampered), np.uint8)), opened)
        verdicts = [int(v) for v in cp.asnumpy(status)]
        got = bytes(cp.asnumpy(opened).tobytes())
    flagged = {7, 8, 9, 10, 11}
    assert verdicts == [1 if i in flagged else 0 for i in range(len(msgs))]
    for i, m in enumerate(msgs):
        want = bytes(m.length) if i in flagged else plain[m.src : m.src + m.length]
        assert got[m.src : m.src + m.length] == want, i


def _where(m: DeviceMessage) -> tuple[int, int, int, int]:
    return m.src, m.dst, m.tag, m.length


# --- two ranks, CUDA buckets, gloo --------------------------------------------------------


def _torch_cuda() -> Any:
    try:
        torch = importlib.import_module("torch")
    except ImportError as exc:
        pytest.skip(f"PyTorch is not installed: {exc}")
    if not torch.cuda.is_available():
        pytest.skip("this PyTorch build has no CUDA device")
    return torch


def rank_main(rank: int, size: int, port: int, out: str) -> None:
    """One rank (a separate process): plain DDP vs encrypted DDP on cuda:0, then a flip."""
    import datetime as dt

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gpucc.ddp import (
        EncryptedAllReduce,
        GradientAuthenticationError,
        GroupKeys,
        PeerAuthenticationError,
        encrypted_allreduce_hook,
    )

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=size, timeout=dt.timedelta(seconds=60))
    torch.cuda.set_device(0)
    # Attestation is tested elsewhere; here the keys come from fixed pairwise secrets.
    secrets = {
        p: hashlib.sha384(b"gpu-ddp-test %d %d" % tuple(sorted((rank, p)))).digest()
        for p in range(size)
        if p != rank
    }
    keys = GroupKeys(rank=rank, world_size=size, shared_secrets=secrets, transcript_hash=bytes(48))

    def model() -> Any:
        torch.manual_seed(7)
        return torch.nn.Sequential(
            torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 10)
        ).cuda()

    def run(state: Any, steps: int) -> list[Any]:
        ddp = DDP(model(), bucket_cap_mb=0.05)
        if state is not None:
            ddp.register_comm_hook(state, encrypted_allreduce_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        for step in range(steps):
            g = torch.Generator().manual_seed(100 * step + rank)
            x, y = torch.randn(32, 64, generator=g).cuda(), torch.randn(32, 10, generator=g).cuda()
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()  # type: ignore[no-untyped-call]
            opt.step()
        return [p.detach().cpu() for p in ddp.parameters()]

    result: dict[str, Any] = {}
    for algorithm in ("a2a", "ring"):
        plain = run(None, 3)
        state = EncryptedAllReduce(keys, algorithm=algorithm)
        enc = run(state, 3)
        result[algorithm] = {
            "diff": max(float((a - b).abs().max()) for a, b in zip(plain, enc, strict=True)),
            "steps": state.stats.steps,
        }
        state.close()

    def flip(msg: Any, frame: bytes, _round: Any) -> bytes:
        if rank == 0 and msg.bucket == 0 and msg.phase != 5:
            return bytes([frame[0] ^ 1]) + frame[1:]
        return frame

    state = EncryptedAllReduce(keys, tamper=flip)
    try:
        run(state, 1)
        result["flip"] = {"error": None}
    except (GradientAuthenticationError, PeerAuthenticationError) as exc:
        result["flip"] = {"error": type(exc).__name__}
    dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))


def test_two_ranks_with_cuda_buckets_match_plain_ddp(cp: Any, tmp_path: Path) -> None:
    _torch_cuda()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(2):
        code = f"from tests.gpu.test_gpu_ddp import rank_main; rank_main({r}, 2, {port}, {str(tmp_path)!r})"
        procs.append(subprocess.Popen([sys.executable, "-c", code], cwd=ROOT))
    for p in procs:
        assert p.wait(timeout=300) == 0
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r in results:
        for algorithm in ("a2a", "ring"):
            assert r[algorithm] == {"diff": 0.0, "steps": 3}
    assert results[0]["flip"] == {"error": "GradientAuthenticationError"}
    assert results[1]["flip"] == {"error": "PeerAuthenticationError"}
