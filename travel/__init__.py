"""GPU Travelling: one GPU visits mutually distrusting data holders in turn.

Each holder runs a key-release service; an orchestrator attests the GPU to each holder
with a fresh nonce, stages that holder's datasets, runs the training step, scrubs and
checks the buffers, rotates the session and records a signed, hash-chained hand-over log.
"""

from .log import LogSummary, verify_log
from .orchestrator import TravelResult, Visit, run_plan
from .plan import Plan, load_plan, parse_plan

__all__ = [
    "LogSummary",
    "Plan",
    "TravelResult",
    "Visit",
    "load_plan",
    "parse_plan",
    "run_plan",
    "verify_log",
]
