"""The supervisor behind `ftrain run`: start torchrun for the allocation, relaunch it when it dies, say why.

The trainer resumes by itself from its newest valid checkpoint, so a relaunch is the same command again. What a
training process cannot do for itself is left here: notice that it died (exit code or signal, as torchrun
reports it), record `failed`, wait a growing backoff, start it again, stop when retrying no longer helps, and pass
a scheduler's preemption on to it. Every event goes through the durable outbox, so a log that is down never
holds up a relaunch. The argv, the child's environment and the reading of torchrun's failure report are pure
functions; nothing here imports torch.
"""

import codecs
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import IO, Final, Literal, NamedTuple, Protocol

import msgspec
import structlog

from ftrain.cli import render
from ftrain.supervise.hostlist import compress_hostlist
from ftrain.supervise.launch_spec import LaunchSpec, build_command
from ftrain.supervise.procs import signal_job
from workers.layout import complete_steps
from workers.outbox import CompleteIntent, FailIntent

BACKOFF_CAP: Final = 60.0
GRACE_SECONDS: Final = 25.0
"""How long a stopping job gets before SIGKILL: under Slurm's default KillWait (30 s), so that `failed` is
recorded before the scheduler kills the supervisor too."""
STALLED_ATTEMPTS: Final = 2
"""Give up after this many attempts in a row that did not advance the newest checkpoint."""
FLUSH_FIRST_SECONDS: Final = 2.0
FLUSH_SECONDS: Final = 10.0
POLL_SECONDS: Final = 0.5
_REPORT_TAIL: Final = 65536

log = structlog.get_logger(__name__)


class Recording(Protocol):
    """What the supervisor needs of `ftrain.recorder.Recorder`."""

    def record(self, intent: FailIntent | CompleteIntent) -> str: ...

    def flush(self, timeout: float) -> bool: ...


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """How hard to try: relaunches allowed, the first wait (doubled per failure), the grace of a stopping job."""

    max_retries: int = 3
    backoff: float = 5.0
    grace: float = GRACE_SECONDS


class Outcome(NamedTuple):
    """How supervision ended; `message` is the one line explaining a non-zero exit."""

    status: Literal["completed", "gave-up", "stopped"]
    exit_code: int
    message: str = ""
    recorded: bool = True
    """False when the last event is still only in the local outbox (the log was unreachable)."""


# -- what to run ---------------------------------------------------------------------------------------------


def local_command(spec: LaunchSpec, torchrun: str, port: int) -> list[str]:
    """torchrun for this host alone, on a private loopback rendezvous so concurrent runs never meet."""
    argv = build_command(msgspec.structs.replace(spec, rdzv_host="127.0.0.1", rdzv_port=port))
    return [torchrun, *argv[1:]]


def srun_command(spec: LaunchSpec, hosts: Sequence[str], torchrun: str) -> list[str]:
    """One srun step running the per-host torchrun command once on every host of the allocation.

    Every task runs the same argv: the c10d rendezvous on the rank-0 host hands out node ranks (torchrun reads
    --node-rank only for the static backend), so nothing host-specific has to be spliced in per node. The
    environment (FTRAIN_RUN_ID, FTRAIN_CKPT_DIR) travels with --export=ALL; --kill-on-bad-exit tears the other
    nodes down when one fails, so the attempt ends as a whole.
    """
    return [
        "srun",
        f"--nodes={spec.nodes}",
        f"--ntasks={spec.nodes}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        f"--nodelist={compress_hostlist(hosts)}",
        "--export=ALL",
        torchrun,
        *build_command(spec)[1:],
    ]


def attempt_commands(
    spec: LaunchSpec, hosts: Sequence[str], torchrun: str, *, slurm: bool
) -> Callable[[], list[str]]:
    """The argv of each new attempt (a local one gets a fresh free port every time)."""
    if slurm:
        return lambda: srun_command(spec, hosts, torchrun)
    return lambda: local_command(spec, torchrun, free_port())


