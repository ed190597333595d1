"""Encrypted, authenticated gradient exchange for PyTorch DistributedDataParallel.

Needs the ``torch`` extra (``pip install 'gpucc[torch]'``).
"""
