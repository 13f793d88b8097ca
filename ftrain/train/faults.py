"""Failure injection for experiments and tests: SIGKILL the whole job at a named point, as a preemption would,
or SIGSTOP it there, as a node that froze or was cut off would stand still.

`FTRAIN_KILL_AT=<point>:<step>[,<point>:<step>…]` — points: `step` (after the optimizer step), and the phases of
a save: `stage` (async: state copied to host buffers), `write` (this rank's shards written), `fanout` (async:
this rank's files durable in the checkpoint directory: copied there, or written there once), `finalize`
(rank 0 holds every rank's digests, before the manifest), `sealed` (rank 0 sealed the step, before recording it);
and of a memory snapshot: `snapshot_sealed` (every rank's part sealed, before rank 0 records it) and `snapshot`
(recorded, its older snapshots dropped). `FTRAIN_STOP_AT` takes the same form and stops instead; a SIGCONT to
the stopped processes lets the job go on from where it stood. The first rank to reach the point signals
torchrun's agent and every rank of its node at once. With `FTRAIN_KILL_ONCE=<dir>`
each kill or stop fires once (a file for each in that directory), so a relaunched job that passes the same point
again survives, as after a real preemption. Run the job in its own process group (`ftrain run` does; so must a
test).

`FTRAIN_STEP_DELAY=<seconds>` (0–60) slows the job instead: every rank sleeps that long at each `step` point,
so that a test or an experiment can act while the job trains (cut a link, kill a server) on any machine.
`FTRAIN_REPLICA_DELAY=<seconds>` (0–60), set on one node's ranks, slows that node's link to its peer: each of
its ranks sleeps that long at the `replicate` point, before exchanging memory snapshot replicas with its buddy.
"""

import os
import signal
import time

from ftrain import settings
from ftrain.host.job_signals import signal_job
from ftrain.host.private_files import FILE_MODE, private_dir

_KILLS = settings.kill_targets()  # at import: a typo fails the trainer before it trains
_STOPS = settings.stop_targets()
_DELAY = settings.step_delay()
_REPLICA_DELAY = settings.replica_delay()


def fault_point(point: str, step: int) -> None:
    """Kill (or stop) the job here if FTRAIN_KILL_AT (FTRAIN_STOP_AT) names this point and step; sleep
    FTRAIN_STEP_DELAY at every `step`, FTRAIN_REPLICA_DELAY at every `replicate`."""
    if point == "step" and _DELAY:
        time.sleep(_DELAY)
    if point == "replicate" and _REPLICA_DELAY:
        time.sleep(_REPLICA_DELAY)
    if (point, step) in _KILLS and _first_time(f"{point}-{step}"):
        _signal_job(signal.SIGKILL)
    if (point, step) in _STOPS and _first_time(f"stop-{point}-{step}"):
        _signal_job(signal.SIGSTOP)


def _signal_job(signum: int) -> None:
    """This node's agent and every worker, each in a session of its own (this process last), or, outside
    torchrun, this process group."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        signal_job(os.getppid(), signum)
    else:
        os.killpg(os.getpgrp(), signum)


def _first_time(name: str) -> bool:
    """True unless this fault already fired: FTRAIN_KILL_ONCE names a directory holding one file per fault."""
    once = settings.kill_once()
    if once is None:
        return True
    private_dir(once, tighten=False)
    try:
        os.close(os.open(once / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, FILE_MODE))
    except FileExistsError:
        return False
    return True
