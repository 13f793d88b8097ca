"""Signalling a whole torchrun job: its agent and every worker.

torchrun starts each worker in a session of its own, so signalling the agent's process group alone leaves the
workers running. Both the supervisor (stopping an attempt) and the trainer's fault injection (killing its own
job at a named point) signal the job this way.
"""

import contextlib
import os
from pathlib import Path


def children(pid: int) -> list[int]:
    """Direct children of `pid` (Linux /proc; none found elsewhere, nor once `pid` has exited: its /proc entry
    can vanish between listing its threads and reading them, and a process that is gone has no children)."""
    tasks = Path(f"/proc/{pid}/task")
    try:
        threads = os.listdir(tasks)
    except OSError:
        return []
    found: list[int] = []
    for thread in threads:
        with contextlib.suppress(OSError, ValueError):
            found += [int(word) for word in (tasks / thread / "children").read_text().split()]
    return found


def signal_job(agent: int, signum: int) -> None:
    """Send `signum` to the agent's process group first, then to each worker's (the caller's own last, if it
    is one). Workers are listed before the agent is signalled (they are its children only while it lives);
    the agent goes first because two workers killing each other at once must not both die before it."""
    workers = children(agent)
    me = os.getpid()
    for group in [agent, *sorted(workers, key=lambda pid: pid == me)]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signum)
