"""Ending a training process without the interpreter's finalization, which races gloo's worker threads.

A gloo worker thread drops its reference to a finished collective just after the caller sees it complete; when
that reference is the last one to a tensor Python has seen, the drop takes the GIL. If the main thread is
finalizing the interpreter by then, the worker is unwound by force inside a noexcept destructor and the process
aborts with "terminate called without an active exception" (SIGABRT, exit -6): a finished job reported as a
failure, and relaunched. Here it was 1 run in 40 of a 2-rank CPU job, the core showing
`~AsyncAllgatherCoalescedWork` → `take_gil` → `PyThread_exit_thread` under `Py_FinalizeEx`. Destroying the
process groups does not help while a module or the manager still references them. A script that has closed
what it owns exits straight instead: its streams flushed, then `os._exit` with its code.

An ftrain error (`ftrain.errors.FtrainError`) that reaches the top ends the process the same way, said once for
the job: one line on rank 0 (every rank raised the same), none elsewhere, exit STOPPED_EXIT on each, so that a
refusal or missing credentials is one line, not a traceback per rank (and under `ftrain run` no launcher
failure block either).
"""

import contextlib
import os
import sys
from collections.abc import Callable
from types import TracebackType
from typing import Final, NoReturn, TextIO

from ftrain.errors import FtrainError

STOPPED_EXIT: Final = 84
"""A worker's exit status after an ftrain error it reported in one line (rank 0)."""
_hooked: list[bool] = []


def run_then_exit(main: Callable[[], int | None]) -> NoReturn:
    """Run `main` and end the process with its return value (or its SystemExit's code), skipping
    finalization; an ftrain error is said once (`say_once`). Any other exception propagates as usual: its
    traceback is printed and the process fails."""
    try:
        code = main()
    except SystemExit as exc:
        if not isinstance(exc.code, int | None):
            raise
        code = exc.code
    except FtrainError as exc:
        code = say_once(exc)
    _exit(code or 0)


def say_once(exc: FtrainError, stream: TextIO | None = None) -> int:
    """Say `exc` in one line on rank 0 (torchrun's RANK; a process outside it is rank 0) on `stream` (default
    stderr); the exit status."""
    if os.environ.get("RANK", "0") == "0":
        print(f"train: {type(exc).__name__}: {exc}", file=stream or sys.stderr, flush=True)
    return STOPPED_EXIT


def one_line_errors() -> None:
    """Make an ftrain error nobody caught end the process as `run_then_exit` does (any other exception goes
    to the hook that was there before, such as the one `init_process_group` installs: call this after it)."""
    if _hooked:
        return
    _hooked.append(True)
    previous = sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, trace: TracebackType | None) -> None:
        if isinstance(exc, FtrainError) and not hasattr(sys, "ps1"):  # an interactive session lives on
            # the process's own stderr: torch's hook, when it wraps this one, holds sys.stderr in a buffer
            _exit(say_once(exc, sys.__stderr__ or sys.stderr))
        previous(kind, exc, trace)

    sys.excepthook = hook


def _exit(code: int) -> NoReturn:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed or broken pipe: nothing more to say there
            stream.flush()
    os._exit(code)
