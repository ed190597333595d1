"""Encrypted DDP (docs/DDP.md): every rank attests to every other, then trains with every
gradient piece that crosses ranks sealed with AES-256-GCM.

    torchrun --nproc-per-node=N ddp_train.py policy.yaml      # GPUs in confidential VMs
    torchrun --nproc-per-node=N ddp_train.py --simulate sim   # simulated GPUs and CVM

With --simulate every rank makes its own simulated GPU under the simulation in ``sim``
(created by the first rank, shared by all), so the ranks verify each other as real ones do.
Beside the encrypted model the script trains the same model with plain DDP and compares.
"""

import datetime as dt
import gc
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from gpucc.assembly import Settings, assemble, simulation_policy
from gpucc.ddp import EncryptedAllReduce, GroupKeys, encrypted_allreduce_hook
from gpucc.gpuattest.policy import load_policy


def settings(args: list[str]) -> Settings:
    if args[:1] == ["--simulate"]:  # for trying it out: attests nothing real
        return Settings(policy=simulation_policy(), simulation=Path(args[1]))
    return Settings(policy=load_policy(Path(args[0])))  # NVIDIA's and the CVM vendor's roots


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)  # the same initial weights on every rank
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def main(args: list[str]) -> None:
    dist.init_process_group("gloo", timeout=dt.timedelta(seconds=120))
    rank = dist.get_rank()
    # Collect this rank's evidence, verify every peer's, derive a key per pair of ranks.
    keys = GroupKeys.establish(platform=assemble(settings(args)))
    relaxed = ", ".join(keys.relaxations) or "none"
    # one write per line: the ranks share the terminal
    print(
        f"rank {rank}: verified its {keys.world_size - 1} peer(s); relaxations: {relaxed}\n", end=""
    )

    model = DDP(make_model(), bucket_cap_mb=25)
    hook = EncryptedAllReduce(keys)
    model.register_comm_hook(hook, encrypted_allreduce_hook)
    plain = DDP(make_model(), bucket_cap_mb=25)  # the same model, plain DDP, to compare
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (model, plain)]
    loss_fn = torch.nn.MSELoss()
    data = torch.Generator().manual_seed(rank)  # each rank its own batches
    loader = [(torch.randn(32, 64, generator=data), torch.randn(32, 1, generator=data))] * 5
    for epoch in range(2):
        for x, y in loader:
            for m, opt in zip((model, plain), opts, strict=True):
                opt.zero_grad()
                loss = loss_fn(m(x), y)
                loss.backward()  # encrypted: raises on every rank if a message fails to verify
                opt.step()
                if m is model:
                    encrypted_loss = loss.item()
        keys.rotate()  # new keys for the next epoch, at the same point on every rank
        if rank == 0:
            print(f"epoch {epoch}: loss {encrypted_loss:.4f}")

    diff = max(
        float((a - b).detach().abs().max())
        for a, b in zip(model.parameters(), plain.parameters(), strict=True)
    )
    if rank == 0:
        print(f"sealed {hook.stats.buckets} gradient bucket(s) in {hook.stats.steps} steps")
        print(f"largest difference from plain DDP: {diff:g}")
    # End the process group here, not in interpreter shutdown: the DDP models and the keys
    # hold it through reference cycles, and a gloo worker thread still releasing a tensor
    # while Python shuts down aborts the process ("terminate called without an active
    # exception"). Collecting them first lets destroy_process_group join its threads.
    del model, plain, hook, keys, opts
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
