"""Why an attempt failed: torchrun exits 1 whichever way a worker died, so its stderr is read as it streams by
for the exit code of the worker it blames (and, across nodes, for the node the runner names as failed first),
and that becomes the `failed` intent and the line the user sees."""

import codecs
import contextlib
import os
import re
import signal
import sys
from typing import IO, Final

from ftrain.domain.lifecycle import FailIntent
from ftrain.supervise.node_exec import NodeExit, parse_node_exit
from ftrain.train.preemption import PREEMPTED_EXIT

_EXITCODE: Final = re.compile(rb"\s*exitcode\s*:\s*(-?\d+)")
_SRUN_NODE_FAILURE: Final = re.compile(rb"srun: error: Node failure on (\S+)")
"""What srun says when Slurm finds a node of the step gone (it then ends the step, 137)."""
_REPORT_TAIL: Final = 65536


class FailureReport:
    """Reads the launcher's stderr as it streams by and keeps the exit code of the worker torchrun blames, and
    the node the multi-node runner (`each_node`) names as failed first, or srun's node failure (its processes
    taken as SIGKILLed: 137, what srun then exits with).

    torchrun exits 1 whichever way a worker died; only its "Root Cause (first observed failure)" block says
    that the worker exited 3 or was killed by SIGKILL (exitcode -9).
    """

    def __init__(self) -> None:
        self.worker_exit: int | None = None
        self.node: NodeExit | None = None
        self._in_root_cause = False
        self._partial = b""

    def feed(self, chunk: bytes) -> None:
        """Take the next piece of output (lines may be split anywhere)."""
        lines = re.split(rb"[\r\n]", self._partial + chunk)
        self._partial = lines.pop()[-_REPORT_TAIL:]
        for line in lines:
            if self.node is None and line.startswith(b"each_node: "):
                self.node = parse_node_exit(line.decode("utf-8", "replace"))
            elif self.node is None and (lost := _SRUN_NODE_FAILURE.match(line)):
                self.node = NodeExit(lost[1].decode("utf-8", "replace"), 128 + signal.SIGKILL)
            if self.worker_exit is not None:
                continue
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


def failure(returncode: int, worker_exit: int | None, node: NodeExit | None = None) -> FailIntent:
    """The `failed` intent for an attempt that ended with `returncode`, the blamed worker's exit as reported,
    and the node named as failed first. A lost node outranks any worker's report: the other nodes' workers
    only failed with it."""
    if returncode < 0:
        return FailIntent(
            reason="signal",
            exit_code=128 - returncode,
            message=f"the launcher was killed by {signal_name(-returncode)}",
        )
    if node is not None and node.lost:
        return FailIntent(
            reason="node-failure",
            exit_code=node.status,
            message=f"node {node.host} lost: its command {status_text(node.status)}",
        )
    if worker_exit is not None and worker_exit < 0:
        return FailIntent(
            reason="signal",
            exit_code=128 - worker_exit,
            message=(
                f"a training process was killed by {signal_name(-worker_exit)}; the launcher exited {returncode}"
            ),
        )
    if worker_exit == PREEMPTED_EXIT:
        return FailIntent(
            reason="preempted",
            exit_code=PREEMPTED_EXIT,
            message=f"the workers saved on a signal and exited {PREEMPTED_EXIT}; the launcher exited {returncode}",
        )
    if worker_exit:
        return FailIntent(
            reason="exit-code",
            exit_code=worker_exit,
            message=f"a training process exited {worker_exit}; the launcher exited {returncode}",
        )
    return FailIntent(reason="exit-code", exit_code=returncode, message=f"the launcher exited {returncode}")


def describe(intent: FailIntent) -> str:
    """`exit code 3`, `killed by SIGKILL`, `node node2 lost: its command was killed by SIGKILL`."""
    if intent.reason in ("node-failure", "preempted"):
        return intent.message
    if intent.reason == "exit-code" or intent.exit_code is None:
        return f"exit code {intent.exit_code}"
    return f"killed by {signal_name(intent.exit_code - 128)}"


def status_text(status: int) -> str:
    """A shell's exit status in words: `exited 255`, `was killed by SIGKILL` (137)."""
    return f"was killed by {signal_name(status - 128)}" if 128 < status < 255 else f"exited {status}"


def signal_name(signum: int) -> str:
    """`SIGTERM`, or `signal 99` for a number no signal has."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
