"""What every layer of gpucc shares: typed errors, safe files, the strict document reader and
the HTTP transport.

The bottom of the package (docs/ARCHITECTURE.md): it imports no other part of gpucc, and
every layer above (the attestation core, staging, the assembly, travel, DDP and the command
line) may import it. ``gpucc.gpuattest.errors`` and ``gpucc.gpuattest.files`` re-export
:mod:`gpucc.core.errors` and :mod:`gpucc.core.files` under their former names.
"""
