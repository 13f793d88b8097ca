"""Workers die with their launcher.

torchrun starts every worker in a session of its own, so a SIGKILL to torchrun's process group (or the OOM
killer taking the agent) leaves the workers running as orphans, still training and writing checkpoints beside
the relaunched job. `die_with_launcher` asks Linux to SIGKILL this process when its parent dies (the parent-
death signal), then checks the parent is still the one it started under: had it died before the request, the
signal would never come.
"""

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
LAUNCHER = os.getppid()
"""The parent when this module was first imported: torchrun's agent, for a worker."""


def die_with_launcher() -> None:
    """Under torchrun on Linux: SIGKILL this process when the agent dies, or now if it already has.
    Call it first thing in a training script; CheckpointManager calls it too. Idempotent."""
    if not sys.platform.startswith("linux") or "TORCHELASTIC_RESTART_COUNT" not in os.environ:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if LAUNCHER == 1 or os.getppid() != LAUNCHER:  # orphaned before the request: the signal will not come
        os.kill(os.getpid(), signal.SIGKILL)
