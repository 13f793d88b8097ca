"""Where an export goes: a new or empty directory of this user's, written in full or not at all.

The target is judged before anything is read or written: refused (exit 2) when it exists and is not an empty
directory of this user's that no one else can write to, or when a directory above it lets another user swap
what is below (`host.private_files` decides, as for every private directory). The files are written into a
private directory created beside it, and that directory is renamed onto the target only once every file is
written and synced: an export that fails or is interrupted leaves no partial output under the target's name.
"""

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ftrain.errors import UsageError
from ftrain.host.atomic_file import fsync_dir
from ftrain.host.private_files import check_above, check_dir


def check_target(to: Path) -> Path:
    """`to`, absolute, when an export may be written there; raises UsageError or UnsafeDirectory else."""
    target = to.absolute()
    if not target.parent.is_dir():
        raise UsageError(f"--to {target}: {target.parent} is not a directory")
    check_above(target.parent, below=f"export directory {target}")
    if os.path.lexists(target):
        check_dir(target, what=f"export directory {target}")
        with os.scandir(target) as entries:
            if any(entries):
                raise UsageError(f"export directory {target} is not empty: choose a new or empty directory")
    return target


@contextmanager
def staged(target: Path) -> Iterator[Path]:
    """A private directory beside `target` to write the export into, renamed onto `target` (new, or an
    empty directory it replaces) when the block ends; removed with everything in it if the block fails."""
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.export-", dir=target.parent))
    try:
        yield work
        fsync_dir(work)
        os.rename(work, target)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    fsync_dir(target.parent)
