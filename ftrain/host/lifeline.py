"""Processes die with the one that started them: the one place ftrain asks Linux for a parent-death signal.

torchrun starts every worker in a session of its own, and the supervisor starts each attempt (the relay, or
torchrun) in one too, so a SIGKILL of the parent (or the OOM killer taking it) leaves its children running as
orphans, still training and writing checkpoints beside the relaunched job. `die_with_parent` asks Linux to
SIGKILL the calling process when its parent dies (the parent-death signal, kept across exec), then checks the
parent is still the one it started under: had it died before the request, the signal would never come. The
supervisor and the relay call it between fork and exec of their child; `die_with_launcher` is a worker's.
"""

import ctypes
import os
import signal
import sys
from typing import Final

PR_SET_PDEATHSIG: Final = 1
_LIBC: Final = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
"""Loaded at import, so that a child between fork and exec only makes the call (no dlopen, no lock)."""
LAUNCHER = os.getppid()
"""The parent when this module was first imported: torchrun's agent, for a worker."""


def die_with_parent(parent: int) -> None:
    """On Linux: SIGKILL this process when `parent` dies, or now if `parent` is no longer its parent. Linux
    sends the signal when the *thread* that forked this process exits: fork from the parent's main thread.
    Raises OSError when the kernel refuses the request."""
    if _LIBC is None:
        return
    if _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # orphaned before the request: the signal will not come
        os.kill(os.getpid(), signal.SIGKILL)


def die_with_launcher() -> None:
    """Under torchrun on Linux: SIGKILL this process when the agent dies, or now if it already has.
    Call it first thing in a training script; CheckpointManager calls it too. Idempotent."""
    if "TORCHELASTIC_RESTART_COUNT" not in os.environ:
        return
    die_with_parent(LAUNCHER)
    if LAUNCHER == 1 and _LIBC is not None:  # started as an orphan
        os.kill(os.getpid(), signal.SIGKILL)
