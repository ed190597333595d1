"""CUDA sources of gpucc's AES-256-GCM staging kernels, shipped as package data.

``aesgcm_math.cuh`` holds the arithmetic (AES-256, GF(2^128) with constant-time carry-less
multiplies, the tiled GHASH decomposition) as ``__host__ __device__`` functions; ``aesgcm.cu``
holds the kernels that :mod:`staging.gpu` compiles with ``cupy.RawModule``; ``harness.cu`` is a
host-only test driver the test suite builds with ``nvcc`` to check the same arithmetic without a
GPU. See ``docs/GPU.md``.
"""
