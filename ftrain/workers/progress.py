"""Progress of long transfers (uploads, downloads, verifies) for a person at a terminal.

A command opens a bar around one operation (`shown`, with the bytes it expects); every byte ftrain moves passes
through a `workers.integrity.Hasher`, which reports it here (`advance`), from whichever thread hashes it. Off when
stderr is not a terminal (logs, CI, the trainer under torchrun never open one): then `advance` is one check.
"""

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import Any

_lock = threading.Lock()
_bar: Any = None
"""The open tqdm bar, if a command opened one."""


@contextlib.contextmanager
def shown(label: str, total: int) -> Iterator[None]:
    """A bar on stderr for `total` bytes while the block runs, when stderr is a terminal."""
    global _bar
    if not sys.stderr.isatty() or _bar is not None:
        yield
        return
    from tqdm import tqdm  # only a terminal pays for the import

    bar = tqdm(total=total, desc=label, unit="B", unit_scale=True, unit_divisor=1024, leave=False)
    _bar = bar
    try:
        yield
    finally:
        with _lock:
            _bar = None
        bar.close()


def advance(count: int) -> None:
    """`count` more bytes moved (hashed)."""
    if _bar is None:
        return
    with _lock:
        if _bar is not None:
            _bar.update(count)
