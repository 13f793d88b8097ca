"""Every node's torchrun runs under this relay, so that a stop signal reaches the workers, and only them, once.

    python -m ftrain.supervise.relay -- torchrun …

torchrun SIGKILLs its workers 30 s after a SIGTERM whatever the scheduler allows (pytorch/pytorch#119856), dies of
a SIGUSR1 it does not forward (#154849), and Slurm's plain `scancel` and time limit send SIGTERM to every process
of a job step at once (measured: the batch shell, torchrun and each worker, in whatever session). So the relay
starts torchrun in a session of its own with the stop signals ignored (and not handled: its
`--signals-to-handle` leaves them out), and on the first stop signal it gets — SIGTERM, SIGINT or a save signal, from the
supervisor, srun or the scheduler — it sends the workers (torchrun's children) the warning signal, once: each
saves at its next step boundary and exits PREEMPTED_EXIT, and torchrun ends as for any failed worker, the relay
with it. The warning is the first save signal that is not SIGTERM or SIGINT (SIGUSR1 by default), so a worker
the scheduler also signalled directly gets two signals of different kinds, never the same one twice. A worker
that does not handle it dies of it; one that never ends is the supervisor's to SIGKILL after its grace period.
The workers inherit the stop signals ignored (SIGTERM, SIGINT, SIGUSR1 by default) unless they handle them, as
CheckpointManager does: a script without it is not stopped by the warning, only by the SIGKILL. Torch-free.
"""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Final

from ftrain import settings
from ftrain.host.job_signals import children
from ftrain.host.lifeline import die_with_parent

STOP_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)
TORCHRUN_HANDLES: Final = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
"""torchrun's own default set (TORCHELASTIC_SIGNALS_TO_HANDLE); the relay takes the stop signals out of it."""
POLL_SECONDS: Final = 0.1


def warning_signal(save: Sequence[signal.Signals]) -> signal.Signals:
    """The signal the workers get: the first save signal that is not SIGTERM or SIGINT, else the first one."""
    return next((s for s in save if s not in STOP_SIGNALS), save[0])


def stop_signals(save: Sequence[signal.Signals]) -> tuple[signal.Signals, ...]:
    """Every signal that means "save and stop" on its way to the workers: SIGTERM, SIGINT and the save signals."""
    return tuple(dict.fromkeys([*STOP_SIGNALS, *save]))


def note_stop(note: Path, signum: signal.Signals) -> None:
    """Write the name of the stop signal into `note` unless one is there (the first writer, the supervisor or
    the relay, got the signal as sent); unnoted, a worker names the warning signal it got."""
    if note.exists():
        return
    with contextlib.suppress(OSError):
        partial = note.with_suffix(".partial")
        partial.write_text(signum.name)
        partial.rename(note)


def torchrun_env(env: dict[str, str], ignored: Sequence[signal.Signals]) -> dict[str, str]:
    """torchrun's environment: it installs its handler only for the signals the relay does not ignore
    (`--signals-to-handle`, read from PET_SIGNALS_TO_HANDLE by torchrun ≥ 2.7, which then overwrites
    TORCHELASTIC_SIGNALS_TO_HANDLE, the variable older versions read)."""
    names = {s.name for s in ignored}
    handled = ",".join(n for n in TORCHRUN_HANDLES if n not in names)
    return {**env, "PET_SIGNALS_TO_HANDLE": handled, "TORCHELASTIC_SIGNALS_TO_HANDLE": handled}


def _shielded(ignored: Sequence[signal.Signals], relay: int) -> None:
    """In the child before exec: ignore the stop signals (inherited by torchrun and its workers), and die with
    the relay (torchrun has a session of its own, so nothing else would end it)."""
    for signum in ignored:
        signal.signal(signum, signal.SIG_IGN)
    die_with_parent(relay)


def catches(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler installed for `signum` (Linux /proc: its SigCgt mask)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next((line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), "0")
    return bool(int(caught, 16) >> (signum - 1) & 1)


def relay(command: Sequence[str], save: Sequence[signal.Signals]) -> int:
    """Run `command` (torchrun) shielded, relaying the first stop signal to its workers; its exit status
    (negative: the signal that ended it).
    A worker gets the warning once it handles it: a signal that came during start-up (Slurm's `--signal` may
    come a minute early) waits until the trainer has installed its handler, since the worker would ignore it
    before (inherited) and take a second one as "now"."""
    warning, ignored = warning_signal(save), stop_signals(save)
    stopped: list[signal.Signals] = []
    notes = None
    if (note := settings.stop_note()) is None:  # else the supervisor's: it notes the signal it got
        notes = Path(tempfile.mkdtemp(prefix="ftrain-relay-"))  # 0700
        note = notes / "stop-signal"

    def on_stop(signum: int, _: FrameType | None) -> None:
        if not stopped:
            stopped.append(signal.Signals(signum))

    for signum in ignored:
        signal.signal(signum, on_stop)
    agent = subprocess.Popen(
        list(command),
        env={**torchrun_env(dict(os.environ), ignored), settings.STOP_NOTE: str(note)},
        start_new_session=True,
        preexec_fn=partial(_shielded, ignored, os.getpid()),  # signal calls only; no thread runs here yet
    )
    try:
        return _relay(agent, warning, ignored, stopped, note)
    finally:
        if notes is not None:
            shutil.rmtree(notes, ignore_errors=True)


def _relay(
    agent: "subprocess.Popen[bytes]",
    warning: signal.Signals,
    ignored: Sequence[signal.Signals],
    stopped: list[signal.Signals],
    note: Path,
) -> int:
    """Wait for `agent`, handing its workers the warning once a stop signal came, its name noted first."""
    told: set[int] = set()
    while True:
        try:
            code = agent.wait(timeout=POLL_SECONDS)
            for signum in ignored:  # a late signal must not turn the status into its own as Python exits
                signal.signal(signum, signal.SIG_IGN)
            return code
        except subprocess.TimeoutExpired:
            if stopped and not told:
                note_stop(note, stopped[0])
            if stopped and (new := [p for p in children(agent.pid) if p not in told and catches(p, warning)]):
                for pid in new:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, warning)
                told.update(new)
                print(f"relay: {stopped[0].name} → {warning.name} to worker(s) {' '.join(map(str, new))} at "
                      f"{time.time():.3f}", file=sys.stderr, flush=True)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[1:] if args[:1] == ["--"] else args
    if not command:
        print("relay: no command to run", file=sys.stderr)
        return 2
    try:
        save = settings.save_signals()
    except settings.InvalidSetting as exc:
        print(f"relay: {exc}", file=sys.stderr)
        return 2
    if not save:
        os.execvp(command[0], command)
    code = relay(command, save)
    if code < 0:  # end as torchrun ended: the supervisor tells a signal (a SIGKILLed job) from an exit status
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those two keep their default action anyway
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main())
