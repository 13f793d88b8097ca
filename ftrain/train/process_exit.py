"""Ending a training process without the interpreter's finalization, which races gloo's worker threads.

A gloo worker thread drops its reference to a finished collective just after the caller sees it complete; when
that reference is the last one to a tensor Python has seen, the drop takes the GIL. If the main thread is
finalizing the interpreter by then, the worker is unwound by force inside a noexcept destructor and the process
aborts with "terminate called without an active exception" (SIGABRT, exit -6): a finished job reported as a
failure, and relaunched. Here it was 1 run in 40 of a 2-rank CPU job, the core showing
`~AsyncAllgatherCoalescedWork` → `take_gil` → `PyThread_exit_thread` under `Py_FinalizeEx`. Destroying the
process groups does not help while a module or the manager still references them. A script that has closed
what it owns exits straight instead: its streams flushed, then `os._exit` with its code.
"""

import contextlib
import os
import sys
from collections.abc import Callable
from typing import NoReturn


def run_then_exit(main: Callable[[], int | None]) -> NoReturn:
    """Run `main` and end the process with its return value (or its SystemExit's code), skipping
    finalization. Any other exception propagates as usual: its traceback is printed and the process fails."""
    try:
        code = main()
    except SystemExit as exc:
        if not isinstance(exc.code, int | None):
            raise
        code = exc.code
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed or broken pipe: nothing more to say there
            stream.flush()
    os._exit(code or 0)
