"""The attempt fence on a file system: the attempt that owns a run's checkpoint directory, in the directory.

The log refuses a zombie attempt's events, but not its writes: an old attempt that wakes up (a process
stopped and continued, a node cut off and back) could still seal step directories and prune the live
attempt's checkpoints. So each attempt claims the directory with its number at start-up, and a writer checks
the claim before it seals or prunes: a higher number means it has been superseded.
"""

import contextlib
from pathlib import Path

from ftrain.host.atomic_file import write_atomic
from ftrain.host.private_files import private_dir
from ftrain.workers.layout import attempt_file
from ftrain.workers.storage.storage_errors import refuse


def owner(run: Path) -> int:
    """The attempt that last claimed `run` (0: none has)."""
    with contextlib.suppress(FileNotFoundError, ValueError):
        return int(attempt_file(run).read_text())
    return 0


def claim(run: Path, attempt: int) -> None:
    """Claim `run` for `attempt` (atomically; never lowers a newer claim). Raises Fenced when a newer
    attempt holds it."""
    check(run, attempt)
    private_dir(run, tighten=False)
    write_atomic(attempt_file(run), str(attempt).encode())


def check(run: Path, attempt: int) -> None:
    """Raise Fenced when a newer attempt than `attempt` has claimed `run`."""
    refuse(attempt, owner(run), run.name)
