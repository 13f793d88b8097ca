"""structlog set-up. The library is quiet by default: used from a user's script, ftrain never writes to stdout
(the script's output); warnings go to stderr as one line each, from rank 0 only, and `FTRAIN_LOG_LEVEL=info`
(or `debug`, or `warning`: then from every rank, as JSON unless stderr is a terminal) or a call to
`configure(level=logging.INFO)` shows more. A user who configured structlog keeps that configuration: ftrain
only fills in structlog's defaults (which print every level to stdout) when nobody configured it.

    import logging
    import ftrain.logs

    ftrain.logs.configure(level=logging.INFO)  # ftrain's events on stderr, key-value on a terminal, else JSON

The CLI calls `configure()` itself, at FTRAIN_LOG_LEVEL's level (warning unless set).
"""

import contextlib
import importlib.machinery
import logging
import os
import sys
from collections.abc import MutableMapping, Sequence
from types import ModuleType
from typing import Any

LEVEL_VARIABLE = "FTRAIN_LOG_LEVEL"
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR,
           "critical": logging.CRITICAL}  # fmt: skip


class _Stderr:
    """Whatever sys.stderr is at the moment of writing (it is replaced by test harnesses and daemons). A line
    that cannot be written is dropped: when whoever read our stderr is gone (a killed launcher, a broken ssh
    connection), logging must not raise into the code that logs, such as the recorder's delivery."""

    def write(self, text: str) -> int:
        try:
            return sys.stderr.write(text)
        except (OSError, ValueError):  # a broken pipe; a closed stream
            return 0

    def flush(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()


def configure(level: int | None = None) -> None:
    """Send structlog to stderr at `level` (default: FTRAIN_LOG_LEVEL, warning unless set) so stdout stays the
    output; InvalidSetting on a malformed FTRAIN_LOG_LEVEL. Replaces any configuration: call it to opt in."""
    if level is None:
        from ftrain import settings

        level = settings.log_level()
    _configure(level)


def _configure(threshold: int, *, human: bool = False) -> None:
    import structlog

    renderer: structlog.typing.Processor = (
        _one_line
        if human
        else structlog.dev.ConsoleRenderer(colors=False)
        if sys.stderr.isatty()
        else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        # one write per line, its newline included: ranks of a job share one stderr pipe, and a line written
        # in two parts (as `print` does) could be glued to another rank's line when stderr is unbuffered
        logger_factory=structlog.WriteLoggerFactory(_Stderr()),  # type: ignore[arg-type]
        # not cached: a logger used before a later `configure` (the user's `configure(level=INFO)`, or a test's
        # capture) would keep the level and output it first ran with; a call costs 2.4 µs, not 0.8
        cache_logger_on_first_use=False,
    )


def library_defaults() -> None:
    """Quiet defaults for a process nobody configured structlog in: stderr, FTRAIN_LOG_LEVEL (warning unless
    set or malformed: the library never fails its user's import over a log level). Done the moment structlog
    is imported (`ftrain/__init__` arranges it), so it never costs a process that logs nothing."""
    if "structlog" in sys.modules:
        _default_unless_configured()
    elif not any(isinstance(f, _WhenImported) for f in sys.meta_path):
        sys.meta_path.insert(0, _WhenImported())


def _default_unless_configured() -> None:
    """FTRAIN_LOG_LEVEL's level, as `configure` does; unset (or malformed), a script's quiet default: warnings
    as one line for people, said once for a job (rank 0, by torchrun's RANK; other ranks only errors)."""
    import structlog

    if structlog.is_configured():
        return
    chosen = _LEVELS.get(os.environ.get(LEVEL_VARIABLE, "").strip().lower())
    if chosen is not None:
        _configure(chosen)
    else:
        _configure(logging.WARNING if os.environ.get("RANK", "0") == "0" else logging.ERROR, human=True)


def _one_line(_: Any, method: str, event: MutableMapping[str, Any]) -> str:
    """`ftrain: warning: loader_not_resumable (loader=DataLoader, consequence=…)`."""
    event.pop("timestamp", None)
    level, name = event.pop("level", method), event.pop("event", "")
    rest = ", ".join(f"{key}={value}" for key, value in event.items())
    return f"ftrain: {level}: {name}" + (f" ({rest})" if rest else "")


class _WhenImported:
    """A meta path finder (`importlib.abc.MetaPathFinder`'s protocol; not its subclass: importing that costs
    every command 0.02 s) that runs `_default_unless_configured` right after structlog's own module has run,
    whoever imports it first (an ftrain module at its top, or the user), and then leaves the import system."""

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != "structlog":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType, *_: Any) -> None:
            run(module)
            _default_unless_configured()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
