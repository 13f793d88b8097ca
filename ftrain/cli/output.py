"""Where the CLI's output goes. Results go to stdout: lines for a person, or with `--json` one JSON document
(then the lines for a person, a supervisor's progress included, go to stderr, so stdout parses). A reader that
closes the pipe early (`ftrain events tail --json | head -1`) ends the command quietly (`OutputClosed`), as
`git log | head` does.

Stdlib only until a JSON document is written: every command's start-up imports this.
"""

import sys
from typing import Any, TextIO

from ftrain.cli.visible import visible

_human_to_stderr = False


class OutputClosed(Exception):
    """Whoever read stdout has gone: the command stops, exit 141 (128 + SIGPIPE), nothing said."""


def json_mode(on: bool) -> None:
    """With `--json`, stdout holds the JSON document alone: person-readable lines go to stderr."""
    global _human_to_stderr
    _human_to_stderr = on


def emit(lines: str | list[str]) -> None:
    """Print output lines for a person, each made visible: a line feed inside one is shown, not obeyed."""
    text = "\n".join(visible(line) for line in ([lines] if isinstance(lines, str) else lines)) + "\n"
    _write(sys.stderr if _human_to_stderr else sys.stdout, text)


def emit_json(value: Any) -> None:
    """Print one JSON document, on one line, the stored strings unchanged (JSON escapes what must be)."""
    import msgspec

    _write(sys.stdout, msgspec.json.encode(value).decode() + "\n")


def _write(stream: TextIO, text: str) -> None:
    try:
        stream.write(text)
        stream.flush()
    except BrokenPipeError:
        raise OutputClosed from None


def emit_text(text: str) -> None:
    """Print generated text as it is (a completion script): not a person's line, never escaped."""
    _write(sys.stdout, text if text.endswith("\n") else text + "\n")
