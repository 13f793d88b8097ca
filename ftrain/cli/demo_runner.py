"""`ftrain` commands run in this process and echoed as a user would type them: how the demos play.

The demos receive the command line's entry point instead of importing it, so the CLI and its demos form no
import cycle.
"""

import shlex
from collections.abc import Callable, Sequence

EntryPoint = Callable[[Sequence[str]], int]


class Shell:
    """Echo `$ ftrain …`, run it through `main`, and return its exit code (SystemExit included)."""

    def __init__(self, main: EntryPoint) -> None:
        self._main = main

    def __call__(self, *argv: str) -> int:
        print(f"\n$ ftrain {shlex.join(argv)}", flush=True)
        try:
            return self._main(list(argv))
        except SystemExit as exc:
            return int(exc.code or 0)
