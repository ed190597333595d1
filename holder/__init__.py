"""gpucc holder: the data holder's key-release service (``gpucc holder serve``, docs/TRAVEL.md).

* :mod:`holder.service`: the HTTP application, its configuration and ``serve``.
* :mod:`holder.decide`: the release decision: which datasets an offer may have.
* :mod:`holder.state`: the holder's durable state in SQLite or PostgreSQL (answered
  challenges, issued keys, audit records, receipts), with :mod:`holder.state_schema` and
  :mod:`holder.state_retention`.
* :mod:`holder.audit`, :mod:`holder.housekeeping`, :mod:`holder.metrics`: the records of
  each decision, the background deletion of expired rows, the Prometheus endpoint.

It runs on the HTTP/1.1 server of :mod:`gpucc.core.httpserver` and speaks the key-release
protocol (:mod:`gpucc.keyrelease`) and the documents a journey exchanges with it
(:mod:`gpucc.travel.signing`, :mod:`gpucc.travel.receipt`).
"""