def child_env(env: Mapping[str, str], run_id: str, ckpt_dir: Path) -> dict[str, str]:
    """The trainer's environment: ours, plus the run and its checkpoint directory, all it needs to resume."""
    return {**env, "FTRAIN_RUN_ID": run_id, "FTRAIN_CKPT_DIR": str(ckpt_dir)}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- why an attempt failed -----------------------------------------------------------------------------------

_EXITCODE: Final = re.compile(rb"\s*exitcode\s*:\s*(-?\d+)")


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


def failure(returncode: int, worker_exit: int | None) -> FailIntent:
    """The `failed` intent for an attempt that ended with `returncode`, the blamed worker's exit as reported."""
    if returncode < 0:
        return FailIntent(
            reason="signal",
            exit_code=128 - returncode,
            message=f"the launcher was killed by {_name(-returncode)}",
        )
    if worker_exit is not None and worker_exit < 0:
        return FailIntent(
            reason="signal",
            exit_code=128 - worker_exit,
            message=f"a training process was killed by {_name(-worker_exit)}; the launcher exited {returncode}",
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
    return f"killed by {_name(intent.exit_code - 128)}"


def backoff_delay(base: float, failures: int) -> float:
    """The wait before the next attempt: `base`, doubled per failure so far, capped at a minute (or `base`)."""
    return min(base * 2.0 ** min(failures - 1, 16), max(BACKOFF_CAP, base))


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _tee(stream: IO[bytes], report: FailureReport) -> None:
    """Copy the launcher's stderr to ours as it comes (progress bars included) while the report reads it.
    Reading goes on even if our stderr is gone, or the launcher would block on a full pipe."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    with stream:
        while chunk := os.read(stream.fileno(), 65536):
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write(decoder.decode(chunk))
                sys.stderr.flush()
            report.feed(chunk)


# -- the loop ------------------------------------------------------------------------------------------------


class Supervisor:
    """Runs attempts until one succeeds, retrying stops helping, or the job is told to stop."""

    def __init__(
        self,
        run_id: str,
        command: Callable[[], list[str]],
        env: Mapping[str, str],
        ckpt_dir: Path,
        policy: RetryPolicy,
        recorder: Recording,
    ) -> None:
        self.run_id = run_id
        self.command = command
        self.env = dict(env)
        self.ckpt_dir = ckpt_dir
        self.policy = policy
        self.recorder = recorder
        self._child: subprocess.Popen[bytes] | None = None
        self._stop: int | None = None
        self._deadline: float | None = None

    def run(self) -> Outcome:
        """Supervise with SIGTERM and SIGINT forwarded to the training processes."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            return self._loop()
        finally:
            for sig, handler in previous.items():
                if handler is not None:
                    signal.signal(sig, handler)

    def _loop(self) -> Outcome:
        newest = self._newest()
        total = self.policy.max_retries + 1
        attempt = stalled = 0
        while True:
            attempt += 1
            if self._stop is not None:  # told to stop during the backoff: the log already has the failure
                return self._stopped("")
            started = time.monotonic()
            returncode, worker_exit = self._attempt()
            ended = time.monotonic()
            step = self._newest()
            progress = step is not None and (newest is None or step > newest)
            newest = step if progress else newest
            head = f"Attempt {attempt} of {total}"
            where = f"after {ended - started:.1f} s — " + (
                f"checkpoint step {step}" if step is not None else "no checkpoint"
            )
            if self._stop is not None:
                name = _name(self._stop)
                stop = FailIntent(
                    reason="preempted",
                    exit_code=128 + self._stop,
                    message=f"{name} forwarded to the training processes",
                )
                recorded = self._record(stop)
                render.emit(f"{head} stopped by {name} {where}")
                return self._stopped(" (recorded as failed: preempted)", recorded)
            if returncode == 0:
                recorded = self._record(CompleteIntent())
                render.emit(f"{head} succeeded {where}")
                return Outcome("completed", 0, recorded=recorded)
            failed = failure(returncode, worker_exit)
            stalled = 0 if progress else stalled + 1
            delay = backoff_delay(self.policy.backoff, attempt)
            recorded = self._record(failed)
            line = f"{head} failed ({describe(failed)}) {where}" + ("" if progress else " (no progress)")
            if stalled >= STALLED_ATTEMPTS or attempt == total:
                render.emit(line)
                why = (
                    f": {stalled} attempts in a row made no progress"
                    if stalled >= STALLED_ATTEMPTS
                    else f" after {attempt - 1} {'retry' if attempt == 2 else 'retries'}"
                )
                return Outcome(
                    "gave-up", 1, f"run {self.run_id} gave up{why} (last: {describe(failed)})", recorded
                )
            render.emit(f"{line}; retrying in {delay:g} s")
            self._sleep_until(ended + delay)  # the time spent recording counts towards the backoff

    def _stopped(self, note: str, recorded: bool = True) -> Outcome:
        assert self._stop is not None
        return Outcome(
            "stopped", 128 + self._stop, f"run {self.run_id} stopped by {_name(self._stop)}{note}", recorded
        )

    def _attempt(self) -> tuple[int, int | None]:
        """Run one attempt in its own process group; its exit status and the blamed worker's exit code."""
        argv = self.command()
        log.info("attempt_started", run_id=self.run_id, argv=argv)
        child = subprocess.Popen(argv, env=self.env, stderr=subprocess.PIPE, start_new_session=True)
        self._child = child
        if self._stop is not None:  # the signal came while the child was being started
            self._signal_child(self._stop)
        assert child.stderr is not None
        report = FailureReport()
        tee = threading.Thread(target=_tee, args=(child.stderr, report), daemon=True)
        tee.start()
        try:
            returncode = self._wait(child)
        finally:
            self._child = None
        tee.join(timeout=5)  # an orphaned worker may hold the pipe open; its output keeps flowing meanwhile
        log.info("attempt_ended", run_id=self.run_id, returncode=returncode, worker_exit=report.worker_exit)
        return returncode, report.worker_exit

    def _wait(self, child: subprocess.Popen[bytes]) -> int:
        """Wait for the child; once the grace period of a stop request is over, kill it."""
        while True:
            try:
                return child.wait(timeout=POLL_SECONDS)
            except subprocess.TimeoutExpired:
                if self._deadline is not None and time.monotonic() >= self._deadline:
                    self._kill(child)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """A stop request: forward it to the training processes and start the grace period."""
        if self._stop is None:
            self._stop = signum
            self._deadline = time.monotonic() + self.policy.grace
        self._signal_child(signum)

    def _signal_child(self, signum: int) -> None:
        child = self._child
        if child is not None and child.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signum)

    def _kill(self, child: subprocess.Popen[bytes]) -> None:
        """SIGKILL the child's group and its children's: torchrun starts each worker in a session of its own."""
        log.warning("grace_period_over", run_id=self.run_id, pid=child.pid)
        signal_job(child.pid, signal.SIGKILL)

    def _record(self, intent: FailIntent | CompleteIntent) -> bool:
        """Let what the trainer recorded land first, record `intent`, and wait (bounded) until it is in the log."""
        self.recorder.flush(FLUSH_FIRST_SECONDS)
        self.recorder.record(intent)
        landed = self.recorder.flush(FLUSH_SECONDS)
        if not landed:
            log.warning("recorded_locally", run_id=self.run_id, intent=type(intent).__name__)
        return landed

    def _sleep_until(self, moment: float) -> None:
        """The backoff, cut short by a stop request."""
        while self._stop is None and (left := moment - time.monotonic()) > 0:
            time.sleep(min(left, POLL_SECONDS))

    def _newest(self) -> int | None:
        steps = complete_steps(self.ckpt_dir)
        return steps[0] if steps else None
