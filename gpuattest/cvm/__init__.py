"""Confidential-VM (CPU TEE) evidence: Intel TDX quotes and AMD SEV-SNP reports.

Each kind has its own verifier module that checks the evidence itself (parsing, chains,
signatures, collateral) and returns :class:`~.findings.CvmFindings`: what was found, with no
policy applied. The policy (accepted TCB statuses, pinned measurements, debug) is applied on
top of the findings, so both kinds are judged by one set of rules.
"""
