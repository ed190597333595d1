"""gpucc key release: a dataset key released only to a session bound to verified attestation.

The protocol (``docs/PROTOCOL.md``) in its parts:

* :mod:`keyrelease.protocol`: the steps (challenge, offer, accept, answer, open) and
  :class:`~gpucc.keyrelease.protocol.DataHolder`, an in-memory holder.
* :mod:`keyrelease.messages`: the pure parts: nonce, transcript, session-key derivation
  and the offer and answer documents.
* :mod:`keyrelease.cvm`: the CVM's evidence in an offer and its check.
* :mod:`keyrelease.requester`: an offer signed by its requester's long-term key.
* :mod:`keyrelease.replay`: the record of answered challenges (in memory or in a file).

It stands on :mod:`gpucc.staging` (the key wrap and key files) and takes the attestation
check as a value (an ``Attester``); :mod:`gpucc.assembly` supplies it.
"""
