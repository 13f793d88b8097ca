"""Save on the scheduler's warning: a signal becomes "checkpoint at the next step boundary, then exit".

Schedulers warn before they kill: Slurm sends SIGTERM (or, with `--signal=B:USR1@120`, SIGUSR1 a chosen time
ahead) and waits `KillWait` before SIGKILL. Each rank notes the signal in a handler that only sets a flag; at
the next step boundary the ranks agree (one tiny collective), drain the save in flight, save, deliver their
events and exit with PREEMPTED_EXIT, which the supervisor records as `failed`, reason `preempted`. Torch-free:
the supervisor reads the exit code from here.
"""

import signal
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any, Final

import structlog

PREEMPTED_EXIT: Final = 83
"""A worker's exit status after it saved on a warning signal (a saved step, not a crash)."""
log = structlog.get_logger(__name__)


def stop_name(received: signal.Signals, note: Path | None) -> str:
    """The signal that stopped the job: the one the relay noted it got (`ftrain run` hands the workers the
    warning signal whatever stopped it), said as relayed, else the one received."""
    try:
        noted = note.read_text().strip() if note is not None else ""
    except OSError:
        noted = ""
    if noted and noted != received.name:
        return f"{noted} (relayed as {received.name})"
    return received.name


class SaveSignals:
    """The warning signals as a flag the training loop reads at its step boundary.

    The handler only records the signal: a checkpoint cannot be written from a signal handler, and every rank
    must save the same step together. Later signals change nothing (schedulers and launchers forward the same
    warning more than once; SIGKILL is the scheduler's "now"). Installed from the main thread only (Python's
    rule); elsewhere the signals keep their actions and a warning says so."""

    def __init__(self, signums: Sequence[signal.Signals]) -> None:
        self.received: signal.Signals | None = None
        self._previous: dict[signal.Signals, Any] = {}
        if signums and threading.current_thread() is not threading.main_thread():
            log.warning("save_signals_not_installed", reason="the manager was made outside the main thread")
            return
        for signum in signums:
            self._previous[signum] = signal.signal(signum, self._on_signal)

    @property
    def installed(self) -> bool:
        return bool(self._previous)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signal.Signals(signum)

    def restore(self) -> None:
        """Give the signals their previous actions back."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
