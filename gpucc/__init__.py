"""gpucc: attestation and confidential data staging for NVIDIA H100 GPUs."""

__version__ = "0.1.0"
