#!/usr/bin/env bash
# Sealed shards into PyTorch under torchrun (docs/TORCH.md): 3 MiB of float32 samples sealed
# into 3 shards, then a 2-rank DDP job on the CPU (gloo) streams them, every chunk verified
# before it becomes a tensor. Runs in a temporary directory, which it removes; no GPU needed.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
export TMPDIR="$work"  # torchrun's logs and PyTorch's caches go there too

# Stand-in data: 3 MiB of float32 samples, 64 values each (63 inputs and a target).
python3 -c "import numpy as n; n.random.default_rng(0).random(3 << 18, 'f4').tofile('train.bin')"
gpucc seal train.bin -o shards/ --data-key train.key --shards 3 --chunk-size 64KiB
ls shards
# --standalone: torchrun's rendezvous on a free local port.
OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node=2 \
    "$here/torch_train.py" shards/train-*-of-00003.gcc
