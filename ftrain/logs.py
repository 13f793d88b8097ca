"""structlog set-up: key-value lines on stderr for a terminal, JSON otherwise; quiet unless asked."""

import contextlib
import sys

import structlog

from ftrain import settings


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
    """Send structlog to stderr at `level` (default: the settings' log level) so stdout stays the output;
    InvalidSetting on a malformed FTRAIN_LOG_LEVEL."""
    threshold = settings.log_level() if level is None else level
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer(colors=False)
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
        cache_logger_on_first_use=True,
    )
