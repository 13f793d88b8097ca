"""Why an attempt failed: torchrun exits 1 whichever way a worker died, so its stderr is read as it streams by
for the exit code of the worker it blames, and that becomes the `failed` intent and the line the user sees."""

import codecs
import contextlib
import os
import re
import signal
import sys
from typing import IO, Final

from projections.lifecycle import FailIntent

_EXITCODE: Final = re.compile(rb"\s*exitcode\s*:\s*(-?\d+)")
_REPORT_TAIL: Final = 65536


class FailureReport:
    """Reads torchrun's stderr as it streams by and keeps the exit code of the worker torchrun blames.

    torchrun exits 1 whichever way a worker died; only its "Root Cause (first observed failure)" block says
    that the worker exited 3 or was killed by SIGKILL (exitcode -9).
    """

    def __init__(self) -> None:
        self.worker_exit: int | None = None
        self._in_root_cause = False
        self._partial = b""

    def feed(self, chunk: bytes) -> None:
        """Take the next piece of output (lines may be split anywhere)."""
        lines = re.split(rb"[\r\n]", self._partial + chunk)
        self._partial = lines.pop()[-_REPORT_TAIL:]
        for line in lines:
            if self.worker_exit is not None:
                return
            if b"Root Cause" in line:
                self._in_root_cause = True
            elif self._in_root_cause and (found := _EXITCODE.match(line)):
                self.worker_exit = int(found[1])


def tee_stderr(stream: IO[bytes], report: FailureReport) -> None:
    """Copy the launcher's stderr to ours as it comes (progress bars included) while the report reads it.
    Reading goes on even if our stderr is gone, or the launcher would block on a full pipe."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    with stream:
        while chunk := os.read(stream.fileno(), 65536):
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write(decoder.decode(chunk))
                sys.stderr.flush()
            report.feed(chunk)


def failure(returncode: int, worker_exit: int | None) -> FailIntent:
    """The `failed` intent for an attempt that ended with `returncode`, the blamed worker's exit as reported."""
    if returncode < 0:
        return FailIntent(
            reason="signal",
            exit_code=128 - returncode,
            message=f"the launcher was killed by {signal_name(-returncode)}",
        )
    if worker_exit is not None and worker_exit < 0:
        return FailIntent(
            reason="signal",
            exit_code=128 - worker_exit,
            message=(
                f"a training process was killed by {signal_name(-worker_exit)}; the launcher exited {returncode}"
            ),
        )
    if worker_exit:
        return FailIntent(
            reason="exit-code",
            exit_code=worker_exit,
            message=f"a training process exited {worker_exit}; the launcher exited {returncode}",
        )
    return FailIntent(reason="exit-code", exit_code=returncode, message=f"the launcher exited {returncode}")


def describe(intent: FailIntent) -> str:
    """`exit code 3`, `killed by SIGKILL`."""
    if intent.reason == "exit-code" or intent.exit_code is None:
        return f"exit code {intent.exit_code}"
    return f"killed by {signal_name(intent.exit_code - 128)}"


def signal_name(signum: int) -> str:
    """`SIGTERM`, or `signal 99` for a number no signal has."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
