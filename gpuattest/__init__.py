"""gpuattest: strict verification of NVIDIA H100 confidential-computing attestation.

The public API lives in the submodules (``gpuattest.verifier``, ``gpuattest.report``,
``gpuattest.rim``, ...); this package imports nothing eagerly so that the CLI starts fast.
"""
