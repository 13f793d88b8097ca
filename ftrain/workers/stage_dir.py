"""Directories private to this user, for node-local staging of async saves (and, on object storage, every
upload and download), and their removal.

Staging lives on shared nodes' local disks, typically under /tmp, where any user can create a name first:
a directory planted there (or a link to one elsewhere) would receive the checkpoint's bytes, or have its
contents deleted by the start-up cleanup. So a staging directory is created 0700, and used only while it
is a real directory owned by this user that no one else can write to, below directories only this user or
root control (or sticky ones, like /tmp, where others cannot move it).
"""

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import structlog

from ftrain.host.nofollow import remove_dir
from ftrain.host.private_files import UnsafeDirectory, check_dir, private_dir, safe_dir
from ftrain.workers.storage.port import RankFiles

__all__ = [
    "UnsafeDirectory",
    "claim_dir",
    "default_stage_dir",
    "local_files",
    "remove_leftovers",
    "safe_stage_dir",
    "same_device",
]
log = structlog.get_logger(__name__)

LABEL = "staging directory"
CHOOSE = "choose another with --ckpt-stage-dir"


def default_stage_dir(job: str) -> Path:
    """The default staging directory of a job: `<tmp>/ftrain-<uid>/<job>`, per user and node-local."""
    return Path(tempfile.gettempdir()) / f"ftrain-{os.getuid()}" / job


def safe_stage_dir(path: Path) -> Path:
    """`path`, created (0700, with any missing parents) unless it exists; raises UnsafeDirectory unless it
    is a directory, not a link, owned by this user and not writable by group or others, and every
    directory above it is this user's or root's and, if others may write to it, sticky (`host.private_files`
    decides, as for every private directory; an existing one is not tightened: it may be the user's)."""
    return safe_dir(path, label=LABEL, choose=CHOOSE)


def same_device(stage: Path, destination: Path) -> bool:
    """Whether files staged under `stage` would land on the device of `destination` (or of its nearest
    existing parent): then staging them first and copying them over would write every byte twice."""
    existing = next(p for p in (destination.absolute(), *destination.absolute().parents) if p.exists())
    return os.stat(stage).st_dev == os.stat(existing).st_dev


def claim_dir(parent: Path, name: str, *, label: str = LABEL, choose: str = CHOOSE) -> bool:
    """The directory `name` under `parent` (a checked private directory), made 0700 by whichever of the
    processes sharing `parent` gets there first: True for that one (it removes the directory after), False
    for the others. Raises UnsafeDirectory (naming it `label`, advising `choose`) unless what is there is a
    real directory of this user's that no one else can write to."""
    path = parent / name
    try:
        os.mkdir(path, 0o700)
        created = True
    except FileExistsError:
        created = False
    check_dir(path, what=f"{label} {path}", choose=choose)
    return created


def remove_leftovers(path: Path) -> bool:
    """Remove a directory of ours (a link there is removed, never followed: the next save would write
    through it); whether something was removed. What cannot be removed is logged: the next start retries."""
    try:
        removed = remove_dir(path.parent, path.name, unlink_link=True)
    except OSError as exc:
        log.warning("stale_staging_not_removed", path=str(path), error=str(exc))
        return False
    if removed:
        log.info("stale_staging_removed", path=str(path))
    return removed


@contextmanager
def local_files(path: Path) -> Iterator[RankFiles]:
    """A fresh private node-local directory for one rank's files of one step, removed on exit."""
    remove_leftovers(path)
    private_dir(path, tighten=False)
    try:
        yield RankFiles(path, final=False)
    finally:
        remove_leftovers(path)
