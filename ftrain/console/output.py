"""Where the CLI's output goes. Results go to stdout: lines for a person, or with `--json` one JSON document
(then the lines for a person, a supervisor's progress included, go to stderr, so stdout parses). A reader that
closes the pipe early (`ftrain events tail --json | head -1`) ends the command quietly (`OutputClosed`), as
`git log | head` does. A stdout that is closed (`>&-`) or cannot take the output (a full disk) is no reader
gone: the command fails with one line on stderr (`OutputUnwritable`, exit 1).

Stdlib only until a JSON document is written: every command's start-up imports this.
"""

import sys
from typing import Any, TextIO

from ftrain.console.visible_text import visible

_human_to_stderr = False


class OutputClosed(Exception):
    """Whoever read stdout has gone: the command stops, exit 141 (128 + SIGPIPE), nothing said."""


class OutputUnwritable(Exception):
    """Stdout is closed or refuses the write (EBADF, ENOSPC, EIO): one line on stderr, exit 1."""


def require_stdout() -> None:
    """Refuse a command whose stdout is closed before it does anything: its result could not be shown, and
    a file it opened would take descriptor 1, inherited by every process it starts."""
    if sys.stdout is None:
        raise OutputUnwritable("stdout is closed")


def json_mode(on: bool) -> None:
    """With `--json`, stdout holds the JSON document alone: person-readable lines go to stderr."""
    global _human_to_stderr
    _human_to_stderr = on


def emit(lines: str | list[str]) -> None:
    """Print output lines for a person, each made visible: a line feed inside one is shown, not obeyed."""
    text = "\n".join(visible(line) for line in ([lines] if isinstance(lines, str) else lines)) + "\n"
    _write("stderr" if _human_to_stderr else "stdout", text)


def emit_json(value: Any) -> None:
    """Print one JSON document, on one line, the stored strings unchanged (JSON escapes what must be)."""
    import msgspec

    _write("stdout", msgspec.json.encode(value).decode() + "\n")


def _write(name: str, text: str) -> None:
    stream: TextIO | None = getattr(sys, name)
    if stream is None:  # the interpreter found the descriptor closed at start-up
        raise OutputUnwritable(f"{name} is closed")
    try:
        stream.write(text)
        stream.flush()
    except BrokenPipeError:
        raise OutputClosed from None
    except OSError as exc:
        raise OutputUnwritable(exc.strerror or str(exc)) from None


def emit_text(text: str) -> None:
    """Print generated text as it is (a completion script): not a person's line, never escaped."""
    _write("stdout", text if text.endswith("\n") else text + "\n")
