"""torchrun's failure block, left out when the worker that ended the attempt already said why in one line.

torchrun reports any worker that exits non-zero with a log line, its own traceback (`ChildFailedError`) and a
"Root Cause" table: some 30 lines for what the trainer said in one — a save on a warning signal
(PREEMPTED_EXIT) or an ftrain error it reported (STOPPED_EXIT). The block is printed once, as torchrun exits,
so it is held from its first line to the rule that closes its table, and dropped only when the exit code it
blames is one of those; any other block, or one cut short, is written as it came. Everything else passes
line by line (a carriage return ends a line too, so progress bars still move)."""

import re
from typing import Final

from ftrain.train.preemption import PREEMPTED_EXIT
from ftrain.train.process_exit import STOPPED_EXIT

SAID: Final = frozenset({PREEMPTED_EXIT, STOPPED_EXIT})
"""Worker exit codes whose worker already said why, in one line."""
_OPENS: Final = re.compile(r"\] failed \(exitcode: -?\d+\) local_rank: \d+ .*of binary: ")
_BLAMED: Final = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_RULE: Final = re.compile(r"^=+\s*$")


class FailureBlock:
    """Passes the launcher's stderr text on, holding back torchrun's failure block until it knows whom the
    block blames."""

    def __init__(self) -> None:
        self._partial = ""
        self._held: list[str] | None = None
        self._blamed: int | None = None
        self._root_cause = False

    def feed(self, text: str) -> str:
        """The next piece of text (lines may be split anywhere); what to write now."""
        lines = re.split(r"(?<=[\r\n])", self._partial + text)
        self._partial = lines.pop()
        return "".join(self._line(line) for line in lines)

    def end(self) -> str:
        """The stream ended: what is still held or unfinished, as it came."""
        held, self._held = self._held or [], None
        rest, self._partial = self._partial, ""
        return "".join(held) + rest

    def _line(self, line: str) -> str:
        if self._held is None:
            if not _OPENS.search(line):
                return line
            self._held, self._blamed, self._root_cause = [], None, False
        self._held.append(line)
        if "Root Cause" in line:
            self._root_cause = True
        elif self._root_cause and self._blamed is None and (found := _BLAMED.match(line)):
            self._blamed = int(found[1])
        elif self._root_cause and _RULE.match(line):
            held, self._held = self._held, None
            return "" if self._blamed in SAID else "".join(held)
        return ""
