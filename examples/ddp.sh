#!/usr/bin/env bash
# Encrypted DDP on the simulator (docs/DDP.md): a 2-rank torchrun job on the CPU (gloo) whose
# ranks attest to each other with simulated GPUs and CVMs, then train with every gradient
# exchange sealed. Runs in a temporary directory, which it removes; no GPU needed.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
export TMPDIR="$work"  # torchrun's logs and PyTorch's caches go there too

# --standalone: torchrun's rendezvous on a free local port; gloo on the CPU.
OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node=2 \
    "$here/ddp_train.py" --simulate sim
