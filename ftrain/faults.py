"""Failure injection for experiments and tests: SIGKILL the whole job at a named point, as a preemption would.

`FTRAIN_KILL_AT=<point>:<step>` — points: `step` (after the optimizer step), and the phases of a save:
`stage` (async: state copied to host buffers), `write` (this rank's shards written), `fanout` (async: this
rank's files copied to durable storage), `finalize` (rank 0 holds every rank's digests, before the manifest).
With `FTRAIN_KILL_ONCE=<path>` the kill fires only for the process that creates that file, so a relaunched
job that passes the point again survives (one injected failure, as in a real preemption). The first rank to
reach the point kills torchrun's agent and every local rank at once. Run the job in its own process group (`ftrain run` does; so must a test).
"""

import os
import signal

from ftrain.procs import signal_job

POINTS = ("step", "stage", "write", "fanout", "finalize")


def _parse(text: str | None) -> tuple[str, int] | None:
    if not text:
        return None
    point, _, step = text.partition(":")
    if point not in POINTS or not step.isdigit():
        raise ValueError(f"FTRAIN_KILL_AT={text!r}: use <point>:<step> with point one of {', '.join(POINTS)}")
    return point, int(step)


_TARGET = _parse(os.environ.get("FTRAIN_KILL_AT"))


def fault_point(point: str, step: int) -> None:
    """Kill the job here if FTRAIN_KILL_AT names this point and step."""
    if (point, step) == _TARGET and _first_time():
        if "TORCHELASTIC_RUN_ID" in os.environ:  # the agent and every worker, each in a session of its own
            signal_job(os.getppid(), signal.SIGKILL)
        os.killpg(os.getpgrp(), signal.SIGKILL)


def _first_time() -> bool:
    """True unless FTRAIN_KILL_ONCE names a file that already exists (then this injection already fired)."""
    once = os.environ.get("FTRAIN_KILL_ONCE")
    if not once:
        return True
    try:
        os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True
