"""The supervisor behind `ftrain run`: start torchrun for the allocation, relaunch it when it dies, say why.

The trainer resumes by itself from its newest valid checkpoint, so a relaunch is the same command again. What a
training process cannot do for itself is left here: notice that it died (exit code or signal, as torchrun
reports it), make sure none of its processes survives it (nor the supervisor: the attempt has its parent-death
signal), record `failed`, wait a growing backoff, open the next attempt in the log (compare-and-set: one
supervisor per attempt), claim the run's storage fence for it (the last attempt's processes, wherever they
still run, can then neither seal nor prune) and start it, stop when retrying no longer helps, and pass a
scheduler's preemption on to it. Every event goes through the durable outbox, so a log that is down never
holds up recording (but a relaunch waits for the log: it must open its attempt). What an attempt runs is in
`attempts`, why it failed in `failure_report`; nothing here imports torch.
"""

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Final, Literal, NamedTuple

import msgspec
import structlog

from ftrain import settings
from ftrain.console.output import emit
from ftrain.domain.lifecycle import CompleteIntent, FailIntent
from ftrain.host.job_signals import signal_job
from ftrain.host.lifeline import die_with_parent
from ftrain.supervise.failure_report import FailureReport, describe, failure, signal_name, tee_stderr
from ftrain.supervise.fencing import claim_opened
from ftrain.supervise.lease_keeper import LeaseKeeper
from ftrain.supervise.node_exec import NodeExit
from ftrain.supervise.node_return import answering
from ftrain.supervise.open_attempt import OPEN_TIMEOUT, NotOpened
from ftrain.supervise.procs import attempt_marks, end_attempt
from ftrain.supervise.relaunch_nodes import next_hosts, rejoined
from ftrain.supervise.relay import STOP_SIGNALS, note_stop, stop_signals, warning_signal
from ftrain.supervise.watchdog import Hang, Watchdog
from ftrain.train.preemption import PREEMPTED_EXIT
from ftrain.workers.layout import complete_steps
from ftrain.workers.recorder import Recording
from ftrain.workers.storage.location import run_location
from ftrain.workers.storage.open import open_run
from ftrain.workers.storage.storage_errors import Fenced, StorageError, StorageUnavailable

BACKOFF_CAP: Final = 60.0
GRACE_SECONDS: Final = 25.0
"""How long a stopping job gets before SIGKILL: under Slurm's default KillWait (30 s), so that `failed` is
recorded before the scheduler kills the supervisor too."""
STALLED_ATTEMPTS: Final = 2
"""Give up after this many attempts in a row that did not advance the newest checkpoint."""
FLUSH_FIRST_SECONDS: Final = 2.0
FLUSH_SECONDS: Final = 10.0
POLL_SECONDS: Final = 0.5
END_SECONDS: Final = 10.0
"""How long the processes of an ended attempt get to die of SIGKILL before the run is given up."""

log = structlog.get_logger(__name__)


class Relaunches(msgspec.Struct, frozen=True, kw_only=True):
    """How many times a failed attempt is relaunched, and the wait before the first (doubled per failure)."""

    max_retries: int = 3
    backoff: float = 5.0


class Outcome(NamedTuple):
    """How supervision ended; `message` is the one line explaining a non-zero exit."""

    status: Literal["completed", "gave-up", "stopped"]
    exit_code: int
    message: str = ""
    recorded: bool = True
    """False when the last event is still only in the local outbox (the log was unreachable)."""


class SetupFailed(Exception):
    """An attempt the log opened could not be started (its storage fence, its progress directory, its
    command; UnsafeDirectory among them): recorded as the attempt's failure, reason `setup`, and supervision
    ends. Nothing of the attempt runs."""


def attempt_head(number: int, first: int, tries: int, total: int) -> str:
    """How a line names an attempt: the run's attempt `number` (as the log counts them), and, when this job
    start did not open the run's first (a relaunch, a requeue), which of its own `total` tries it is: the
    budget of a job start never changes, whatever came before it."""
    if first == 1:
        return f"Attempt {number} of {total}"
    return f"Attempt {number} ({tries} of {total} in this job start)"


def backoff_delay(base: float, failures: int) -> float:
    """The wait before the next attempt: `base`, doubled per failure so far, capped at a minute (or `base`)."""
    return min(base * 2.0 ** min(failures - 1, 16), max(BACKOFF_CAP, base))


