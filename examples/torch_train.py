"""Train on a sealed shard set (docs/TORCH.md), with the dataset key in train.key:

torchrun --standalone --nproc-per-node=N torch_train.py shards/train-*.gcc
"""

import gc
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from gpucc.staging import open_sealed, read_key_file
from gpucc.staging.torch_dataset import SealedChunkStream, host_shared_key

FEATURES = 64  # one sample: 63 float32 inputs and a float32 target


def main(shards: list[str]) -> None:
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)

    # One key release per host, shared with its local ranks in memory. With an attested
    # session: host_shared_key(lambda: session.dataset_key(open_sealed(shards[0]).header_digest))
    key = host_shared_key(lambda: open_sealed(shards[0]).unwrap(read_key_file("train.key")))

    stream = SealedChunkStream(
        shards,  # the shard set, in order: a missing, foreign or reordered shard is refused
        key=key,
        device="cuda" if cuda else "cpu",  # cuda: verified on the GPU, zero-copy DLPack
        record_size=4 * FEATURES,
        dtype=torch.float32,
        seed=0,
        pad=True,  # every rank gets the same number of chunks (DDP steps in lockstep)
    )
    loader = DataLoader(stream, batch_size=None, num_workers=0)  # one chunk = one batch

    model = DistributedDataParallel(torch.nn.Linear(FEATURES - 1, 1).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.MSELoss()
    for epoch in range(2):
        stream.set_epoch(epoch)
        for batch in loader:  # (samples, 64) float32, verified, a tensor of its own
            x, y = batch[:, :-1], batch[:, -1:]
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f}")
    stream.close()  # zero what is left of the plaintext
    # End the group here, not in interpreter shutdown (see ddp_train.py): DDP holds it
    # through reference cycles, so collect them and let destroy_process_group join its threads.
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
