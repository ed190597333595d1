"""GPU Travelling: one GPU visits mutually distrusting data holders in turn.

Each holder runs a key-release service; an orchestrator attests the GPU to each holder
with a fresh nonce, stages that holder's datasets, runs the training step, scrubs and
checks the buffers, rotates the session and records a signed, hash-chained hand-over log.
"""
