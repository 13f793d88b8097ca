"""Everything ftrain keeps is private to its user: directories 0700, files 0600, whatever the umask.

Other users share the login and compute nodes. The umask only removes bits, so an explicit mode at creation
(then a chmod, for a umask that removed the owner's own bits) is enough for what ftrain creates; a directory it
finds with looser bits (an FTRAIN_HOME made by an older version) is tightened when the caller says it is ours.
"""

import contextlib
import os
from pathlib import Path
from typing import Final

DIR_MODE: Final = 0o700
FILE_MODE: Final = 0o600


def private_dir(path: Path, *, tighten: bool = True) -> Path:
    """`mkdir -p` whose every created directory is 0700; `tighten` also chmods an existing leaf to 0700
    (only for directories ftrain owns: never a user's storage root)."""
    missing: list[Path] = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it meanwhile
            directory.mkdir(mode=DIR_MODE)
        os.chmod(directory, DIR_MODE)
    if tighten and not missing:
        os.chmod(path, DIR_MODE)
    return path


def private_file(path: Path) -> Path:
    """Create `path` empty and 0600 if missing (an existing one keeps its bytes and is tightened to 0600):
    for files another library opens itself, such as a SQLite database, whose -wal and -shm copy its mode."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)
    return path


def open_private(path: Path, flags: int) -> int:
    """`os.open` that creates the file 0600, never readable by others even for an instant."""
    fd = os.open(path, flags | os.O_CREAT, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd
