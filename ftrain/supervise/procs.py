"""Making sure none of an attempt's processes outlives it.

When torchrun's agent dies first (a SIGKILL to its group, the OOM killer) its workers, each in a session of
its own, become orphans nobody tracks. What every process of an attempt keeps is its environment: the
supervisor starts the attempt with the run, the attempt number and a nonce of the attempt's own in it
(`attempt_marks`), and every worker inherits them. The nonce is what tells them apart: run ids repeat (every `ftrain demo` is
dist-demo-1x2, a script is run twice against two logs), and ending one attempt must never kill another
supervisor's attempt with the same run and number on the host.
"""

import contextlib
import os
import secrets
import signal
import time
from collections.abc import Mapping
from pathlib import Path

from ftrain import settings

REAP_POLL_SECONDS = 0.05


def attempt_marks(run_id: str, attempt: int) -> dict[str, str]:
    """The variables a supervisor starts `attempt` of `run_id` with, a fresh nonce among them."""
    return {
        settings.RUN_ID: run_id,
        settings.ATTEMPT: str(attempt),
        settings.ATTEMPT_NONCE: secrets.token_hex(16),
    }


def attempt_processes(marks: Mapping[str, str]) -> list[int]:
    """The live processes on this host whose environment holds every one of `marks` (an attempt's, inherited
    from its supervisor; a zombie's environment reads empty, so the dead are not listed)."""
    wanted = {f"{name}={value}".encode() for name, value in marks.items()}
    me = os.getpid()
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        with contextlib.suppress(OSError):
            if wanted <= set((entry / "environ").read_bytes().split(b"\0")):
                found.append(int(entry.name))
    return found


def end_attempt(marks: Mapping[str, str], timeout: float) -> list[int]:
    """SIGKILL every process holding `marks` until none is left (a stopped process dies too); returns those
    still alive after `timeout` seconds (none, unless a process is stuck in the kernel)."""
    deadline = time.monotonic() + timeout
    while left := attempt_processes(marks):
        if time.monotonic() >= deadline:
            return left
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(REAP_POLL_SECONDS)
    return []
