"""Failure injection for experiments and tests: SIGKILL the whole job at a named point, as a preemption would.

`FTRAIN_KILL_AT=<point>:<step>[,<point>:<step>…]` — points: `step` (after the optimizer step), and the phases of a save:
`stage` (async: state copied to host buffers), `write` (this rank's shards written), `fanout` (async: this
rank's files copied to durable storage), `finalize` (rank 0 holds every rank's digests, before the manifest).
With `FTRAIN_KILL_ONCE=<dir>` each kill fires once (a file per kill in that directory), so a relaunched job
that passes the same point again survives, as after a real preemption. The first rank to
reach the point kills torchrun's agent and every local rank at once. Run the job in its own process group (`ftrain run` does; so must a test).
"""

import os
import signal

from ftrain import settings
from ftrain.supervise.procs import signal_job

_TARGETS = settings.kill_targets()  # at import: a typo fails the trainer before it trains


def fault_point(point: str, step: int) -> None:
    """Kill the job here if FTRAIN_KILL_AT names this point and step."""
    if (point, step) in _TARGETS and _first_time(point, step):
        if "TORCHELASTIC_RUN_ID" in os.environ:  # the agent and every worker, each in a session of its own
            signal_job(os.getppid(), signal.SIGKILL)
        os.killpg(os.getpgrp(), signal.SIGKILL)


def _first_time(point: str, step: int) -> bool:
    """True unless this kill already fired: FTRAIN_KILL_ONCE names a directory holding one file per kill."""
    once = settings.kill_once()
    if once is None:
        return True
    once.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(once / f"{point}-{step}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True
