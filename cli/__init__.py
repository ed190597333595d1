"""The gpucc command line (Typer). Thin: parses options, calls the libraries, renders."""

import gc

# Start-up allocates some 150,000 long-lived objects (modules, classes, the command tree)
# and next to no garbage cycles. At CPython's default first-generation threshold (700)
# the cycle collector ran about 70 times during one `gpucc attest`, finding nothing, for
# some 5% of its wall time. A larger first generation keeps collecting in long-running
# commands (holder, stage, travel) at a bounded cost in memory.
gc.set_threshold(50_000, 20, 20)