class Supervisor:
    """Runs attempts until one succeeds, retrying stops helping, or the job is told to stop."""

    def __init__(
        self,
        run_id: str,
        command: Callable[[tuple[str, ...]], list[str]],
        env: Mapping[str, str],
        ckpt_dir: Path | str,
        relaunches: Relaunches,
        recorder: Recording,
        *,
        attempt: int,
        opener: Callable[[tuple[str, ...]], int],
        hosts: tuple[str, ...],
        min_nodes: int | None = None,
        probe: Callable[[str], Sequence[str]] | None = None,
        grace: float = GRACE_SECONDS,
        lease: LeaseKeeper | None = None,
        hang_timeout: float | None = None,
        save_signals: Sequence[signal.Signals] = (),
        requeue: bool = False,
        vouched: bool = False,
    ) -> None:
        """`command` is an attempt's argv on the given hosts; `attempt`: the run's attempt the log opened for
        the first start (1 for a new run), on `hosts`; `opener` opens the next one on the given hosts in the
        log before each relaunch, returning its number (raises NotOpened). `min_nodes` below the number of
        hosts lets a relaunch go on without a node the last attempt lost (None: every node, always); `probe`: the
        argv asking a dropped node whether it is back (`node_return.node_probe`; None: never taken back). `lease`:
        the run's supervisor lease, renewed meanwhile (lost: the attempt is stopped, nothing recorded);
        `hang_timeout`: seconds without progress of any rank that end an attempt as hung (None: never).
        `save_signals`: the signals the trainer saves on (each node's torchrun runs under the relay, which
        hands the workers the warning one); a stop signal reaches the attempt as that warning, and only SIGTERM
        and SIGINT start the grace period (an early warning leaves the time to the scheduler). `requeue`: a
        node lost that the relaunch cannot go on without ends supervision (the job is requeued) instead of
        waiting for the node in this allocation. `vouched`: the log held a checkpoint of the run when this
        supervisor took it (a relaunch), so each attempt's fence is claimed only where the run's location is
        found (`fencing.claim_opened`); it becomes true once an attempt sealed one."""
        self.run_id = run_id
        self.command = command
        self.hosts = hosts
        self.allocation = hosts
        self.probe = probe
        self.min_nodes = len(hosts) if min_nodes is None else min_nodes
        self.env = dict(env)
        self.ckpt_dir = ckpt_dir
        self.relaunches = relaunches
        self.grace = grace
        self.recorder = recorder
        self.opener = opener
        self.number = attempt
        self._child: subprocess.Popen[bytes] | None = None
        self._stop: int | None = None
        self._deadline: float | None = None
        self.lease = lease
        self.hang_timeout = hang_timeout
        self._hang: Hang | None = None
        self.save_signals = tuple(save_signals)
        self.requeue = requeue
        self.vouched = vouched
        self._note = Path(os.devnull)
        """Where the stop signal's name is noted for the workers (FTRAIN_STOP_NOTE; set by `run`)."""

    def run(self) -> Outcome:
        """Supervise with SIGTERM, SIGINT and the save signals forwarded to the training processes."""
        notes = Path(tempfile.mkdtemp(prefix="ftrain-stop-"))  # 0700: the workers' note of the stop signal
        self._note = notes / "stop-signal"
        previous = {sig: signal.signal(sig, self._on_signal) for sig in stop_signals(self.save_signals)}
        try:
            return self._loop()
        finally:
            for sig, handler in previous.items():
                if handler is not None:
                    signal.signal(sig, handler)
            shutil.rmtree(notes, ignore_errors=True)

    def _loop(self) -> Outcome:
        newest = self._newest()
        total = self.relaunches.max_retries + 1
        first = self.number
        attempt = stalled = 0
        while True:
            attempt += 1
            if self._stop is not None:  # told to stop during the backoff: the log already has the failure
                return self._stopped("")
            if (lost := self._lost()) is not None:  # another supervisor took the run over in the backoff
                return Outcome("gave-up", 1, lost, recorded=False)
            if attempt > 1:
                try:
                    self.number = self._open()
                except NotOpened as exc:
                    return Outcome("gave-up", 1, f"run {self.run_id} not relaunched: {exc}")
                if self.lease is not None:
                    self.lease.attempt = self.number
            started = time.monotonic()
            try:
                returncode, report, survivors = self._attempt()
            except SetupFailed as exc:  # opened in the log, so recorded: never left `running`
                recorded = self._record(FailIntent(reason="setup", message=str(exc), attempt=self.number))
                emit(f"{attempt_head(self.number, first, attempt, total)} not started: {exc}")
                return Outcome(
                    "gave-up", 1, f"run {self.run_id} gave up: attempt {self.number}: {exc}", recorded
                )
            ended = time.monotonic()
            if (lost := self._lost()) is not None:  # the new holder recorded this attempt's end
                head = attempt_head(self.number, first, attempt, total)
                emit(f"{head} stopped after {ended - started:.1f} s: {lost}")
                return Outcome("gave-up", 1, lost, recorded=False)
            step = self._newest()
            self.vouched = self.vouched or step is not None
            progress = step is not None and (newest is None or step > newest)
            newest = step if progress else newest
            head = attempt_head(self.number, first, attempt, total)
            where = f"after {ended - started:.1f} s — " + (
                f"checkpoint step {step}" if step is not None else "no checkpoint"
            )
            if self._stop is not None and not (returncode == 0 and self._stop not in STOP_SIGNALS):
                name = signal_name(self._stop)  # (an early warning the job outran: it completed)
                saved = report.worker_exit == PREEMPTED_EXIT
                stop = FailIntent(
                    reason="preempted",
                    exit_code=PREEMPTED_EXIT if saved else 128 + self._stop,
                    message=f"{name}: the workers saved step {step} and exited {PREEMPTED_EXIT}"
                    if saved
                    else f"{name} forwarded to the training processes",
                    attempt=self.number,
                )
                recorded = self._record(stop)
                emit(f"{head} stopped by {name} {where}")
                return self._stopped(" (recorded as failed: preempted)", recorded)
            if returncode == 0:
                recorded = self._record(CompleteIntent(attempt=self.number))
                emit(f"{head} succeeded {where}")
                return Outcome("completed", 0, recorded=recorded)
            hang, self._hang = self._hang, None
            failed = msgspec.structs.replace(
                failure(returncode, report.worker_exit, report.node)
                if hang is None
                else FailIntent(reason="hang", message=hang.message),
                attempt=self.number,
            )
            stalled = 0 if progress else stalled + 1
            delay = backoff_delay(self.relaunches.backoff, attempt)
            recorded = self._record(failed)
            if failed.reason == "preempted":  # the scheduler signalled the workers itself: it wants the nodes
                emit(f"{head} preempted: the workers saved and exited {PREEMPTED_EXIT} {where}")
                return Outcome(
                    "stopped", PREEMPTED_EXIT, f"run {self.run_id} preempted (recorded as failed)", recorded
                )
            said = describe(failed) if hang is None else f"hung: {hang.message}"
            line = f"{head} failed ({said}) {where}" + ("" if progress else " (no progress)")
            if survivors:
                emit(line)
                return Outcome(
                    "gave-up",
                    1,
                    f"run {self.run_id} not relaunched: process(es) {' '.join(map(str, survivors))} of attempt "
                    f"{self.number} survived SIGKILL",
                    recorded,
                )
            if stalled >= STALLED_ATTEMPTS or attempt == total:
                emit(line)
                why = (
                    f": {stalled} attempts in a row made no progress"
                    if stalled >= STALLED_ATTEMPTS
                    else f" after {attempt - 1} {'retry' if attempt == 2 else 'retries'}"
                )
                return Outcome("gave-up", 1, f"run {self.run_id} gave up{why} (last: {said})", recorded)
            hosts = next_hosts(self.hosts, report.node, self.min_nodes)
            if self.requeue and report.node is not None and report.node.lost and hosts == self.hosts:
                emit(line)
                return Outcome(
                    "gave-up",
                    1,
                    f"run {self.run_id} gave up in this allocation: node {report.node.host} lost, and "
                    f"--min-nodes {self.min_nodes} needs it",
                    recorded,
                )
            if hosts != self.hosts:
                assert report.node is not None
                line += f"; going on without {report.node.host} (--min-nodes {self.min_nodes})"
            if back := self._back(hosts, report.node):
                hosts = rejoined(self.allocation, hosts, back)
                line += f"; taking back {', '.join(h for h in hosts if h in back)} (answering again)"
            if hosts != self.hosts:
                line += f": {len(hosts)} node(s), {', '.join(hosts)}"
                self.hosts = hosts
            emit(f"{line}; retrying in {delay:g} s")
            self._sleep_until(ended + delay)  # the time spent recording counts towards the backoff

    def _back(self, hosts: tuple[str, ...], lost: NodeExit | None) -> set[str]:
        """The nodes an earlier relaunch dropped that answer again; the one the last attempt lost is left out
        of this relaunch whatever it answers."""
        dropped = [h for h in self.allocation if h not in hosts and (lost is None or h != lost.host)]
        return answering(self.probe, dropped, self.env) if self.probe is not None and dropped else set()

    def _open(self) -> int:
        """Open the next attempt once the last one's failure is in the log: the log opens no attempt of a run
        it still sees running. A log that just lost a server may take a while to take it. Raises NotOpened."""
        if not self.recorder.flush(OPEN_TIMEOUT):
            raise NotOpened(
                f"the event log is out of reach: the failure of attempt {self.number} is only in the local outbox"
            )
        return self.opener(self.hosts)

    def _stopped(self, note: str, recorded: bool = True) -> Outcome:
        assert self._stop is not None
        name = signal_name(self._stop)
        return Outcome("stopped", 128 + self._stop, f"run {self.run_id} stopped by {name}{note}", recorded)

    def _attempt(self) -> tuple[int, FailureReport, list[int]]:
        """Run one attempt in its own process group; its exit status, what its stderr said of the failure (the
        blamed worker's exit code, the node that failed first), and the processes of the attempt that outlived
        it and a SIGKILL (normally none). Raises SetupFailed when it cannot be started."""
        marks = attempt_marks(self.run_id, self.number)
        watchdog = None
        try:
            claim_opened(
                self.ckpt_dir, self.number, vouched=self.vouched
            )  # from here on no older attempt seals or prunes
            argv = self.command(self.hosts)
            log.info("attempt_started", run_id=self.run_id, attempt=self.number, argv=argv)
            env = {**self.env, **marks, settings.STOP_NOTE: str(self._note)}
            if self.hang_timeout is not None:
                name = f"{self.run_id}-{self.number}-{marks[settings.ATTEMPT_NONCE]}"
                watchdog = Watchdog.for_attempt(name, self.hang_timeout)
                env[settings.PROGRESS_DIR] = str(watchdog.directory)
            child = subprocess.Popen(
                argv,
                env=env,
                stderr=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=partial(die_with_parent, os.getpid()),  # forked by the main thread (signals)
            )
        except (OSError, subprocess.SubprocessError, StorageUnavailable, StorageError, Fenced) as exc:
            if watchdog is not None:
                watchdog.close()
            raise SetupFailed(f"{type(exc).__name__}: {exc}") from exc
        self._child = child
        if self._stop is not None:  # the signal came while the child was being started
            self._signal_child(warning_signal(self.save_signals) if self.save_signals else self._stop)
        assert child.stderr is not None
        report = FailureReport()
        tee = threading.Thread(target=tee_stderr, args=(child.stderr, report), daemon=True)
        tee.start()
        try:
            returncode = self._wait(child, watchdog)
        finally:
            self._child = None
        survivors = end_attempt(marks, END_SECONDS)  # orphaned workers, stopped ones too
        if watchdog is not None:
            watchdog.close()
        tee.join(timeout=5)
        log.info(
            "attempt_ended",
            run_id=self.run_id,
            returncode=returncode,
            worker_exit=report.worker_exit,
            node=report.node,
        )
        return returncode, report, survivors

    def _wait(self, child: subprocess.Popen[bytes], watchdog: Watchdog | None = None) -> int:
        """Wait for the child; kill it once the grace period of a stop request is over, when the lease is
        lost, or when the watchdog finds it hung."""
        while True:
            try:
                return child.wait(timeout=POLL_SECONDS)
            except subprocess.TimeoutExpired:
                over = self._deadline is not None and time.monotonic() >= self._deadline
                if over or self._lost() is not None:
                    self._kill(child)
                elif self._hang is None and watchdog is not None and (hang := watchdog.poll()):
                    log.warning("attempt_hung", run_id=self.run_id, attempt=self.number, message=hang.message)
                    self._hang = hang
                    self._kill(child)

    def _lost(self) -> str | None:
        """Why this supervisor no longer holds the run's lease (None: it does, or it holds none)."""
        return None if self.lease is None else self.lease.lost

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """A stop request: forward it to the training processes (as the warning signal, when the trainer saves
        on one) and start the grace period (SIGTERM and SIGINT: an early warning leaves it to the scheduler)."""
        if self._stop is None:
            self._stop = signum
            note_stop(self._note, signal.Signals(signum))  # before the warning: what the workers name
        if self._deadline is None and signum in STOP_SIGNALS:
            self._deadline = time.monotonic() + self.grace
        self._signal_child(warning_signal(self.save_signals) if self.save_signals else signum)

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
        while self._stop is None and self._lost() is None and (left := moment - time.monotonic()) > 0:
            time.sleep(min(left, POLL_SECONDS))

    def _newest(self) -> int | None:
        """The newest sealed step (a path, or the run's `s3://` location); None when none, or out of reach."""
        if isinstance(self.ckpt_dir, str):
            try:
                location = run_location(self.ckpt_dir)
                found = open_run(location).complete()
            except (StorageUnavailable, StorageError):
                return None
            return found[0].step if found else None
        steps = complete_steps(self.ckpt_dir)
        return steps[0] if steps else None
